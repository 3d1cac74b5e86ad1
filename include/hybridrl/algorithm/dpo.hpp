#pragma once
/// \file
/// DPO (Rafailov et al. 2023) on (chosen, rejected) pairs, as TRL's `DPOTrainer.dpo_loss`
/// (trl/trainer/dpo_trainer.py): sigmoid with conservative label smoothing (cDPO), IPO
/// (Azar et al. 2023) and hinge (SLiC, Zhao et al. 2023) — `Algorithm<DPO>`.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <string_view>
#include <vector>

#include "hybridrl/algorithm/aggregate.hpp"
#include "hybridrl/algorithm/checks.hpp"
#include "hybridrl/algorithm/base.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/error.hpp"
#include "hybridrl/core/loss.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/tensor_batch.hpp"

namespace hybridrl {

/// The preference loss applied to the margin h = (π_c − ref_c) − (π_r − ref_r).
enum class DPOLoss {
  sigmoid,  ///< −(1−ε) log σ(βh) − ε log σ(−βh)   (DPO; cDPO when ε = label_smoothing > 0)
  ipo,      ///< (h − 1/(2β))²                    (IPO; TRL feeds it length-averaged log-probs)
  hinge,    ///< max(0, 1 − βh)                    (SLiC hinge)
};
HYBRIDRL_ENUM_NAMES(DPOLoss, sigmoid, ipo, hinge);

/// Run-time options of DPO (TRL DPOConfig defaults).
struct DPOOptions {
  /// β: strength of the implicit KL constraint (IPO's τ).
  HYBRIDRL_ARG(double, beta) = 0.1;
  /// ε of cDPO: assumed probability that a preference label is flipped (sigmoid loss only).
  HYBRIDRL_ARG(double, label_smoothing) = 0.0;
  /// Which preference loss.
  HYBRIDRL_ARG(DPOLoss, loss_type) = DPOLoss::sigmoid;
  HYBRIDRL_FIELDS(beta, label_smoothing, loss_type)

  /// Throws hybridrl::Error for beta <= 0, label_smoothing outside [0, 0.5] or on a non-sigmoid
  /// loss, or NaN.
  void validate() const {
    detail::check_finite_option("beta", beta_);
    detail::check_finite_option("label_smoothing", label_smoothing_);
    HYBRIDRL_CHECK(beta_ > 0, fmt::format("beta = {} must be > 0", beta_),
                   "use a positive beta, typically 0.1 to 0.5");
    HYBRIDRL_CHECK(label_smoothing_ >= 0 && label_smoothing_ <= 0.5,
                   fmt::format("label_smoothing = {} must lie in [0, 0.5]", label_smoothing_),
                   "use 0 for DPO, or a flip probability below 0.5 for conservative DPO");
    HYBRIDRL_CHECK(label_smoothing_ == 0 || loss_type_ == DPOLoss::sigmoid,
                   fmt::format("label_smoothing = {} applies only to the sigmoid loss",
                               label_smoothing_),
                   "set label_smoothing(0) for the ipo and hinge losses");
  }
};

/// Result of dpo_loss.
struct DPOLossResult {
  at::Tensor loss;              ///< 0-d, with grad
  at::Tensor chosen_rewards;    ///< β (π_c − ref_c), [batch], detached
  at::Tensor rejected_rewards;  ///< β (π_r − ref_r), [batch], detached
  at::Tensor accuracy;          ///< 0-d: fraction of pairs with chosen reward > rejected reward
};

/// DPO family loss (TRL `dpo_loss`). Inputs are per-sequence SUMMED log-probs, [batch] each;
/// the per-pair losses are averaged over `counts.global_sequences` pairs (× data_parallel_size), or
/// over the batch for an empty LossCounts.
[[nodiscard]] inline DPOLossResult dpo_loss(const at::Tensor& policy_chosen,
                                            const at::Tensor& policy_rejected,
                                            const at::Tensor& ref_chosen,
                                            const at::Tensor& ref_rejected,
                                            const DPOOptions& opts = {},
                                            const LossCounts& counts = {}) {
  constexpr std::string_view fn = "dpo_loss";
  opts.validate();
  detail::check_dims(fn, "policy_chosen", policy_chosen, 1);
  detail::check_floating(fn, "policy_chosen", policy_chosen);
  detail::check_same_shape(fn, "policy_chosen", policy_chosen, "policy_rejected", policy_rejected);
  detail::check_same_shape(fn, "policy_chosen", policy_chosen, "ref_chosen", ref_chosen);
  detail::check_same_shape(fn, "policy_chosen", policy_chosen, "ref_rejected", ref_rejected);
  const double beta = opts.beta();
  const auto chosen_ratio = policy_chosen - ref_chosen.detach();
  const auto rejected_ratio = policy_rejected - ref_rejected.detach();
  const auto h = chosen_ratio - rejected_ratio;
  at::Tensor losses;
  switch (opts.loss_type()) {
    case DPOLoss::sigmoid: {
      const double eps = opts.label_smoothing();
      losses = -(1.0 - eps) * at::log_sigmoid(beta * h);
      if (eps > 0) losses = losses - eps * at::log_sigmoid(-beta * h);
      break;
    }
    case DPOLoss::ipo: losses = (h - 1.0 / (2.0 * beta)).square(); break;
    case DPOLoss::hinge: losses = at::relu(1.0 - beta * h); break;
  }
  DPOLossResult out;
  out.loss = detail::sequence_mean(losses, counts);
  out.chosen_rewards = beta * chosen_ratio.detach();
  out.rejected_rewards = beta * rejected_ratio.detach();
  out.accuracy = at::gt(out.chosen_rewards, out.rejected_rewards).to(h.scalar_type()).mean();
  return out;
}

/// DPO: reads the summed policy and reference log-probs of both completions of each pair.
template <>
struct Algorithm<DPO> : algorithm_base<DPO, DPOOptions, DataKind::preference_pairs> {
  static constexpr std::string_view name = "DPO";
  static constexpr bool needs_reference = true;

  /// chosen_log_probs_sum, rejected_log_probs_sum (policy, with grad), ref_chosen_log_probs_sum,
  /// ref_rejected_log_probs_sum, all [B].
  static std::vector<Key> loss_reads(const options_type& /*o*/) {
    return {keys::chosen_log_probs_sum, keys::rejected_log_probs_sum, keys::ref_chosen_log_probs_sum,
            keys::ref_rejected_log_probs_sum};
  }

  /// DPO loss of one micro-batch of pairs. Metrics: dpo/loss (share, sum); rewards/chosen,
  /// rewards/rejected, rewards/accuracies, rewards/margins (means over the pairs).
  static LossOutput loss(const TensorBatch& batch, const options_type& o, const state_type& /*s*/,
                         const LossCounts& counts) {
    auto r = dpo_loss(batch.tensor(keys::chosen_log_probs_sum),
                      batch.tensor(keys::rejected_log_probs_sum),
                      batch.tensor(keys::ref_chosen_log_probs_sum),
                      batch.tensor(keys::ref_rejected_log_probs_sum), o, counts);
    const int64_t pairs = batch.size();
    LossOutput out;
    out.loss = r.loss;
    out.metrics["dpo/loss"] = Metric::sum(r.loss / static_cast<double>(counts.data_parallel_size));
    out.metrics["rewards/chosen"] = Metric::sequence_mean(r.chosen_rewards.mean(), pairs);
    out.metrics["rewards/rejected"] = Metric::sequence_mean(r.rejected_rewards.mean(), pairs);
    out.metrics["rewards/accuracies"] = Metric::sequence_mean(r.accuracy, pairs);
    out.metrics["rewards/margins"] =
        Metric::sequence_mean((r.chosen_rewards - r.rejected_rewards).mean(), pairs);
    return out;
  }
};
static_assert(algorithm_policy<Algorithm<DPO>>);

}  // namespace hybridrl
