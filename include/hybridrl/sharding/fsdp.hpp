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
  /// Recompute each decoder block in backward instead of storing its activations.
  HYBRIDRL_ARG(bool, activation_checkpointing) = false;

  /// Throws hybridrl::Error for an impossible value.
  void validate() const {
    HYBRIDRL_CHECK(shard_group_size_ == -1 || shard_group_size_ >= 1,
                   fmt::format("fsdp.shard_group_size = {} is invalid", shard_group_size_),
                   "use -1 (shard over all ranks) or a positive group size that divides world_size");
    HYBRIDRL_CHECK(c10::isFloatingType(param_dtype_) && c10::isFloatingType(reduce_dtype_),
                   "fsdp.param_dtype and fsdp.reduce_dtype must be floating-point types",
                   "use at::kBFloat16, at::kHalf or at::kFloat");
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
