#pragma once
/// \file
/// KTO (Ethayarajh et al. 2024) on completions labelled desirable / undesirable, as TRL's
/// `KTOTrainer.kto_loss` (trl/trainer/kto_trainer.py): the reference point z0 is the KL between
/// policy and reference estimated on MISMATCHED (prompt, completion) pairs, detached, averaged over
/// the data-parallel group and clamped at 0 — `Algorithm<KTO>`. z0 is computed once per mini-batch
/// (prepare_mini_batch) over all of its rows on all ranks, and kept in the algorithm's state.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // formats at::IntArrayRef (tensor shapes)

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hybridrl/algorithm/aggregate.hpp"
#include "hybridrl/algorithm/checks.hpp"
#include "hybridrl/algorithm/base.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/distributed/communicator.hpp"
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
  HYBRIDRL_FIELDS(beta, desirable_weight, undesirable_weight)

  /// Throws hybridrl::Error for beta <= 0, negative weights or NaN.
  void validate() const {
    detail::check_finite_option("beta", beta_);
    detail::check_finite_option("desirable_weight", desirable_weight_);
    detail::check_finite_option("undesirable_weight", undesirable_weight_);
    HYBRIDRL_CHECK(beta_ > 0, fmt::format("beta = {} must be > 0", beta_),
                   "use a positive beta, e.g. 0.1");
    HYBRIDRL_CHECK(desirable_weight_ >= 0,
                   fmt::format("desirable_weight = {} must be >= 0", desirable_weight_),
                   "use non-negative weights; the KTO paper keeps λ_D·n_D / (λ_U·n_U) in [1, 4/3]");
    HYBRIDRL_CHECK(undesirable_weight_ >= 0,
                   fmt::format("undesirable_weight = {} must be >= 0", undesirable_weight_),
                   "use non-negative weights; the KTO paper keeps λ_D·n_D / (λ_U·n_U) in [1, 4/3]");
  }
};

/// Row order of the mismatched pairs, the one convention of hybridrl (TRL's `_get_kl_dataset`
/// rotation `[c[-1]] + c[:-1]`): prompt i goes with the completion of row (i − 1) mod B, so entry i
/// of the result is (i − 1) mod B. keys::kl_input_ids and the loader follow it. Needs B >= 2 (else
/// a row would pair with itself).
[[nodiscard]] inline at::Tensor kto_mismatched_index(int64_t batch_size) {
  HYBRIDRL_CHECK(batch_size >= 2,
                 fmt::format("KTO needs at least 2 samples per batch to build mismatched "
                             "(prompt, completion) pairs for its KL estimate, got {}",
                             batch_size),
                 "raise the batch size to 2 or more");
  return (at::arange(batch_size, at::kLong) + (batch_size - 1)).remainder(batch_size);
}

/// The KTO reference point z0 = max(0, mean over all rows of all ranks of (kl_policy − kl_ref)),
/// detached. `kl_policy_logps`, `kl_ref_logps`: [batch] summed log-probs of mismatched pairs.
/// `comm` sums rows and counts over the data-parallel group (nullptr = one rank). Estimated
/// locally (one rank) it needs at least 2 rows, since the pairs are built within the batch.
[[nodiscard]] inline at::Tensor kto_kl_estimate(const at::Tensor& kl_policy_logps,
                                                const at::Tensor& kl_ref_logps,
                                                Communicator* comm = nullptr) {
  constexpr std::string_view fn = "kto_kl_estimate";
  detail::check_dims(fn, "kl_policy_logps", kl_policy_logps, 1);
  detail::check_same_shape(fn, "kl_policy_logps", kl_policy_logps, "kl_ref_logps", kl_ref_logps);
  c10::NoGradGuard no_grad;
  const auto diff = kl_policy_logps.detach() - kl_ref_logps.detach();
  if (comm == nullptr || comm->size() == 1) {
    (void)kto_mismatched_index(diff.size(0));  // the B >= 2 check of a local estimate
    return diff.mean().clamp_min(0.0);
  }
  auto sum_and_rows = at::stack(
      {diff.to(at::kDouble).sum(),
       at::scalar_tensor(static_cast<double>(diff.size(0)), diff.options().dtype(at::kDouble))});
  comm->all_reduce(sum_and_rows, ReduceOp::sum);
  return (sum_and_rows[0] / sum_and_rows[1].clamp_min(1.0)).to(diff.scalar_type()).clamp_min(0.0);
}

/// Result of kto_loss.
struct KTOLossResult {
  at::Tensor loss;     ///< 0-d, with grad
  at::Tensor z0;       ///< 0-d reference point (detached)
  at::Tensor rewards;  ///< implied rewards β (π − ref), [batch], detached
};

/// KTO loss for a given z0 (TRL `kto_loss`): desirable rows λ_D (1 − σ(β(r − z0))), undesirable
/// rows λ_U (1 − σ(β(z0 − r))), r = π − ref; averaged over `counts.global_sequences` (or locally).
[[nodiscard]] inline KTOLossResult kto_loss_given_z0(const at::Tensor& policy_logps,
                                                     const at::Tensor& ref_logps,
                                                     const at::Tensor& z0,
                                                     const at::Tensor& desirable,
                                                     const KTOOptions& opts = {},
                                                     const LossCounts& counts = {}) {
  constexpr std::string_view fn = "kto_loss";
  opts.validate();
  detail::check_dims(fn, "policy_logps", policy_logps, 1);
  detail::check_floating(fn, "policy_logps", policy_logps);
  detail::check_same_shape(fn, "policy_logps", policy_logps, "ref_logps", ref_logps);
  detail::check_dims(fn, "desirable", desirable, 1);
  HYBRIDRL_CHECK(desirable.scalar_type() == at::kBool && desirable.size(0) == policy_logps.size(0),
                 fmt::format("kto_loss: desirable must be a bool tensor of {} rows, got {} of shape {}",
                             policy_logps.size(0), std::string(c10::toString(desirable.scalar_type())),
                             desirable.sizes()),
                 "pass one label per completion: true = desirable, false = undesirable");
  HYBRIDRL_CHECK(z0.defined() && z0.dim() == 0, "kto_loss: z0 must be a defined 0-d tensor",
                 "pass the reference point from kto_kl_estimate");
  const double beta = opts.beta();
  const auto ratio = policy_logps - ref_logps.detach();
  const auto zz = z0.detach().to(ratio.scalar_type());
  const auto chosen = opts.desirable_weight() * (1.0 - at::sigmoid(beta * (ratio - zz)));
  const auto rejected = opts.undesirable_weight() * (1.0 - at::sigmoid(beta * (zz - ratio)));
  const auto losses = at::where(desirable, chosen, rejected);
  KTOLossResult out;
  out.loss = detail::sequence_mean(losses, counts);
  out.z0 = zz;
  out.rewards = beta * ratio.detach();
  return out;
}

/// KTO loss (TRL `kto_loss`). All inputs [batch]: `policy_logps`, `ref_logps` summed log-probs
/// of the (prompt, completion) pairs; `kl_policy_logps`, `kl_ref_logps` those of the mismatched
/// pairs (kto_mismatched_index); `desirable` bool. z0 = kto_kl_estimate(kl..., comm).
[[nodiscard]] inline KTOLossResult kto_loss(const at::Tensor& policy_logps,
                                            const at::Tensor& ref_logps,
                                            const at::Tensor& kl_policy_logps,
                                            const at::Tensor& kl_ref_logps,
                                            const at::Tensor& desirable,
                                            const KTOOptions& opts = {},
                                            const LossCounts& counts = {},
                                            Communicator* comm = nullptr) {
  detail::check_same_shape("kto_loss", "policy_logps", policy_logps, "kl_policy_logps",
                           kl_policy_logps);
  auto z0 = kto_kl_estimate(kl_policy_logps, kl_ref_logps, comm);
  return kto_loss_given_z0(policy_logps, ref_logps, z0, desirable, opts, counts);
}

/// KTO's per-run state: the reference point of the current mini-batch.
struct KTOState {
  /// z0 of the current mini-batch (0-d, detached); set by prepare_mini_batch.
  at::Tensor z0;
};

/// KTO. prepare_mini_batch estimates z0 over the whole mini-batch (all ranks) from the mismatched
/// pairs' summed log-probs; loss then reads the labelled pairs and the labels.
template <>
struct Algorithm<KTO> : algorithm_base<KTO, KTOOptions, DataKind::labelled_completions> {
  static constexpr std::string_view name = "KTO";
  static constexpr bool needs_reference = true;
  using state_type = KTOState;

  /// The empty state (z0 comes with each mini-batch).
  static state_type make_state(const options_type& /*o*/) { return {}; }

  /// kl_log_probs_sum, ref_kl_log_probs_sum (the mismatched pairs, [B]).
  static std::vector<Key> prepare_reads(const options_type& /*o*/) {
    return {keys::kl_log_probs_sum, keys::ref_kl_log_probs_sum};
  }
  /// log_probs_sum (with grad), ref_log_probs_sum, desirable.
  static std::vector<Key> loss_reads(const options_type& /*o*/) {
    return {keys::log_probs_sum, keys::ref_log_probs_sum, keys::desirable};
  }

  /// z0 over the mini-batch and the data-parallel group (kto_kl_estimate), into `state`.
  static void prepare_mini_batch(TensorBatch& mini_batch, const options_type& /*o*/,
                                 state_type& state, Communicator* comm) {
    state.z0 = kto_kl_estimate(mini_batch.tensor(keys::kl_log_probs_sum),
                               mini_batch.tensor(keys::ref_kl_log_probs_sum), comm);
  }

  /// KTO loss of one micro-batch with the mini-batch's z0. Metrics: kto/loss (share, sum),
  /// kto/kl = z0 (the same in every micro-batch: max), rewards/chosen and rewards/rejected (means
  /// over the desirable / undesirable rows).
  static LossOutput loss(const TensorBatch& batch, const options_type& o, const state_type& state,
                         const LossCounts& counts) {
    HYBRIDRL_CHECK(state.z0.defined(),
                   "Algorithm<KTO>::loss: the state has no z0 for this mini-batch",
                   "call Algorithm<KTO>::prepare_mini_batch(mini_batch, options, state, comm) "
                   "before the micro-batch loop");
    const auto& desirable = batch.tensor(keys::desirable);
    auto r = kto_loss_given_z0(batch.tensor(keys::log_probs_sum),
                               batch.tensor(keys::ref_log_probs_sum), state.z0, desirable, o,
                               counts);
    LossOutput out;
    out.loss = r.loss;
    out.metrics["kto/loss"] = Metric::sum(r.loss / static_cast<double>(counts.data_parallel_size));
    out.metrics["kto/kl"] = Metric::max(r.z0);
    const auto d = desirable.to(r.rewards.scalar_type());
    const auto n_d = d.sum(), n_u = (1.0 - d).sum();
    out.metrics["rewards/chosen"] = Metric::sequence_mean((r.rewards * d).sum() / n_d.clamp_min(1.0), n_d);
    out.metrics["rewards/rejected"] =
        Metric::sequence_mean((r.rewards * (1.0 - d)).sum() / n_u.clamp_min(1.0), n_u);
    return out;
  }
};
static_assert(algorithm_policy<Algorithm<KTO>>);

}  // namespace hybridrl
