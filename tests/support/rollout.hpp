#pragma once
// Test support for the rollout suite: the fixture models' directory, prompt batches, greedy
// decoding by full recompute (the oracle of both engines) and a row's response tokens.
#include <hybridrl/model/causal_lm.hpp>
#include <hybridrl/model/log_probs.hpp>
#include <hybridrl/rollout/generation.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hybridrl::testing {
inline const std::string kRolloutModels = std::string(HYBRIDRL_FIXTURES_DIR) + "/models";

// A small Llama in the CUDA kernels' shapes (head_dim 64, 2 query heads per KV head: the decode
// kernel covers it, so a CUDA generation replays graphs; FlashAttention-2 takes it too).
inline ModelConfig kernel_shaped_config() {
  ModelConfig c;
  c.vocab_size = 320;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 256;
  c.eos_token_id = 2;
  return c;
}

// Left-padded prompts of the given token lists.
inline TensorBatch prompt_batch(const std::vector<std::vector<int64_t>>& rows) { return left_padded_prompts(rows); }

// Greedy continuation by full recompute: each step runs the whole sequence through forward() and
// takes the argmax of the last position (no cache, no padding).
inline std::vector<int64_t> greedy_by_recompute(CausalLM m, std::vector<int64_t> seq, int64_t n, int64_t eos = -1) {
  c10::NoGradGuard g;
  std::vector<int64_t> out;
  for (int64_t t = 0; t < n; ++t) {
    auto logits = m->forward(at::tensor(seq, at::kLong).view({1, -1}));
    const auto next = logits[0][-1].argmax().item<int64_t>();
    out.push_back(next);
    seq.push_back(next);
    if (next == eos) break;
  }
  return out;
}

inline std::vector<int64_t> row_tokens(const TensorBatch& out, int64_t row) {
  auto r = out.tensor(keys::responses)[row];
  auto m = out.tensor(keys::response_mask)[row];
  std::vector<int64_t> v;
  for (int64_t t = 0; t < r.size(0); ++t) {
    if (m[t].item<int64_t>() == 1) v.push_back(r[t].item<int64_t>());
  }
  return v;
}
// The largest gap between a rollout's returned log-probs and the model's own log-probs of the
// drawn tokens (token_log_probs at the sampling temperature, T = 1 for greedy).
inline double max_rollout_log_prob_error(CausalLM m, const TensorBatch& out, double T) {
  c10::NoGradGuard g;
  auto lp = token_log_probs(m, out.tensor(keys::input_ids),
                            ForwardArgs{}.attention_mask(out.tensor(keys::attention_mask))
                                .position_ids(out.tensor(keys::position_ids)),
                            LogProbOptions{}.temperature(T == 0.0 ? 1.0 : T))
                .log_probs;
  const auto P = out.tensor(keys::prompts).size(1);
  auto resp_lp = lp.narrow(1, P, lp.size(1) - P);
  auto mask = out.tensor(keys::response_mask).to(at::kBool);
  return (resp_lp - out.tensor(keys::rollout_log_probs)).abs().masked_select(mask).max().item<double>();
}
}  // namespace hybridrl::testing
