#pragma once
/// \file
/// The concepts of the Algorithm axis: what a fit loop calls on an `Algorithm<Tag>`. Every hook is
/// listed; `algorithm_base` (algorithm/base.hpp) supplies the optional ones, so the trainer calls
/// all of them unconditionally and never branches on the algorithm's identity.
///
/// The hooks, in the order of one training step:
/// - `static state_type make_state(const options_type&)`: per-run state (PPO: its KL controller).
/// - `static bool uses_reference(const options_type&)`: whether these options read the reference.
/// - `static void compute_advantages(TensorBatch&, const options_type&, state_type&)` (online):
///   reads rewards/scores (and values), writes "advantages" (and "returns").
/// - `static void prepare_mini_batch(TensorBatch&, const options_type&, state_type&, Communicator*)`:
///   once per mini-batch before the micro-batch loop (KTO's z0, any statistic over the whole
///   mini-batch, reduced over ranks; nullptr = one rank).
/// - `static LossOutput loss(const TensorBatch&, const options_type&, const state_type&,
///   const LossCounts&)`: the actor's (or offline model's) loss on one micro-batch.
/// - `static LossOutput value_loss(...)` (same arguments; algorithms with a critic).
/// - `static void after_step(const TensorBatch&, const options_type&, state_type&, Communicator*)`:
///   once per step after the update (the KL controller's update).
/// - key declarations, each `static std::vector<Key> xxx(const options_type&)`: `advantage_reads`,
///   `advantage_writes`, `prepare_reads`, `loss_reads`, `value_loss_reads`: the keys a hook reads
///   or writes with these options, so the trainer `require()`s them at phase boundaries.

#include <concepts>
#include <string_view>
#include <type_traits>
#include <vector>

#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/loss.hpp"
#include "hybridrl/core/policy.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/distributed/communicator.hpp"

namespace hybridrl {

/// Compile-time traits of an algorithm: `tag`, `options_type` (default-constructible, copyable,
/// with `void validate() const`), `name`, `data_kind` (DataKind), `needs_critic`, `needs_reference`.
template <class P>
concept algorithm_traits =
    requires {
      typename P::tag;
      typename P::options_type;
      { P::name } -> std::convertible_to<std::string_view>;
      { P::data_kind } -> std::convertible_to<DataKind>;
      { P::needs_critic } -> std::convertible_to<bool>;
      { P::needs_reference } -> std::convertible_to<bool>;
    } && std::default_initializable<typename P::options_type> &&
    std::copy_constructible<typename P::options_type> &&
    requires(const typename P::options_type& o) { o.validate(); };

/// True for algorithms that generate their own samples (DataKind::prompts) and so need a Rollout.
template <class P>
inline constexpr bool is_online_v = [] {
  if constexpr (algorithm_traits<P>) {
    return P::data_kind == DataKind::prompts;
  } else {
    return false;
  }
}();

/// Per-run state: `state_type` (movable) and `static state_type make_state(const options_type&)`.
template <class P>
concept has_state_hook = requires(const typename P::options_type& o) {
  typename P::state_type;
  { P::make_state(o) } -> std::same_as<typename P::state_type>;
} && std::movable<typename P::state_type>;

/// Hook: `static LossOutput loss(const TensorBatch&, const options_type&, const state_type&,
/// const LossCounts&)`, the actor's (or offline model's) loss on one micro-batch.
template <class P>
concept has_loss_hook = has_state_hook<P> &&
    requires(const TensorBatch& b, const typename P::options_type& o,
             const typename P::state_type& s, const LossCounts& c) {
      { P::loss(b, o, s, c) } -> std::same_as<LossOutput>;
    };

/// Hook (online algorithms): `static void compute_advantages(TensorBatch&, const options_type&,
/// state_type&)`, which reads rewards/scores (and values) and writes "advantages" (and "returns").
template <class P>
concept has_advantage_hook = has_state_hook<P> &&
    requires(TensorBatch& b, const typename P::options_type& o, typename P::state_type& s) {
      { P::compute_advantages(b, o, s) } -> std::same_as<void>;
    };

/// Hook (algorithms with a critic): `static LossOutput value_loss(const TensorBatch&,
/// const options_type&, const state_type&, const LossCounts&)`.
template <class P>
concept has_value_loss_hook = has_state_hook<P> &&
    requires(const TensorBatch& b, const typename P::options_type& o,
             const typename P::state_type& s, const LossCounts& c) {
      { P::value_loss(b, o, s, c) } -> std::same_as<LossOutput>;
    };

/// Hooks of the step's life cycle (algorithm_base supplies them): `uses_reference(options)`,
/// `prepare_mini_batch(TensorBatch&, options, state&, Communicator*)` and
/// `after_step(const TensorBatch&, options, state&, Communicator*)`.
template <class P>
concept has_step_hooks = has_state_hook<P> &&
    requires(TensorBatch& b, const TensorBatch& cb, const typename P::options_type& o,
             typename P::state_type& s, Communicator* comm) {
      { P::uses_reference(o) } -> std::convertible_to<bool>;
      { P::prepare_mini_batch(b, o, s, comm) } -> std::same_as<void>;
      { P::after_step(cb, o, s, comm) } -> std::same_as<void>;
    };

/// The keys each hook reads or writes with given options (algorithm_base declares none):
/// `advantage_reads`, `advantage_writes`, `prepare_reads`, `loss_reads`, `value_loss_reads`, each
/// `static std::vector<Key> (const options_type&)`.
template <class P>
concept has_key_declarations = requires(const typename P::options_type& o) {
  { P::advantage_reads(o) } -> std::convertible_to<std::vector<Key>>;
  { P::advantage_writes(o) } -> std::convertible_to<std::vector<Key>>;
  { P::prepare_reads(o) } -> std::convertible_to<std::vector<Key>>;
  { P::loss_reads(o) } -> std::convertible_to<std::vector<Key>>;
  { P::value_loss_reads(o) } -> std::convertible_to<std::vector<Key>>;
};

/// An Algorithm policy provides: the traits, `state_type` + `make_state`, the step hooks, the key
/// declarations and the `loss` hook; online ones also `compute_advantages`; with a critic also
/// `value_loss`. Derive from `algorithm_base<Tag, Options, Kind>` to get every optional hook.
template <class P>
concept algorithm_policy = algorithm_traits<P> && has_state_hook<P> && has_step_hooks<P> &&
                           has_key_declarations<P> && has_loss_hook<P> &&
                           (!is_online_v<P> || has_advantage_hook<P>) &&
                           (!P::needs_critic || has_value_loss_hook<P>);

}  // namespace hybridrl
