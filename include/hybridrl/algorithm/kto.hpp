#pragma once
/// \file
/// KTO (Ethayarajh et al. 2024) on completions labelled desirable / undesirable, as TRL's
/// `KTOTrainer.kto_loss` (trl/trainer/kto_trainer.py): the reference point z0 is the KL between
/// policy and reference estimated on MISMATCHED (prompt, completion) pairs, detached, averaged over
/// the data-parallel group and clamped at 0 — `Algorithm<KTO>`.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // formats at::IntArrayRef (tensor shapes)

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "hybridrl/algorithm/aggregate.hpp"
#include "hybridrl/algorithm/checks.hpp"
#include "hybridrl/core/concepts.hpp"
#include "hybridrl/core/error.hpp"
#include "hybridrl/core/loss.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/tensor_batch.hpp"

namespace hybridrl {

/// Run-time options of KTO (TRL KTOConfig defaults).
struct KTOOptions {
  /// β: scale of the implied reward.
  HYBRIDRL_ARG(double, beta) = 0.1;
  /// λ_D: weight of the desirable examples' losses.
  HYBRIDRL_ARG(double, desirable_weight) = 1.0;
  /// λ_U: weight of the undesirable examples' losses.
  HYBRIDRL_ARG(double, undesirable_weight) = 1.0;

  /// Throws hybridrl::Error for beta <= 0, negative weights or NaN.
  void validate() const {
    detail::check_finite_option("beta", beta_);
    detail::check_finite_option("desirable_weight", desirable_weight_);
    detail::check_finite_option("undesirable_weight", undesirable_weight_);
    HYBRIDRL_CHECK(beta_ > 0, fmt::format("beta = {} must be > 0", beta_),
                   "use a positive beta, e.g. 0.1");
    HYBRIDRL_CHECK(desirable_weight_ >= 0 && undesirable_weight_ >= 0,
                   fmt::format("desirable_weight = {} and undesirable_weight = {} must be >= 0",
                               desirable_weight_, undesirable_weight_),
                   "use non-negative weights; the KTO paper keeps λ_D·n_D / (λ_U·n_U) in [1, 4/3]");
  }
};

/// Averages a 0-d tensor over the data-parallel group (e.g. all_reduce SUM then divide by world).
/// An empty function means one rank.
using AllReduceMean = std::function<at::Tensor(const at::Tensor&)>;

/// The KTO reference point z0 = max(0, mean over the group of mean(kl_policy − kl_ref)), detached.
/// `kl_policy_logps`, `kl_ref_logps`: [batch] summed log-probs of mismatched pairs.
[[nodiscard]] inline at::Tensor kto_kl_estimate(const at::Tensor& kl_policy_logps,
                                                const at::Tensor& kl_ref_logps,
                                                const AllReduceMean& all_reduce_mean = {}) {
  detail::check_dims("kto_kl_estimate", "kl_policy_logps", kl_policy_logps, 1);
  detail::check_same_shape("kto_kl_estimate", "kl_policy_logps", kl_policy_logps, "kl_ref_logps",
                           kl_ref_logps);
  c10::NoGradGuard no_grad;
  auto kl = (kl_policy_logps.detach() - kl_ref_logps.detach()).mean();
  if (all_reduce_mean) kl = all_reduce_mean(kl);
  return kl.clamp_min(0.0);
}

/// Row order of the mismatched pairs: completion of row i−1 (mod B) goes with prompt i, as TRL's
/// KL dataset rotates completions by one. Needs batch_size >= 2 (else a row would pair with itself).
[[nodiscard]] inline at::Tensor kto_mismatched_index(int64_t batch_size) {
  HYBRIDRL_CHECK(batch_size >= 2,
                 fmt::format("KTO needs at least 2 samples per batch to build mismatched "
                             "(prompt, completion) pairs for its KL estimate, got {}",
                             batch_size),
                 "raise the per-device batch size (micro_batch_size_per_gpu) to 2 or more");
  return (at::arange(batch_size, at::kLong) + (batch_size - 1)).remainder(batch_size);
}

/// Result of kto_loss.
struct KTOLossResult {
  at::Tensor loss;              ///< 0-d, with grad
  at::Tensor z0;                ///< 0-d reference point (detached)
  at::Tensor rewards;           ///< implied rewards β (π − ref), [batch], detached
};

namespace detail {

/// KTO loss for a given z0: desirable rows λ_D (1 − σ(β(r − z0))), undesirable rows
/// λ_U (1 − σ(β(z0 − r))), r = π − ref; averaged with sequence_mean.
inline KTOLossResult kto_loss_given_z0(const at::Tensor& policy_logps, const at::Tensor& ref_logps,
                                       const at::Tensor& z0, const at::Tensor& desirable,
                                       const KTOOptions& opts, const LossScale& scale) {
  constexpr std::string_view fn = "kto_loss";
  opts.validate();
  check_dims(fn, "policy_logps", policy_logps, 1);
  check_floating(fn, "policy_logps", policy_logps);
  check_same_shape(fn, "policy_logps", policy_logps, "ref_logps", ref_logps);
  check_dims(fn, "desirable", desirable, 1);
  HYBRIDRL_CHECK(desirable.scalar_type() == at::kBool && desirable.size(0) == policy_logps.size(0),
                 fmt::format("kto_loss: desirable must be a bool tensor of {} rows, got {} of shape {}",
                             policy_logps.size(0), std::string(c10::toString(desirable.scalar_type())),
                             desirable.sizes()),
                 "pass one label per completion: true = desirable, false = undesirable");
  const double beta = opts.beta();
  const auto ratio = policy_logps - ref_logps.detach();
  const auto zz = z0.detach().to(ratio.scalar_type());
  const auto chosen = opts.desirable_weight() * (1.0 - at::sigmoid(beta * (ratio - zz)));
  const auto rejected = opts.undesirable_weight() * (1.0 - at::sigmoid(beta * (zz - ratio)));
  const auto losses = at::where(desirable, chosen, rejected);
  KTOLossResult out;
  out.loss = sequence_mean(losses, scale);
  out.z0 = zz;
  out.rewards = beta * ratio.detach();
  return out;
}

}  // namespace detail

/// KTO loss (TRL `kto_loss`). All inputs [batch]: `policy_logps`, `ref_logps` summed log-probs
/// of the (prompt, completion) pairs; `kl_policy_logps`, `kl_ref_logps` those of the mismatched
/// pairs (see kto_mismatched_index); `desirable` bool. z0 = kto_kl_estimate(..., all_reduce_mean).
[[nodiscard]] inline KTOLossResult kto_loss(const at::Tensor& policy_logps,
                                            const at::Tensor& ref_logps,
                                            const at::Tensor& kl_policy_logps,
                                            const at::Tensor& kl_ref_logps,
                                            const at::Tensor& desirable,
                                            const KTOOptions& opts = {},
                                            const LossScale& scale = {},
                                            const AllReduceMean& all_reduce_mean = {}) {
  detail::check_same_shape("kto_loss", "policy_logps", policy_logps, "kl_policy_logps",
                           kl_policy_logps);
  auto z0 = kto_kl_estimate(kl_policy_logps, kl_ref_logps, all_reduce_mean);
  return detail::kto_loss_given_z0(policy_logps, ref_logps, z0, desirable, opts, scale);
}

/// KTO. loss reads "log_probs_sum", "ref_log_probs_sum" (the labelled pairs), "kl_log_probs_sum",
/// "kl_ref_log_probs_sum" (the mismatched pairs, rows ordered by kto_mismatched_index), all [B],
/// and "desirable" [B] bool. z0 comes from meta "kto_z0" when the trainer estimated it over the
/// whole mini-batch and data-parallel group (kto_kl_estimate); otherwise from this micro-batch.
template <>
struct Algorithm<KTO> {
  using tag = KTO;
  using options_type = KTOOptions;
  static constexpr std::string_view name = "KTO";
  static constexpr DataKind data_kind = DataKind::labelled_completions;
  static constexpr bool needs_critic = false;
  static constexpr bool needs_reference = true;

  /// Rows whose completions form the mismatched pairs of `batch` (checks batch >= 2).
  static at::Tensor mismatched_index(const TensorBatch& batch) {
    return kto_mismatched_index(batch.size());
  }

  /// KTO loss of one micro-batch, with reward and KL metrics.
  static LossOutput loss(const TensorBatch& batch, const options_type& o, const LossScale& scale) {
    (void)kto_mismatched_index(batch.size());  // the batch-size check, before any work
    const auto& policy = batch.tensor("log_probs_sum");
    at::Tensor z0 = batch.meta().contains("kto_z0")
                        ? at::scalar_tensor(batch.meta()["kto_z0"].get<double>(), policy.options())
                        : kto_kl_estimate(batch.tensor("kl_log_probs_sum"),
                                          batch.tensor("kl_ref_log_probs_sum"));
    auto r = detail::kto_loss_given_z0(policy, batch.tensor("ref_log_probs_sum"), z0,
                                       batch.tensor("desirable"), o, scale);
    LossOutput out;
    out.loss = r.loss;
    out.metrics["kto/loss"] = r.loss.detach();
    out.metrics["kto/kl"] = r.z0;
    const auto d = batch.tensor("desirable").to(r.rewards.scalar_type());
    out.metrics["rewards/chosen"] = (r.rewards * d).sum() / d.sum().clamp_min(1.0);
    out.metrics["rewards/rejected"] = (r.rewards * (1.0 - d)).sum() / (1.0 - d).sum().clamp_min(1.0);
    return out;
  }
};
static_assert(algorithm_policy<Algorithm<KTO>>);

}  // namespace hybridrl
