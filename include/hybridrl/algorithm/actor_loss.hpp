#pragma once
/// \file
/// The actor loss PPO, GRPO and user policies share: ActorLossOptions (clip ranges, dual clip,
/// aggregation, entropy bonus, KL loss; verl's actor config), the clipped surrogate
/// (verl `compute_policy_loss_vanilla`) and `actor_loss`, which combines them on a micro-batch.
/// PPOOptions and GRPOOptions hold an ActorLossOptions as `actor` (composition, not a copy).

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "hybridrl/algorithm/aggregate.hpp"
#include "hybridrl/algorithm/checks.hpp"
#include "hybridrl/algorithm/kl.hpp"
#include "hybridrl/core/error.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/loss.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/tensor_batch.hpp"

namespace hybridrl {

/// Options of the actor loss (verl actor config; same defaults).
struct ActorLossOptions {
  /// Its keys sit at the owning algorithm's level: `algorithm.clip_high`, not `algorithm.actor.clip_high`.
  static constexpr bool inline_fields = true;
  /// ε_low: the ratio is clipped below at 1 − clip_low.
  HYBRIDRL_ARG(double, clip_low) = 0.2;
  /// ε_high: the ratio is clipped above at 1 + clip_high (DAPO's clip-higher uses 0.28).
  HYBRIDRL_ARG(double, clip_high) = 0.2;
  /// Dual-clip bound c > 1 (Ye et al. 2020): for A < 0 the loss is capped at −c·A.
  HYBRIDRL_ARG(double, clip_c) = 3.0;
  /// How the token losses (surrogate, entropy, KL loss) become a scalar.
  HYBRIDRL_ARG(LossAgg, loss_agg) = LossAgg::token_mean;
  /// L of LossAgg::seq_mean_token_sum_norm (0 = the padded response length, mask.size(1)).
  HYBRIDRL_ARG(int64_t, norm_length) = 0;
  /// Entropy bonus coefficient (reads keys::entropy when non-zero).
  HYBRIDRL_ARG(double, entropy_coeff) = 0.0;
  /// Add kl_loss_coef · KL(π‖π_ref) to the loss (reads keys::ref_log_probs).
  HYBRIDRL_ARG(bool, use_kl_loss) = false;
  /// Coefficient of the KL loss.
  HYBRIDRL_ARG(double, kl_loss_coef) = 0.001;
  /// Estimator of the KL loss (verl default low_var_kl = k3).
  HYBRIDRL_ARG(KLEstimator, kl_loss_type) = KLEstimator::k3;
  HYBRIDRL_FIELDS(clip_low, clip_high, clip_c, loss_agg, norm_length, entropy_coeff, use_kl_loss,
                  kl_loss_coef, kl_loss_type)

  /// Throws hybridrl::Error naming the first impossible field (clip_low outside (0, 1),
  /// clip_high <= 0, clip_c <= 1, negative norm_length or kl_loss_coef, a NaN).
  void validate() const {
    for (auto [name, v] : {std::pair{"clip_low", clip_low_}, std::pair{"clip_high", clip_high_},
                           std::pair{"clip_c", clip_c_}, std::pair{"entropy_coeff", entropy_coeff_},
                           std::pair{"kl_loss_coef", kl_loss_coef_}}) {
      detail::check_finite_option(name, v);
    }
    HYBRIDRL_CHECK(clip_low_ > 0 && clip_low_ < 1,
                   fmt::format("clip_low = {} must lie in (0, 1)", clip_low_),
                   "use a lower clip range such as 0.2 (the ratio is clipped at 1 - clip_low)");
    HYBRIDRL_CHECK(clip_high_ > 0, fmt::format("clip_high = {} must be > 0", clip_high_),
                   "use an upper clip range such as 0.2 or 0.28");
    HYBRIDRL_CHECK(clip_c_ > 1, fmt::format("clip_c = {} must be > 1 for dual-clip PPO", clip_c_),
                   "use a dual-clip bound above 1, e.g. 3.0 (verl's default)");
    HYBRIDRL_CHECK(norm_length_ >= 0, fmt::format("norm_length = {} is negative", norm_length_),
                   "use 0 (the padded response length) or the maximum response length");
    HYBRIDRL_CHECK(kl_loss_coef_ >= 0, fmt::format("kl_loss_coef = {} is negative", kl_loss_coef_),
                   "use a KL loss coefficient >= 0 (or use_kl_loss(false))");
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
/// loss = aggregate_loss(l, mask, opts.loss_agg, counts). Only the clip and aggregation fields of
/// `opts` are used; old_logp and advantages are detached (no gradient flows into them).
[[nodiscard]] inline PolicyLossResult ppo_policy_loss(const at::Tensor& logp,
                                                      const at::Tensor& old_logp,
                                                      const at::Tensor& advantages,
                                                      const at::Tensor& mask,
                                                      const ActorLossOptions& opts = {},
                                                      const LossCounts& counts = {}) {
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
  out.loss = aggregate_loss(losses, mask, opts.loss_agg(), counts, opts.norm_length());
  const auto dtype = logp.scalar_type();
  out.clip_fraction = detail::masked_mean_metric(at::gt(l2, l1).to(dtype), mask);
  out.clip_fraction_lower =
      detail::masked_mean_metric(at::logical_and(at::gt(clipped, l3), negative).to(dtype), mask);
  out.approx_kl = detail::masked_mean_metric(-log_ratio, mask);
  return out;
}


/// The keys actor_loss reads with `opts`: log_probs, old_log_probs, advantages, response_mask;
/// entropy when entropy_coeff ≠ 0; ref_log_probs with use_kl_loss.
[[nodiscard]] inline std::vector<Key> actor_loss_reads(const ActorLossOptions& opts) {
  std::vector<Key> out{keys::log_probs, keys::old_log_probs, keys::advantages, keys::response_mask};
  if (opts.entropy_coeff() != 0.0) out.push_back(keys::entropy);
  if (opts.use_kl_loss()) out.push_back(keys::ref_log_probs);
  return out;
}

/// Actor loss of one micro-batch: clipped surrogate − entropy_coeff · H + kl_loss_coef · KL, each
/// aggregated the same way (reads actor_loss_reads(opts)). Metrics: actor/pg_loss, actor/entropy,
/// actor/kl_loss are additive shares (loss / data_parallel_size, Reduce::sum); actor/pg_clipfrac,
/// actor/pg_clipfrac_lower, actor/ppo_kl are token means; actor/kl_coef is a constant (max).
[[nodiscard]] inline LossOutput actor_loss(const TensorBatch& batch, const ActorLossOptions& opts,
                                           const LossCounts& counts) {
  const auto& mask = batch.tensor(keys::response_mask);
  const auto& logp = batch.tensor(keys::log_probs);
  auto pg = ppo_policy_loss(logp, batch.tensor(keys::old_log_probs), batch.tensor(keys::advantages),
                            mask, opts, counts);
  const double share = 1.0 / static_cast<double>(counts.data_parallel_size);
  const auto tokens = detail::mask_as(mask, at::kDouble).sum();
  LossOutput out;
  out.loss = pg.loss;
  out.metrics["actor/pg_loss"] = Metric::sum(pg.loss * share);
  out.metrics["actor/pg_clipfrac"] = Metric::token_mean(pg.clip_fraction, tokens);
  out.metrics["actor/pg_clipfrac_lower"] = Metric::token_mean(pg.clip_fraction_lower, tokens);
  out.metrics["actor/ppo_kl"] = Metric::token_mean(pg.approx_kl, tokens);
  if (opts.entropy_coeff() != 0.0) {
    HYBRIDRL_CHECK(batch.has_tensor(keys::entropy),
                   fmt::format("entropy_coeff = {} but the batch has no '{}' tensor",
                               opts.entropy_coeff(), keys::entropy.name),
                   "compute the per-token entropy [batch, T] in the actor forward, or set "
                   "entropy_coeff(0)");
    auto ent = aggregate_loss(batch.tensor(keys::entropy), mask, opts.loss_agg(), counts,
                              opts.norm_length());
    out.loss = out.loss - opts.entropy_coeff() * ent;
    out.metrics["actor/entropy"] = Metric::sum(ent * share);
  }
  if (opts.use_kl_loss()) {
    auto kld = kl_penalty(logp, batch.tensor(keys::ref_log_probs).detach(), opts.kl_loss_type());
    auto kl = aggregate_loss(kld, mask, opts.loss_agg(), counts, opts.norm_length());
    out.loss = out.loss + opts.kl_loss_coef() * kl;
    out.metrics["actor/kl_loss"] = Metric::sum(kl * share);
    out.metrics["actor/kl_coef"] = Metric::max(at::scalar_tensor(opts.kl_loss_coef(), at::kDouble));
  }
  return out;
}

}  // namespace hybridrl
