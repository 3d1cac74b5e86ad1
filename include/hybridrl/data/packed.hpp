#pragma once
/// \file
/// `Loader<Packed>`: packs samples into rows of a fixed token length, position ids restarting at
/// each sample and no attention across samples.

#include <fmt/format.h>

#include <cstdint>

#include "hybridrl/core/concepts.hpp"
#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"

namespace hybridrl {

/// Run-time options of Loader<Packed>.
struct PackedOptions {
  /// Samples per batch before packing (prompts for online algorithms, pairs for DPO).
  HYBRIDRL_ARG(int64_t, batch_size) = 8;
  /// Tokens per packed row.
  HYBRIDRL_ARG(int64_t, row_length) = 4096;
  HYBRIDRL_ARG(bool, shuffle) = true;
  HYBRIDRL_ARG(uint64_t, seed) = 0;
  /// Batches prepared ahead by the background thread.
  HYBRIDRL_ARG(int64_t, prefetch_factor) = 2;

  /// Throws hybridrl::Error for an impossible value.
  void validate() const {
    HYBRIDRL_CHECK(batch_size_ >= 1, fmt::format("loader.batch_size = {} is below 1", batch_size_),
                   "use a positive batch size");
    HYBRIDRL_CHECK(row_length_ >= 1, fmt::format("loader.row_length = {} is below 1", row_length_),
                   "use a row length at least as long as the longest sample");
    HYBRIDRL_CHECK(prefetch_factor_ >= 0,
                   fmt::format("loader.prefetch_factor = {} is negative", prefetch_factor_),
                   "use 0 (no background thread) or a small positive depth such as 2");
  }
};

/// Sequence packing into fixed-length rows.
template <>
struct Loader<Packed> {
  using tag = Packed;
  using options_type = PackedOptions;
  static constexpr std::string_view name = "Packed";
  static constexpr bool packs_sequences = true;
};
static_assert(loader_policy<Loader<Packed>>);

}  // namespace hybridrl
