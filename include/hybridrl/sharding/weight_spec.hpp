#pragma once
/// \file
/// The layout in which a consumer (a rollout engine) asks a sharded model for its weights: one
/// tensor-parallel shard of every parameter, in a dtype. Replaces the compile-time WeightLayout:
/// FSDP training with generation TP = 2 is the same code path as TP3D at TP = 2.

#include <c10/core/ScalarType.h>
#include <fmt/format.h>

#include <cstdint>
#include <optional>

#include "hybridrl/core/error.hpp"

namespace hybridrl {

/// Which shard of the weights, and in which dtype. tp_size 1 = full weights.
struct WeightSpec {
  int64_t tp_size = 1;  ///< tensor-parallel degree of the consumer
  int64_t tp_rank = 0;  ///< which shard, in [0, tp_size)
  /// dtype of the exported tensors; nullopt keeps each parameter's own dtype.
  std::optional<c10::ScalarType> dtype;

  /// Throws hybridrl::Error for tp_size < 1 or a rank outside [0, tp_size).
  void validate() const {
    HYBRIDRL_CHECK(tp_size >= 1, fmt::format("tp_size = {} must be >= 1", tp_size),
                   "use 1 for full weights, or the rollout's tensor-parallel degree");
    HYBRIDRL_CHECK(tp_rank >= 0 && tp_rank < tp_size,
                   fmt::format("tp_rank = {} must lie in [0, tp_size = {})", tp_rank, tp_size),
                   "pass this rank's index in the rollout's tensor-parallel group");
  }
  friend bool operator==(const WeightSpec&, const WeightSpec&) = default;
};

}  // namespace hybridrl
