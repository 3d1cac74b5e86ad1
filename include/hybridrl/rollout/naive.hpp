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

  /// Throws hybridrl::Error for an impossible value.
  void validate() const {
    sampling_.validate();
    HYBRIDRL_CHECK(max_batch_size_ >= 1,
                   fmt::format("naive.max_batch_size = {} is below 1", max_batch_size_),
                   "use a positive batch size");
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
