#pragma once
/// \file
/// `Rollout<Paged>`: paged KV cache (fixed-size blocks, per-sequence block tables), a scheduler
/// that admits sequences while blocks are free and preempts when they run out, continuous
/// batching, and prefix sharing so the n samples of one prompt share its prompt blocks.
/// Accepts tensor-parallel weights, so it pairs with Sharding<TP3D>.

#include <fmt/format.h>

#include <cstdint>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/rollout/concepts.hpp"
#include "hybridrl/rollout/sampling.hpp"

namespace hybridrl {

/// Run-time options of Rollout<Paged>.
struct PagedOptions {
  HYBRIDRL_ARG(SamplingOptions, sampling) = {};
  /// Tokens per KV block.
  HYBRIDRL_ARG(int64_t, block_size) = 16;
  /// Fraction of free device memory the KV cache may take after weights are loaded.
  HYBRIDRL_ARG(double, memory_fraction) = 0.5;
  /// Sequences decoded together at most.
  HYBRIDRL_ARG(int64_t, max_num_seqs) = 256;
  /// Tokens (prefill + decode) processed in one scheduler step at most.
  HYBRIDRL_ARG(int64_t, max_num_batched_tokens) = 8192;
  /// Share the prompt blocks among the n samples of one prompt.
  HYBRIDRL_ARG(bool, prefix_sharing) = true;
  /// Tensor-parallel size of the generation engine (the one owner of this knob: the batch
  /// geometry reads it, it is not set there).
  HYBRIDRL_ARG(int64_t, tensor_parallel_size) = 1;
  /// Capture the decode step in CUDA graphs (CUDA only).
  HYBRIDRL_ARG(bool, cuda_graphs) = true;

  HYBRIDRL_FIELDS(sampling, block_size, memory_fraction, max_num_seqs, max_num_batched_tokens,
                  prefix_sharing, tensor_parallel_size, cuda_graphs)

  /// Throws hybridrl::Error for an impossible value (problem starts with the field name).
  void validate() const {
    sampling_.validate();  // inline fields: rollout.temperature, not rollout.sampling.temperature
    HYBRIDRL_CHECK(block_size_ >= 1 && (block_size_ & (block_size_ - 1)) == 0,
                   fmt::format("block_size = {} is not a positive power of two", block_size_),
                   "use 16 (the usual choice) or another power of two");
    HYBRIDRL_CHECK(memory_fraction_ > 0.0 && memory_fraction_ < 1.0,
                   fmt::format("memory_fraction = {} is outside (0, 1)", memory_fraction_),
                   "use a fraction such as 0.5; training state needs the rest");
    HYBRIDRL_CHECK(max_num_seqs_ >= 1, fmt::format("max_num_seqs = {} is below 1", max_num_seqs_),
                   "allow at least one sequence per step, e.g. 256");
    HYBRIDRL_CHECK(max_num_batched_tokens_ >= 1,
                   fmt::format("max_num_batched_tokens = {} is below 1", max_num_batched_tokens_),
                   "allow a positive token budget per scheduler step, e.g. 8192");
    HYBRIDRL_CHECK(tensor_parallel_size_ >= 1,
                   fmt::format("tensor_parallel_size = {} is below 1", tensor_parallel_size_),
                   "use 1 or a tensor-parallel size that divides the number of GPUs");
  }
};

/// Paged KV cache with continuous batching. The descriptor of Rollout<Paged>; its engine comes with
/// the rollout issue.
template <>
struct Rollout<Paged> {
  using tag = Paged;
  using options_type = PagedOptions;
  static constexpr std::string_view name = "Paged";
  static constexpr bool accepts_tensor_parallel_weights = true;
};
static_assert(rollout_policy<Rollout<Paged>>,
              "hybridrl: Rollout<Paged> must model rollout_policy (rollout/concepts.hpp)");

}  // namespace hybridrl
