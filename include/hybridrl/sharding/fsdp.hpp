#pragma once
/// \file
/// `Sharding<FSDP>`: fully sharded data parallel. Parameters live as flat shards per layer unit,
/// are all-gathered before use and resharded after; gradients are reduce-scattered; optimizer state
/// is sharded. For generation it gathers full weights and exports the shard any WeightSpec asks for
/// (produces_tensor_parallel_shards = false: it can hand over full weights).

#include <c10/core/ScalarType.h>
#include <fmt/format.h>

#include <cstdint>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/sharding/concepts.hpp"

namespace hybridrl {

/// Run-time options of Sharding<FSDP>.
struct FSDPOptions {
  /// Ranks one parameter is sharded over; -1 = all ranks (ZeRO-3), smaller = hybrid sharding.
  HYBRIDRL_ARG(int64_t, shard_group_size) = -1;
  /// dtype of gathered parameters in forward/backward (mixed precision).
  HYBRIDRL_ARG(c10::ScalarType, param_dtype) = c10::ScalarType::BFloat16;
  /// dtype in which gradients are reduce-scattered.
  HYBRIDRL_ARG(c10::ScalarType, reduce_dtype) = c10::ScalarType::Float;
  /// Keep sharded parameters and optimizer state on the CPU between uses.
  HYBRIDRL_ARG(bool, cpu_offload) = false;
  /// Recompute each decoder block in backward instead of storing its activations (the one owner
  /// of this knob; the model applies it through its layer runner).
  HYBRIDRL_ARG(bool, activation_checkpointing) = false;

  HYBRIDRL_FIELDS(shard_group_size, param_dtype, reduce_dtype, cpu_offload,
                  activation_checkpointing)

  /// Throws hybridrl::Error for an impossible value (problem starts with the field name).
  void validate() const {
    HYBRIDRL_CHECK(shard_group_size_ == -1 || shard_group_size_ >= 1,
                   fmt::format("shard_group_size = {} is invalid", shard_group_size_),
                   "use -1 (shard over all ranks) or a positive group size that divides world_size");
    HYBRIDRL_CHECK(c10::isFloatingType(param_dtype_),
                   fmt::format("param_dtype = {} is not a floating-point type",
                               c10::toString(param_dtype_)),
                   "use bfloat16, float16 or float32");
    HYBRIDRL_CHECK(c10::isFloatingType(reduce_dtype_),
                   fmt::format("reduce_dtype = {} is not a floating-point type",
                               c10::toString(reduce_dtype_)),
                   "use float32 (or bfloat16 to halve the gradient traffic)");
  }

  /// Throws when shard_group_size does not tile `world_size` ranks (checked once it is known).
  void check_world(int64_t world_size) const {
    HYBRIDRL_CHECK(shard_group_size_ == -1 || world_size % shard_group_size_ == 0,
                   fmt::format("shard_group_size = {} does not divide world_size {} ({} % {} = {})",
                               shard_group_size_, world_size, world_size, shard_group_size_,
                               world_size % shard_group_size_),
                   "use -1 (shard over all ranks) or a divisor of the number of GPUs");
  }
};

/// Fully sharded data parallel. The descriptor of Sharding<FSDP>; its engine comes with the sharding
/// issue.
template <>
struct Sharding<FSDP> {
  using tag = FSDP;
  using options_type = FSDPOptions;
  static constexpr std::string_view name = "FSDP";
  static constexpr bool produces_tensor_parallel_shards = false;
};
static_assert(sharding_policy<Sharding<FSDP>>,
              "hybridrl: Sharding<FSDP> must model sharding_policy (sharding/concepts.hpp)");

}  // namespace hybridrl
