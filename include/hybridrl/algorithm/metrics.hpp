#pragma once
/// \file
/// MetricAggregator: combines the metrics of a mini-batch's micro-batches, then of the ranks, by
/// each metric's Reduce (core/loss.hpp): shares are summed, means weighted by their token or
/// sequence counts, maxima maxed. Accumulates on the metrics' device; one device→host copy (and
/// at most three collectives) when the result is read.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>
#include <string>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/loss.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/distributed/communicator.hpp"

namespace hybridrl {

/// Accumulates metrics of micro-batches (add) and reduces them over ranks (result).
class MetricAggregator {
 public:
  /// Adds one micro-batch's metrics. A name keeps the Reduce it first came with; a mean needs its
  /// weight.
  void add(const std::map<std::string, Metric>& metrics) {
    for (const auto& [name, m] : metrics) {
      HYBRIDRL_CHECK(m.value.defined() && m.value.numel() == 1,
                     fmt::format("metric '{}' must be a 0-d tensor", name),
                     "return each metric as a 0-d detached tensor (e.g. x.mean().detach())");
      const bool mean = m.reduce == Reduce::token_mean || m.reduce == Reduce::sequence_mean;
      HYBRIDRL_CHECK(!mean || (m.weight.defined() && m.weight.numel() == 1),
                     fmt::format("metric '{}' is a {} without a weight", name, enum_name(m.reduce)),
                     "make means with Metric::token_mean(value, tokens) or "
                     "Metric::sequence_mean(value, sequences)");
      const auto v = m.value.detach().reshape({}).to(at::kDouble);
      auto it = acc_.find(name);
      if (it == acc_.end()) {
        Acc a{m.reduce, mean ? v * m.weight.detach().reshape({}).to(at::kDouble) : v,
              mean ? m.weight.detach().reshape({}).to(at::kDouble) : at::Tensor()};
        acc_.emplace(name, std::move(a));
        continue;
      }
      auto& a = it->second;
      HYBRIDRL_CHECK(a.reduce == m.reduce,
                     fmt::format("metric '{}' came as {} and now as {}", name, enum_name(a.reduce),
                                 enum_name(m.reduce)),
                     "give each metric name one reduction in every micro-batch");
      if (mean) {
        const auto w = m.weight.detach().reshape({}).to(at::kDouble);
        a.value = a.value + v * w;
        a.weight = a.weight + w;
      } else if (m.reduce == Reduce::max) {
        a.value = at::maximum(a.value, v);
      } else {
        a.value = a.value + v;
      }
    }
  }
  /// Adds the metrics of one loss hook's output.
  void add(const LossOutput& out) { add(out.metrics); }

  /// The aggregate of every metric added so far; with `comm` (collective: every rank calls it
  /// with the same metric names) also over the ranks of the group. A mean of total weight 0 is 0.
  [[nodiscard]] std::map<std::string, double> result(Communicator* comm = nullptr) const {
    std::map<std::string, double> out;
    if (acc_.empty() && comm == nullptr) return out;
    std::vector<at::Tensor> sums, maxima;  // sums: shares, then (numerator, weight) pairs
    for (const auto& [name, a] : acc_) {
      if (a.reduce == Reduce::max) {
        maxima.push_back(a.value);
      } else {
        sums.push_back(a.value);
        if (a.weight.defined()) sums.push_back(a.weight);
      }
    }
    const auto device = acc_.empty() ? at::Device(at::kCPU) : acc_.begin()->second.value.device();
    auto pack = [&](const std::vector<at::Tensor>& v) {
      return v.empty() ? at::zeros({0}, at::TensorOptions().dtype(at::kDouble).device(device))
                       : at::stack(v);
    };
    auto s = pack(sums), mx = pack(maxima);
    if (comm != nullptr && comm->size() > 1) {
      // Same metric set on every rank? (max of n and of −n agree) — else all ranks throw together.
      const auto n = static_cast<double>(acc_.size());
      auto check = at::tensor(std::vector<double>{n, -n}, at::TensorOptions().dtype(at::kDouble))
                       .to(device);
      comm->all_reduce(check, ReduceOp::max);
      const auto c = check.cpu();
      HYBRIDRL_CHECK(c[0].item<double>() == -c[1].item<double>(),
                     "MetricAggregator::result: the ranks hold different numbers of metrics",
                     "return the same metric names from every micro-batch on every rank");
      if (s.numel() > 0) comm->all_reduce(s, ReduceOp::sum);
      if (mx.numel() > 0) comm->all_reduce(mx, ReduceOp::max);
    }
    const auto hs = s.cpu(), hm = mx.cpu();
    const double* ps = hs.data_ptr<double>();
    const double* pm = hm.data_ptr<double>();
    for (const auto& [name, a] : acc_) {
      if (a.reduce == Reduce::max) {
        out[name] = *pm++;
      } else if (a.weight.defined()) {
        const double num = *ps++, w = *ps++;
        out[name] = w > 0 ? num / w : 0.0;
      } else {
        out[name] = *ps++;
      }
    }
    return out;
  }

  /// Forgets everything added (start of the next step).
  void clear() noexcept { acc_.clear(); }
  /// True when nothing was added.
  [[nodiscard]] bool empty() const noexcept { return acc_.empty(); }

 private:
  struct Acc {
    Reduce reduce;
    at::Tensor value;   ///< sum, max, or Σ value·weight for the means
    at::Tensor weight;  ///< Σ weight (means only)
  };
  std::map<std::string, Acc> acc_;
};

/// How far the rollout engine's log-probs are from the trainer's recomputation of the same
/// tokens under the same weights (the rollout–training mismatch of a hybrid engine; verl's
/// `training/rollout_probs_diff_*` and `rollout_corr/*`, slime's `train_rollout_logprob_abs_diff`),
/// over the tokens where `mask` is 1. With d = train − rollout log-probs and the importance ratio
/// ρ = exp(d) = π_train / π_rollout:
///   rollout/log_prob_diff      mean |d|            rollout/log_prob_diff_max   max |d|
///   rollout/probs_diff_mean    mean |π_train − π_rollout| (verl's training/rollout_probs_diff_mean)
///   rollout/ratio_mean, _std   mean and standard deviation of ρ
///   rollout/ratio_min, _max    its extremes
///   rollout/k3_kl              mean (ρ − 1 − log ρ), the k3 estimate of KL(π_rollout ‖ π_train)
/// In exact arithmetic all are 0 (ratios 1); bf16 leaves a noise floor. Empty mask: all 0 (ratios 1).
inline std::map<std::string, double> rollout_agreement_metrics(const at::Tensor& rollout_log_probs,
                                                               const at::Tensor& train_log_probs, const at::Tensor& mask) {
  HYBRIDRL_CHECK(rollout_log_probs.sizes() == train_log_probs.sizes() && mask.sizes() == train_log_probs.sizes(),
                 "rollout_agreement_metrics: rollout log-probs, training log-probs and mask differ in shape",
                 "pass the three [B, response_len] tensors of one batch");
  const auto keep = mask.to(at::kBool);
  const auto d = (train_log_probs.to(at::kDouble) - rollout_log_probs.to(at::kDouble)).masked_select(keep);
  std::map<std::string, double> m;
  if (d.numel() == 0) {
    for (const char* k : {"rollout/log_prob_diff", "rollout/log_prob_diff_max", "rollout/probs_diff_mean",
                          "rollout/ratio_std", "rollout/k3_kl"}) {
      m[k] = 0.0;
    }
    m["rollout/ratio_mean"] = m["rollout/ratio_min"] = m["rollout/ratio_max"] = 1.0;
    return m;
  }
  const auto rho = d.exp();
  const auto p_train = train_log_probs.to(at::kDouble).masked_select(keep).exp();
  const auto p_rollout = rollout_log_probs.to(at::kDouble).masked_select(keep).exp();
  // one host copy for the eight values
  const auto v = at::stack({d.abs().mean(), d.abs().max(), (p_train - p_rollout).abs().mean(), rho.mean(),
                            d.numel() > 1 ? rho.std() : at::zeros({}, rho.options()), rho.min(), rho.max(),
                            (rho - 1.0 - d).mean()})
                     .cpu();
  const auto* x = v.data_ptr<double>();
  m["rollout/log_prob_diff"] = x[0];
  m["rollout/log_prob_diff_max"] = x[1];
  m["rollout/probs_diff_mean"] = x[2];
  m["rollout/ratio_mean"] = x[3];
  m["rollout/ratio_std"] = x[4];
  m["rollout/ratio_min"] = x[5];
  m["rollout/ratio_max"] = x[6];
  m["rollout/k3_kl"] = x[7];
  return m;
}

}  // namespace hybridrl
