#pragma once
/// \file
/// `Loader<Bucketed>`: groups samples of similar length into batches (by count, or capped by a
/// token budget). The reference oracle for Loader<Packed>.

#include <fmt/format.h>

#include <cstdint>

#include "hybridrl/core/concepts.hpp"
#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"

namespace hybridrl {

/// Run-time options of Loader<Bucketed>.
struct BucketedOptions {
  /// Samples per batch (prompts for online algorithms, pairs for DPO).
  HYBRIDRL_ARG(int64_t, batch_size) = 8;
  /// Cap on padded tokens per batch (batch × longest sample); 0 = batch by count only.
  HYBRIDRL_ARG(int64_t, max_tokens_per_batch) = 0;
  /// Shuffle sample order each epoch (seeded).
  HYBRIDRL_ARG(bool, shuffle) = true;
  HYBRIDRL_ARG(uint64_t, seed) = 0;
  /// Batches prepared ahead by the background thread.
  HYBRIDRL_ARG(int64_t, prefetch_factor) = 2;

  /// Throws hybridrl::Error for an impossible value.
  void validate() const {
    HYBRIDRL_CHECK(batch_size_ >= 1, fmt::format("loader.batch_size = {} is below 1", batch_size_),
                   "use a positive batch size");
    HYBRIDRL_CHECK(max_tokens_per_batch_ >= 0,
                   fmt::format("loader.max_tokens_per_batch = {} is negative", max_tokens_per_batch_),
                   "use 0 (no token cap) or a positive budget");
    HYBRIDRL_CHECK(prefetch_factor_ >= 0,
                   fmt::format("loader.prefetch_factor = {} is negative", prefetch_factor_),
                   "use 0 (no background thread) or a small positive depth such as 2");
  }
};

/// Length-bucketed batches.
template <>
struct Loader<Bucketed> {
  using tag = Bucketed;
  using options_type = BucketedOptions;
  static constexpr std::string_view name = "Bucketed";
  static constexpr bool packs_sequences = false;
};
static_assert(loader_policy<Loader<Bucketed>>);

}  // namespace hybridrl
