#pragma once
/// \file
/// `Loader<Bucketed>`: groups samples of similar length into padded batches (by count, or capped
/// by a token budget — verl's use_dynamic_bsz), so each batch's longest sample is close to its
/// average. The reference oracle for Loader<Packed>.

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/data/collate.hpp"
#include "hybridrl/data/concepts.hpp"
#include "hybridrl/data/dataset.hpp"
#include "hybridrl/data/loader.hpp"
#include "hybridrl/data/loader_options.hpp"
#include "hybridrl/data/planning.hpp"

namespace hybridrl {

/// Run-time options of Loader<Bucketed>: the common loader options plus the length bucketing.
struct BucketedOptions {
  /// Shared loader options (their keys sit at this level: loader.shuffle, loader.epochs...).
  HYBRIDRL_ARG(LoaderCommonOptions, common) = {};
  HYBRIDRL_LOADER_COMMON_ACCESSORS
  /// Cap on padded tokens per batch (units × sequences per unit × longest); 0 = by count only.
  /// With a cap, batch_size is the most units a batch may hold (offline algorithms only).
  HYBRIDRL_ARG(int64_t, max_tokens_per_batch) = 0;
  /// Batches per sorting window: samples are shuffled, then sorted by length inside windows of
  /// window_batches × batch_size samples. Larger = less padding, less randomness; 0 = whole epoch.
  HYBRIDRL_ARG(int64_t, window_batches) = 256;

  HYBRIDRL_FIELDS(common, max_tokens_per_batch, window_batches)

  /// Throws hybridrl::Error for an impossible value (problem starts with the field name).
  void validate() const {
    common_.validate();
    HYBRIDRL_CHECK(max_tokens_per_batch_ >= 0,
                   fmt::format("max_tokens_per_batch = {} is negative", max_tokens_per_batch_),
                   "use 0 (no token cap) or a positive budget");
    HYBRIDRL_CHECK(window_batches_ >= 0,
                   fmt::format("window_batches = {} is negative", window_batches_),
                   "use 0 (sort the whole epoch) or a positive number of batches such as 256");
  }
};

/// Length-bucketed batches. Hooks: plan_epoch (which units form each batch), check_data (options
/// against the data, before any work), collate (units → TensorBatch) and make (the loader object).
template <>
struct Loader<Bucketed> {
  using tag = Bucketed;
  using options_type = BucketedOptions;
  static constexpr std::string_view name = "Bucketed";
  static constexpr bool packs_sequences = false;

  /// Unit indices of every batch of `epoch`, deterministic in (lengths, options, epoch).
  [[nodiscard]] static std::vector<std::vector<int64_t>> plan_epoch(
      const std::vector<int64_t>& unit_lengths, int64_t sequences_per_unit, const options_type& o,
      int64_t epoch) {
    BucketPlanOptions p;
    p.batch_size = o.batch_size();
    p.max_tokens_per_batch = o.max_tokens_per_batch();
    p.sequences_per_unit = sequences_per_unit;
    p.window_batches = o.window_batches();
    p.shuffle = o.shuffle();
    p.drop_last = o.drop_last();
    return bucket_batches(unit_lengths, p, detail::epoch_seed(o.seed(), epoch));
  }

  /// Throws when the token budget cannot hold the longest unit.
  static void check_data(int64_t longest_sequence, int64_t sequences_per_unit,
                         [[maybe_unused]] DataKind kind, const options_type& o) {
    const int64_t need = longest_sequence * sequences_per_unit;
    HYBRIDRL_CHECK(o.max_tokens_per_batch() == 0 || o.max_tokens_per_batch() >= need,
                   fmt::format("loader.max_tokens_per_batch = {} cannot hold the longest sample: "
                               "{} tokens × {} sequence(s) = {}",
                               o.max_tokens_per_batch(), longest_sequence, sequences_per_unit, need),
                   fmt::format("raise max_tokens_per_batch to at least {}, or lower the dataset's "
                               "max_length",
                               need));
  }

  /// A padded batch of `units`.
  template <dataset D>
  [[nodiscard]] static TensorBatch collate(const D& d, std::span<const int64_t> units,
                                           const options_type& o) {
    return collate_padded(d, units, o.prompt_padding());
  }

  /// The loader over `data`, fresh or resumed from a saved LoaderState.
  template <dataset D>
  [[nodiscard]] static BatchLoader<Loader<Bucketed>, D> make(
      std::shared_ptr<const D> data, options_type options,
      std::optional<LoaderState> resume = std::nullopt) {
    return BatchLoader<Loader<Bucketed>, D>(std::move(data), std::move(options), std::move(resume));
  }
  /// The loader over a dataset taken by value.
  template <dataset D>
  [[nodiscard]] static BatchLoader<Loader<Bucketed>, D> make(
      D data, options_type options, std::optional<LoaderState> resume = std::nullopt) {
    return make(std::shared_ptr<const D>(std::make_shared<D>(std::move(data))), std::move(options),
                std::move(resume));
  }
};
static_assert(loader_policy<Loader<Bucketed>>,
              "hybridrl: Loader<Bucketed> must model loader_policy (data/concepts.hpp)");
static_assert(batch_loader<BatchLoader<Loader<Bucketed>, PromptDataset>>,
              "hybridrl: Loader<Bucketed>::make must return a batch_loader (data/concepts.hpp)");

}  // namespace hybridrl
