#pragma once
/// \file
/// The fit loop's scoring: which model computes which key an algorithm reads, and the helpers that
/// compute them. An algorithm declares the keys its hooks read (`loss_reads`, `prepare_reads`);
/// the trainer produces each from its name, never from the algorithm's identity:
/// - `[<part>_]log_probs_sum` (part: chosen, rejected, kl, or none): the policy's summed log-probs
///   of that part's response tokens (with grad when a loss reads it);
/// - `ref_[<part>_]log_probs_sum`: the same from the frozen reference (no grad);
/// - `log_probs`, `entropy`: the policy's per-token values, aligned as core/keys.hpp says (to
///   `responses` in a rollout batch); `ref_log_probs`: the reference's;
/// - `values`: the critic's (PPO's value loss), aligned as log_probs; `old_values` is the same from
///   the fit loop's values pass, before the step's updates.
/// Any other key must already be in the batch (the loader's `desirable`, the rollout's tensors,
/// `old_log_probs` from the fit loop's old-log-prob pass, `scores`, `advantages`).

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <exception>
#include <span>
#include <type_traits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/data/packing.hpp"
#include "hybridrl/detail/compat.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include "hybridrl/model/log_probs.hpp"
#include "hybridrl/sharding/frozen.hpp"
#include "hybridrl/trainer/rewards.hpp"

namespace hybridrl {

/// Decodes token ids to text (a tokenizer's decode), for rewards that read the response text.
using DecodeFn = std::function<std::string(const std::vector<int64_t>&)>;

/// Who produces a key the algorithm reads.
enum class KeySource {
  batch,      ///< already in the batch (loader, rollout, reward, advantages)
  policy,     ///< the policy's forward
  reference,  ///< the frozen reference's forward
  critic,     ///< the critic's forward
};

/// A key the trainer computes: its source, the part of the batch it scores ("chosen_", "kl_", "")
/// and whether it is a per-sequence sum (else per-token log_probs / entropy).
struct ScoredKey {
  std::string key;
  KeySource source = KeySource::batch;
  std::string prefix;
  bool summed = false;
  std::string field = "log_probs";  ///< the forward's output it is made of (log_probs or entropy)
};

/// How the trainer produces `key` (see the file comment).
inline ScoredKey scored_key(std::string_view key) {
  ScoredKey s{std::string(key)};
  std::string_view k = key;
  bool ref = false;
  if (k.rfind("ref_", 0) == 0) {
    ref = true;
    k.remove_prefix(4);
  }
  constexpr std::string_view sum = "log_probs_sum";
  if (k.size() >= sum.size() && k.substr(k.size() - sum.size()) == sum) {
    const auto part = k.substr(0, k.size() - sum.size());
    if (part.empty() || part == "chosen_" || part == "rejected_" || part == "kl_") {
      s.source = ref ? KeySource::reference : KeySource::policy;
      s.prefix = std::string(part);
      s.summed = true;
    }
    return s;
  }
  if (!ref && k == "values") {
    s.source = KeySource::critic;
    s.field = "values";
    return s;
  }
  if (k == "log_probs" || (!ref && k == "entropy")) {
    s.source = ref ? KeySource::reference : KeySource::policy;
    s.field = std::string(k);
  }
  return s;
}

namespace detail {

/// The tensors of one part of an offline batch under their plain names: "<prefix>input_ids" →
/// "input_ids" (attention_mask, position_ids, response_mask alike); a rollout batch's part ""
/// keeps `responses`, so the forward aligns its results to them.
inline TensorBatch part_of(const TensorBatch& b, const std::string& prefix) {
  std::map<std::string, at::Tensor> t;
  if (prefix.empty() && b.has_tensor("responses")) t.emplace("responses", b.tensor("responses"));
  for (const char* k : {"input_ids", "attention_mask", "position_ids", "response_mask"}) {
    const auto name = prefix + k;
    if (b.has_tensor(name)) t.emplace(k, b.tensor(name));
  }
  HYBRIDRL_CHECK(t.count("input_ids") != 0 && t.count("response_mask") != 0,
                 fmt::format("the batch has no '{}input_ids' and '{}response_mask' to score (it has {})", prefix,
                             prefix, fmt::join(b.tensor_keys(), ", ")),
                 "use the loader of the algorithm's data kind (docs/data.md lists each kind's keys)");
  return TensorBatch(std::move(t));
}

/// Σ over response tokens of `log_probs` [B, T] under `response_mask` [B, T] → [B].
inline at::Tensor masked_sum(const at::Tensor& log_probs, const at::Tensor& response_mask) {
  return (log_probs * response_mask.to(log_probs.device()).to(log_probs.scalar_type())).sum(-1);
}

/// The tensors of the parts (roles) that `keys` score, under their prefixed names.
inline TensorBatch roles_of(const TensorBatch& b, const std::vector<ScoredKey>& keys) {
  std::vector<std::string> names;
  std::set<std::string> prefixes;
  for (const auto& k : keys) prefixes.insert(k.prefix);
  for (const auto& p : prefixes) {
    for (const char* k : {"input_ids", "attention_mask", "position_ids", "response_mask"}) {
      if (b.has_tensor(p + k)) names.push_back(p + k);
    }
  }
  return b.select(names);
}

/// Computes `keys` (all from one model) of micro-batch `micro` → key → tensor. `forward(rows)`
/// runs the model over a batch of rows (input_ids, attention_mask, position_ids, and cu_seqlens
/// when packed) and returns its `log_probs` (and `entropy`) aligned to input_ids. `pack`, when
/// given, packs the micro-batch's parts into rows (Loader<Packed>): one forward for every part
/// (DPO's chosen and rejected together); without it each part is one padded forward.
template <class Forward, class Pack>
std::map<std::string, at::Tensor> score_keys(const TensorBatch& micro, const std::vector<ScoredKey>& keys,
                                             Forward&& forward, const Pack* pack) {
  std::map<std::string, at::Tensor> out;
  if (keys.empty()) return out;
  if constexpr (!std::is_same_v<Pack, std::nullptr_t>) {
    if (pack != nullptr) {
      const auto p = (*pack)(roles_of(micro, keys));
      const auto scored = forward(p.rows);
      for (const auto& k : keys) {
        if (k.summed) {
          const auto& lp = scored.tensor(keys::log_probs);
          out[k.key] = unpack_sum(p, lp * p.rows.tensor(keys::response_mask).to(lp.scalar_type()), k.prefix);
        } else {
          auto x = unpack(p, scored.tensor(k.field), "");
          if (micro.has_tensor("responses")) {  // a rollout batch: aligned to the responses
            const auto R = micro.tensor("responses").size(1);
            x = x.narrow(1, x.size(1) - R, R);
          }
          out[k.key] = x;
        }
      }
      return out;
    }
  }
  std::map<std::string, TensorBatch> by_part;
  for (const auto& k : keys) {
    auto it = by_part.find(k.prefix);
    if (it == by_part.end()) it = by_part.emplace(k.prefix, forward(part_of(micro, k.prefix))).first;
    out[k.key] = k.summed ? masked_sum(it->second.tensor(keys::log_probs), micro.tensor(k.prefix + "response_mask"))
                          : it->second.tensor(k.field);
  }
  return out;
}

/// A forward of the frozen `model` (no grad) in score_keys' form: log_probs of rows (aligned to
/// `responses` when the rows have them, as the engines' forward).
inline auto frozen_forward(const CausalLM& model, LogProbOptions o) {
  o.with_entropy(false);
  return [model, o](const TensorBatch& rows) {
    c10::NoGradGuard g;
    ForwardArgs args;
    if (rows.has_tensor("attention_mask")) args.attention_mask(rows.tensor("attention_mask"));
    if (rows.has_tensor("position_ids")) args.position_ids(rows.tensor("position_ids"));
    if (rows.has_tensor("cu_seqlens")) args.cu_seqlens(rows.tensor("cu_seqlens"));
    const auto dev = model->parameters().front().device();
    auto r = token_log_probs(model, rows.tensor("input_ids").to(dev), args, o);
    auto lp = r.log_probs.to(at::kFloat);
    if (rows.has_tensor("responses") && !rows.has_tensor("cu_seqlens")) {
      const auto R = rows.tensor("responses").size(1);
      lp = lp.narrow(1, lp.size(1) - R, R);
    }
    return TensorBatch({{keys::log_probs.str(), lp}});
  };
}

/// As above, for a reference sharded over the ranks (ShardedFrozen): collective, so every rank
/// scores as many micro-batches. `model` must outlive the returned function.
inline auto frozen_forward(const ShardedFrozen<CausalLM>& model, LogProbOptions o) {
  return [&model, inner = frozen_forward(model.model(), o)](const TensorBatch& rows) {
    return model.run([&](const CausalLM&) { return inner(rows); });
  };
}

/// Scores every row of a rollout batch with `reward` → float32 [B] on the batch's device (NaN or
/// infinite where the reward said so: the caller checks). A row's RewardInput holds its dataset
/// fields (answer, data_source, uid and the line's others), its prompt text (the `prompt` column),
/// its prompt ids (the `prompts` tensor without its left padding), its response ids (up to the
/// response mask's end, EOS included) and their text by `decode` ("" without one).
inline at::Tensor score_rollout(const TensorBatch& batch, const BatchRewardFn& reward, const DecodeFn& decode) {
  const auto B = batch.size();
  const auto resp = batch.tensor(keys::responses).to(at::kCPU).to(at::kLong).contiguous();
  const auto lens = batch.tensor(keys::response_mask).to(at::kCPU).to(at::kLong).sum(1).contiguous();
  std::vector<nlohmann::json> rows(static_cast<size_t>(B), nlohmann::json::object());
  std::vector<std::vector<int64_t>> ids(static_cast<size_t>(B)), prompt_ids(static_cast<size_t>(B));
  if (batch.has_tensor(keys::prompts.str()) && batch.has_tensor(keys::attention_mask.str())) {
    const auto p = batch.tensor(keys::prompts).to(at::kCPU).to(at::kLong).contiguous();
    const auto P = p.size(1);
    const auto pm = batch.tensor(keys::attention_mask).narrow(1, 0, P).to(at::kCPU).to(at::kLong).contiguous();
    for (int64_t b = 0; b < B; ++b) {
      const auto* row = p.data_ptr<int64_t>() + b * P;
      const auto* m = pm.data_ptr<int64_t>() + b * P;
      for (int64_t j = 0; j < P; ++j) {
        if (m[j] != 0) prompt_ids[static_cast<size_t>(b)].push_back(row[j]);
      }
    }
  }
  std::vector<std::string> texts(static_cast<size_t>(B)), prompts(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    auto& row = rows[static_cast<size_t>(b)];
    for (const auto& key : {keys::answer, keys::data_source, keys::uid}) {
      if (batch.has_column(key.str())) row[key.str()] = batch.column(key.str())[static_cast<size_t>(b)];
    }
    if (batch.has_column(keys::extra.str())) {
      const auto& extra = batch.column(keys::extra.str())[static_cast<size_t>(b)];
      if (extra.is_object()) {
        for (const auto& [k, v] : extra.items()) row[k] = v;
      }
    }
    if (batch.has_column(keys::prompt_text.str())) {
      const auto& p = batch.column(keys::prompt_text.str())[static_cast<size_t>(b)];
      if (p.is_string()) prompts[static_cast<size_t>(b)] = p.get<std::string>();
    }
    const auto n = lens[b].item<int64_t>();
    const auto* r = resp.data_ptr<int64_t>() + b * resp.size(1);
    ids[static_cast<size_t>(b)].assign(r, r + n);
    if (decode) texts[static_cast<size_t>(b)] = decode(ids[static_cast<size_t>(b)]);
  }
  std::vector<RewardInput> in(static_cast<size_t>(B));
  for (size_t b = 0; b < in.size(); ++b) in[b] = RewardInput{&rows[b], prompts[b], texts[b], ids[b], prompt_ids[b]};
  const auto scores = reward(in);
  HYBRIDRL_CHECK(static_cast<int64_t>(scores.size()) == B,
                 fmt::format("the reward returned {} scores for {} responses", scores.size(), B),
                 "return one score per input, in order");
  std::vector<float> f(scores.begin(), scores.end());
  return at::tensor(f, at::kFloat).to(batch.tensor(keys::responses).device());
}

/// Throws hybridrl::Error for the first input a reward model of config `c` cannot score (no
/// tokens, more than its max_position_embeddings).
inline void check_reward_inputs(const ModelConfig& c, std::span<const RewardInput> in) {
  const auto max_len = c.max_position_embeddings;
  for (size_t i = 0; i < in.size(); ++i) {
    const auto len = static_cast<int64_t>(in[i].prompt_ids.size() + in[i].response_ids.size());
    HYBRIDRL_CHECK(len > 0, fmt::format("reward model: input {} has neither prompt nor response tokens", i),
                   "pass RewardInputs with prompt_ids and response_ids (Trainer::fit fills both)");
    HYBRIDRL_CHECK(len <= max_len,
                   fmt::format("reward model: input {} has {} tokens, more than its max_position_embeddings {}", i,
                               len, max_len),
                   "shorten rollout.max_new_tokens or the prompts, or use a reward model with a longer context");
  }
}

/// The scores of `in` (checked: check_reward_inputs) from a reward model: right-padded
/// micro-batches of `micro_batch_size` rows, each given to `score(ids, mask)` → [rows].
template <class Score>
std::vector<double> reward_model_scores(std::span<const RewardInput> in, int64_t micro_batch_size, Score&& score) {
  c10::NoGradGuard g;
  std::vector<double> out;
  out.reserve(in.size());
  for (size_t i0 = 0; i0 < in.size(); i0 += static_cast<size_t>(micro_batch_size)) {
    const auto n = std::min(in.size() - i0, static_cast<size_t>(micro_batch_size));
    int64_t L = 0;
    for (size_t i = i0; i < i0 + n; ++i) {
      L = std::max(L, static_cast<int64_t>(in[i].prompt_ids.size() + in[i].response_ids.size()));
    }
    auto ids = at::zeros({static_cast<int64_t>(n), L}, at::kLong), mask = at::zeros_like(ids);
    auto* id = ids.data_ptr<int64_t>();
    auto* mk = mask.data_ptr<int64_t>();
    for (size_t r = 0; r < n; ++r) {
      const auto& x = in[i0 + r];
      int64_t j = 0;
      for (auto t : x.prompt_ids) id[static_cast<int64_t>(r) * L + j++] = t;
      for (auto t : x.response_ids) id[static_cast<int64_t>(r) * L + j++] = t;
      for (int64_t k = 0; k < j; ++k) mk[static_cast<int64_t>(r) * L + k] = 1;
    }
    const at::Tensor s = score(ids, mask).to(at::kCPU).to(at::kDouble).contiguous();
    for (int64_t r = 0; r < s.size(0); ++r) out.push_back(s[r].item<double>());
  }
  return out;
}

}  // namespace detail

/// A batched reward from a frozen reward model (load_reward_model): each input scored as its
/// prompt ids then its response ids — the policy's tokens, so the reward model must share the
/// policy's tokenizer — right-padded into micro-batches of `micro_batch_size` rows, without grad;
/// the score is the head at the last token (HF's sequence classification). What a reward model
/// cannot score (a row with no tokens, a row longer than its max_position_embeddings) is an Error.
inline BatchRewardFn reward_model_reward(RewardModel model, int64_t micro_batch_size = 16) {
  HYBRIDRL_CHECK(micro_batch_size >= 1, fmt::format("reward_model_reward: micro_batch_size = {} is below 1", micro_batch_size),
                 "score at least one row per forward, e.g. 16");
  return [model, micro_batch_size](std::span<const RewardInput> in) mutable {
    detail::check_reward_inputs(model->config(), in);
    return detail::reward_model_scores(in, micro_batch_size,
                                       [&](const at::Tensor& ids, const at::Tensor& mask) {
                                         return model->score_sequences(ids, mask);
                                       });
  };
}

/// As above, from a reward model sharded over the ranks (ShardedFrozen): collective, so every
/// rank must score as many micro-batches — the same number of inputs, as fit()'s equal shares
/// give. An input count that differs between ranks, or an input one rank cannot score, is
/// refused on every rank before any forward, never a hang.
inline BatchRewardFn reward_model_reward(std::shared_ptr<ShardedFrozen<RewardModel>> model, int64_t micro_batch_size = 16,
                                         std::shared_ptr<Communicator> group = nullptr) {
  HYBRIDRL_CHECK(micro_batch_size >= 1, fmt::format("reward_model_reward: micro_batch_size = {} is below 1", micro_batch_size),
                 "score at least one row per forward, e.g. 16");
  HYBRIDRL_CHECK(model != nullptr, "reward_model_reward: no reward model", "pass a ShardedFrozen<RewardModel>");
  return [model, micro_batch_size, group](std::span<const RewardInput> in) {
    std::exception_ptr unscorable;  // this rank's inputs, checked before the ranks compare notes
    try {
      detail::check_reward_inputs(model->model()->config(), in);
    } catch (const Error&) {
      unscorable = std::current_exception();
    }
    if (group && group->size() > 1) {  // the micro-batch counts must match, and every rank go on
      const auto count = static_cast<int64_t>(in.size());
      auto n = at::tensor(std::vector<int64_t>{count, -count, unscorable ? 1 : 0}, at::kLong);
      group->all_reduce(n, ReduceOp::max);
      if (unscorable) std::rethrow_exception(unscorable);
      const auto most = n[0].item<int64_t>(), least = -n[1].item<int64_t>();
      HYBRIDRL_CHECK(n[2].item<int64_t>() == 0, "sharded reward model: another rank's responses cannot be scored",
                     "see that rank's error (a response without tokens, or longer than the reward model's context)");
      HYBRIDRL_CHECK(most == least,
                     fmt::format("sharded reward model: the ranks score between {} and {} responses", least, most),
                     "give every rank of the reward model's group the same number of responses (fit() does: "
                     "data.train_batch_size × rollout.n divisible by the group's ranks)");
    }
    if (unscorable) std::rethrow_exception(unscorable);
    return detail::reward_model_scores(in, micro_batch_size,
                                       [&](const at::Tensor& ids, const at::Tensor& mask) {
                                         return model->run([&](RewardModel m) { return m->score_sequences(ids, mask); });
                                       });
  };
}

namespace detail {

/// Bytes of memory in use: the caching allocator's on CUDA, the process's resident set on the CPU
/// (peak: the largest resident set so far).
struct MemoryUse {
  double allocated_gb = 0, reserved_gb = 0, peak_gb = 0;
};
inline MemoryUse memory_use(const at::Device& device) {
  constexpr double GB = 1024.0 * 1024.0 * 1024.0;
  MemoryUse m;
  if (device.is_cuda()) {
    const auto c = compat::cuda_memory(device.index() < 0 ? 0 : device.index());
    m.allocated_gb = static_cast<double>(c.allocated) / GB;
    m.reserved_gb = static_cast<double>(c.reserved) / GB;
    m.peak_gb = static_cast<double>(c.peak_allocated) / GB;
    return m;
  }
  std::ifstream statm("/proc/self/statm");
  long long pages = 0, resident = 0;
  if (statm >> pages >> resident) {
    m.allocated_gb = m.reserved_gb = static_cast<double>(resident) * 4096.0 / GB;
  }
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) == 0) m.peak_gb = static_cast<double>(ru.ru_maxrss) * 1024.0 / GB;
  return m;
}

}  // namespace detail
}  // namespace hybridrl
