#pragma once
/// \file
/// LoaderCommonOptions: the options every Loader policy shares (Bucketed and Packed hold one by
/// composition; its fields appear at the `loader.` level of the configuration). Two of its values
/// are not configuration keys, because another part owns them: `batch_size` is set by the trainer
/// from `data.train_batch_size`, and `seed` is derived from the run's one seed
/// (`derive_seed(seed, "loader")`). A loader used on its own sets both directly.

#include <fmt/format.h>

#include <cstdint>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/data/collate.hpp"

namespace hybridrl {

/// Options every Loader policy shares; the fields BatchLoader reads.
struct LoaderCommonOptions {
  /// Lends its fields to the parent's level: `loader.shuffle`, not `loader.common.shuffle`.
  static constexpr bool inline_fields = true;

  /// Units per batch (prompts for online algorithms, pairs for DPO). Not a configuration key: the
  /// trainer sets it from data.train_batch_size.
  HYBRIDRL_ARG(int64_t, batch_size) = 8;
  /// Shuffle seed, per epoch mixed with the epoch. Not a configuration key: the trainer derives it
  /// from its run seed.
  HYBRIDRL_ARG(uint64_t, seed) = 0;
  /// Shuffle sample order (and batch order) each epoch.
  HYBRIDRL_ARG(bool, shuffle) = true;
  /// Drop the final short batch of an epoch (verl's train loader does).
  HYBRIDRL_ARG(bool, drop_last) = false;
  /// Epochs before next() returns std::nullopt; 0 = endless.
  HYBRIDRL_ARG(int64_t, epochs) = 1;
  /// Batches prepared ahead by the background thread; 0 = build on the caller's thread.
  HYBRIDRL_ARG(int64_t, prefetch_factor) = 2;
  /// Page-lock batch tensors for fast host-to-GPU copies (only when CUDA is available).
  HYBRIDRL_ARG(bool, pin_memory) = true;
  /// Padding side of prompt batches (left, so generation appends on the right, as verl does).
  HYBRIDRL_ARG(PaddingSide, prompt_padding) = PaddingSide::left;

  HYBRIDRL_FIELDS(shuffle, drop_last, epochs, prefetch_factor, pin_memory, prompt_padding)

  /// Throws hybridrl::Error for an impossible value (problem starts with the field name).
  void validate() const {
    HYBRIDRL_CHECK(batch_size_ >= 1, fmt::format("batch_size = {} is below 1", batch_size_),
                   "use a positive batch size (the trainer sets it to data.train_batch_size)");
    HYBRIDRL_CHECK(epochs_ >= 0, fmt::format("epochs = {} is negative", epochs_),
                   "use 0 (endless) or a positive number of epochs");
    HYBRIDRL_CHECK(prefetch_factor_ >= 0,
                   fmt::format("prefetch_factor = {} is negative", prefetch_factor_),
                   "use 0 (no background thread) or a small positive depth such as 2");
  }
};

}  // namespace hybridrl

/// Inside a loader Options struct with a `LoaderCommonOptions common_` member: the getters and
/// chainable setters of every common field, so `BucketedOptions{}.batch_size(8).seed(1)` works.
#define HYBRIDRL_LOADER_COMMON_ACCESSORS                        \
  HYBRIDRL_FORWARD_ARG(int64_t, common, batch_size)             \
  HYBRIDRL_FORWARD_ARG(uint64_t, common, seed)                  \
  HYBRIDRL_FORWARD_ARG(bool, common, shuffle)                   \
  HYBRIDRL_FORWARD_ARG(bool, common, drop_last)                 \
  HYBRIDRL_FORWARD_ARG(int64_t, common, epochs)                 \
  HYBRIDRL_FORWARD_ARG(int64_t, common, prefetch_factor)        \
  HYBRIDRL_FORWARD_ARG(bool, common, pin_memory)                \
  HYBRIDRL_FORWARD_ARG(PaddingSide, common, prompt_padding)
