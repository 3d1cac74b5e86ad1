#pragma once
/// \file
/// The Loader axis's contract: the `dataset` a loader reads, the `loader_policy` descriptor
/// (traits, the planning and checking hooks, the options the shared loader object reads) and the
/// run-time `batch_loader` its `make(dataset, options, resume_state)` returns.

#include <concepts>
#include <cstdint>
#include <optional>
#include <vector>

#include "hybridrl/core/concepts.hpp"
#include "hybridrl/core/policy.hpp"
#include "hybridrl/core/tensor_batch.hpp"

namespace hybridrl {

struct DataStatistics;  // data/dataset.hpp

/// What a loader needs from a dataset: units with known lengths, a pad id, statistics and a
/// data kind. PromptDataset, PreferenceDataset and LabelledDataset model it.
template <class D>
concept dataset = requires(const D& d, int64_t i) {
  { d.size() } -> std::convertible_to<int64_t>;
  { d.unit_length(i) } -> std::convertible_to<int64_t>;
  { d.longest_sequence() } -> std::convertible_to<int64_t>;
  { d.pad_id() } -> std::convertible_to<int64_t>;
  { d.statistics() } -> std::convertible_to<const DataStatistics&>;
  { D::data_kind } -> std::convertible_to<DataKind>;
  { D::sequences_per_unit } -> std::convertible_to<int64_t>;
};

/// The Loader descriptor's traits: `tag`, `options_type`, `name` and
/// `static constexpr bool packs_sequences` (its batches are packed rows whose position ids restart
/// per sample, rather than padded rows).
template <class P>
concept loader_traits = named_policy<P> && requires {
  { P::packs_sequences } -> std::convertible_to<bool>;
};

/// Hook: `static std::vector<std::vector<int64_t>> plan_epoch(const std::vector<int64_t>&
/// unit_lengths, int64_t sequences_per_unit, const options_type&, int64_t epoch)` — the unit
/// indices of each batch of an epoch, deterministic in its arguments (the seed is in the options).
template <class P>
concept has_plan_epoch_hook =
    requires(const std::vector<int64_t>& lengths, const typename P::options_type& o) {
      { P::plan_epoch(lengths, int64_t{1}, o, int64_t{0}) } -> std::same_as<std::vector<std::vector<int64_t>>>;
    };

/// Hook: `static void check_data(int64_t longest_sequence, int64_t sequences_per_unit, DataKind,
/// const options_type&)` — throws hybridrl::Error when the options cannot hold the data.
template <class P>
concept has_check_data_hook = requires(const typename P::options_type& o) {
  P::check_data(int64_t{1}, int64_t{1}, DataKind::prompts, o);
};

/// The options the shared loader object (data/loader.hpp) reads: `seed()`, `epochs()`,
/// `prefetch_factor()` (and, where used, `batch_size()`, `drop_last()`, `pin_memory()`).
template <class P>
concept has_loader_options = requires(const typename P::options_type& o) {
  { o.seed() } -> std::convertible_to<uint64_t>;
  { o.epochs() } -> std::convertible_to<int64_t>;
  { o.prefetch_factor() } -> std::convertible_to<int64_t>;
};

/// A Loader policy: loader_traits, the plan_epoch and check_data hooks and the loader options.
/// Its `template <dataset D> static TensorBatch collate(const D&, std::span<const int64_t> units,
/// const options_type&)` and `make(dataset, options, resume_state)` are templates over the
/// dataset, so they are checked where they are used; make returns a batch_loader.
template <class P>
concept loader_policy = loader_traits<P> && has_plan_epoch_hook<P> && has_check_data_hook<P> && has_loader_options<P>;

/// The run-time loader: `std::optional<TensorBatch> next()` (std::nullopt after the last epoch) and
/// `state()`, its position, saved with checkpoints so a resumed run sees the same data order.
template <class L>
concept batch_loader = requires(L& l, const L& cl) {
  { l.next() } -> std::same_as<std::optional<TensorBatch>>;
  cl.state();
};

}  // namespace hybridrl
