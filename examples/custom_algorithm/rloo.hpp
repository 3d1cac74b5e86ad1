#pragma once
// A user's own algorithm, written outside the library: RLOO (Ahmadian et al. 2024), the REINFORCE
// leave-one-out baseline with PPO's clipped update. A tag, an Options struct and one specialization
// deriving from algorithm_base (which supplies every optional hook); library functions do the math.
#include <hybridrl/hybridrl.hpp>

#include <string_view>
#include <vector>

/// The tag that names the algorithm in a trainer type: Algorithm<RLOO>.
struct RLOO {};

/// RLOO's run-time numbers: the shared actor-loss settings (clip ranges, aggregation, ...).
struct RLOOOptions {
  HYBRIDRL_ARG(hybridrl::ActorLossOptions, actor) = {};
  HYBRIDRL_FIELDS(actor)
  void validate() const { actor_.validate(); }
};

/// RLOO: online (samples n completions per prompt), no critic, no reference model.
template <>
struct hybridrl::Algorithm<RLOO> : algorithm_base<RLOO, RLOOOptions, DataKind::prompts> {
  static constexpr std::string_view name = "RLOO";

  /// The keys each hook reads / writes, checked by the trainer at each phase boundary.
  static std::vector<Key> advantage_reads(const options_type&) {
    return {keys::scores, keys::group_ids, keys::response_mask};
  }
  static std::vector<Key> advantage_writes(const options_type&) { return {keys::advantages}; }
  static std::vector<Key> loss_reads(const options_type& o) { return actor_loss_reads(o.actor()); }

  /// Leave-one-out baseline within each prompt's group of samples.
  static void compute_advantages(TensorBatch& b, const options_type&, state_type&) {
    b.set(keys::advantages, compute_rloo_advantages(b.tensor(keys::scores), b.tensor(keys::group_ids),
                                                    b.tensor(keys::response_mask)));
  }

  /// The shared actor loss (clipped surrogate; entropy and KL terms if enabled), with metrics.
  static LossOutput loss(const TensorBatch& b, const options_type& o, const state_type&,
                         const LossCounts& counts) {
    return actor_loss(b, o.actor(), counts);
  }
};
static_assert(hybridrl::algorithm_policy<hybridrl::Algorithm<RLOO>>);
