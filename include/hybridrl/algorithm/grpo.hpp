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
#include <utility>

#include "hybridrl/algorithm/advantages.hpp"
#include "hybridrl/algorithm/aggregate.hpp"
#include "hybridrl/algorithm/kl.hpp"
#include "hybridrl/algorithm/ppo.hpp"
#include "hybridrl/core/concepts.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/tensor_batch.hpp"

namespace hybridrl {

/// Run-time options of Algorithm<GRPO> (verl GRPO example defaults).
struct GRPOOptions {
  /// ε_low of the clipped surrogate.
  HYBRIDRL_ARG(double, clip_low) = 0.2;
  /// ε_high of the clipped surrogate.
  HYBRIDRL_ARG(double, clip_high) = 0.2;
  /// Dual-clip bound c > 1.
  HYBRIDRL_ARG(double, clip_c) = 3.0;
  /// How token losses become a scalar.
  HYBRIDRL_ARG(LossAgg, loss_agg) = LossAgg::token_mean;
  /// L of seq_mean_token_sum_norm (0 = padded response length).
  HYBRIDRL_ARG(int64_t, norm_length) = 0;
  /// Divide the group-centred score by the group std (false: Dr.GRPO).
  HYBRIDRL_ARG(bool, norm_adv_by_std) = true;
  /// ε added to the group std.
  HYBRIDRL_ARG(double, epsilon) = 1e-6;
  /// Entropy bonus coefficient (needs the "entropy" column when non-zero).
  HYBRIDRL_ARG(double, entropy_coeff) = 0.0;
  /// Passes over each batch of rollouts.
  HYBRIDRL_ARG(int64_t, ppo_epochs) = 1;
  /// Add coef · KL(π‖π_ref) to the loss (GRPO's KL term; needs "ref_log_probs").
  HYBRIDRL_ARG(bool, use_kl_loss) = true;
  /// Coefficient of the KL loss.
  HYBRIDRL_ARG(double, kl_loss_coef) = 0.001;
  /// Estimator of the KL loss (low_var_kl = k3).
  HYBRIDRL_ARG(KlEstimator, kl_loss_type) = KlEstimator::k3;

  /// The Dr.GRPO switch: on = no std normalisation and seq-mean-token-sum-norm aggregation;
  /// off = GRPO's std normalisation and token-mean.
  GRPOOptions& dr_grpo(bool on) {
    norm_adv_by_std_ = !on;
    loss_agg_ = on ? LossAgg::seq_mean_token_sum_norm : LossAgg::token_mean;
    return *this;
  }
  /// True when both Dr.GRPO settings are in effect.
  [[nodiscard]] bool dr_grpo() const noexcept {
    return !norm_adv_by_std_ && loss_agg_ == LossAgg::seq_mean_token_sum_norm;
  }

  /// The clip / aggregation part as PolicyLossOptions.
  [[nodiscard]] PolicyLossOptions policy_loss_options() const {
    return PolicyLossOptions{}.clip_low(clip_low_).clip_high(clip_high_).clip_c(clip_c_)
        .loss_agg(loss_agg_).norm_length(norm_length_);
  }

  /// Throws hybridrl::Error naming the first impossible field.
  void validate() const {
    policy_loss_options().validate();
    for (auto [name, v] : {std::pair{"epsilon", epsilon_}, std::pair{"entropy_coeff", entropy_coeff_},
                           std::pair{"kl_loss_coef", kl_loss_coef_}}) {
      detail::check_finite_option(name, v);
    }
    HYBRIDRL_CHECK(epsilon_ >= 0, fmt::format("epsilon = {} is negative", epsilon_),
                   "use a small non-negative epsilon such as 1e-6");
    HYBRIDRL_CHECK(kl_loss_coef_ >= 0, fmt::format("kl_loss_coef = {} is negative", kl_loss_coef_),
                   "use a KL loss coefficient >= 0 (or use_kl_loss(false))");
    HYBRIDRL_CHECK(ppo_epochs_ >= 1, fmt::format("ppo_epochs = {} must be >= 1", ppo_epochs_),
                   "use at least one pass over each batch");
  }
};

/// GRPO. compute_advantages reads "scores" [B] (or, without it, Σ_t "token_level_rewards"),
/// "group_ids" [B] int64 and "response_mask", and writes "advantages" and "returns" (equal, as in
/// verl). loss reads "log_probs", "old_log_probs", "advantages", "response_mask", plus
/// "ref_log_probs" (use_kl_loss) and "entropy" (entropy_coeff ≠ 0).
template <>
struct Algorithm<GRPO> {
  using tag = GRPO;
  using options_type = GRPOOptions;
  static constexpr std::string_view name = "GRPO";
  static constexpr DataKind data_kind = DataKind::prompts;
  static constexpr bool needs_critic = false;
  static constexpr bool needs_reference = true;

  /// Whether `o` reads reference log-probs.
  static bool uses_reference(const options_type& o) { return o.use_kl_loss(); }

  /// Group-normalised outcome advantages; see the struct comment for the columns.
  static void compute_advantages(TensorBatch& batch, const options_type& o) {
    const auto& mask = batch.tensor("response_mask");
    auto scores = batch.has_tensor("scores") ? batch.tensor("scores")
                                             : batch.tensor("token_level_rewards").sum(-1);
    auto adv = compute_grpo_advantages(scores, batch.tensor("group_ids"), mask, o.epsilon(),
                                       o.norm_adv_by_std());
    batch.set("advantages", adv);
    batch.set("returns", adv);
  }

  /// Actor loss on one micro-batch (clipped surrogate + KL loss + entropy bonus).
  static LossOutput loss(const TensorBatch& batch, const options_type& o, const LossScale& scale) {
    return detail::actor_loss(batch, o, scale);
  }
};
static_assert(algorithm_policy<Algorithm<GRPO>>);

}  // namespace hybridrl
