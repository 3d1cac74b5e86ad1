#pragma once
/// \file
/// GRPO (Shao et al. 2024, DeepSeekMath) as verl runs it: no critic, group-normalised outcome
/// advantages (verl `compute_grpo_outcome_advantage`), the PPO clipped surrogate, and a KL loss
/// against the reference (on by default, low_var_kl). The Dr.GRPO switch (Liu et al. 2025) drops
/// the std normalisation and aggregates with seq-mean-token-sum-norm — `Algorithm<GRPO>`.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "hybridrl/algorithm/advantages.hpp"
#include "hybridrl/algorithm/actor_loss.hpp"
#include "hybridrl/algorithm/base.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/tensor_batch.hpp"

namespace hybridrl {

/// Run-time options of Algorithm<GRPO> (verl GRPO example defaults). The passes over each batch
/// (ppo_epochs) are a loop count of the fit loop: BatchGeometry owns them.
struct GRPOOptions {
  /// The actor loss; GRPO's KL term against the reference is on by default (k3, coef 0.001).
  HYBRIDRL_ARG(ActorLossOptions, actor) = ActorLossOptions{}.use_kl_loss(true);
  /// Divide the group-centred score by the group std (false: Dr.GRPO).
  HYBRIDRL_ARG(bool, norm_adv_by_std) = true;
  /// ε added to the group std: A = (s − mean) / (std + ε); an all-equal group gets A = 0.
  HYBRIDRL_ARG(double, epsilon) = 1e-6;
  HYBRIDRL_FIELDS(actor, norm_adv_by_std, epsilon)

  /// The Dr.GRPO switch: on = no std normalisation and seq-mean-token-sum-norm aggregation;
  /// off = GRPO's std normalisation and token-mean.
  GRPOOptions& dr_grpo(bool on) {
    norm_adv_by_std_ = !on;
    actor_.loss_agg(on ? LossAgg::seq_mean_token_sum_norm : LossAgg::token_mean);
    return *this;
  }
  /// True when both Dr.GRPO settings are in effect.
  [[nodiscard]] bool dr_grpo() const noexcept {
    return !norm_adv_by_std_ && actor_.loss_agg() == LossAgg::seq_mean_token_sum_norm;
  }

  /// Throws hybridrl::Error naming the first impossible field (the actor fields sit at this level: "clip_low = ...").
  void validate() const {
    actor_.validate();  // inline fields: no "actor." in the path
    detail::check_finite_option("epsilon", epsilon_);
    HYBRIDRL_CHECK(epsilon_ > 0 || (!norm_adv_by_std_ && epsilon_ == 0),
                   fmt::format("epsilon = {} must be > 0 when norm_adv_by_std is on", epsilon_),
                   "use a small positive epsilon such as 1e-6 (a group whose samples all score "
                   "the same has std 0, and 0 / 0 is NaN)");
  }
};

/// GRPO: group-normalised outcome advantages, PPO's clipped surrogate and a KL loss. The keys of
/// each hook: advantage_reads / advantage_writes / loss_reads.
template <>
struct Algorithm<GRPO> : algorithm_base<GRPO, GRPOOptions, DataKind::prompts> {
  static constexpr std::string_view name = "GRPO";
  /// A reference model exists; uses_reference() says if these options read it.
  static constexpr bool needs_reference = true;

  /// Whether `o` reads reference log-probs (the KL loss).
  static bool uses_reference(const options_type& o) { return o.actor().use_kl_loss(); }

  /// scores, group_ids, response_mask.
  static std::vector<Key> advantage_reads(const options_type& /*o*/) {
    return {keys::scores, keys::group_ids, keys::response_mask};
  }
  /// advantages, returns (equal, as in verl).
  static std::vector<Key> advantage_writes(const options_type& /*o*/) {
    return {keys::advantages, keys::returns};
  }
  /// actor_loss_reads(o.actor()).
  static std::vector<Key> loss_reads(const options_type& o) { return actor_loss_reads(o.actor()); }

  /// Group-normalised outcome advantages of the sequence scores, broadcast over response tokens.
  static void compute_advantages(TensorBatch& batch, const options_type& o, state_type& /*s*/) {
    auto adv = compute_grpo_advantages(batch.tensor(keys::scores), batch.tensor(keys::group_ids),
                                       batch.tensor(keys::response_mask), o.epsilon(),
                                       o.norm_adv_by_std());
    batch.set(keys::advantages, adv);
    batch.set(keys::returns, adv);
  }

  /// Actor loss on one micro-batch (clipped surrogate + KL loss + entropy bonus).
  static LossOutput loss(const TensorBatch& batch, const options_type& o, const state_type& /*s*/,
                         const LossCounts& counts) {
    return actor_loss(batch, o.actor(), counts);
  }
};
static_assert(algorithm_policy<Algorithm<GRPO>>);

}  // namespace hybridrl
