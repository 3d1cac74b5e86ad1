#pragma once
/// \file
/// The Llama-family causal LM (Llama, Mistral, Qwen2) and its critic, on the decoder trunk of
/// model/decoder.hpp. Every forward mode gives the same logits for the same tokens:
/// - padded batch with attention mask (left or right padding): `forward(ids, ForwardArgs{}.attention_mask(m))`;
/// - packed rows (several sequences per row, positions restarting, no attention across them):
///   `forward(ids, ForwardArgs{}.cu_seqlens(cu))`, as Loader<Packed> lays them out;
/// - incremental decode through any KV-cache layout: `forward_with_attention(ids, positions, attn_fn)`
///   (the dense cache of Rollout<Naive> is rollout/naive/dense_kv_cache.hpp).
/// Per-token log-probs and entropy, chunked so [B, T, V] never exists: model/log_probs.hpp.
/// Parameter names equal Hugging Face tensor names (`model.layers.0.self_attn.q_proj.weight`).
/// Built with a sharded ParallelContext, a model holds this rank's tensor-parallel shard.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "hybridrl/core/error.hpp"
#include "hybridrl/model/config.hpp"
#include "hybridrl/model/decoder.hpp"
#include "hybridrl/model/parallel.hpp"
#include "hybridrl/model/parameter_init.hpp"

namespace hybridrl {

namespace detail {

/// Copies every parameter of `src` into the same-named parameter of `dst` (no grad), by name.
/// When `dst` is a tensor-parallel shard (`dst_pc` sharded) and `src` is full, each parameter gets
/// its shard of the source (detail::tp_shard), so no full copy is made.
inline void copy_parameters(torch::nn::Module& dst, const torch::nn::Module& src, const ParallelContext& dst_pc = {},
                            bool src_full = true) {
  c10::NoGradGuard no_grad;
  auto from = src.named_parameters();
  for (auto& p : dst.named_parameters()) {
    const auto* s = from.find(p.key());
    HYBRIDRL_CHECK(s != nullptr, fmt::format("copy_parameters: source has no parameter '{}'", p.key()),
                   "copy between models built from the same config");
    const auto& t = (dst_pc.sharded() && src_full) ? tp_shard(*s, p.key(), dst_pc) : *s;
    HYBRIDRL_CHECK(t.sizes() == p.value().sizes(),
                   fmt::format("copy_parameters: '{}' has shape {} in the source but {} in the copy", p.key(),
                               fmt::join(t.sizes(), "x"), fmt::join(p.value().sizes(), "x")),
                   "copy between models of one config and one tensor-parallel layout (or from a full model)");
    p.value().copy_(t);
  }
}

}  // namespace detail

/// The causal LM, HF's `LlamaForCausalLM` / `MistralForCausalLM` / `Qwen2ForCausalLM`:
/// the trunk (`model`) and `lm_head` (absent when tied to the embedding). Under tensor parallelism
/// lm_head is column-parallel over the vocabulary.
class CausalLMImpl : public torch::nn::Module {
 public:
  /// A randomly initialised model for `c` (this rank's shard under a sharded `pc`).
  explicit CausalLMImpl(const ModelConfig& c, const ParallelContext& pc = {}) {
    model = register_module("model", Decoder(c, pc));
    if (!c.tie_word_embeddings) {
      lm_head = register_module("lm_head", ColumnParallelLinear(c.hidden_size, c.vocab_size, false, pc));
    }
  }

  /// Logits [B, T, vocab] (in the compute dtype) of `input_ids` [B, T]; see ForwardArgs. Under
  /// tensor parallelism: this rank's vocabulary slice [B, T, vocab/tp] (ids from vocab_start()).
  at::Tensor forward(const at::Tensor& input_ids, const ForwardArgs& args = {}) {
    return logits(model->forward(input_ids, args));
  }

  /// Final hidden states [B, T, hidden]: feed slices of them to log_probs_and_entropy.
  at::Tensor hidden_states(const at::Tensor& input_ids, const ForwardArgs& args = {}) {
    return model->forward(input_ids, args);
  }

  /// Logits of hidden states (the output projection alone); this rank's vocabulary slice under TP.
  at::Tensor logits(const at::Tensor& hidden) {
    return at::linear(detail::copy_to_tp(hidden, parallel()), output_weight());
  }

  /// Logits of `input_ids` [B, n] at `positions` [B, n], with attention done by `attn_fn` for each
  /// layer (the caller writes k/v into its cache and attends over it: the rollouts' entry point;
  /// with `kv_write` the layers store k/v there themselves, see DecoderImpl::forward_with_attention).
  at::Tensor forward_with_attention(const at::Tensor& input_ids, const at::Tensor& positions, const AttentionFn& attn_fn,
                                    const KvWrite* kv_write = nullptr) {
    return logits(model->forward_with_attention(input_ids, positions, attn_fn, kv_write));
  }

  /// The output matrix [vocab, hidden] (this rank's [vocab/tp, hidden]): lm_head's, or the
  /// embedding's when tied.
  [[nodiscard]] at::Tensor output_weight() const {
    return lm_head ? lm_head->weight : model->embed_tokens->weight;
  }
  /// First vocabulary id of this rank's logits (0 without tensor parallelism).
  [[nodiscard]] int64_t vocab_start() const { return model->embed_tokens->vocab_start(); }
  /// The architecture.
  [[nodiscard]] const ModelConfig& config() const noexcept { return model->config(); }
  /// This rank's tensor-parallel place.
  [[nodiscard]] const ParallelContext& parallel() const noexcept { return model->parallel(); }

  Decoder model{nullptr};
  ColumnParallelLinear lm_head{nullptr};
};
/// Module holder of CausalLMImpl.
TORCH_MODULE(CausalLM);

/// The critic: the same trunk with a scalar head, HF's `...ForTokenClassification` with one label
/// (`score` = Linear(hidden, 1) with bias, replicated under tensor parallelism), as verl's critic.
class ValueModelImpl : public torch::nn::Module {
 public:
  /// A randomly initialised critic for `c` (score: normal(0, initializer_range), bias 0, as HF).
  /// Under a sharded `pc` construction is collective: score is broadcast from tp rank 0.
  explicit ValueModelImpl(const ModelConfig& c, const ParallelContext& pc = {}) {
    model = register_module("model", Decoder(c, pc));
    score = register_module("score", torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, 1).bias(true)));
    c10::NoGradGuard no_grad;
    score->weight.normal_(0.0, c.initializer_range);
    score->bias.zero_();
    if (pc.sharded()) pc.tp->broadcast(score->weight, 0);  // replicated: every rank holds rank 0's draw
  }
  /// Values [B, T] (fp32) of every position; see ForwardArgs.
  at::Tensor forward(const at::Tensor& input_ids, const ForwardArgs& args = {}) {
    return score(model->forward(input_ids, args)).squeeze(-1).to(at::kFloat);
  }
  /// The architecture.
  [[nodiscard]] const ModelConfig& config() const noexcept { return model->config(); }
  /// This rank's tensor-parallel place.
  [[nodiscard]] const ParallelContext& parallel() const noexcept { return model->parallel(); }

  Decoder model{nullptr};
  torch::nn::Linear score{nullptr};
};
/// Module holder of ValueModelImpl.
TORCH_MODULE(ValueModel);

/// A reward model: the same trunk with a scalar head and no bias, HF's
/// `...ForSequenceClassification` with one label (Skywork, OpenRLHF and TRL reward models), frozen
/// in training. The score of a sequence is the head's output at its last token.
class RewardModelImpl : public torch::nn::Module {
 public:
  /// A randomly initialised reward model for `c` (score: normal(0, initializer_range), as HF).
  explicit RewardModelImpl(const ModelConfig& c) {
    model = register_module("model", Decoder(c));
    score = register_module("score", torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, 1).bias(false)));
    c10::NoGradGuard no_grad;
    score->weight.normal_(0.0, c.initializer_range);
  }
  /// The head's output [B, T] (fp32) at every position; see ForwardArgs.
  at::Tensor forward(const at::Tensor& input_ids, const ForwardArgs& args = {}) {
    return score(model->forward(input_ids, args)).squeeze(-1).to(at::kFloat);
  }
  /// One score per row [B] (fp32): the head at the row's last token, the last position where
  /// `attention_mask` [B, T] is 1 (right or left padding alike; HF takes the last non-pad token).
  at::Tensor score_sequences(const at::Tensor& input_ids, const at::Tensor& attention_mask) {
    HYBRIDRL_CHECK(input_ids.dim() == 2 && attention_mask.sizes() == input_ids.sizes(),
                   fmt::format("RewardModel.score_sequences: input_ids [{}] and attention_mask [{}] must be the same [B, T]",
                               fmt::join(input_ids.sizes(), ", "), fmt::join(attention_mask.sizes(), ", ")),
                   "pass the batch's input_ids and its 0/1 attention_mask");
    const auto dev = score->weight.device();
    const auto mask = attention_mask.to(dev).to(at::kLong);
    HYBRIDRL_CHECK(mask.sum(1).gt(0).all().item<bool>(), "RewardModel.score_sequences: a row has no token",
                   "score non-empty sequences");
    // position ids count the tokens (left padding shifts them, as the policy's forward does)
    const auto pos = (mask.cumsum(1) - 1).clamp_min(0);
    const auto per_token = forward(input_ids.to(dev), ForwardArgs{}.attention_mask(mask).position_ids(pos));
    const auto T = mask.size(1);
    const auto last = (at::arange(T, mask.options()).unsqueeze(0) * mask).argmax(1, true);
    return per_token.gather(1, last).squeeze(1);
  }
  /// The architecture.
  [[nodiscard]] const ModelConfig& config() const noexcept { return model->config(); }

  Decoder model{nullptr};
  torch::nn::Linear score{nullptr};
};
/// Module holder of RewardModelImpl.
TORCH_MODULE(RewardModel);

namespace detail {

/// Whether a copy laid out by `to` can be filled from a model laid out by `from`: the same layout,
/// or a shard of a full model.
inline void check_copy_layout(const ParallelContext& from, const ParallelContext& to, std::string_view what) {
  HYBRIDRL_CHECK(from.tp_size == to.tp_size ? from.tp_rank == to.tp_rank : from.tp_size == 1,
                 fmt::format("{}: the policy is tensor-parallel shard {} of {}, the copy asks for shard {} of {}", what,
                             from.tp_rank, from.tp_size, to.tp_rank, to.tp_size),
                 "build the copy with the policy's own ParallelContext, or from a full (tp_size 1) policy");
}

}  // namespace detail

/// A critic whose trunk is a copy of `policy`'s (score freshly initialised): verl's critic init.
/// Laid out by `pc` (default: the policy's own layout): a full policy gives each rank its shard.
inline ValueModel make_value_model(const CausalLM& policy, std::optional<ParallelContext> pc = std::nullopt) {
  const auto layout = pc.value_or(policy->parallel());
  detail::check_copy_layout(policy->parallel(), layout, "make_value_model");
  ValueModel v(policy->config(), layout);
  const auto p = policy->parameters();
  v->to(p.front().device(), p.front().scalar_type());
  detail::copy_parameters(*v->model, *policy->model, layout, !policy->parallel().sharded());
  return v;
}

/// The frozen reference model: a copy of `policy` (same device and dtype) with no grads, in eval
/// mode, sharing no tensor with the policy, with the default layer runner (an engine installs its
/// own: the policy's gathers the policy's shards). Laid out by `pc`
/// (default: the policy's own layout, so a shard copies only its shard; from a full policy each
/// rank copies just its shard, never the full model).
inline CausalLM make_reference(const CausalLM& policy, std::optional<ParallelContext> pc = std::nullopt) {
  const auto layout = pc.value_or(policy->parallel());
  detail::check_copy_layout(policy->parallel(), layout, "make_reference");
  const auto p = policy->parameters();
  CausalLM ref{nullptr};
  {  // built where the policy lives, undrawn: every parameter is copied next
    ParameterInit scope(at::TensorOptions().device(p.front().device()).dtype(p.front().scalar_type()), /*random=*/false);
    ref = CausalLM(policy->config(), layout);
  }
  ref->to(p.front().device(), p.front().scalar_type());
  detail::copy_parameters(*ref, *policy, layout, !policy->parallel().sharded());
  for (auto& q : ref->parameters()) q.requires_grad_(false);
  ref->eval();
  return ref;
}

}  // namespace hybridrl
