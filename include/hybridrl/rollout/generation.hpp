#pragma once
/// \file
/// What every rollout engine does around its KV cache: read and check the requests of a prompts
/// batch (before any model work), keep each sequence's stop state, and lay the results out as the
/// rollout keys (rollout/concepts.hpp: rollout_output_keys).

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include "hybridrl/model/config.hpp"
#include "hybridrl/rollout/sampler.hpp"
#include "hybridrl/rollout/sampling.hpp"
#include "hybridrl/sharding/weights.hpp"

namespace hybridrl {

/// Why a sequence stopped (the int64 values of keys::finish_reason).
enum class FinishReason : int64_t {
  length = 0,  ///< max_new_tokens, or the model's context, was reached
  stop = 1,    ///< a stop token (EOS unless ignore_eos, or one of stop_token_ids) was drawn
  aborted = 2  ///< the engine gave up on it
};

/// The name of a finish reason ("length", "stop", "aborted"), as vLLM spells them.
constexpr std::string_view finish_reason_name(FinishReason r) noexcept {
  switch (r) {
    case FinishReason::length: return "length";
    case FinishReason::stop: return "stop";
    case FinishReason::aborted: return "aborted";
  }
  return "aborted";
}

/// One request row of a generate() call.
struct GenerationRequest {
  std::vector<int64_t> prompt;  ///< the real prompt tokens (padding removed)
  int64_t group = 0;            ///< group id (rows of one prompt share it)
  int64_t sample = 0;           ///< index among the rows of its group, in batch order
  uint64_t seed = 0;            ///< the request's seed (sampling_seeds, or request_seed(seed, group))
};

/// A finished (or running) sequence: its response tokens and their log-probs.
struct GeneratedSequence {
  std::vector<int64_t> tokens;
  std::vector<float> log_probs;
  FinishReason reason = FinishReason::length;
  bool done = false;
};

/// The stop rule of one call: stop ids (EOS unless ignore_eos), min / max new tokens, and the
/// model's context length.
struct StopRule {
  std::vector<int64_t> stop_ids;
  int64_t min_new_tokens = 0;
  int64_t max_new_tokens = 1;
  int64_t context = 0;  ///< max_position_embeddings: prompt + response never exceed it

  static StopRule make(const SamplingOptions& s, const ModelConfig& c) {
    StopRule r;
    r.stop_ids = s.stop_token_ids();
    if (!s.ignore_eos()) {  // the model's EOS and generation_config.json's stop ids
      if (c.eos_token_id) r.stop_ids.push_back(*c.eos_token_id);
      r.stop_ids.insert(r.stop_ids.end(), c.eos_token_ids.begin(), c.eos_token_ids.end());
    }
    std::sort(r.stop_ids.begin(), r.stop_ids.end());
    r.stop_ids.erase(std::unique(r.stop_ids.begin(), r.stop_ids.end()), r.stop_ids.end());
    r.min_new_tokens = s.min_new_tokens();
    r.max_new_tokens = s.max_new_tokens();
    r.context = c.max_position_embeddings;
    return r;
  }
  /// Most response tokens a prompt of `prompt_len` tokens may get.
  [[nodiscard]] int64_t budget(int64_t prompt_len) const { return std::min(max_new_tokens, context - prompt_len); }
  /// Appends `token` (drawn with `log_prob`) to `seq` and decides whether it is finished.
  void append(GeneratedSequence& seq, int64_t prompt_len, int64_t token, float log_prob) const {
    seq.tokens.push_back(token);
    seq.log_probs.push_back(log_prob);
    const auto n = static_cast<int64_t>(seq.tokens.size());
    if (n >= min_new_tokens && std::binary_search(stop_ids.begin(), stop_ids.end(), token)) {
      seq.reason = FinishReason::stop;
      seq.done = true;
    } else if (n >= budget(prompt_len)) {
      seq.reason = FinishReason::length;
      seq.done = true;
    }
  }
  /// bool [rows, vocab]: the stop ids, banned for rows with fewer than min_new_tokens tokens
  /// (`generated[i]` tokens so far); undefined when no row is banned anything.
  [[nodiscard]] at::Tensor banned(const std::vector<int64_t>& generated, int64_t vocab, at::Device device) const {
    if (min_new_tokens == 0 || stop_ids.empty()) return {};
    const auto rows = static_cast<int64_t>(generated.size());
    std::vector<uint8_t> row_banned(generated.size());
    bool any = false;
    for (size_t i = 0; i < generated.size(); ++i) {
      row_banned[i] = generated[i] < min_new_tokens ? 1 : 0;
      any = any || row_banned[i];
    }
    if (!any) return {};
    auto col = at::zeros({vocab}, at::kBool);
    for (auto id : stop_ids) {
      if (id < vocab) col[id] = true;  // an id outside the vocabulary can never be drawn anyway
    }
    auto r = at::from_blob(row_banned.data(), {rows, 1}, at::kByte).to(at::kBool);
    return r.logical_and(col.view({1, vocab})).to(device);
  }
};

/// A prompts batch of token lists: input_ids [B, P] left-padded with `pad_id` and attention_mask,
/// as generate() takes it (P = the longest list).
inline TensorBatch left_padded_prompts(const std::vector<std::vector<int64_t>>& rows, int64_t pad_id = 0) {
  int64_t P = 0;
  for (const auto& r : rows) P = std::max<int64_t>(P, static_cast<int64_t>(r.size()));
  const auto B = static_cast<int64_t>(rows.size());
  auto ids = at::full({B, P}, pad_id, at::kLong), mask = at::zeros({B, P}, at::kLong);
  for (int64_t i = 0; i < B; ++i) {
    const auto& r = rows[static_cast<size_t>(i)];
    const auto L = static_cast<int64_t>(r.size());
    if (L == 0) continue;
    ids[i].narrow(0, P - L, L).copy_(at::tensor(r, at::kLong));
    mask[i].narrow(0, P - L, L).fill_(1);
  }
  return TensorBatch({{keys::input_ids.str(), ids}, {keys::attention_mask.str(), mask}});
}

/// Reads and checks the requests of `prompts` for a model with config `c`: `input_ids` [B, P]
/// int64 with optional `attention_mask` (any padding side; the real tokens are the mask's 1s),
/// optional `group_ids` [B] (default: the row index) and `sampling_seeds` [B]. Throws
/// hybridrl::Error before any model work for an empty prompt, a token id outside the vocabulary,
/// a prompt that leaves no room in the model's context, or malformed tensors. `engine` names the
/// caller in messages.
inline std::vector<GenerationRequest> read_requests(const TensorBatch& prompts, const SamplingOptions& s,
                                                    const ModelConfig& c, std::string_view engine) {
  HYBRIDRL_CHECK(prompts.has(keys::input_ids),
                 fmt::format("{}.generate: the prompts batch has no '{}'", engine, keys::input_ids.name),
                 "pass left-padded prompt ids as input_ids [B, P] (the Loader's prompt batch does)");
  auto ids = prompts.tensor(keys::input_ids);
  HYBRIDRL_CHECK(ids.dim() == 2 && !at::isFloatingType(ids.scalar_type()) && ids.scalar_type() != at::kBool,
                 fmt::format("{}.generate: input_ids has shape [{}] and dtype {}", engine, fmt::join(ids.sizes(), ", "),
                             c10::toString(ids.scalar_type())),
                 "pass integer token ids [B, P]");
  ids = ids.to(at::kCPU).to(at::kLong).contiguous();
  const auto B = ids.size(0), P = ids.size(1);
  HYBRIDRL_CHECK(B >= 1, fmt::format("{}.generate: the prompts batch has no rows", engine), "pass at least one prompt");
  at::Tensor mask = prompts.has(keys::attention_mask) ? prompts.tensor(keys::attention_mask).to(at::kCPU).to(at::kLong)
                                                      : at::ones({B, P}, at::kLong);
  HYBRIDRL_CHECK(mask.sizes() == ids.sizes(),
                 fmt::format("{}.generate: attention_mask has shape [{}], input_ids [{}]", engine,
                             fmt::join(mask.sizes(), ", "), fmt::join(ids.sizes(), ", ")),
                 "pass a mask of the same shape as input_ids");
  at::Tensor groups = prompts.has(keys::group_ids) ? prompts.tensor(keys::group_ids).to(at::kCPU).to(at::kLong)
                                                   : at::arange(B, at::kLong);
  HYBRIDRL_CHECK(groups.dim() == 1 && groups.size(0) == B,
                 fmt::format("{}.generate: group_ids has shape [{}] for {} rows", engine, fmt::join(groups.sizes(), ", "), B),
                 "pass one group id per row");
  at::Tensor seeds;
  if (prompts.has(keys::sampling_seeds)) {
    seeds = prompts.tensor(keys::sampling_seeds).to(at::kCPU).to(at::kLong);
    HYBRIDRL_CHECK(seeds.dim() == 1 && seeds.size(0) == B,
                   fmt::format("{}.generate: sampling_seeds has shape [{}] for {} rows", engine,
                               fmt::join(seeds.sizes(), ", "), B),
                   "pass one seed per row");
  }
  const auto* id = ids.data_ptr<int64_t>();
  const auto* m = mask.contiguous().data_ptr<int64_t>();
  const auto* g = groups.contiguous().data_ptr<int64_t>();
  std::map<int64_t, int64_t> seen;  // group -> rows so far
  std::vector<GenerationRequest> out(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) {
    auto& r = out[static_cast<size_t>(i)];
    for (int64_t t = 0; t < P; ++t) {
      if (m[i * P + t] == 0) continue;
      const auto tok = id[i * P + t];
      HYBRIDRL_CHECK(tok >= 0 && tok < c.vocab_size,
                     fmt::format("{}.generate: prompt {} holds token id {} outside the vocabulary [0, {})", engine, i,
                                 tok, c.vocab_size),
                     "tokenize with the model's own tokenizer");
      r.prompt.push_back(tok);
    }
    HYBRIDRL_CHECK(!r.prompt.empty(), fmt::format("{}.generate: prompt {} is empty (its attention_mask is all 0)", engine, i),
                   "drop empty prompts, or give each at least one token (e.g. BOS)");
    const auto len = static_cast<int64_t>(r.prompt.size());
    HYBRIDRL_CHECK(len < c.max_position_embeddings,
                   fmt::format("{}.generate: prompt {} has {} tokens, the model's context is {} "
                               "(max_position_embeddings): no room for a response",
                               engine, i, len, c.max_position_embeddings),
                   "truncate the prompt (the Loader's max_prompt_length) or use a model with a longer context");
    r.group = g[i];
    r.sample = seen[r.group]++;
    r.seed = seeds.defined() ? static_cast<uint64_t>(seeds[i].item<int64_t>()) : request_seed(s.seed(), r.group);
  }
  return out;
}

/// The rollout keys of finished sequences: prompts left-padded to the longest prompt, responses
/// right-padded with `pad_id` to the longest response, response_mask, rollout_log_probs,
/// finish_reason, the full input_ids / attention_mask / position_ids and group_ids. Every other
/// tensor and column of `source` (rewards' ground truth, uid, ...) is carried over by row.
inline TensorBatch rollout_batch(const TensorBatch& source, const std::vector<GenerationRequest>& req,
                                 const std::vector<GeneratedSequence>& seq, int64_t pad_id) {
  const auto B = static_cast<int64_t>(req.size());
  int64_t P = 1, R = 1;
  for (int64_t i = 0; i < B; ++i) {
    P = std::max<int64_t>(P, static_cast<int64_t>(req[static_cast<size_t>(i)].prompt.size()));
    R = std::max<int64_t>(R, static_cast<int64_t>(seq[static_cast<size_t>(i)].tokens.size()));
  }
  auto prompts = at::full({B, P}, pad_id, at::kLong), pmask = at::zeros({B, P}, at::kLong);
  auto responses = at::full({B, R}, pad_id, at::kLong), rmask = at::zeros({B, R}, at::kLong);
  auto lps = at::zeros({B, R}, at::kFloat);
  auto reasons = at::zeros({B}, at::kLong), groups = at::zeros({B}, at::kLong);
  auto* pp = prompts.data_ptr<int64_t>();
  auto* pm = pmask.data_ptr<int64_t>();
  auto* rp = responses.data_ptr<int64_t>();
  auto* rm = rmask.data_ptr<int64_t>();
  auto* lp = lps.data_ptr<float>();
  for (int64_t i = 0; i < B; ++i) {
    const auto& r = req[static_cast<size_t>(i)];
    const auto& s = seq[static_cast<size_t>(i)];
    const auto L = static_cast<int64_t>(r.prompt.size());
    for (int64_t t = 0; t < L; ++t) {
      pp[i * P + P - L + t] = r.prompt[static_cast<size_t>(t)];
      pm[i * P + P - L + t] = 1;
    }
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      rp[i * R + static_cast<int64_t>(t)] = s.tokens[t];
      rm[i * R + static_cast<int64_t>(t)] = 1;
      lp[i * R + static_cast<int64_t>(t)] = s.log_probs[t];
    }
    reasons[i] = static_cast<int64_t>(s.reason);
    groups[i] = r.group;
  }
  auto mask = at::cat({pmask, rmask}, 1);
  TensorBatch out = source;
  for (const auto& k : {keys::input_ids, keys::attention_mask, keys::position_ids, keys::group_ids}) {
    if (out.has(k)) out.erase(k);
  }
  out.set(keys::prompts, prompts)
      .set(keys::responses, responses)
      .set(keys::response_mask, rmask)
      .set(keys::rollout_log_probs, lps)
      .set(keys::finish_reason, reasons)
      .set(keys::input_ids, at::cat({prompts, responses}, 1))
      .set(keys::attention_mask, mask)
      .set(keys::position_ids, (mask.cumsum(1) - 1).clamp_min(0))
      .set(keys::group_ids, groups);
  return out;
}

/// `batch` (a rollout_batch) with its prompts left-padded to `P` and its responses right-padded to
/// `R` tokens (`pad_id`; masks and rollout log-probs 0), input_ids, attention_mask and position_ids
/// rebuilt: what rollout_batch makes of the same rows among longer ones. Rollout batches of
/// several generation ranks padded to their common (P, R) concatenate (all_gather).
inline TensorBatch pad_rollout_batch(const TensorBatch& batch, int64_t P, int64_t R, int64_t pad_id) {
  batch.require({keys::prompts, keys::responses, keys::response_mask, keys::attention_mask}, "pad_rollout_batch");
  const auto prompts = batch.tensor(keys::prompts), responses = batch.tensor(keys::responses);
  const auto p0 = prompts.size(1), r0 = responses.size(1);
  HYBRIDRL_CHECK(P >= p0 && R >= r0,
                 fmt::format("pad_rollout_batch: the batch has prompts of {} and responses of {} tokens, more than "
                             "P = {}, R = {}", p0, r0, P, R),
                 "pad to at least the batch's own lengths (the maximum over the ranks)");
  if (P == p0 && R == r0) return batch;
  auto left = [&](const at::Tensor& t, double v) { return at::constant_pad_nd(t, {P - p0, 0}, v); };
  auto right = [&](const at::Tensor& t, double v) { return at::constant_pad_nd(t, {0, R - r0}, v); };
  const auto pmask = left(batch.tensor(keys::attention_mask).narrow(1, 0, p0), 0);
  const auto rmask = right(batch.tensor(keys::response_mask), 0);
  const auto new_prompts = left(prompts, static_cast<double>(pad_id));
  const auto new_responses = right(responses, static_cast<double>(pad_id));
  const auto mask = at::cat({pmask, rmask}, 1);
  TensorBatch out = batch;
  for (const auto& k : {keys::prompts, keys::responses, keys::response_mask, keys::input_ids, keys::attention_mask,
                        keys::position_ids}) {
    if (out.has(k)) out.erase(k);
  }
  if (out.has(keys::rollout_log_probs)) {
    const auto lp = right(batch.tensor(keys::rollout_log_probs), 0);
    out.erase(keys::rollout_log_probs);
    out.set(keys::rollout_log_probs, lp);
  }
  out.set(keys::prompts, new_prompts)
      .set(keys::responses, new_responses)
      .set(keys::response_mask, rmask)
      .set(keys::input_ids, at::cat({new_prompts, new_responses}, 1))
      .set(keys::attention_mask, mask)
      .set(keys::position_ids, (mask.cumsum(1) - 1).clamp_min(0));
  return out;
}

/// A randomly initialised model for `c` on `device` in `dtype`, without gradients: what an engine
/// made from a config generates with once load_weights has filled it.
inline CausalLM inference_model(const ModelConfig& c, at::Device device, at::ScalarType dtype) {
  CausalLM m(c);
  m->to(device, dtype);
  for (auto& p : m->parameters()) p.requires_grad_(false);
  return m;
}

/// Copies a bucket of named tensors (Hugging Face names, full shapes) into `model`'s parameters in
/// place; `engine` names the caller in errors (an unknown name, a shape that differs).
inline void load_named_weights(CausalLM& model, const WeightBucket& bucket, std::string_view engine) {
  auto params = model->named_parameters();
  c10::NoGradGuard no_grad;
  for (const auto& t : bucket) {
    auto* p = params.find(t.name);
    HYBRIDRL_CHECK(p != nullptr, fmt::format("{}.load_weights: the model has no parameter '{}'", engine, t.name),
                   "export weights from a model of the same config (Hugging Face names)");
    HYBRIDRL_CHECK(p->sizes() == t.tensor.sizes(),
                   fmt::format("{}.load_weights: '{}' has shape [{}], the engine's [{}]", engine, t.name,
                               fmt::join(t.tensor.sizes(), ", "), fmt::join(p->sizes(), ", ")),
                   "export full weights (WeightSpec tp_size 1) of a model of the same config");
    p->copy_(t.tensor);
  }
}

}  // namespace hybridrl
