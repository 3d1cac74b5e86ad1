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

/// How tokens are drawn (rollout/sampler.hpp). temperature = 0 means greedy. Its keys sit directly
/// under the rollout's (`rollout.temperature`, `rollout.top_p`, ...: inline_fields).
struct SamplingOptions {
  static constexpr bool inline_fields = true;

  HYBRIDRL_ARG(double, temperature) = 1.0;
  /// Keep only the k most likely tokens; 0 = off.
  HYBRIDRL_ARG(int64_t, top_k) = 0;
  /// Keep the smallest set of most likely tokens whose probability reaches p; 1.0 = off.
  HYBRIDRL_ARG(double, top_p) = 1.0;
  /// Keep only tokens at least min_p times as likely as the most likely one; 0 = off.
  HYBRIDRL_ARG(double, min_p) = 0.0;
  /// Longest response, in tokens.
  HYBRIDRL_ARG(int64_t, max_new_tokens) = 256;
  /// Shortest response: stop tokens (EOS included) cannot be drawn before this many tokens.
  HYBRIDRL_ARG(int64_t, min_new_tokens) = 0;
  /// Token ids that end a response, besides the model's EOS.
  HYBRIDRL_ARG(std::vector<int64_t>, stop_token_ids) = {};
  /// Do not stop at the model's EOS ids (config.json, generation_config.json); stop_token_ids still stop.
  HYBRIDRL_ARG(bool, ignore_eos) = false;
  /// Base seed. A request's noise is a function of (its seed, its sample index, the position), and
  /// its seed is request_seed(seed, group id) unless the prompts carry `sampling_seeds`: the same
  /// request draws the same tokens whatever else is in the batch. The trainer derives it from its
  /// run seed (derive_seed(seed, "sampling")).
  HYBRIDRL_ARG(uint64_t, seed) = 0;

  HYBRIDRL_FIELDS(temperature, top_k, top_p, min_p, max_new_tokens, min_new_tokens, stop_token_ids, ignore_eos, seed)

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
    HYBRIDRL_CHECK(std::isfinite(min_p_) && min_p_ >= 0.0 && min_p_ < 1.0,
                   fmt::format("min_p = {} is outside [0, 1)", min_p_),
                   "use 0 to disable min-p, or a value such as 0.05");
    HYBRIDRL_CHECK(min_new_tokens_ >= 0 && min_new_tokens_ <= max_new_tokens_,
                   fmt::format("min_new_tokens = {} is outside [0, max_new_tokens = {}]", min_new_tokens_, max_new_tokens_),
                   "use 0, or a minimum no larger than max_new_tokens");
    for (auto id : stop_token_ids_) {
      HYBRIDRL_CHECK(id >= 0, fmt::format("stop_token_ids holds {}, a negative id", id), "list token ids >= 0");
    }
    HYBRIDRL_CHECK(max_new_tokens_ >= 1,
                   fmt::format("max_new_tokens = {} is below 1", max_new_tokens_),
                   "allow at least one response token");
  }
};

}  // namespace hybridrl
