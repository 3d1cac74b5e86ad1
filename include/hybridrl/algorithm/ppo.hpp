#pragma once
/// \file
/// PPO (Schulman et al. 2017) as verl runs it: the clipped surrogate with asymmetric clip ranges
/// and dual-clip (verl `compute_policy_loss_vanilla`), the clipped value loss (verl
/// `compute_value_loss`), GAE advantages, KL either in the reward (`apply_kl_penalty`, fixed or
/// adaptive controller) or in the loss (`use_kl_loss`), and an entropy bonus — `Algorithm<PPO>`.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "hybridrl/algorithm/advantages.hpp"
#include "hybridrl/algorithm/aggregate.hpp"
#include "hybridrl/algorithm/checks.hpp"
#include "hybridrl/algorithm/kl.hpp"
#include "hybridrl/core/concepts.hpp"
#include "hybridrl/core/error.hpp"
#include "hybridrl/core/loss.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/tensor_batch.hpp"

namespace hybridrl {

/// Numbers of the clipped policy loss (verl actor config; same defaults).
struct PolicyLossOptions {
  /// ε_low: the ratio is clipped below at 1 − clip_low.
  HYBRIDRL_ARG(double, clip_low) = 0.2;
  /// ε_high: the ratio is clipped above at 1 + clip_high (DAPO's clip-higher uses 0.28).
  HYBRIDRL_ARG(double, clip_high) = 0.2;
  /// Dual-clip bound c > 1 (Ye et al. 2020): for A < 0 the loss is capped at −c·A.
  HYBRIDRL_ARG(double, clip_c) = 3.0;
  /// How the token losses become a scalar.
  HYBRIDRL_ARG(LossAgg, loss_agg) = LossAgg::token_mean;
  /// L of LossAgg::seq_mean_token_sum_norm (0 = the padded response length, mask.size(1)).
  HYBRIDRL_ARG(int64_t, norm_length) = 0;

  /// Throws hybridrl::Error for clip_low <= 0 (or >= 1), clip_high <= 0, clip_c <= 1 or NaN.
  void validate() const {
    detail::check_finite_option("clip_low", clip_low_);
    detail::check_finite_option("clip_high", clip_high_);
    detail::check_finite_option("clip_c", clip_c_);
    HYBRIDRL_CHECK(clip_low_ > 0 && clip_low_ < 1,
                   fmt::format("clip_low = {} must lie in (0, 1)", clip_low_),
                   "use a lower clip range such as 0.2 (the ratio is clipped at 1 - clip_low)");
    HYBRIDRL_CHECK(clip_high_ > 0, fmt::format("clip_high = {} must be > 0", clip_high_),
                   "use an upper clip range such as 0.2 or 0.28");
    HYBRIDRL_CHECK(clip_c_ > 1, fmt::format("clip_c = {} must be > 1 for dual-clip PPO", clip_c_),
                   "use a dual-clip bound above 1, e.g. 3.0 (verl's default)");
    HYBRIDRL_CHECK(norm_length_ >= 0, fmt::format("norm_length = {} is negative", norm_length_),
                   "use 0 (the padded response length) or the maximum response length");
  }
};

/// Result of ppo_policy_loss; every tensor is 0-d, the metrics are detached.
struct PolicyLossResult {
  at::Tensor loss;                 ///< aggregated clipped surrogate (with grad)
  at::Tensor clip_fraction;        ///< fraction of valid tokens where the clipped term was taken
  at::Tensor clip_fraction_lower;  ///< fraction where the dual clip (A < 0, ratio > c) was taken
  at::Tensor approx_kl;            ///< masked mean of old_logp − logp (after the ±20 clamp)
};

/// Clipped PPO surrogate with dual clip (verl `compute_policy_loss_vanilla`). All [batch, T]:
/// ratio = exp(clamp(logp − old_logp, −20, 20));
/// l = max(−A·ratio, −A·clip(ratio, 1−ε_low, 1+ε_high)); for A < 0, l = min(l, −A·c);
/// loss = aggregate_loss(l, mask, opts.loss_agg, scale).
[[nodiscard]] inline PolicyLossResult ppo_policy_loss(const at::Tensor& logp,
                                                      const at::Tensor& old_logp,
                                                      const at::Tensor& advantages,
                                                      const at::Tensor& mask,
                                                      const PolicyLossOptions& opts = {},
                                                      const LossScale& scale = {}) {
  constexpr std::string_view fn = "ppo_policy_loss";
  opts.validate();
  detail::check_dims(fn, "logp", logp, 2);
  detail::check_floating(fn, "logp", logp);
  detail::check_same_shape(fn, "logp", logp, "old_logp", old_logp);
  detail::check_same_shape(fn, "logp", logp, "advantages", advantages);
  detail::check_same_shape(fn, "logp", logp, "mask", mask);
  const auto adv = advantages.detach();
  const auto log_ratio = (logp - old_logp.detach()).clamp(-20.0, 20.0);
  const auto ratio = log_ratio.exp();
  const auto l1 = -adv * ratio;
  const auto l2 = -adv * ratio.clamp(1.0 - opts.clip_low(), 1.0 + opts.clip_high());
  const auto clipped = at::max(l1, l2);
  const auto l3 = -adv * opts.clip_c();
  const auto negative = adv < 0;
  const auto losses = at::where(negative, at::min(clipped, l3), clipped);
  PolicyLossResult out;
  out.loss = aggregate_loss(losses, mask, opts.loss_agg(), scale, opts.norm_length());
  const auto dtype = logp.scalar_type();
  out.clip_fraction = detail::masked_mean_metric(at::gt(l2, l1).to(dtype), mask);
  out.clip_fraction_lower =
      detail::masked_mean_metric(at::logical_and(at::gt(clipped, l3), negative).to(dtype), mask);
  out.approx_kl = detail::masked_mean_metric(-log_ratio, mask);
  return out;
}

/// Result of ppo_value_loss; tensors are 0-d.
struct ValueLossResult {
  at::Tensor loss;           ///< 0.5 · aggregated clipped squared error (with grad)
  at::Tensor clip_fraction;  ///< fraction of valid tokens where the clipped error was larger
};

/// Clipped value loss (verl `compute_value_loss`). All [batch, T]: v_clip = clamp(values,
/// old_values − clip, old_values + clip); loss = 0.5 · agg(max((values − R)², (v_clip − R)²)).
[[nodiscard]] inline ValueLossResult ppo_value_loss(const at::Tensor& values,
                                                    const at::Tensor& old_values,
                                                    const at::Tensor& returns,
                                                    const at::Tensor& mask, double clip = 0.5,
                                                    LossAgg agg = LossAgg::token_mean,
                                                    const LossScale& scale = {}) {
  constexpr std::string_view fn = "ppo_value_loss";
  detail::check_dims(fn, "values", values, 2);
  detail::check_floating(fn, "values", values);
  detail::check_same_shape(fn, "values", values, "old_values", old_values);
  detail::check_same_shape(fn, "values", values, "returns", returns);
  detail::check_same_shape(fn, "values", values, "mask", mask);
  detail::check_finite_option("cliprange_value", clip);
  HYBRIDRL_CHECK(clip > 0, fmt::format("{}: clip = {} must be > 0", fn, clip),
                 "use a value clip range such as 0.5 (verl's critic.cliprange_value)");
  const auto old = old_values.detach();
  const auto ret = returns.detach();
  const auto clipped_values = at::max(at::min(values, old + clip), old - clip);
  const auto e1 = (values - ret).square();
  const auto e2 = (clipped_values - ret).square();
  ValueLossResult out;
  out.loss = 0.5 * aggregate_loss(at::max(e1, e2), mask, agg, scale);
  out.clip_fraction = detail::masked_mean_metric(at::gt(e2, e1).to(values.scalar_type()), mask);
  return out;
}

/// Run-time options of Algorithm<PPO> (verl ppo_trainer.yaml defaults).
struct PPOOptions {
  // ---- actor ----
  /// ε_low of the clipped surrogate.
  HYBRIDRL_ARG(double, clip_low) = 0.2;
  /// ε_high of the clipped surrogate.
  HYBRIDRL_ARG(double, clip_high) = 0.2;
  /// Dual-clip bound c > 1.
  HYBRIDRL_ARG(double, clip_c) = 3.0;
  /// How token losses become a scalar (actor, entropy and KL loss).
  HYBRIDRL_ARG(LossAgg, loss_agg) = LossAgg::token_mean;
  /// L of seq_mean_token_sum_norm (0 = padded response length).
  HYBRIDRL_ARG(int64_t, norm_length) = 0;
  /// Entropy bonus coefficient (needs the "entropy" column when non-zero).
  HYBRIDRL_ARG(double, entropy_coeff) = 0.0;
  /// Passes over each batch of rollouts.
  HYBRIDRL_ARG(int64_t, ppo_epochs) = 1;
  /// Add coef · KL(π‖π_ref) to the actor loss (needs "ref_log_probs").
  HYBRIDRL_ARG(bool, use_kl_loss) = false;
  /// Coefficient of the KL loss.
  HYBRIDRL_ARG(double, kl_loss_coef) = 0.001;
  /// Estimator of the KL loss (verl default low_var_kl = k3).
  HYBRIDRL_ARG(KlEstimator, kl_loss_type) = KlEstimator::k3;
  // ---- advantage ----
  /// Discount γ of GAE.
  HYBRIDRL_ARG(double, gamma) = 1.0;
  /// λ of GAE.
  HYBRIDRL_ARG(double, lam) = 1.0;
  /// Subtract β · KL(old ‖ ref) from the token rewards before GAE.
  HYBRIDRL_ARG(bool, use_kl_in_reward) = false;
  /// Estimator of the in-reward KL (verl default "kl" = k1).
  HYBRIDRL_ARG(KlEstimator, kl_penalty) = KlEstimator::k1;
  /// Controller of the in-reward coefficient β (fixed or adaptive).
  HYBRIDRL_ARG(KlControlOptions, kl_ctrl) = {};
  // ---- critic ----
  /// Value clip range.
  HYBRIDRL_ARG(double, cliprange_value) = 0.5;
  /// How the value loss is aggregated.
  HYBRIDRL_ARG(LossAgg, value_loss_agg) = LossAgg::token_mean;

  /// The clip / aggregation part as PolicyLossOptions.
  [[nodiscard]] PolicyLossOptions policy_loss_options() const {
    return PolicyLossOptions{}.clip_low(clip_low_).clip_high(clip_high_).clip_c(clip_c_)
        .loss_agg(loss_agg_).norm_length(norm_length_);
  }

  /// Throws hybridrl::Error naming the first impossible field.
  void validate() const {
    policy_loss_options().validate();
    kl_ctrl_.validate();
    for (auto [name, v] : {std::pair{"entropy_coeff", entropy_coeff_},
                           std::pair{"kl_loss_coef", kl_loss_coef_}, std::pair{"gamma", gamma_},
                           std::pair{"lam", lam_}, std::pair{"cliprange_value", cliprange_value_}}) {
      detail::check_finite_option(name, v);
    }
    HYBRIDRL_CHECK(ppo_epochs_ >= 1, fmt::format("ppo_epochs = {} must be >= 1", ppo_epochs_),
                   "use at least one pass over each batch");
    HYBRIDRL_CHECK(kl_loss_coef_ >= 0, fmt::format("kl_loss_coef = {} is negative", kl_loss_coef_),
                   "use a KL loss coefficient >= 0");
    HYBRIDRL_CHECK(gamma_ >= 0 && gamma_ <= 1 && lam_ >= 0 && lam_ <= 1,
                   fmt::format("gamma = {} and lam = {} must lie in [0, 1]", gamma_, lam_),
                   "use a discount and a GAE lambda in [0, 1]");
    HYBRIDRL_CHECK(cliprange_value_ > 0,
                   fmt::format("cliprange_value = {} must be > 0", cliprange_value_),
                   "use a value clip range such as 0.5");
  }
};

namespace detail {

/// Actor loss shared by PPO, GRPO and user policies: clipped surrogate − entropy_coeff · H
/// + kl_loss_coef · KL, each aggregated the same way. Reads "log_probs", "old_log_probs",
/// "advantages", "response_mask"; "entropy" when entropy_coeff ≠ 0; "ref_log_probs" with use_kl_loss.
template <class Opts>
LossOutput actor_loss(const TensorBatch& batch, const Opts& opts, const LossScale& scale) {
  const auto& mask = batch.tensor("response_mask");
  const auto& logp = batch.tensor("log_probs");
  auto pg = ppo_policy_loss(logp, batch.tensor("old_log_probs"), batch.tensor("advantages"), mask,
                            opts.policy_loss_options(), scale);
  LossOutput out;
  out.loss = pg.loss;
  out.metrics["actor/pg_loss"] = pg.loss.detach();
  out.metrics["actor/pg_clipfrac"] = pg.clip_fraction;
  out.metrics["actor/pg_clipfrac_lower"] = pg.clip_fraction_lower;
  out.metrics["actor/ppo_kl"] = pg.approx_kl;
  if (opts.entropy_coeff() != 0.0) {
    HYBRIDRL_CHECK(batch.has_tensor("entropy"),
                   fmt::format("entropy_coeff = {} but the batch has no 'entropy' column",
                               opts.entropy_coeff()),
                   "compute the per-token entropy [batch, T] in the actor forward, or set "
                   "entropy_coeff(0)");
    auto ent = aggregate_loss(batch.tensor("entropy"), mask, opts.loss_agg(), scale,
                              opts.norm_length());
    out.loss = out.loss - opts.entropy_coeff() * ent;
    out.metrics["actor/entropy"] = ent.detach();
  }
  if (opts.use_kl_loss()) {
    auto kld = kl_penalty(logp, batch.tensor("ref_log_probs").detach(), opts.kl_loss_type());
    auto kl = aggregate_loss(kld, mask, opts.loss_agg(), scale, opts.norm_length());
    out.loss = out.loss + opts.kl_loss_coef() * kl;
    out.metrics["actor/kl_loss"] = kl.detach();
    out.metrics["actor/kl_coef"] = at::scalar_tensor(opts.kl_loss_coef(), at::kDouble);
  }
  return out;
}

}  // namespace detail

/// PPO with a critic and GAE. Columns: compute_advantages reads "response_mask", "old_values",
/// and "token_level_rewards" — or, with use_kl_in_reward, "token_level_scores", "old_log_probs",
/// "ref_log_probs" (β from meta "kl_coef" if set, else kl_ctrl.kl_coef), writing
/// "token_level_rewards" and meta "reward_kl"; it writes "advantages" and "returns".
/// loss reads "log_probs", "old_log_probs", "advantages", "response_mask" (+ "entropy",
/// "ref_log_probs" when enabled); value_loss reads "values", "old_values", "returns", "response_mask".
template <>
struct Algorithm<PPO> {
  using tag = PPO;
  using options_type = PPOOptions;
  static constexpr std::string_view name = "PPO";
  static constexpr DataKind data_kind = DataKind::prompts;
  static constexpr bool needs_critic = true;
  /// A reference model exists (classic RLHF PPO); uses_reference() says if these options read it.
  static constexpr bool needs_reference = true;

  /// Whether `o` reads reference log-probs (KL in the reward or in the loss).
  static bool uses_reference(const options_type& o) { return o.use_kl_in_reward() || o.use_kl_loss(); }

  /// A KL controller for the in-reward coefficient; the trainer stores value() in meta "kl_coef"
  /// before compute_advantages and calls update(meta "reward_kl", batch size) after it.
  static KlController make_kl_controller(const options_type& o) { return KlController(o.kl_ctrl()); }

  /// GAE on token rewards (optionally KL-penalised); see the struct comment for the columns.
  static void compute_advantages(TensorBatch& batch, const options_type& o) {
    const auto& mask = batch.tensor("response_mask");
    if (o.use_kl_in_reward()) {
      const double coef = batch.meta().value("kl_coef", o.kl_ctrl().kl_coef());
      auto r = apply_kl_penalty(batch.tensor("token_level_scores"), batch.tensor("old_log_probs"),
                                batch.tensor("ref_log_probs"), mask, coef, o.kl_penalty());
      batch.set("token_level_rewards", r.token_level_rewards);
      batch.set_meta("reward_kl", r.mean_kl.item<double>());
      batch.set_meta("kl_coef", coef);
    } else if (!batch.has_tensor("token_level_rewards") && batch.has_tensor("token_level_scores")) {
      batch.set("token_level_rewards", batch.tensor("token_level_scores"));
    }
    auto gae = compute_gae(batch.tensor("token_level_rewards"), batch.tensor("old_values"), mask,
                           o.gamma(), o.lam());
    batch.set("advantages", gae.advantages);
    batch.set("returns", gae.returns);
  }

  /// Actor loss on one micro-batch (clipped surrogate, entropy bonus, optional KL loss).
  static LossOutput loss(const TensorBatch& batch, const options_type& o, const LossScale& scale) {
    return detail::actor_loss(batch, o, scale);
  }

  /// Critic loss on one micro-batch (clipped value loss).
  static LossOutput value_loss(const TensorBatch& batch, const options_type& o,
                               const LossScale& scale) {
    auto v = ppo_value_loss(batch.tensor("values"), batch.tensor("old_values"),
                            batch.tensor("returns"), batch.tensor("response_mask"),
                            o.cliprange_value(), o.value_loss_agg(), scale);
    LossOutput out;
    out.loss = v.loss;
    out.metrics["critic/vf_loss"] = v.loss.detach();
    out.metrics["critic/vf_clipfrac"] = v.clip_fraction;
    return out;
  }
};
static_assert(algorithm_policy<Algorithm<PPO>>);

}  // namespace hybridrl
