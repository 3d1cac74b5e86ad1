#pragma once
/// \file
/// `Rollout<Naive>`: a dense padded KV cache; all sequences of a batch advance together. Simple and
/// the reference oracle for Rollout<Paged> (greedy outputs must match). Needs full weights
/// (accepts_tensor_parallel_weights = false), so it does not pair with Sharding<TP3D>.

#include <fmt/format.h>

#include <cstdint>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/rollout/concepts.hpp"
#include "hybridrl/rollout/sampling.hpp"

namespace hybridrl {

/// Run-time options of Rollout<Naive>.
struct NaiveOptions {
  HYBRIDRL_ARG(SamplingOptions, sampling) = {};
  /// Sequences generated together (the dense cache is max_batch_size × (prompt + max_new_tokens)).
  HYBRIDRL_ARG(int64_t, max_batch_size) = 64;
  /// Tensor-parallel size of the generation engine. Rollout<Naive> holds full weights, so only 1
  /// is valid; the key exists so that every rollout spells it the same way (the Trainer reports
  /// a larger value with the fix).
  HYBRIDRL_ARG(int64_t, tensor_parallel_size) = 1;

  HYBRIDRL_FIELDS(sampling, max_batch_size, tensor_parallel_size)

  /// Throws hybridrl::Error for an impossible value (problem starts with the field name).
  void validate() const {
    detail::validate_member(sampling_, "sampling");
    HYBRIDRL_CHECK(max_batch_size_ >= 1,
                   fmt::format("max_batch_size = {} is below 1", max_batch_size_),
                   "use a positive batch size");
    HYBRIDRL_CHECK(tensor_parallel_size_ >= 1,
                   fmt::format("tensor_parallel_size = {} is below 1", tensor_parallel_size_),
                   "use 1: Rollout<Naive> runs one full copy of the model per rank");
  }
};

/// Dense padded KV cache. The descriptor of Rollout<Naive>; its engine comes with the rollout issue.
template <>
struct Rollout<Naive> {
  using tag = Naive;
  using options_type = NaiveOptions;
  static constexpr std::string_view name = "Naive";
  static constexpr bool accepts_tensor_parallel_weights = false;
};
static_assert(rollout_policy<Rollout<Naive>>,
              "hybridrl: Rollout<Naive> must model rollout_policy (rollout/concepts.hpp)");

}  // namespace hybridrl
