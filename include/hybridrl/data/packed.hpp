#pragma once
/// \file
/// `Loader<Packed>`: its batches are per-sequence (the same keys and layout as Loader<Bucketed>,
/// without length sorting), and its micro-batches are packed at the forward boundary:
/// `Loader<Packed>::pack(batch, options)` (data/packing.hpp) lays the sequences into rows of
/// row_length tokens, position ids restarting at each sequence and no attention across sequences
/// (cu_seqlens, segment_ids); unpack / unpack_sum bring per-token results back. The same pack()
/// serves offline batches and generated (rollout) batches.

#include <fmt/format.h>

#include <algorithm>
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
#include "hybridrl/data/packing.hpp"
#include "hybridrl/data/planning.hpp"

namespace hybridrl {

/// Run-time options of Loader<Packed>: the common loader options plus the row length.
struct PackedOptions {
  /// Shared loader options (their keys sit at this level: loader.shuffle, loader.epochs...).
  HYBRIDRL_ARG(LoaderCommonOptions, common) = {};
  HYBRIDRL_LOADER_COMMON_ACCESSORS
  /// Tokens per packed row; must be at least the longest sequence.
  HYBRIDRL_ARG(int64_t, row_length) = 4096;

  HYBRIDRL_FIELDS(common, row_length)

  /// Throws hybridrl::Error for an impossible value (problem starts with the field name).
  void validate() const {
    common_.validate();
    HYBRIDRL_CHECK(row_length_ >= 1, fmt::format("row_length = {} is below 1", row_length_),
                   "use a row length at least as long as the longest sample");
  }
};

/// Sequence packing into fixed-length rows. Hooks as Loader<Bucketed>.
template <>
struct Loader<Packed> {
  using tag = Packed;
  using options_type = PackedOptions;
  static constexpr std::string_view name = "Packed";
  static constexpr bool packs_sequences = true;

  /// Unit indices of every batch of `epoch`: the shuffled order cut into batch_size units.
  [[nodiscard]] static std::vector<std::vector<int64_t>> plan_epoch(
      const std::vector<int64_t>& unit_lengths, [[maybe_unused]] int64_t sequences_per_unit,
      const options_type& o, int64_t epoch) {
    BucketPlanOptions p;
    p.batch_size = o.batch_size();
    p.shuffle = o.shuffle();
    p.drop_last = o.drop_last();
    p.window_batches = 1;  // no length sorting beyond a batch: packing absorbs the variation
    auto batches = bucket_batches(unit_lengths, p, detail::epoch_seed(o.seed(), epoch));
    for (auto& b : batches) std::sort(b.begin(), b.end());
    return batches;
  }

  /// Throws when a row cannot hold the longest sequence.
  static void check_data(int64_t longest_sequence, [[maybe_unused]] int64_t sequences_per_unit,
                         DataKind kind, const options_type& o) {
    HYBRIDRL_CHECK(kind == DataKind::prompts || o.row_length() >= longest_sequence,
                   fmt::format("loader.row_length = {} is shorter than the longest sequence of the "
                               "dataset ({} tokens)",
                               o.row_length(), longest_sequence),
                   fmt::format("raise row_length to at least {}, or lower the dataset's max_length "
                               "so longer lines are rejected or skipped",
                               longest_sequence));
  }

  /// A per-sequence batch of `units` (padded to its longest; packing is pack()).
  template <dataset D>
  [[nodiscard]] static TensorBatch collate(const D& d, std::span<const int64_t> units,
                                           const options_type& o) {
    return collate_padded(d, units, o.prompt_padding());
  }

  /// The micro-batch boundary: packs a per-sequence batch (a loader batch, a rollout batch or a
  /// slice of one) into rows of `o.row_length()` tokens.
  [[nodiscard]] static PackedMicroBatch pack(const TensorBatch& per_sequence, const options_type& o) {
    return hybridrl::pack(per_sequence, o.row_length());
  }

  /// The loader over `data`, fresh or resumed from a saved LoaderState.
  template <dataset D>
  [[nodiscard]] static BatchLoader<Loader<Packed>, D> make(
      std::shared_ptr<const D> data, options_type options,
      std::optional<LoaderState> resume = std::nullopt) {
    return BatchLoader<Loader<Packed>, D>(std::move(data), std::move(options), std::move(resume));
  }
  /// The loader over a dataset taken by value.
  template <dataset D>
  [[nodiscard]] static BatchLoader<Loader<Packed>, D> make(
      D data, options_type options, std::optional<LoaderState> resume = std::nullopt) {
    return make(std::shared_ptr<const D>(std::make_shared<D>(std::move(data))), std::move(options),
                std::move(resume));
  }
};
static_assert(loader_policy<Loader<Packed>>,
              "hybridrl: Loader<Packed> must model loader_policy (data/concepts.hpp)");
static_assert(batch_loader<BatchLoader<Loader<Packed>, PromptDataset>>,
              "hybridrl: Loader<Packed>::make must return a batch_loader (data/concepts.hpp)");

}  // namespace hybridrl
