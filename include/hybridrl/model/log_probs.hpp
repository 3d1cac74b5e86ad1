#pragma once
/// \file
/// Per-token log-probs and entropies of a causal LM, computed `chunk_size` positions at a time in
/// fp32 so the full [B, T, V] logits never exist (each chunk is activation-checkpointed, so neither
/// does backward keep them); on CUDA one fused kernel per chunk reads the logits once, in their
/// dtype, and the backward writes their gradient once (cuda/fused.hpp's token_log_prob). Under
/// tensor parallelism the logits stay vocabulary-sharded: the softmax normaliser is a max and a
/// sum all-reduce over the group, never a gather of [B, T, V].
///
/// Alignment (core/keys.hpp): token_log_probs has the shape of input_ids and entry t is
/// log p(token t | tokens < t); column 0 is 0 (the first token is not predicted). So
/// `(log_probs * response_mask).sum(-1)` is the summed response log-prob with no shift, which is
/// what sequence_log_probs returns.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/cuda/fused.hpp"
#include "hybridrl/model/activation_checkpoint.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include "hybridrl/model/parallel.hpp"

namespace hybridrl {

/// How log-probs are computed.
struct LogProbOptions {
  /// Sequence positions per chunk: peak logits memory is B × chunk_size × vocab floats.
  HYBRIDRL_ARG(int64_t, chunk_size) = 128;
  /// Logits are divided by this before the softmax (the sampling temperature, as verl does).
  HYBRIDRL_ARG(double, temperature) = 1.0;
  /// Also compute the entropy of each position's distribution (PPO's entropy bonus and verl's
  /// entropy metric need it). Turn it off for reference / old log-probs: it costs one more
  /// exp-multiply-reduce over the vocabulary per chunk (and an all-reduce under TP).
  HYBRIDRL_ARG(bool, with_entropy) = true;

  /// Throws hybridrl::Error for chunk_size < 1 or temperature <= 0.
  void validate() const {
    HYBRIDRL_CHECK(chunk_size_ >= 1, fmt::format("chunk_size = {} must be >= 1", chunk_size_),
                   "use a positive number of positions per chunk, e.g. 128");
    HYBRIDRL_CHECK(temperature_ > 0, fmt::format("temperature = {} must be > 0", temperature_),
                   "use the sampling temperature of the rollout (1.0 for none)");
  }
};

/// Per-token log-probs and entropies, fp32 (entropy undefined unless requested).
struct TokenLogProbs {
  at::Tensor log_probs;  ///< log p(label) of each position
  at::Tensor entropy;    ///< entropy of the distribution that predicted it
};

namespace detail {

/// [..., 1] log p(lab) (and [..., 2] with the entropy appended) of fp32 logits `l` [..., V_local]
/// whose columns are vocabulary ids vocab_start.. (the whole vocabulary when `pc` is not sharded).
inline at::Tensor log_prob_columns(const at::Tensor& l, const at::Tensor& lab, bool ent, const ParallelContext& pc,
                                   int64_t vocab_start) {
  if (!pc.sharded()) {
    auto logp = at::log_softmax(l, -1);
    auto out = logp.gather(-1, lab);
    if (!ent) return out;
    auto entropy = at::logsumexp(l, -1, true) - (logp.exp() * l).sum(-1, true);
    return at::cat({out, entropy}, -1);
  }
  // vocabulary-parallel: logZ = log S + M with S = Σ_ranks Σ_v exp(l - M) and M the global max
  // (a constant: its gradient cancels). Local terms use only M and the local logits; everything
  // after an all-reduce is replicated, so the all-reduces pass gradients through unchanged.
  auto m = std::get<0>(l.detach().max(-1, true)).contiguous();
  pc.tp->all_reduce(m, ReduceOp::max);
  auto e = at::exp(l - m);
  auto sum = reduce_from_tp(e.sum(-1, true), pc);
  auto logz = at::log(sum) + m;
  const auto n = l.size(-1);
  auto local = lab - vocab_start;
  auto mine = local.ge(0).logical_and(local.lt(n));
  auto target = reduce_from_tp(l.gather(-1, local.clamp(0, n - 1)) * mine.to(l.scalar_type()), pc);
  auto out = target - logz;
  if (!ent) return out;
  // entropy = logZ - E_p[l], E_p[l] = Σ_ranks Σ_v exp(l - M) l / S
  auto weighted = reduce_from_tp((e * l).sum(-1, true), pc);
  return at::cat({out, logz - weighted / sum}, -1);
}

/// log-probs of `labels` (and entropies) from `hidden` [B, T, hidden] through the output matrix
/// `weight` ([V, hidden], or this rank's [V/tp, hidden] from id `vocab_start` under a sharded
/// `pc`), chunk by chunk over dim 1; with grad, each chunk is activation-checkpointed so backward
/// keeps only its hidden slice, never its logits.
inline TokenLogProbs chunked_log_probs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                       const LogProbOptions& o, const ParallelContext& pc = {},
                                       int64_t vocab_start = 0) {
  o.validate();
  HYBRIDRL_CHECK(hidden.dim() == 3 && labels.dim() == 2 && hidden.size(0) == labels.size(0) &&
                     hidden.size(1) == labels.size(1),
                 fmt::format("log_probs_and_entropy: hidden {} and labels {} do not line up",
                             fmt::join(hidden.sizes(), "x"), fmt::join(labels.sizes(), "x")),
                 "pass hidden [B, T, hidden] and labels [B, T] (labels[t] is predicted from hidden[t])");
  const auto T = hidden.size(1);
  const double temp = o.temperature();
  const bool ent = o.with_entropy();
  std::vector<at::Tensor> lp, en;
  for (int64_t t0 = 0; t0 < T; t0 += o.chunk_size()) {
    const auto n = std::min(o.chunk_size(), T - t0);
    auto lab = labels.narrow(1, t0, n).to(hidden.device()).to(at::kLong).unsqueeze(-1);
    auto fn = [weight, lab, temp, ent, pc, vocab_start](const at::Tensor& h) {
      auto logits = at::linear(copy_to_tp(h, pc), weight);
      if (!pc.sharded()) {  // on CUDA: one kernel per row, nothing [tokens, vocab] in fp32 (cuda/fused.hpp)
        const auto V = logits.size(-1);
        auto [flp, fen] = fused::token_log_prob(logits.reshape({-1, V}), lab.reshape({-1}), temp, ent);
        if (flp.defined()) {
          auto shape = lab.sizes().vec();  // [B, n, 1]
          if (!ent) return flp.view(shape);
          shape.back() = 2;
          return at::stack({flp, fen}, -1).view(shape);
        }
      }
      logits = logits.to(at::promote_types(logits.scalar_type(), at::kFloat));  // fp32 at least
      if (temp != 1.0) logits = logits / temp;
      return log_prob_columns(logits, lab, ent, pc, vocab_start);
    };
    auto r = activation_checkpoint(fn, hidden.narrow(1, t0, n), {weight});
    lp.push_back(r.select(-1, 0));
    if (ent) en.push_back(r.select(-1, 1));
  }
  TokenLogProbs out;
  out.log_probs = T > 0 ? at::cat(lp, 1) : at::zeros({hidden.size(0), 0}, hidden.options().dtype(at::kFloat));
  if (ent) out.entropy = T > 0 ? at::cat(en, 1) : out.log_probs.clone();
  return out;
}

}  // namespace detail

/// log p(labels[b, t] | hidden[b, t]) and entropies, fp32 [B, T], `chunk_size` positions at a
/// time; pass only the hidden positions you need (e.g. the response part). Under tensor
/// parallelism every rank gets the full (replicated) result.
inline TokenLogProbs log_probs_and_entropy(CausalLM model, const at::Tensor& hidden, const at::Tensor& labels,
                                           const LogProbOptions& o = {}) {
  return detail::chunked_log_probs(hidden, model->output_weight(), labels, o, model->parallel(), model->vocab_start());
}

/// Per-token log-probs of a batch, aligned with `input_ids` [B, T]: entry t is
/// log p(input_ids[t] | input_ids[< t]) and column 0 is 0; entropy entry t is the entropy of the
/// distribution that predicted token t (column 0: 0). In packed rows the first token of each
/// sequence is scored under the previous sequence's context: it is a prompt token, masked out by
/// response_mask.
inline TokenLogProbs token_log_probs(CausalLM model, const at::Tensor& input_ids, const ForwardArgs& args = {},
                                     const LogProbOptions& o = {}) {
  auto ids = input_ids.dim() == 1 ? input_ids.unsqueeze(0) : input_ids;
  auto h = model->hidden_states(ids, args);
  const auto T = h.size(1);
  HYBRIDRL_CHECK(T >= 1, "token_log_probs: input_ids has no tokens", "pass at least one token per row");
  auto r = log_probs_and_entropy(model, h.narrow(1, 0, T - 1), ids.narrow(1, 1, T - 1), o);
  auto shift = [](const at::Tensor& t) {
    return t.defined() ? at::cat({at::zeros({t.size(0), 1}, t.options()), t}, 1) : t;
  };
  return {shift(r.log_probs), shift(r.entropy)};
}

/// Summed response log-probs [B] of the sequences stored under `prefix` in `batch`:
/// `(token_log_probs * response_mask).sum(-1)`. Reads `<prefix>input_ids` and
/// `<prefix>response_mask`, and `<prefix>attention_mask` / `<prefix>position_ids` when present;
/// prefix "chosen_" / "rejected_" (DPO pairs), "kl_" (KTO mismatched pairs) or "" (the batch's own).
/// Entropy is not computed (o.with_entropy is ignored).
inline at::Tensor sequence_log_probs(CausalLM model, const TensorBatch& batch, std::string_view prefix = "",
                                     const LogProbOptions& o = {}) {
  auto key = [&](std::string_view q) { return std::string(prefix) + std::string(q); };
  for (const auto& k : {key("input_ids"), key("response_mask")}) {
    HYBRIDRL_CHECK(batch.has_tensor(k),
                   fmt::format("sequence_log_probs: the batch has no tensor '{}' (prefix '{}'); it has {}", k, prefix,
                               fmt::join(batch.tensor_keys(), ", ")),
                   "pass the prefix the loader wrote (\"chosen_\", \"rejected_\", \"kl_\" or \"\")");
  }
  HYBRIDRL_CHECK(!(prefix.empty() && batch.has_tensor("cu_seqlens")),
                 "sequence_log_probs: the batch is packed (it has cu_seqlens): a row holds several sequences",
                 "use token_log_probs(model, ids, ForwardArgs{}.cu_seqlens(cu)) and sum per sequence, or an unpacked loader");
  ForwardArgs args;
  if (batch.has_tensor(key("attention_mask"))) args.attention_mask(batch.tensor(key("attention_mask")));
  if (batch.has_tensor(key("position_ids"))) args.position_ids(batch.tensor(key("position_ids")));
  auto opts = o;
  opts.with_entropy(false);
  const auto& ids = batch.tensor(key("input_ids"));
  const auto& mask = batch.tensor(key("response_mask"));
  HYBRIDRL_CHECK(mask.sizes() == ids.sizes(),
                 fmt::format("sequence_log_probs: '{}' has shape {} but '{}' has {}", key("response_mask"),
                             fmt::join(mask.sizes(), "x"), key("input_ids"), fmt::join(ids.sizes(), "x")),
                 "the response mask must have the shape of the token ids it marks");
  auto lp = token_log_probs(model, ids, args, opts).log_probs;
  return (lp * mask.to(lp.device()).to(lp.scalar_type())).sum(-1);
}

}  // namespace hybridrl
