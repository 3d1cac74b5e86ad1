#pragma once
/// \file
/// KL estimators between the policy and the reference (verl `kl_penalty` / `kl_penalty_forward`,
/// core_algos.py; J. Schulman, "Approximating KL divergence", 2020), the KL-in-reward penalty
/// (verl `apply_kl_penalty`, ray_trainer.py) and the fixed / adaptive KL coefficient controllers
/// (verl `FixedKLController`, `AdaptiveKLController`; Ziegler et al. 2019).

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <variant>

#include "hybridrl/algorithm/checks.hpp"
#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"

namespace hybridrl {

/// Per-token estimator of KL(π ‖ π_ref) from the sampled tokens' log-probs.
enum class KLEstimator {
  k1,       ///< log π − log π_ref                          (verl "kl" / "k1")
  k2,       ///< ½ (log π − log π_ref)²                     (verl "mse" / "k2")
  k3,       ///< e^{−d} − 1 + d with d = log π − log π_ref, input and output clamped ("low_var_kl")
  abs,      ///< |log π − log π_ref|                        (verl "abs")
  k1_plus,  ///< value of k1, gradient of k2 (straight-through, verl "k1+")
  k3_plus,  ///< value of k3, gradient of k2 (straight-through, verl "k3+")
};

HYBRIDRL_ENUM_NAMES(KLEstimator, k1, k2, k3, abs, k1_plus, k3_plus);

/// Token-level KL estimate [batch, T] of `logp` (policy) against `ref_logp` (reference), same
/// shape. k3 clamps d to [−20, 20] before exp and the result to [−10, 10], as verl does. The
/// straight-through forms return the forward value of k1/k3 with the gradient of k2 (which is the
/// unbiased gradient of KL on-policy).
[[nodiscard]] inline at::Tensor kl_penalty(const at::Tensor& logp, const at::Tensor& ref_logp,
                                           KLEstimator estimator) {
  detail::check_floating("kl_penalty", "logp", logp);
  detail::check_same_shape("kl_penalty", "logp", logp, "ref_logp", ref_logp);
  const auto d = logp - ref_logp;
  auto forward = [&](KLEstimator e) -> at::Tensor {
    switch (e) {
      case KLEstimator::k1: return d;
      case KLEstimator::k2: return 0.5 * d.square();
      case KLEstimator::abs: return d.abs();
      case KLEstimator::k3:
      default: {
        auto neg = (-d).clamp(-20.0, 20.0);  // log(π_ref/π)
        return (neg.exp() - neg - 1.0).clamp(-10.0, 10.0);
      }
    }
  };
  switch (estimator) {
    case KLEstimator::k1_plus:
    case KLEstimator::k3_plus: {
      auto value = forward(estimator == KLEstimator::k1_plus ? KLEstimator::k1 : KLEstimator::k3);
      auto grad_path = 0.5 * d.square();
      return grad_path - grad_path.detach() + value.detach();
    }
    default: return forward(estimator);
  }
}

/// Result of apply_kl_penalty.
struct KLPenaltyResult {
  at::Tensor token_level_rewards;  ///< scores − coef · KL · mask, [batch, T]
  at::Tensor kl;                   ///< the masked per-token KL, [batch, T]
  at::Tensor mean_kl;              ///< batch mean of per-sequence masked-mean KL (0-d), for the controller
};

/// KL in the reward (verl `apply_kl_penalty`): rewards = scores − coef · kl_penalty(old, ref) · mask.
/// `mean_kl` is the mean over sequences of each sequence's masked-mean KL; feed it (and the batch
/// size) to KLController::update. No gradient flows (these are rollout-time quantities).
[[nodiscard]] inline KLPenaltyResult apply_kl_penalty(const at::Tensor& token_level_scores,
                                                      const at::Tensor& old_logp,
                                                      const at::Tensor& ref_logp,
                                                      const at::Tensor& mask, double kl_coef,
                                                      KLEstimator estimator = KLEstimator::k1) {
  constexpr std::string_view fn = "apply_kl_penalty";
  detail::check_dims(fn, "token_level_scores", token_level_scores, 2);
  detail::check_same_shape(fn, "token_level_scores", token_level_scores, "old_logp", old_logp);
  detail::check_same_shape(fn, "token_level_scores", token_level_scores, "ref_logp", ref_logp);
  detail::check_same_shape(fn, "token_level_scores", token_level_scores, "mask", mask);
  detail::check_finite_option("kl_coef", kl_coef);
  c10::NoGradGuard no_grad;
  const auto m = detail::mask_as(mask, token_level_scores.scalar_type());
  auto kl = kl_penalty(old_logp, ref_logp, estimator) * m;
  auto per_seq = kl.sum(-1) / m.sum(-1).clamp_min(1.0);
  return {token_level_scores - kl_coef * kl, kl, per_seq.mean()};
}

/// Whether the KL coefficient is constant or adapted toward a target KL.
enum class KLControl { fixed, adaptive };
HYBRIDRL_ENUM_NAMES(KLControl, fixed, adaptive);

/// Options of the KL coefficient controller (verl `algorithm.kl_ctrl`, same defaults).
struct KLControlOptions {
  /// fixed: the coefficient stays `kl_coef`; adaptive: it tracks `target_kl`.
  HYBRIDRL_ARG(KLControl, type) = KLControl::fixed;
  /// Initial (or constant) KL coefficient β.
  HYBRIDRL_ARG(double, kl_coef) = 0.001;
  /// Adaptive only: the KL the controller steers toward.
  HYBRIDRL_ARG(double, target_kl) = 0.1;
  /// Adaptive only: samples over which the coefficient may change by at most ±20 %.
  HYBRIDRL_ARG(double, horizon) = 10000;
  HYBRIDRL_FIELDS(type, kl_coef, target_kl, horizon)

  /// Throws hybridrl::Error for a negative or non-finite coefficient, target or horizon.
  void validate() const {
    detail::check_finite_option("kl_coef", kl_coef_);
    detail::check_finite_option("target_kl", target_kl_);
    detail::check_finite_option("horizon", horizon_);
    HYBRIDRL_CHECK(kl_coef_ >= 0, fmt::format("kl_coef = {} is negative", kl_coef_),
                   "use a KL coefficient >= 0 (0 disables the penalty)");
    HYBRIDRL_CHECK(type_ == KLControl::fixed || target_kl_ > 0,
                   fmt::format("target_kl = {} must be > 0 for the adaptive controller",
                               target_kl_),
                   "set a positive target KL, e.g. 0.1");
    HYBRIDRL_CHECK(type_ == KLControl::fixed || horizon_ > 0,
                   fmt::format("horizon = {} must be > 0 for the adaptive controller",
                               horizon_),
                   "set a positive horizon, e.g. 10000");
  }
};

/// A constant KL coefficient (verl FixedKLController).
class FixedKLController {
 public:
  /// Holds `kl_coef` forever.
  explicit FixedKLController(double kl_coef) : value_(kl_coef) {}
  /// The current coefficient β.
  [[nodiscard]] double value() const noexcept { return value_; }
  /// No-op: a fixed coefficient ignores the observed KL.
  void update(double /*current_kl*/, int64_t /*n_steps*/) noexcept {}
  /// Sets β (a checkpoint's restore).
  void set_value(double v) noexcept { value_ = v; }

 private:
  double value_;
};

/// Adaptive KL coefficient (verl AdaptiveKLController, Ziegler et al. 2019):
/// e = clip(KL/target − 1, −0.2, 0.2);  β ← β · (1 + e · n_steps / horizon).
class AdaptiveKLController {
 public:
  /// Starts at `init_kl_coef` and steers toward `target_kl` over `horizon` samples.
  AdaptiveKLController(double init_kl_coef, double target_kl, double horizon)
      : value_(init_kl_coef), target_(target_kl), horizon_(horizon) {}
  /// The current coefficient β.
  [[nodiscard]] double value() const noexcept { return value_; }
  /// Updates β from the KL observed on a batch of `n_steps` samples.
  void update(double current_kl, int64_t n_steps) noexcept {
    const double error = std::clamp(current_kl / target_ - 1.0, -0.2, 0.2);
    value_ *= 1.0 + error * static_cast<double>(n_steps) / horizon_;
  }
  /// Sets β (a checkpoint's restore).
  void set_value(double v) noexcept { value_ = v; }

 private:
  double value_, target_, horizon_;
};

/// The controller chosen by KLControlOptions: fixed or adaptive, behind one interface.
class KLController {
 public:
  /// Validates `options` and builds the controller they describe.
  explicit KLController(const KLControlOptions& options = {})
      : impl_(make(options)) {}
  /// The current coefficient β.
  [[nodiscard]] double value() const {
    return std::visit([](const auto& c) { return c.value(); }, impl_);
  }
  /// Feeds the KL observed on a batch of `n_steps` samples to the controller.
  void update(double current_kl, int64_t n_steps) {
    std::visit([&](auto& c) { c.update(current_kl, n_steps); }, impl_);
  }
  /// Sets the current coefficient (a resumed run continues from its checkpoint's β).
  void set_value(double v) {
    std::visit([&](auto& c) { c.set_value(v); }, impl_);
  }

 private:
  using Impl = std::variant<FixedKLController, AdaptiveKLController>;
  static Impl make(const KLControlOptions& o) {
    o.validate();
    if (o.type() == KLControl::adaptive) {
      return AdaptiveKLController(o.kl_coef(), o.target_kl(), o.horizon());
    }
    return FixedKLController(o.kl_coef());
  }
  Impl impl_;
};

}  // namespace hybridrl
