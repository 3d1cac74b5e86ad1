#pragma once
/// \file
/// One C++20 concept per policy axis, layered from small documented pieces, plus the cross-axis
/// concept `trainer_config`. Built-in policies assert these right where they are defined; the
/// Trainer re-checks each piece with its own static_assert so the compiler prints a sentence.

#include <concepts>
#include <type_traits>

#include "hybridrl/core/loss.hpp"
#include "hybridrl/core/policy.hpp"
#include "hybridrl/core/tensor_batch.hpp"

namespace hybridrl {

/// Options types are validated once at construction: `void validate() const` throws hybridrl::Error.
template <class O>
concept validatable_options = std::default_initializable<O> && std::copy_constructible<O> &&
                              requires(const O& o) { o.validate(); };

/// Every policy names its tag, its Options type and a human-readable name.
template <class P>
concept named_policy = requires {
  typename P::tag;
  typename P::options_type;
  { P::name } -> std::convertible_to<std::string_view>;
} && validatable_options<typename P::options_type>;

// ---- Algorithm: algorithm/concepts.hpp --------------------------------------------------------
}  // namespace hybridrl
#include "hybridrl/algorithm/concepts.hpp"
namespace hybridrl {

// ---- Sharding ----------------------------------------------------------------------------------

/// A Sharding policy provides `tag`, `options_type`, `name` and `rollout_layout` (WeightLayout):
/// the layout in which it hands updated weights to the Rollout.
template <class P>
concept sharding_policy = named_policy<P> && requires {
  { P::rollout_layout } -> std::convertible_to<WeightLayout>;
};

// ---- Rollout -----------------------------------------------------------------------------------

/// A Rollout policy provides `tag`, `options_type`, `name` and `accepts_tensor_parallel_weights`
/// (bool): whether it can generate from weights split over a tensor-parallel group.
template <class P>
concept rollout_policy = named_policy<P> && requires {
  { P::accepts_tensor_parallel_weights } -> std::convertible_to<bool>;
};

// ---- Loader ------------------------------------------------------------------------------------

/// A Loader policy provides `tag`, `options_type`, `name` and `packs_sequences` (bool): whether
/// its batches are packed rows (position ids restart per sample) rather than padded rows; and the
/// hooks the shared loader object (data/loader.hpp) calls:
/// - `static std::vector<std::vector<int64_t>> plan_epoch(const std::vector<int64_t>& unit_lengths,
///   int64_t sequences_per_unit, const options_type&, int64_t epoch)`: the unit indices of each
///   batch of an epoch, deterministic in its arguments (the seed is in the options);
/// - `static void check_data(int64_t longest_sequence, int64_t sequences_per_unit, DataKind,
///   const options_type&)`: throws hybridrl::Error when the options cannot hold the data;
/// - `template <dataset D> static TensorBatch collate(const D&, std::span<const int64_t> units,
///   const options_type&)` and `make(dataset, options, resume_state)` (templates, so checked
///   where they are used). The options must also have `seed()`, `epochs()`, `batch_size()`,
///   `drop_last()`, `prefetch_factor()` and `pin_memory()`.
template <class P>
concept loader_policy =
    named_policy<P> &&
    requires(const std::vector<int64_t>& lengths, const typename P::options_type& o) {
      { P::packs_sequences } -> std::convertible_to<bool>;
      { P::plan_epoch(lengths, int64_t{1}, o, int64_t{0}) } ->
          std::same_as<std::vector<std::vector<int64_t>>>;
      P::check_data(int64_t{1}, int64_t{1}, DataKind::prompts, o);
      { o.seed() } -> std::convertible_to<uint64_t>;
      { o.epochs() } -> std::convertible_to<int64_t>;
      { o.prefetch_factor() } -> std::convertible_to<int64_t>;
    };

// ---- cross-axis ----------------------------------------------------------------------------------

/// The cross-axis rules of a Trainer, in one concept (R is NoRollout for the offline form):
/// each slot holds its own axis; online algorithms have a Rollout and offline ones none; a Sharding
/// that hands over tensor-parallel weights needs a Rollout that accepts them.
template <class A, class S, class R, class L>
concept trainer_config =
    is_algorithm_v<A> && is_sharding_v<S> && (is_rollout_v<R> || std::same_as<R, NoRollout>) &&
    is_loader_v<L> && algorithm_policy<A> && sharding_policy<S> && loader_policy<L> &&
    (std::same_as<R, NoRollout> || rollout_policy<R>) &&
    (is_online_v<A> == !std::same_as<R, NoRollout>) &&
    (S::rollout_layout != WeightLayout::tensor_parallel || std::same_as<R, NoRollout> ||
     R::accepts_tensor_parallel_weights);

}  // namespace hybridrl
