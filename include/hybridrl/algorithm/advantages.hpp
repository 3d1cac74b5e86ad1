#pragma once
/// \file
/// Advantage estimators (verl core_algos.py): GAE (`compute_gae_advantage_return`), GRPO
/// (`compute_grpo_outcome_advantage`), RLOO (`compute_rloo_outcome_advantage`) and REINFORCE++
/// (`compute_reinforce_plus_plus_outcome_advantage`), plus verl's `masked_whiten`.
/// All run without autograd, vectorised over the batch: the group statistics use scatter-adds,
/// and the two recursions are a reverse loop over T with tensor ops on [batch] columns.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <cstdint>
#include <string_view>
#include <tuple>

#include "hybridrl/algorithm/checks.hpp"
#include "hybridrl/core/error.hpp"

namespace hybridrl {

/// Advantages and returns, both [batch, T].
struct AdvantagesAndReturns {
  at::Tensor advantages;  ///< what the policy loss multiplies the ratio by
  at::Tensor returns;     ///< the critic's regression target (GAE) or discounted return
};

/// (values − mean) / sqrt(var + 1e-8) over the mask's 1-entries, with the unbiased (Bessel)
/// variance (verl `masked_whiten`); `shift_mean = false` adds the mean back. Needs at least two
/// valid entries; positions outside the mask are whitened too (callers multiply by the mask).
[[nodiscard]] inline at::Tensor masked_whiten(const at::Tensor& values, const at::Tensor& mask,
                                              bool shift_mean = true) {
  detail::check_same_shape("masked_whiten", "values", values, "mask", mask);
  const auto m = detail::mask_as(mask, values.scalar_type());
  const auto n = m.sum();
  const double count = n.item<double>();
  HYBRIDRL_CHECK(count >= 2.0,
                 fmt::format("masked_whiten: the mask selects {} token(s); an unbiased variance "
                             "needs at least 2",
                             count),
                 "whiten over a larger batch (increase the batch size or the response length), or "
                 "check that response_mask is not all zeros");
  const auto mean = (values * m).sum() / n;
  const auto var = ((values - mean).square() * m).sum() / n * (count / (count - 1.0));
  auto out = (values - mean) * at::rsqrt(var + 1e-8);
  return shift_mean ? out : out + mean;
}

namespace detail {

inline void check_token_inputs(std::string_view fn, std::string_view name, const at::Tensor& x,
                               const at::Tensor& mask) {
  check_dims(fn, name, x, 2);
  check_floating(fn, name, x);
  check_same_shape(fn, name, x, "mask", mask);
  check_finite(fn, name, x);
}

/// Dense group index [batch] in [0, G), per-group sample counts [G] (as `dtype`) from group_ids.
inline std::tuple<at::Tensor, at::Tensor> dense_groups(std::string_view fn, const at::Tensor& scores,
                                                       const at::Tensor& group_ids,
                                                       const at::Tensor& mask) {
  check_dims(fn, "scores", scores, 1);
  check_floating(fn, "scores", scores);
  check_dims(fn, "group_ids", group_ids, 1);
  check_dims(fn, "mask", mask, 2);
  HYBRIDRL_CHECK(group_ids.scalar_type() == at::kLong,
                 fmt::format("{}: group_ids must be int64, got {}", fn,
                             std::string(c10::toString(group_ids.scalar_type()))),
                 "pass the prompt index of each sample as an at::kLong tensor");
  HYBRIDRL_CHECK(group_ids.size(0) == scores.size(0) && mask.size(0) == scores.size(0),
                 fmt::format("{}: scores has {} rows, group_ids {}, mask {}", fn, scores.size(0),
                             group_ids.size(0), mask.size(0)),
                 "pass one score and one group id per sample (row of mask)");
  check_finite(fn, "scores", scores);
  auto [unique, inverse] = at::_unique(group_ids, /*sorted=*/true, /*return_inverse=*/true);
  auto counts = at::zeros({unique.size(0)}, scores.options())
                    .index_add_(0, inverse, at::ones_like(scores));
  return {inverse, counts};
}

}  // namespace detail

/// Sequence scores [B] placed on each response's last token (verl's reward manager:
/// `reward_tensor[i, valid_response_length - 1] = score`) → token-level scores [B, R] (float32,
/// zero elsewhere; a response of length 0 gets none). `response_mask` [B, R] is 1 on the response
/// tokens, a prefix of each row.
[[nodiscard]] inline at::Tensor scores_on_last_token(const at::Tensor& scores, const at::Tensor& response_mask) {
  constexpr std::string_view fn = "scores_on_last_token";
  detail::check_dims(fn, "scores", scores, 1);
  detail::check_dims(fn, "response_mask", response_mask, 2);
  HYBRIDRL_CHECK(scores.size(0) == response_mask.size(0),
                 fmt::format("{}: scores has {} rows, response_mask {}", fn, scores.size(0), response_mask.size(0)),
                 "pass one score per response");
  const auto lens = response_mask.to(at::kLong).sum(1);
  auto out = at::zeros(response_mask.sizes(), response_mask.options().dtype(at::kFloat));
  const auto has = lens.gt(0);
  const auto last = (lens - 1).clamp_min(0).unsqueeze(1);
  out.scatter_(1, last, (scores.to(at::kFloat) * has.to(at::kFloat)).unsqueeze(1));
  return out;
}

/// Generalised advantage estimation (Schulman et al. 2016), mask-aware as in verl: from the last
/// token back, δ_t = r_t + γ V_next − V_t, A_t = δ_t + γλ A_next, where V_next and A_next only
/// advance on tokens with mask = 1 (masked tokens carry them through). returns = A + V (before
/// whitening); advantages = masked_whiten(A) · mask. `rewards`, `values`, `mask`: [batch, T].
[[nodiscard]] inline AdvantagesAndReturns compute_gae(const at::Tensor& rewards,
                                                      const at::Tensor& values,
                                                      const at::Tensor& mask, double gamma,
                                                      double lam) {
  constexpr std::string_view fn = "compute_gae";
  detail::check_token_inputs(fn, "rewards", rewards, mask);
  detail::check_token_inputs(fn, "values", values, mask);
  HYBRIDRL_CHECK(gamma >= 0.0 && gamma <= 1.0 && lam >= 0.0 && lam <= 1.0,
                 fmt::format("compute_gae: gamma = {} and lam = {} must lie in [0, 1]", gamma, lam),
                 "use a discount and a GAE lambda in [0, 1] (verl defaults: 1.0 and 1.0)");
  c10::NoGradGuard no_grad;
  const auto dtype = rewards.scalar_type();
  const auto m = detail::mask_as(mask, dtype);
  // Time-major copies so each step reads a contiguous [batch] column.
  const auto r_t = rewards.t().contiguous();
  const auto v_t = values.detach().to(dtype).t().contiguous();
  const auto m_t = m.t().contiguous();
  const int64_t T = rewards.size(1);
  auto adv_t = at::empty_like(r_t);
  auto next_value = at::zeros({rewards.size(0)}, rewards.options());
  auto last_gae = at::zeros_like(next_value);
  for (int64_t t = T - 1; t >= 0; --t) {
    const auto v = v_t[t];
    const auto mt = m_t[t];
    // candidate = r + γ V_next − V + γλ A_next
    auto candidate = r_t[t] - v;
    candidate.add_(next_value, gamma).add_(last_gae, gamma * lam);
    last_gae.addcmul_(mt, candidate - last_gae);  // A_next ← m·candidate + (1−m)·A_next
    next_value.addcmul_(mt, v - next_value);      // V_next ← m·V + (1−m)·V_next
    adv_t[t].copy_(last_gae);
  }
  auto advantages = adv_t.t();
  auto returns = advantages + values.detach().to(dtype);
  return {masked_whiten(advantages, m) * m, returns};
}

/// GRPO outcome advantage (Shao et al. 2024; verl `compute_grpo_outcome_advantage`): per group of
/// samples of one prompt, (score − mean) / (std + eps) with the unbiased std, or score − mean when
/// `norm_by_std` is false (Dr.GRPO). A singleton group uses mean 0 and std 1. `scores` [batch],
/// `group_ids` [batch] int64, `mask` [batch, T]; returns score advantages broadcast × mask.
[[nodiscard]] inline at::Tensor compute_grpo_advantages(const at::Tensor& scores,
                                                        const at::Tensor& group_ids,
                                                        const at::Tensor& mask, double eps = 1e-6,
                                                        bool norm_by_std = true) {
  HYBRIDRL_CHECK(eps >= 0.0, fmt::format("compute_grpo_advantages: eps = {} is negative", eps),
                 "use a small non-negative epsilon such as 1e-6");
  c10::NoGradGuard no_grad;
  auto [group, counts] = detail::dense_groups("compute_grpo_advantages", scores, group_ids, mask);
  const auto s = scores.detach();
  auto sums = at::zeros_like(counts).index_add_(0, group, s);
  auto multi = counts > 1;
  auto mean = at::where(multi, sums / counts, at::zeros_like(sums));
  auto centred = s - mean.index_select(0, group);
  auto out = centred;
  if (norm_by_std) {
    auto sq = at::zeros_like(counts).index_add_(0, group, centred.square());
    auto stdev = at::where(multi, (sq / (counts - 1).clamp_min(1)).sqrt(), at::ones_like(sq));
    out = centred / (stdev.index_select(0, group) + eps);
  }
  return out.unsqueeze(-1) * detail::mask_as(mask, s.scalar_type());
}

/// RLOO advantage (Ahmadian et al. 2024; verl `compute_rloo_outcome_advantage`): the score minus
/// the mean score of the OTHER samples of its group, (s − mean)·n/(n−1); a singleton group keeps
/// its raw score. Shapes as compute_grpo_advantages.
[[nodiscard]] inline at::Tensor compute_rloo_advantages(const at::Tensor& scores,
                                                        const at::Tensor& group_ids,
                                                        const at::Tensor& mask) {
  c10::NoGradGuard no_grad;
  auto [group, counts] = detail::dense_groups("compute_rloo_advantages", scores, group_ids, mask);
  const auto s = scores.detach();
  auto sums = at::zeros_like(counts).index_add_(0, group, s);
  auto n = counts.index_select(0, group);
  auto mean = sums.index_select(0, group) / n;
  auto out = at::where(n > 1, (s - mean) * (n / (n - 1).clamp_min(1)), s);
  return out.unsqueeze(-1) * detail::mask_as(mask, s.scalar_type());
}

/// REINFORCE++ (Hu 2025; verl `compute_reinforce_plus_plus_outcome_advantage`): discounted
/// return G_t = r_t + γ G_{t+1}, reset to 0 after a masked token (G_{t+1} is carried only through
/// mask = 1), advantages = masked_whiten(G) · mask over the whole batch. `rewards`, `mask` [batch, T].
[[nodiscard]] inline AdvantagesAndReturns compute_reinforce_pp_advantages(const at::Tensor& rewards,
                                                                          const at::Tensor& mask,
                                                                          double gamma) {
  constexpr std::string_view fn = "compute_reinforce_pp_advantages";
  detail::check_token_inputs(fn, "rewards", rewards, mask);
  HYBRIDRL_CHECK(gamma >= 0.0 && gamma <= 1.0,
                 fmt::format("{}: gamma = {} must lie in [0, 1]", fn, gamma),
                 "use a discount in [0, 1] (verl default 1.0)");
  c10::NoGradGuard no_grad;
  const auto m = detail::mask_as(mask, rewards.scalar_type());
  const auto r_t = rewards.t().contiguous();
  const auto m_t = m.t().contiguous();
  auto ret_t = at::empty_like(r_t);
  auto running = at::zeros({rewards.size(0)}, rewards.options());
  for (int64_t t = rewards.size(1) - 1; t >= 0; --t) {
    auto g = r_t[t] + gamma * running;
    ret_t[t].copy_(g);
    running = g * m_t[t];
  }
  auto returns = ret_t.t();
  return {masked_whiten(returns, m) * m, returns};
}

}  // namespace hybridrl
