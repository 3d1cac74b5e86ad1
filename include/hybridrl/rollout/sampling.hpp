#pragma once
/// \file
/// Sampling options shared by every Rollout policy.

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"

namespace hybridrl {

/// How tokens are drawn. temperature = 0 means greedy.
struct SamplingOptions {
  HYBRIDRL_ARG(double, temperature) = 1.0;
  /// Keep only the k most likely tokens; 0 = off.
  HYBRIDRL_ARG(int64_t, top_k) = 0;
  /// Keep the smallest set of tokens whose probability reaches p; 1.0 = off.
  HYBRIDRL_ARG(double, top_p) = 1.0;
  /// Longest response, in tokens.
  HYBRIDRL_ARG(int64_t, max_new_tokens) = 256;
  /// Token ids that end a response (the EOS id is added by the tokenizer).
  HYBRIDRL_ARG(std::vector<int64_t>, stop_token_ids) = {};
  /// Base seed; sample i of a batch draws from seed + i, so results do not depend on batching.
  /// Not a configuration key: the trainer derives it from its run seed (derive_seed(seed,
  /// "sampling")).
  HYBRIDRL_ARG(uint64_t, seed) = 0;

  HYBRIDRL_FIELDS(temperature, top_k, top_p, max_new_tokens, stop_token_ids)

  /// Throws hybridrl::Error for an impossible value (problem starts with the field name).
  void validate() const {
    HYBRIDRL_CHECK(std::isfinite(temperature_) && temperature_ >= 0.0,
                   fmt::format("temperature = {} is invalid", temperature_),
                   "use 0 (greedy) or a positive temperature such as 1.0");
    HYBRIDRL_CHECK(top_k_ >= 0, fmt::format("top_k = {} is negative", top_k_),
                   "use 0 to disable top-k, or a positive k");
    HYBRIDRL_CHECK(top_p_ > 0.0 && top_p_ <= 1.0,
                   fmt::format("top_p = {} is outside (0, 1]", top_p_),
                   "use 1.0 to disable nucleus sampling, or a value such as 0.9");
    HYBRIDRL_CHECK(max_new_tokens_ >= 1,
                   fmt::format("max_new_tokens = {} is below 1", max_new_tokens_),
                   "allow at least one response token");
  }
};

}  // namespace hybridrl
