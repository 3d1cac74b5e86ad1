#pragma once
/// \file
/// PPO (Schulman et al. 2017) as verl runs it: the clipped surrogate with asymmetric clip ranges
/// and dual-clip (verl `compute_policy_loss_vanilla`), the clipped value loss (verl
/// `compute_value_loss`), GAE advantages, KL either in the reward (`apply_kl_penalty`, fixed or
/// adaptive controller) or in the loss (`actor.use_kl_loss`), and an entropy bonus — `Algorithm<PPO>`.
/// The clipped surrogate and the shared actor loss are in algorithm/actor_loss.hpp.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hybridrl/algorithm/actor_loss.hpp"
#include "hybridrl/algorithm/advantages.hpp"
#include "hybridrl/algorithm/aggregate.hpp"
#include "hybridrl/algorithm/checks.hpp"
#include "hybridrl/algorithm/kl.hpp"
#include "hybridrl/algorithm/base.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/error.hpp"
#include "hybridrl/core/loss.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/tensor_batch.hpp"

namespace hybridrl {

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
                                                    const LossCounts& counts = {}) {
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
  out.loss = 0.5 * aggregate_loss(at::max(e1, e2), mask, agg, counts);
  out.clip_fraction = detail::masked_mean_metric(at::gt(e2, e1).to(values.scalar_type()), mask);
  return out;
}

/// Run-time options of Algorithm<PPO> (verl ppo_trainer.yaml defaults). The passes over each batch
/// (ppo_epochs) are a loop count of the fit loop: BatchGeometry owns them.
struct PPOOptions {
  /// The actor loss: clip ranges, aggregation, entropy bonus, KL loss.
  HYBRIDRL_ARG(ActorLossOptions, actor) = {};
  // ---- advantage ----
  /// Discount γ of GAE.
  HYBRIDRL_ARG(double, gamma) = 1.0;
  /// λ of GAE.
  HYBRIDRL_ARG(double, lam) = 1.0;
  /// Subtract β · KL(old ‖ ref) from the token rewards before GAE (reads keys::ref_log_probs).
  HYBRIDRL_ARG(bool, use_kl_in_reward) = false;
  /// Estimator of the in-reward KL (verl default "kl" = k1).
  HYBRIDRL_ARG(KLEstimator, kl_penalty) = KLEstimator::k1;
  /// Controller of the in-reward coefficient β (fixed or adaptive).
  HYBRIDRL_ARG(KLControlOptions, kl_ctrl) = {};
  // ---- critic ----
  /// Value clip range.
  HYBRIDRL_ARG(double, cliprange_value) = 0.5;
  /// How the value loss is aggregated.
  HYBRIDRL_ARG(LossAgg, value_loss_agg) = LossAgg::token_mean;
  HYBRIDRL_FIELDS(actor, gamma, lam, use_kl_in_reward, kl_penalty, kl_ctrl, cliprange_value,
                  value_loss_agg)

  /// Throws hybridrl::Error naming the first impossible field (the actor fields sit at this level: "clip_low = ...").
  void validate() const {
    actor_.validate();  // inline fields: no "actor." in the path
    detail::validate_member(kl_ctrl_, "kl_ctrl");
    for (auto [name, v] : {std::pair{"gamma", gamma_}, std::pair{"lam", lam_},
                           std::pair{"cliprange_value", cliprange_value_}}) {
      detail::check_finite_option(name, v);
    }
    HYBRIDRL_CHECK(gamma_ >= 0 && gamma_ <= 1, fmt::format("gamma = {} must lie in [0, 1]", gamma_),
                   "use a discount in [0, 1]");
    HYBRIDRL_CHECK(lam_ >= 0 && lam_ <= 1, fmt::format("lam = {} must lie in [0, 1]", lam_),
                   "use a GAE lambda in [0, 1]");
    HYBRIDRL_CHECK(cliprange_value_ > 0,
                   fmt::format("cliprange_value = {} must be > 0", cliprange_value_),
                   "use a value clip range such as 0.5");
  }
};

/// PPO's per-run state: the in-reward KL controller and the KL measured by the last
/// compute_advantages (fed to the controller by after_step).
struct PPOState {
  KLController kl_ctrl;
  /// Mean per-sequence KL(old ‖ ref) of the last compute_advantages (0-d; undefined without KL
  /// in the reward).
  at::Tensor reward_kl;
  /// Sequences that KL was measured on.
  int64_t reward_kl_sequences = 0;
};

/// PPO with a critic and GAE. The keys of each hook: advantage_reads / advantage_writes /
/// loss_reads / value_loss_reads. With use_kl_in_reward, compute_advantages penalises the token
/// scores with β = state.kl_ctrl.value() and after_step feeds the measured KL to the controller.
template <>
struct Algorithm<PPO> : algorithm_base<PPO, PPOOptions, DataKind::prompts> {
  static constexpr std::string_view name = "PPO";
  static constexpr bool needs_critic = true;
  /// A reference model exists (classic RLHF PPO); uses_reference() says if these options read it.
  static constexpr bool needs_reference = true;
  using state_type = PPOState;

  /// The KL controller of `o.kl_ctrl` (validated).
  static state_type make_state(const options_type& o) { return {KLController(o.kl_ctrl()), {}, 0}; }
  /// What a checkpoint keeps of the state: the in-reward KL coefficient β (the adaptive
  /// controller's moves), so a resumed run continues with it.
  static std::map<std::string, double> save_state(const state_type& s) { return {{"kl_coef", s.kl_ctrl.value()}}; }
  /// Restores what save_state wrote.
  static void load_state(state_type& s, const std::map<std::string, double>& saved) {
    if (auto it = saved.find("kl_coef"); it != saved.end()) s.kl_ctrl.set_value(it->second);
  }

  /// Whether `o` reads reference log-probs (KL in the reward or in the loss).
  static bool uses_reference(const options_type& o) {
    return o.use_kl_in_reward() || o.actor().use_kl_loss();
  }

  /// token_level_scores, old_values, response_mask; old_log_probs and ref_log_probs with KL in
  /// the reward.
  static std::vector<Key> advantage_reads(const options_type& o) {
    std::vector<Key> out{keys::token_level_scores, keys::old_values, keys::response_mask};
    if (o.use_kl_in_reward()) {
      out.push_back(keys::old_log_probs);
      out.push_back(keys::ref_log_probs);
    }
    return out;
  }
  /// token_level_rewards, advantages, returns.
  static std::vector<Key> advantage_writes(const options_type& /*o*/) {
    return {keys::token_level_rewards, keys::advantages, keys::returns};
  }
  /// actor_loss_reads(o.actor()).
  static std::vector<Key> loss_reads(const options_type& o) { return actor_loss_reads(o.actor()); }
  /// values, old_values, returns, response_mask.
  static std::vector<Key> value_loss_reads(const options_type& /*o*/) {
    return {keys::values, keys::old_values, keys::returns, keys::response_mask};
  }

  /// Token rewards (scores, KL-penalised with KL in the reward), then GAE.
  static void compute_advantages(TensorBatch& batch, const options_type& o, state_type& state) {
    const auto& mask = batch.tensor(keys::response_mask);
    const auto& scores = batch.tensor(keys::token_level_scores);
    const auto& old_values = batch.tensor(keys::old_values);
    if (o.use_kl_in_reward()) {
      auto r = apply_kl_penalty(scores, batch.tensor(keys::old_log_probs),
                                batch.tensor(keys::ref_log_probs), mask, state.kl_ctrl.value(),
                                o.kl_penalty());
      batch.set(keys::token_level_rewards, r.token_level_rewards);
      state.reward_kl = r.mean_kl;
      state.reward_kl_sequences = batch.size();
    } else {
      batch.set(keys::token_level_rewards, scores);
    }
    auto gae = compute_gae(batch.tensor(keys::token_level_rewards), old_values, mask, o.gamma(),
                           o.lam());
    batch.set(keys::advantages, gae.advantages);
    batch.set(keys::returns, gae.returns);
  }

  /// Feeds the KL measured by compute_advantages to the controller (verl: kl_ctrl.update(current_kl,
  /// n_steps = batch size)); over ranks, the KL is the sequence-weighted mean and n_steps the total.
  static void after_step(const TensorBatch& /*batch*/, const options_type& o, state_type& state,
                         Communicator* comm) {
    if (!o.use_kl_in_reward() || !state.reward_kl.defined()) return;
    auto kl_and_n = at::stack({state.reward_kl.to(at::kDouble) *
                                   static_cast<double>(state.reward_kl_sequences),
                               at::scalar_tensor(static_cast<double>(state.reward_kl_sequences),
                                                 state.reward_kl.options().dtype(at::kDouble))});
    if (comm != nullptr && comm->size() > 1) comm->all_reduce(kl_and_n, ReduceOp::sum);
    const auto host = kl_and_n.cpu();
    const double n = host[1].item<double>();
    if (n > 0) state.kl_ctrl.update(host[0].item<double>() / n, static_cast<int64_t>(n));
    state.reward_kl = at::Tensor();
    state.reward_kl_sequences = 0;
  }

  /// Actor loss on one micro-batch (clipped surrogate, entropy bonus, optional KL loss).
  static LossOutput loss(const TensorBatch& batch, const options_type& o, const state_type& /*s*/,
                         const LossCounts& counts) {
    return actor_loss(batch, o.actor(), counts);
  }

  /// Critic loss on one micro-batch (clipped value loss). Metrics: critic/vf_loss (share, sum),
  /// critic/vf_clipfrac (token mean).
  static LossOutput value_loss(const TensorBatch& batch, const options_type& o,
                               const state_type& /*s*/, const LossCounts& counts) {
    const auto& mask = batch.tensor(keys::response_mask);
    auto v = ppo_value_loss(batch.tensor(keys::values), batch.tensor(keys::old_values),
                            batch.tensor(keys::returns), mask, o.cliprange_value(),
                            o.value_loss_agg(), counts);
    LossOutput out;
    out.loss = v.loss;
    out.metrics["critic/vf_loss"] =
        Metric::sum(v.loss / static_cast<double>(counts.data_parallel_size));
    out.metrics["critic/vf_clipfrac"] =
        Metric::token_mean(v.clip_fraction, detail::mask_as(mask, at::kDouble).sum());
    return out;
  }
};
static_assert(algorithm_policy<Algorithm<PPO>>);

}  // namespace hybridrl
