#pragma once
/// \file
/// The compile-time rules of a `Trainer<...>`, in two forms:
/// - `trainer_config<A, S, R, L>`: every rule as one concept (R is NoRollout for the offline form),
///   so tests write `static_assert(!trainer_config<...>)`;
/// - `detail::trainer_rules<Policies...>`: one `static_assert` per rule, each a sentence that names
///   what is wrong (the missing trait or hook) and what to write instead. The rules are checked in
///   order and ONLY THE FIRST BROKEN ONE SPEAKS: `detail::first_broken_rule` stops at it, so a
///   later rule is never even evaluated (a broken slot does not cascade into ten messages).
/// A final catch-all asserts `trainer_config` itself, should a rule ever lack its sentence.

#include <concepts>
#include <cstddef>
#include <type_traits>

#include "hybridrl/algorithm/concepts.hpp"
#include "hybridrl/core/concepts.hpp"
#include "hybridrl/core/policy.hpp"
#include "hybridrl/data/concepts.hpp"
#include "hybridrl/rollout/concepts.hpp"
#include "hybridrl/sharding/concepts.hpp"

namespace hybridrl {

/// The cross-axis rules of a Trainer as one concept (R is NoRollout for the offline form): each
/// slot holds its own axis and models its axis's concept; online algorithms have a Rollout and
/// offline ones none; a Sharding that produces tensor-parallel shards needs a Rollout that accepts
/// tensor-parallel weights.
template <class A, class S, class R, class L>
concept trainer_config =
    is_algorithm_v<A> && is_sharding_v<S> && (is_rollout_v<R> || std::same_as<R, NoRollout>) &&
    is_loader_v<L> && algorithm_policy<A> && sharding_policy<S> && loader_policy<L> &&
    (std::same_as<R, NoRollout> || rollout_policy<R>) && (is_online_v<A> == !std::same_as<R, NoRollout>) &&
    (!S::produces_tensor_parallel_shards || std::same_as<R, NoRollout> || R::accepts_tensor_parallel_weights);

namespace detail {

/// The four slots of a Trainer, whichever form (3 or 4 policies) was written.
template <class... Ps>
struct trainer_slots {
  using algorithm = void;
  using sharding = void;
  using rollout = NoRollout;
  using loader = void;
  static constexpr bool offline_form = false;
};
template <class A, class S, class L>
struct trainer_slots<A, S, L> {
  using algorithm = A;
  using sharding = S;
  using rollout = NoRollout;
  using loader = L;
  static constexpr bool offline_form = true;
};
template <class A, class S, class R, class L>
struct trainer_slots<A, S, R, L> {
  using algorithm = A;
  using sharding = S;
  using rollout = R;
  using loader = L;
  static constexpr bool offline_form = false;
};

/// Every rule of a Trainer, in the order they are checked. `ok`: none is broken.
enum class TrainerRule {
  ok,
  // (a) each slot takes its own axis
  policy_count, first_slot, second_slot, offline_last_slot_is_rollout, third_slot, last_slot,
  // an axis template used with a tag it has no specialization for: that template already spoke
  unspecialized_tag,
  // (d) a policy missing a requirement names it
  algorithm_named, algorithm_traits, algorithm_base, algorithm_loss, algorithm_advantages, algorithm_value_loss,
  sharding_named, sharding_traits, sharding_forward, sharding_training, sharding_state, sharding_export,
  rollout_named, rollout_traits, rollout_generate, rollout_weights, rollout_memory, rollout_stats,
  loader_named, loader_traits, loader_plan_epoch, loader_check_data, loader_options,
  // (b) online algorithms need a Rollout, offline ones take none
  online_needs_rollout, offline_takes_no_rollout,
  // (c) tensor-parallel shards need a Rollout that accepts them
  tensor_parallel_weights,
};

/// The first broken rule of an Algorithm policy, or ok.
template <class A>
consteval TrainerRule algorithm_rule() {
  if constexpr (unspecialized<A>) {
    return TrainerRule::unspecialized_tag;
  } else if constexpr (!named_policy<A>) {
    return TrainerRule::algorithm_named;
  } else if constexpr (!algorithm_traits<A>) {
    return TrainerRule::algorithm_traits;
  } else if constexpr (!has_state_hook<A> || !has_step_hooks<A> || !has_key_declarations<A>) {
    return TrainerRule::algorithm_base;
  } else if constexpr (!has_loss_hook<A>) {
    return TrainerRule::algorithm_loss;
  } else if constexpr (is_online_v<A> && !has_advantage_hook<A>) {
    return TrainerRule::algorithm_advantages;
  } else if constexpr (A::needs_critic && !has_value_loss_hook<A>) {
    return TrainerRule::algorithm_value_loss;
  } else {
    return TrainerRule::ok;
  }
}

/// The first broken rule of a Sharding policy (and of its engine_type, when declared), or ok.
template <class S>
consteval TrainerRule sharding_rule() {
  if constexpr (unspecialized<S>) {
    return TrainerRule::unspecialized_tag;
  } else if constexpr (!named_policy<S>) {
    return TrainerRule::sharding_named;
  } else if constexpr (!sharding_traits<S>) {
    return TrainerRule::sharding_traits;
  } else if constexpr (!declares_engine<S>) {
    return TrainerRule::ok;
  } else if constexpr (!scores_batches<typename S::engine_type>) {
    return TrainerRule::sharding_forward;
  } else if constexpr (!trains_with_optimizer<typename S::engine_type>) {
    return TrainerRule::sharding_training;
  } else if constexpr (!has_checkpoint_state<typename S::engine_type>) {
    return TrainerRule::sharding_state;
  } else if constexpr (!exports_weights<typename S::engine_type>) {
    return TrainerRule::sharding_export;
  } else {
    return TrainerRule::ok;
  }
}

/// The first broken rule of a Rollout policy (and of its engine_type, when declared), or ok.
template <class R>
consteval TrainerRule rollout_rule() {
  if constexpr (std::is_same_v<R, NoRollout>) {
    return TrainerRule::ok;
  } else if constexpr (unspecialized<R>) {
    return TrainerRule::unspecialized_tag;
  } else if constexpr (!named_policy<R>) {
    return TrainerRule::rollout_named;
  } else if constexpr (!rollout_traits<R>) {
    return TrainerRule::rollout_traits;
  } else if constexpr (!declares_engine<R>) {
    return TrainerRule::ok;
  } else if constexpr (!generates_batches<typename R::engine_type>) {
    return TrainerRule::rollout_generate;
  } else if constexpr (!loads_weights<typename R::engine_type>) {
    return TrainerRule::rollout_weights;
  } else if constexpr (!releases_memory<typename R::engine_type>) {
    return TrainerRule::rollout_memory;
  } else if constexpr (!reports_rollout_stats<typename R::engine_type>) {
    return TrainerRule::rollout_stats;
  } else {
    return TrainerRule::ok;
  }
}

/// The first broken rule of a Loader policy, or ok.
template <class L>
consteval TrainerRule loader_rule() {
  if constexpr (unspecialized<L>) {
    return TrainerRule::unspecialized_tag;
  } else if constexpr (!named_policy<L>) {
    return TrainerRule::loader_named;
  } else if constexpr (!loader_traits<L>) {
    return TrainerRule::loader_traits;
  } else if constexpr (!has_plan_epoch_hook<L>) {
    return TrainerRule::loader_plan_epoch;
  } else if constexpr (!has_check_data_hook<L>) {
    return TrainerRule::loader_check_data;
  } else if constexpr (!has_loader_options<L>) {
    return TrainerRule::loader_options;
  } else {
    return TrainerRule::ok;
  }
}

/// The first broken cross-axis rule of well-formed policies, or ok.
template <class A, class S, class R>
consteval TrainerRule cross_axis_rule() {
  constexpr bool no_rollout = std::is_same_v<R, NoRollout>;
  if constexpr (is_online_v<A> && no_rollout) {
    return TrainerRule::online_needs_rollout;
  } else if constexpr (!is_online_v<A> && !no_rollout) {
    return TrainerRule::offline_takes_no_rollout;
  } else if constexpr (no_rollout) {
    return TrainerRule::ok;
  } else if constexpr (S::produces_tensor_parallel_shards && !R::accepts_tensor_parallel_weights) {
    return TrainerRule::tensor_parallel_weights;
  } else {
    return TrainerRule::ok;
  }
}

/// The first broken rule of `Trainer<Ps...>`, or ok. Each step runs only when every step before
/// it passed, so nothing about a later slot is instantiated once one rule is broken.
template <class... Ps>
consteval TrainerRule first_broken_rule() {
  using slots = trainer_slots<Ps...>;
  using A = typename slots::algorithm;
  using S = typename slots::sharding;
  using R = typename slots::rollout;
  using L = typename slots::loader;
  if constexpr (sizeof...(Ps) != 3 && sizeof...(Ps) != 4) {
    return TrainerRule::policy_count;
  } else if constexpr (!is_algorithm_v<A>) {
    return TrainerRule::first_slot;
  } else if constexpr (!is_sharding_v<S>) {
    return TrainerRule::second_slot;
  } else if constexpr (slots::offline_form && is_rollout_v<L>) {
    return TrainerRule::offline_last_slot_is_rollout;
  } else if constexpr (!slots::offline_form && !is_rollout_v<R>) {
    return TrainerRule::third_slot;
  } else if constexpr (!is_loader_v<L>) {
    return TrainerRule::last_slot;
  } else if constexpr (algorithm_rule<A>() != TrainerRule::ok) {
    return algorithm_rule<A>();
  } else if constexpr (sharding_rule<S>() != TrainerRule::ok) {
    return sharding_rule<S>();
  } else if constexpr (rollout_rule<R>() != TrainerRule::ok) {
    return rollout_rule<R>();
  } else if constexpr (loader_rule<L>() != TrainerRule::ok) {
    return loader_rule<L>();
  } else {
    return cross_axis_rule<A, S, R>();
  }
}

/// trainer_config of the slots, evaluated only when every sentence-carrying rule passed.
template <bool RulesPassed, class... Ps>
consteval bool catch_all_holds() {
  if constexpr (RulesPassed) {
    using slots = trainer_slots<Ps...>;
    return trainer_config<typename slots::algorithm, typename slots::sharding, typename slots::rollout,
                          typename slots::loader>;
  } else {
    return true;
  }
}

/// One static_assert per rule; instantiated by Trainer<Ps...>. At most one of them fails.
template <class... Ps>
struct trainer_rules {
  static constexpr TrainerRule broken = first_broken_rule<Ps...>();
  static constexpr bool ok = broken == TrainerRule::ok;

  // ---- rule (a): each slot takes its own axis ----
  static_assert(broken != TrainerRule::policy_count,
                "hybridrl: Trainer takes 4 policies for online algorithms, "
                "Trainer<Algorithm<..>, Sharding<..>, Rollout<..>, Loader<..>>, or 3 for offline "
                "ones, Trainer<Algorithm<..>, Sharding<..>, Loader<..>>.");
  static_assert(broken != TrainerRule::first_slot,
                "hybridrl: the first Trainer slot takes an Algorithm<..> (PPO, GRPO, DPO, KTO or "
                "your own tag). Write the policies in the order Algorithm, Sharding, Rollout, "
                "Loader.");
  static_assert(broken != TrainerRule::second_slot,
                "hybridrl: the second Trainer slot takes a Sharding<..> (FSDP or TP3D). Write the "
                "policies in the order Algorithm, Sharding, Rollout, Loader.");
  static_assert(broken != TrainerRule::offline_last_slot_is_rollout,
                "hybridrl: the last Trainer slot takes a Loader<..> (Packed or Bucketed), not a "
                "Rollout. Online algorithms take four policies: "
                "Trainer<Algorithm<..>, Sharding<..>, Rollout<..>, Loader<..>>.");
  static_assert(broken != TrainerRule::third_slot,
                "hybridrl: the third slot of a 4-policy Trainer takes a Rollout<..> (Paged or "
                "Naive). Write the policies in the order Algorithm, Sharding, Rollout, Loader.");
  static_assert(broken != TrainerRule::last_slot,
                "hybridrl: the last Trainer slot takes a Loader<..> (Packed or Bucketed). Write the "
                "policies in the order Algorithm, Sharding, Rollout, Loader.");

  // ---- rule (d): a policy missing a requirement names it ----
  static_assert(broken != TrainerRule::algorithm_named,
                "hybridrl: the Algorithm policy must declare `using tag = YourTag;`, "
                "`using options_type = YourOptions;` (with `void validate() const`) and "
                "`static constexpr std::string_view name`. See docs/extending.md.");
  static_assert(broken != TrainerRule::algorithm_traits,
                "hybridrl: the Algorithm policy must declare `static constexpr DataKind data_kind`, "
                "`static constexpr bool needs_critic` and `static constexpr bool needs_reference`. "
                "See docs/extending.md.");
  static_assert(broken != TrainerRule::algorithm_base,
                "hybridrl: the Algorithm policy lacks the hooks every algorithm has (state_type, "
                "make_state, uses_reference, prepare_mini_batch, after_step and the key "
                "declarations). Derive it from hybridrl::algorithm_base<YourTag, YourOptions, "
                "DataKind::...>, which supplies them all (docs/extending.md).");
  static_assert(broken != TrainerRule::algorithm_loss,
                "hybridrl: the Algorithm policy is missing the hook `static LossOutput loss(const "
                "TensorBatch&, const options_type&, const state_type&, const LossCounts&)`. Add it "
                "to your Algorithm<YourTag> specialization (docs/extending.md).");
  static_assert(broken != TrainerRule::algorithm_advantages,
                "hybridrl: an online Algorithm (data_kind = DataKind::prompts) is missing the hook "
                "`static void compute_advantages(TensorBatch&, const options_type&, state_type&)`. "
                "Add it, or declare a different data_kind for an offline algorithm "
                "(docs/extending.md).");
  static_assert(broken != TrainerRule::algorithm_value_loss,
                "hybridrl: an Algorithm with needs_critic = true is missing the hook `static "
                "LossOutput value_loss(const TensorBatch&, const options_type&, const state_type&, "
                "const LossCounts&)`. Add it, or set needs_critic = false (docs/extending.md).");

  static_assert(broken != TrainerRule::sharding_named,
                "hybridrl: the Sharding policy must declare `using tag = YourTag;`, "
                "`using options_type = YourOptions;` (with `void validate() const`) and "
                "`static constexpr std::string_view name`. See docs/architecture.md (Engines).");
  static_assert(broken != TrainerRule::sharding_traits,
                "hybridrl: the Sharding policy must declare `static constexpr bool "
                "produces_tensor_parallel_shards` (true when the weights it trains stay split over a "
                "tensor-parallel group). See sharding/concepts.hpp.");
  static_assert(broken != TrainerRule::sharding_forward,
                "hybridrl: the Sharding policy's engine_type is missing the hook `TensorBatch "
                "forward(const TensorBatch&)` (per-token log_probs and entropy). Add it to your engine "
                "(sharding/concepts.hpp, sharded_model).");
  static_assert(broken != TrainerRule::sharding_training,
                "hybridrl: the Sharding policy's engine_type is missing the hooks `void backward(const "
                "at::Tensor& loss)` and `at::Tensor step()` (optimizer step, returns the gradient "
                "norm). Add them to your engine (sharding/concepts.hpp, sharded_model).");
  static_assert(broken != TrainerRule::sharding_state,
                "hybridrl: the Sharding policy's engine_type is missing the checkpoint hooks "
                "`StateDict state_dict() const` and `void load_state_dict(const StateDict&)`. Add them "
                "to your engine (sharding/concepts.hpp, sharded_model).");
  static_assert(broken != TrainerRule::sharding_export,
                "hybridrl: the Sharding policy's engine_type is missing the hook `void "
                "export_weights(const WeightSpec&, const WeightSink&) const`, which hands a rollout "
                "engine its weights. Add it to your engine (sharding/concepts.hpp, sharded_model).");

  static_assert(broken != TrainerRule::rollout_named,
                "hybridrl: the Rollout policy must declare `using tag = YourTag;`, "
                "`using options_type = YourOptions;` (with `void validate() const`) and "
                "`static constexpr std::string_view name`. See docs/architecture.md (Engines).");
  static_assert(broken != TrainerRule::rollout_traits,
                "hybridrl: the Rollout policy must declare `static constexpr bool "
                "accepts_tensor_parallel_weights` (whether its engine generates from weights split "
                "over a tensor-parallel group). See rollout/concepts.hpp.");
  static_assert(broken != TrainerRule::rollout_generate,
                "hybridrl: the Rollout policy's engine_type is missing the hook `TensorBatch "
                "generate(const TensorBatch& prompts)` (and `generate(prompts, const "
                "SamplingOptions&)`). Add it to your engine (rollout/concepts.hpp, rollout_engine).");
  static_assert(broken != TrainerRule::rollout_weights,
                "hybridrl: the Rollout policy's engine_type is missing the hooks `WeightSpec "
                "weight_spec() const` and `void load_weights(const WeightBucket&)`. Add them to your "
                "engine (rollout/concepts.hpp, rollout_engine).");
  static_assert(broken != TrainerRule::rollout_memory,
                "hybridrl: the Rollout policy's engine_type is missing the hooks `void "
                "release_memory()` and `void resume_memory()` (free and re-allocate the KV cache). Add "
                "them to your engine (rollout/concepts.hpp, rollout_engine).");
  static_assert(broken != TrainerRule::rollout_stats,
                "hybridrl: the Rollout policy's engine_type is missing the hook `RolloutStats stats() "
                "const`. Add it to your engine (rollout/concepts.hpp, rollout_engine).");

  static_assert(broken != TrainerRule::loader_named,
                "hybridrl: the Loader policy must declare `using tag = YourTag;`, "
                "`using options_type = YourOptions;` (with `void validate() const`) and "
                "`static constexpr std::string_view name`. See docs/data.md.");
  static_assert(broken != TrainerRule::loader_traits,
                "hybridrl: the Loader policy must declare `static constexpr bool packs_sequences`. "
                "See docs/data.md.");
  static_assert(broken != TrainerRule::loader_plan_epoch,
                "hybridrl: the Loader policy is missing the hook `static "
                "std::vector<std::vector<int64_t>> plan_epoch(const std::vector<int64_t>&, int64_t, "
                "const options_type&, int64_t)`. See docs/data.md.");
  static_assert(broken != TrainerRule::loader_check_data,
                "hybridrl: the Loader policy is missing the hook `static void check_data(int64_t, "
                "int64_t, DataKind, const options_type&)`. See docs/data.md.");
  static_assert(broken != TrainerRule::loader_options,
                "hybridrl: the Loader policy's options_type must provide `seed()`, `epochs()` and "
                "`prefetch_factor()` (the loader object reads them). See docs/data.md.");

  // ---- rule (b): online algorithms need a Rollout, offline ones take none ----
  static_assert(broken != TrainerRule::online_needs_rollout,
                "hybridrl: this Algorithm is online (PPO, GRPO: it generates its own samples) and "
                "needs a Rollout. Write Trainer<Algorithm<..>, Sharding<..>, Rollout<Paged>, "
                "Loader<..>> (or Rollout<Naive>).");
  static_assert(broken != TrainerRule::offline_takes_no_rollout,
                "hybridrl: this Algorithm is offline (DPO, KTO: it trains on a fixed dataset) and "
                "takes no Rollout. Remove the Rollout slot: Trainer<Algorithm<..>, Sharding<..>, "
                "Loader<..>>.");

  // ---- rule (c): tensor-parallel weights need a Rollout that accepts them ----
  static_assert(broken != TrainerRule::tensor_parallel_weights,
                "hybridrl: Sharding<TP3D> hands the rollout weights split over the tensor-parallel "
                "group, and this Rollout needs full weights. Use Rollout<Paged> with Sharding<TP3D>, "
                "or use Sharding<FSDP> with Rollout<Naive>.");

  // ---- catch-all: the concept itself, should a rule above ever lack its sentence ----
  static_assert(catch_all_holds<ok, Ps...>(),
                "hybridrl: these policies do not satisfy trainer_config<A, S, R, L> "
                "(trainer/rules.hpp), though no rule with a sentence of its own is broken. Check each "
                "policy against its axis concept.");
};

}  // namespace detail
}  // namespace hybridrl
