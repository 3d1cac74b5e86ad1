#pragma once
// A user's own algorithm, written outside the library: RLOO (Ahmadian et al. 2024) — the
// REINFORCE leave-one-out baseline with PPO's clipped update. A tag, an Options struct and one
// specialization of hybridrl::Algorithm deriving from algorithm_base, which supplies every
// optional hook (state, reference use, per-mini-batch preparation, after-step update); the
// library's free functions do the math.
#include <hybridrl/hybridrl.hpp>

#include <string_view>
#include <vector>

/// The tag that names the algorithm in a trainer type: Algorithm<RLOO>.
struct RLOO {};

/// RLOO's run-time numbers: the shared actor-loss settings (clip ranges, aggregation, ...).
struct RLOOOptions {
  HYBRIDRL_ARG(hybridrl::ActorLossOptions, actor) = {};
  HYBRIDRL_FIELDS(actor)
  /// Throws hybridrl::Error for impossible actor settings ("actor.clip_low = ...").
  void validate() const { hybridrl::detail::validate_member(actor_, "actor"); }
};

/// RLOO: online (samples n completions per prompt), no critic, no reference model.
template <>
struct hybridrl::Algorithm<RLOO> : algorithm_base<RLOO, RLOOOptions, DataKind::prompts> {
  static constexpr std::string_view name = "RLOO";

  /// compute_advantages reads scores [B], group_ids [B], response_mask [B, R] ...
  static std::vector<Key> advantage_reads(const options_type&) {
    return {keys::scores, keys::group_ids, keys::response_mask};
  }
  /// ... and writes advantages [B, R].
  static std::vector<Key> advantage_writes(const options_type&) { return {keys::advantages}; }
  /// The loss reads what the shared actor loss reads with these options.
  static std::vector<Key> loss_reads(const options_type& o) { return actor_loss_reads(o.actor()); }

  /// Leave-one-out baseline within each prompt's group of samples.
  static void compute_advantages(TensorBatch& batch, const options_type&, state_type&) {
    batch.set(keys::advantages,
              compute_rloo_advantages(batch.tensor(keys::scores), batch.tensor(keys::group_ids),
                                      batch.tensor(keys::response_mask)));
  }

  /// The shared actor loss (clipped surrogate; entropy and KL terms if enabled).
  static LossOutput loss(const TensorBatch& batch, const options_type& o, const state_type&,
                         const LossCounts& counts) {
    return actor_loss(batch, o.actor(), counts);
  }
};
static_assert(hybridrl::algorithm_policy<hybridrl::Algorithm<RLOO>>);
