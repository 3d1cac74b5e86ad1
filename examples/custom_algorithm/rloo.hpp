#pragma once
// A user's own algorithm, written outside the library: RLOO (Ahmadian et al. 2024) — the
// REINFORCE leave-one-out baseline with PPO's clipped update. A tag, an Options struct and one
// specialization of hybridrl::Algorithm with its hooks; the library's free functions do the math.
#include <hybridrl/hybridrl.hpp>

#include <string_view>

/// The tag that names the algorithm in a trainer type: Algorithm<RLOO>.
struct RLOO {};

/// RLOO's run-time numbers: the clipped-loss settings (clip ranges, aggregation).
struct RLOOOptions {
  HYBRIDRL_ARG(hybridrl::PolicyLossOptions, policy_loss) = {};
  /// Throws hybridrl::Error for impossible clip settings.
  void validate() const { policy_loss_.validate(); }
};

/// RLOO: online (samples n completions per prompt), no critic, no reference model.
template <>
struct hybridrl::Algorithm<RLOO> {
  using tag = RLOO;
  using options_type = RLOOOptions;
  static constexpr std::string_view name = "RLOO";
  static constexpr DataKind data_kind = DataKind::prompts;
  static constexpr bool needs_critic = false;
  static constexpr bool needs_reference = false;

  /// Reads "scores" [B], "group_ids" [B], "response_mask" [B,T]; writes "advantages" [B,T].
  static void compute_advantages(TensorBatch& batch, const options_type&) {
    batch.set("advantages", compute_rloo_advantages(batch.tensor("scores"), batch.tensor("group_ids"),
                                                    batch.tensor("response_mask")));
  }

  /// Clipped surrogate on "log_probs" vs "old_log_probs", normalised by the global counts.
  static LossOutput loss(const TensorBatch& batch, const options_type& o, const LossCounts& scale) {
    auto r = ppo_policy_loss(batch.tensor("log_probs"), batch.tensor("old_log_probs"),
                             batch.tensor("advantages"), batch.tensor("response_mask"),
                             o.policy_loss(), scale);
    return {r.loss, {{"actor/pg_clipfrac", r.clip_fraction}, {"actor/ppo_kl", r.approx_kl}}};
  }
};
static_assert(hybridrl::algorithm_policy<hybridrl::Algorithm<RLOO>>);
