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
  /// Tensor-parallel size of the generation engine.
  HYBRIDRL_ARG(int64_t, tensor_parallel_size) = 1;
  /// Capture the decode step in CUDA graphs (CUDA only).
  HYBRIDRL_ARG(bool, cuda_graphs) = true;

  /// Throws hybridrl::Error for an impossible value.
  void validate() const {
    sampling_.validate();
    HYBRIDRL_CHECK(block_size_ >= 1 && (block_size_ & (block_size_ - 1)) == 0,
                   fmt::format("paged.block_size = {} is not a positive power of two", block_size_),
                   "use 16 (the usual choice) or another power of two");
    HYBRIDRL_CHECK(memory_fraction_ > 0.0 && memory_fraction_ < 1.0,
                   fmt::format("paged.memory_fraction = {} is outside (0, 1)", memory_fraction_),
                   "use a fraction such as 0.5; training state needs the rest");
    HYBRIDRL_CHECK(max_num_seqs_ >= 1 && max_num_batched_tokens_ >= 1 && tensor_parallel_size_ >= 1,
                   fmt::format("paged: max_num_seqs={}, max_num_batched_tokens={}, "
                               "tensor_parallel_size={} must all be >= 1",
                               max_num_seqs_, max_num_batched_tokens_, tensor_parallel_size_),
                   "use positive limits");
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
