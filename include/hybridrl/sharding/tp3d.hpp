#pragma once
/// \file
/// `Sharding<TP3D>`: a data × tensor (× pipeline) mesh. Linear layers are column/row parallel, the
/// embedding and the loss vocabulary-parallel. Weights reach the rollout still split along the
/// tensor axis (produces_tensor_parallel_shards = true), so the Rollout must accept them
/// (Rollout<Paged>).

#include <fmt/format.h>

#include <cstdint>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/sharding/concepts.hpp"

namespace hybridrl {

/// Run-time options of Sharding<TP3D>: the training mesh. data × tensor × pipeline must equal
/// world_size (checked when the world size is known); data = -1 means "whatever is left". The
/// tensor-parallel size here is the training one; generation has its own (rollout.
/// tensor_parallel_size) and receives weights in the layout it asks for (WeightSpec).
struct TP3DOptions {
  HYBRIDRL_ARG(int64_t, data_parallel_size) = -1;
  HYBRIDRL_ARG(int64_t, tensor_parallel_size) = 1;
  HYBRIDRL_ARG(int64_t, pipeline_parallel_size) = 1;
  /// Split the sequence dimension of norms/dropouts over the tensor group (Megatron SP).
  HYBRIDRL_ARG(bool, sequence_parallel) = false;

  HYBRIDRL_FIELDS(data_parallel_size, tensor_parallel_size, pipeline_parallel_size,
                  sequence_parallel)

  /// Throws hybridrl::Error for an impossible mesh (problem starts with the field name).
  void validate() const {
    HYBRIDRL_CHECK(data_parallel_size_ == -1 || data_parallel_size_ >= 1,
                   fmt::format("data_parallel_size = {} is invalid", data_parallel_size_),
                   "use -1 (take the ranks the other axes leave) or a positive size");
    HYBRIDRL_CHECK(tensor_parallel_size_ >= 1,
                   fmt::format("tensor_parallel_size = {} is below 1", tensor_parallel_size_),
                   "use 1 (no tensor parallelism) or a divisor of the number of GPUs");
    HYBRIDRL_CHECK(pipeline_parallel_size_ >= 1,
                   fmt::format("pipeline_parallel_size = {} is below 1", pipeline_parallel_size_),
                   "use 1 (no pipeline parallelism) or a divisor of the number of GPUs");
  }

  /// The data-parallel size on `world_size` ranks; throws when the mesh does not tile the world.
  [[nodiscard]] int64_t resolve_data_parallel(int64_t world_size) const {
    const int64_t model = tensor_parallel_size_ * pipeline_parallel_size_;
    HYBRIDRL_CHECK(world_size % model == 0,
                   fmt::format("tensor_parallel_size × pipeline_parallel_size = {} × {} = {} does "
                               "not divide world_size {} ({} % {} = {})",
                               tensor_parallel_size_, pipeline_parallel_size_, model, world_size,
                               world_size, model, world_size % model),
                   "choose tensor and pipeline sizes whose product divides the number of GPUs");
    const int64_t dp = world_size / model;
    HYBRIDRL_CHECK(data_parallel_size_ == -1 || data_parallel_size_ == dp,
                   fmt::format("data_parallel_size × tensor_parallel_size × pipeline_parallel_size "
                               "= {} × {} × {} = {} but world_size is {}",
                               data_parallel_size_, tensor_parallel_size_, pipeline_parallel_size_,
                               data_parallel_size_ * model, world_size),
                   fmt::format("set data_parallel_size to {} or -1", dp));
    return dp;
  }

  /// Throws when the mesh does not tile `world_size` ranks (the Trainer's cross-axis check).
  void check_world(int64_t world_size) const { (void)resolve_data_parallel(world_size); }
};

/// Data × tensor (× pipeline) parallelism. The descriptor of Sharding<TP3D>; its engine comes with the
/// sharding issue.
template <>
struct Sharding<TP3D> {
  using tag = TP3D;
  using options_type = TP3DOptions;
  static constexpr std::string_view name = "TP3D";
  static constexpr bool produces_tensor_parallel_shards = true;
};
static_assert(sharding_policy<Sharding<TP3D>>,
              "hybridrl: Sharding<TP3D> must model sharding_policy (sharding/concepts.hpp)");

}  // namespace hybridrl
