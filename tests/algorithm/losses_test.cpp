// Losses: loss aggregation, PPO policy / value loss, DPO, KTO. Expected values by hand (the
// arithmetic is written next to each check); gradients against central finite differences in
// double precision.

#include <hybridrl/algorithm/aggregate.hpp>
#include <hybridrl/algorithm/actor_loss.hpp>
#include <hybridrl/algorithm/dpo.hpp>
#include <hybridrl/algorithm/grpo.hpp>
#include <hybridrl/algorithm/kto.hpp>
#include <hybridrl/algorithm/ppo.hpp>

#include <cmath>
#include <functional>
#include <vector>
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using namespace hybridrl::testing;

namespace {


/// Autograd gradient of f at x against central differences (h = 1e-6), elementwise.
void check_gradient(const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& f) {
  auto xg = x.clone().set_requires_grad(true);
  f(xg).backward();
  auto grad = xg.grad().reshape(-1);
  at::NoGradGuard no_grad;
  const double h = 1e-6;
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto xp = x.clone(), xm = x.clone();
    xp.view(-1)[i] += h;
    xm.view(-1)[i] -= h;
    const double fd = (val(f(xp)) - val(f(xm))) / (2 * h);
    CHECK(grad[i].item<double>() == doctest::Approx(fd).epsilon(1e-6).scale(1.0));
  }
}

}  // namespace

TEST_SUITE("algorithm/aggregate") {
  TEST_CASE("the four modes by hand, local and global counts, with a fully masked row") {
    auto loss = mat({{1, 2, 3}, {4, 5, 6}, {7, 8, 9}});
    auto mask = mat({{1, 1, 0}, {1, 0, 0}, {0, 0, 0}});
    // valid tokens 1, 2 | 4; row sums 3, 4; row token-means 1.5, 4; 2 non-empty rows, L = 3
    CHECK(val(aggregate_loss(loss, mask, LossAgg::token_mean, LossCounts{})) == doctest::Approx(7.0 / 3));
    CHECK(val(aggregate_loss(loss, mask, LossAgg::seq_mean_token_sum, LossCounts{})) == doctest::Approx(3.5));
    CHECK(val(aggregate_loss(loss, mask, LossAgg::seq_mean_token_mean, LossCounts{})) == doctest::Approx(2.75));
    CHECK(val(aggregate_loss(loss, mask, LossAgg::seq_mean_token_sum_norm, LossCounts{})) ==
          doctest::Approx(3.5 / 3));
    CHECK(val(aggregate_loss(loss, mask, LossAgg::seq_mean_token_sum_norm, LossCounts{}, 10)) ==
          doctest::Approx(0.35));
    // global counts: 7 / 7 tokens, x dp 2 ; sequences 7 / 4
    CHECK(val(aggregate_loss(loss, mask, LossAgg::token_mean, 7, 4, 2)) == doctest::Approx(2.0));
    CHECK(val(aggregate_loss(loss, mask, LossAgg::seq_mean_token_sum, 7, 4)) == doctest::Approx(7.0 / 4));
    CHECK(val(aggregate_loss(loss, mask.to(at::kBool), LossAgg::seq_mean_token_mean, 7, 4)) ==
          doctest::Approx(5.5 / 4));
    CHECK(val(aggregate_loss(loss, mask, LossAgg::seq_mean_token_sum_norm, 7, 4, 1, 7)) ==
          doctest::Approx(1.0 / 4));
  }

  TEST_CASE("zero counts give a zero loss that still backpropagates; bad arguments throw") {
    auto loss = at::ones({2, 2}, at::kDouble).set_requires_grad(true);
    auto zero = at::zeros({2, 2}, at::kDouble);
    auto out = aggregate_loss(loss, zero, LossAgg::token_mean, 0, 0);
    CHECK(val(out) == 0.0);
    out.backward();
    CHECK(val(loss.grad().abs().sum()) == 0.0);
    CHECK(val(aggregate_loss(loss, zero, LossAgg::seq_mean_token_mean, LossCounts{})) == 0.0);
    CHECK_THROWS_AS(aggregate_loss(loss, at::ones({2, 3}), LossAgg::token_mean, 1, 1), Error);
    CHECK_THROWS_AS(aggregate_loss(loss, zero, LossAgg::token_mean, -1, 1), Error);
    CHECK_THROWS_WITH_AS(aggregate_loss(loss, zero, LossAgg::token_mean, LossCounts{0, 0, 2}),
                         doctest::Contains("data_parallel_size"), Error);
    // enums round-trip by their identifiers
    for (auto agg : {LossAgg::token_mean, LossAgg::seq_mean_token_sum, LossAgg::seq_mean_token_mean,
                     LossAgg::seq_mean_token_sum_norm}) {
      CHECK(enum_from_name<LossAgg>(enum_name(agg)) == agg);
    }
    CHECK(enum_name(LossAgg::seq_mean_token_sum_norm) == "seq_mean_token_sum_norm");
    CHECK(!enum_from_name<LossAgg>("mean").has_value());
  }
}

TEST_SUITE("algorithm/ppo") {
  TEST_CASE("clipped surrogate by hand: upper clip, lower clip, dual clip, unclipped, masked") {
    // eps_low 0.2, eps_high 0.28, c 3
    auto log_ratio = vec({std::log(1.5), std::log(0.5), std::log(4.0), std::log(1.1), 50.0});
    auto adv = mat({{1.0, -1.0, -1.0, 2.0, 5.0}});
    auto old_lp = at::full({1, 5}, -2.0, at::kDouble);
    auto lp = old_lp + log_ratio.unsqueeze(0);
    auto mask = mat({{1, 1, 1, 1, 0}});
    auto opts = ActorLossOptions{}.clip_low(0.2).clip_high(0.28).clip_c(3.0);
    auto r = ppo_policy_loss(lp, old_lp, adv, mask, opts);
    // token 0: A=1, ratio 1.5  -> max(-1.5, -1.28)          = -1.28  (clipped)
    // token 1: A=-1, ratio .5  -> max(0.5, 0.8), min(., 3)  =  0.8   (clipped)
    // token 2: A=-1, ratio 4   -> max(4, 1.28) = 4, min(4, 3) = 3    (dual clip)
    // token 3: A=2, ratio 1.1  -> -2.2                               (inside the range)
    CHECK(val(r.loss) == doctest::Approx((-1.28 + 0.8 + 3.0 - 2.2) / 4));
    CHECK(val(r.clip_fraction) == doctest::Approx(0.5));
    CHECK(val(r.clip_fraction_lower) == doctest::Approx(0.25));
    CHECK(val(r.approx_kl) ==
          doctest::Approx(-(std::log(1.5) + std::log(0.5) + std::log(4.0) + std::log(1.1)) / 4));
  }

  TEST_CASE("ratio overflow: log-ratio clamped to [-20, 20], so A = 0 with a huge ratio is no NaN") {
    auto old_lp = at::zeros({1, 3}, at::kFloat);
    auto lp = at::tensor({100.0f, -100.0f, 100.0f}).reshape({1, 3}).set_requires_grad(true);
    auto adv = at::tensor({0.0f, 1.0f, 1.0f}).reshape({1, 3});
    auto r = ppo_policy_loss(lp, old_lp, adv, at::ones({1, 3}));
    // token 0: -0 * e^20 = 0; token 1: ratio e^-20 -> max(-e^-20, -0.8) = -e^-20;
    // token 2: ratio e^20 -> max(-e^20, -1.2) = -1.2
    CHECK(std::isfinite(val(r.loss)));
    CHECK(val(r.loss) == doctest::Approx((0.0 - std::exp(-20.0) - 1.2) / 3).epsilon(1e-5));
    r.loss.backward();
    CHECK(at::isfinite(lp.grad()).all().item<bool>());
    CHECK(val(r.approx_kl) == doctest::Approx(-20.0 / 3));
  }

  TEST_CASE("ppo_policy_loss gradient = finite differences (double), every aggregation") {
    at::manual_seed(1);
    auto old_lp = -at::rand({3, 6}, at::kDouble) * 2;
    auto base = old_lp + (at::rand({3, 6}, at::kDouble) - 0.5) * 0.9;  // ratios in e^±0.45
    auto adv = at::randn({3, 6}, at::kDouble);
    auto mask = (at::rand({3, 6}) > 0.3).to(at::kDouble);
    mask[0][0] = 1;
    for (auto agg : {LossAgg::token_mean, LossAgg::seq_mean_token_sum, LossAgg::seq_mean_token_mean,
                     LossAgg::seq_mean_token_sum_norm}) {
      auto opts = ActorLossOptions{}.clip_low(0.1).clip_high(0.15).clip_c(1.3).loss_agg(agg);
      check_gradient(base, [&](const at::Tensor& lp) {
        return ppo_policy_loss(lp, old_lp, adv, mask, opts, LossCounts{11, 3, 1}).loss;
      });
    }
  }

  TEST_CASE("ppo_value_loss by hand and against finite differences") {
    auto values = mat({{1.0, 0.2, 9.0}});
    auto old_values = mat({{0.0, 0.0, 0.0}});
    auto returns = mat({{2.0, 0.1, 0.0}});
    auto mask = mat({{1, 1, 0}});
    auto r = ppo_value_loss(values, old_values, returns, mask, 0.5);
    // token 0: clip(1) = .5; max((1-2)^2, (.5-2)^2) = 2.25 (clipped); token 1: 0.01
    CHECK(val(r.loss) == doctest::Approx(0.5 * (2.25 + 0.01) / 2));
    CHECK(val(r.clip_fraction) == doctest::Approx(0.5));
    at::manual_seed(2);
    auto ov = at::randn({2, 5}, at::kDouble);
    auto ret = at::randn({2, 5}, at::kDouble);
    auto m = at::ones({2, 5}, at::kDouble);
    check_gradient(ov + at::randn({2, 5}, at::kDouble) * 0.4, [&](const at::Tensor& v) {
      return ppo_value_loss(v, ov, ret, m, 0.2, LossAgg::seq_mean_token_mean).loss;
    });
  }

  TEST_CASE("options validation names the field and the fix") {
    CHECK_THROWS_WITH_AS(ActorLossOptions{}.clip_c(1.0).validate(), doctest::Contains("clip_c"), Error);
    CHECK_THROWS_WITH_AS(ActorLossOptions{}.clip_low(0).validate(), doctest::Contains("clip_low"), Error);
    CHECK_THROWS_WITH_AS(ActorLossOptions{}.clip_high(std::nan("")).validate(),
                         doctest::Contains("clip_high"), Error);
    // nested members carry their dotted path; the problem starts with the field's name
    CHECK_THROWS_WITH_AS(PPOOptions{}.actor(ActorLossOptions{}.clip_low(1.5)).validate(),
                         doctest::Contains("clip_low = 1.5 must lie in (0, 1)"), Error);
    CHECK_THROWS_WITH_AS(PPOOptions{}.kl_ctrl(KLControlOptions{}.kl_coef(-1)).validate(),
                         doctest::Contains("kl_ctrl.kl_coef = -1"), Error);
    CHECK_THROWS_WITH_AS(GRPOOptions{}.actor(ActorLossOptions{}.kl_loss_coef(-0.5)).validate(),
                         doctest::Contains("kl_loss_coef = -0.5"), Error);
    CHECK_THROWS_WITH_AS(PPOOptions{}.lam(1.5).validate(), doctest::Contains("lam"), Error);
    CHECK_THROWS_AS(ppo_value_loss(at::ones({1, 2}), at::ones({1, 2}), at::ones({1, 2}),
                                   at::ones({1, 2}), -0.1),
                    Error);
    CHECK_NOTHROW(PPOOptions{}.validate());
  }
}

TEST_SUITE("algorithm/dpo") {
  TEST_CASE("sigmoid, cDPO, IPO, hinge by hand; implicit rewards and accuracy") {
    // pair 0: chosen ratio -1-(-2) = 1, rejected ratio -3-(-2) = -1 -> h = 2
    // pair 1: chosen ratio 0, rejected ratio 0.5 -> h = -0.5
    auto pc = vec({-1.0, -4.0}), pr = vec({-3.0, -2.5}), rc = vec({-2.0, -4.0}), rr = vec({-2.0, -3.0});
    const double b = 0.1;
    auto sig = dpo_loss(pc, pr, rc, rr, DPOOptions{}.beta(b));
    CHECK(val(sig.loss) == doctest::Approx((softplus(-b * 2) + softplus(b * 0.5)) / 2));
    CHECK(sig.chosen_rewards[0].item<double>() == doctest::Approx(0.1));
    CHECK(sig.rejected_rewards[0].item<double>() == doctest::Approx(-0.1));
    CHECK(val(sig.accuracy) == doctest::Approx(0.5));
    auto cdpo = dpo_loss(pc, pr, rc, rr, DPOOptions{}.beta(b).label_smoothing(0.1));
    CHECK(val(cdpo.loss) == doctest::Approx((0.9 * softplus(-0.2) + 0.1 * softplus(0.2) +
                                             0.9 * softplus(0.05) + 0.1 * softplus(-0.05)) / 2));
    auto ipo = dpo_loss(pc, pr, rc, rr, DPOOptions{}.beta(b).loss_type(DPOLoss::ipo));
    CHECK(val(ipo.loss) == doctest::Approx((9.0 + 30.25) / 2));  // (2-5)^2, (-0.5-5)^2
    auto hinge = dpo_loss(pc, pr, rc, rr, DPOOptions{}.beta(b).loss_type(DPOLoss::hinge));
    CHECK(val(hinge.loss) == doctest::Approx((0.8 + 1.05) / 2));
    // global normalisation: 2 pairs of 8 on 2 ranks -> sum / 8 * 2
    auto g = dpo_loss(pc, pr, rc, rr, DPOOptions{}.beta(b), LossCounts{0, 8, 2});
    CHECK(val(g.loss) == doctest::Approx((softplus(-0.2) + softplus(0.05)) / 4));
  }

  TEST_CASE("dpo_loss gradients = finite differences for each loss type") {
    at::manual_seed(3);
    auto x = at::randn({4, 4}, at::kDouble);  // rows: policy chosen, policy rejected, ref c, ref r
    for (auto type : {DPOLoss::sigmoid, DPOLoss::ipo, DPOLoss::hinge}) {
      auto opts = DPOOptions{}.beta(0.3).loss_type(type)
                      .label_smoothing(type == DPOLoss::sigmoid ? 0.2 : 0.0);
      auto ref = x.slice(0, 2, 4);
      check_gradient(x.slice(0, 0, 2).clone(), [&](const at::Tensor& p) {
        return dpo_loss(p[0], p[1], ref[0], ref[1], opts).loss;
      });
    }
  }

  TEST_CASE("validation: beta > 0, label smoothing in [0, 0.5] and only with sigmoid") {
    CHECK_THROWS_WITH_AS(DPOOptions{}.beta(-1).validate(), doctest::Contains("beta"), Error);
    CHECK_THROWS_AS(DPOOptions{}.label_smoothing(0.7).validate(), Error);
    CHECK_THROWS_AS(DPOOptions{}.label_smoothing(0.1).loss_type(DPOLoss::ipo).validate(), Error);
    CHECK_THROWS_AS(dpo_loss(at::ones({2}), at::ones({3}), at::ones({2}), at::ones({2})), Error);
  }
}

TEST_SUITE("algorithm/kto") {
  TEST_CASE("loss, z0 and rewards by hand") {
    auto policy = vec({-1, -2, -3, -4}), ref = vec({-2, -2, -1, -4});  // ratios 1, 0, -2, 0
    auto kl_policy = vec({-1, -1, -1, -1}), kl_ref = vec({-1.5, -1.2, -0.8, -1.0});
    auto desirable = bools({1, 0, 1, 0});
    // z0 = mean(0.5, 0.2, -0.2, 0) = 0.125
    const double b = 0.5, wd = 1.0, wu = 1.5, z0 = 0.125;
    auto r = kto_loss(policy, ref, kl_policy, kl_ref, desirable,
                      KTOOptions{}.beta(b).desirable_weight(wd).undesirable_weight(wu));
    CHECK(val(r.z0) == doctest::Approx(z0));
    const double want = (wd * (1 - sigmoid(b * (1 - z0))) + wu * (1 - sigmoid(b * (z0 - 0))) +
                         wd * (1 - sigmoid(b * (-2 - z0))) + wu * (1 - sigmoid(b * (z0 - 0)))) / 4;
    CHECK(val(r.loss) == doctest::Approx(want));
    CHECK(r.rewards[2].item<double>() == doctest::Approx(-1.0));
    // a negative KL estimate is clamped to 0
    auto neg = kto_loss(policy, ref, kl_ref, kl_policy, desirable, KTOOptions{});
    CHECK(val(neg.z0) == 0.0);
    // z0 is detached: no gradient flows into the KL completions
    auto klp = kl_policy.clone().set_requires_grad(true);
    auto pol = policy.clone().set_requires_grad(true);
    kto_loss(pol, ref, klp, kl_ref, desirable).loss.backward();
    CHECK(!klp.grad().defined());
    CHECK(pol.grad().defined());
  }

  TEST_CASE("kto_loss gradient = finite differences") {
    at::manual_seed(4);
    auto ref = at::randn({5}, at::kDouble), klp = at::randn({5}, at::kDouble);
    auto klr = klp - 0.3;
    auto desirable = bools({1, 1, 0, 1, 0});
    check_gradient(ref + at::randn({5}, at::kDouble), [&](const at::Tensor& p) {
      return kto_loss(p, ref, klp, klr, desirable, KTOOptions{}.beta(0.7).undesirable_weight(1.3),
                      LossCounts{0, 9, 1}).loss;
    });
  }

  TEST_CASE("mismatched pairs: TRL's rotation (prompt i, completion i-1), need a batch of at least 2") {
    // TRL _get_kl_dataset: completions' = [c[-1]] + c[:-1], so row i takes completion i - 1 mod B.
    for (int64_t n : {3, 4, 5}) {
      std::vector<int64_t> trl(static_cast<size_t>(n));
      trl[0] = n - 1;
      for (int64_t i = 1; i < n; ++i) trl[static_cast<size_t>(i)] = i - 1;
      CHECK(kto_mismatched_index(n).equal(at::tensor(trl)));
    }
    CHECK(kto_mismatched_index(3).equal(at::tensor({2L, 0L, 1L})));  // not i + 1 = {1, 2, 0}
    CHECK_THROWS_WITH_AS(kto_mismatched_index(1), doctest::Contains("at least 2"), Error);
    // a local z0 estimate (one rank) needs 2 rows; the loss given z0 does not
    CHECK_THROWS_WITH_AS(kto_kl_estimate(vec({1.0}), vec({0.5})), doctest::Contains("at least 2"), Error);
    CHECK(val(kto_loss_given_z0(vec({-1.0}), vec({-1.0}), at::scalar_tensor(0.0, at::kDouble),
                                bools({1})).loss) == doctest::Approx(0.5));  // 1 - sigmoid(0)
    CHECK_THROWS_AS(kto_loss(at::ones({2}), at::ones({2}), at::ones({2}), at::ones({2}),
                             at::ones({2})),  // labels not bool
                    Error);
    CHECK_THROWS_WITH_AS(KTOOptions{}.desirable_weight(-1).validate(),
                         doctest::Contains("desirable_weight"), Error);
  }
}

TEST_SUITE("algorithm/detach") {
  // A missing .detach() on old log-probs, advantages, returns, old values or reference log-probs
  // lets gradient flow into rollout-time data; each case gives those inputs requires_grad and
  // checks that they receive none while the trained input does.
  TEST_CASE("ppo_policy_loss: no gradient into old_logp or advantages") {
    auto lp = at::full({2, 3}, -1.0, at::kDouble).set_requires_grad(true);
    auto old_lp = at::full({2, 3}, -1.1, at::kDouble).set_requires_grad(true);
    auto adv = mat({{1, -1, 2}, {0.5, -2, 1}}).set_requires_grad(true);
    ppo_policy_loss(lp, old_lp, adv, at::ones({2, 3}, at::kDouble)).loss.backward();
    CHECK(lp.grad().defined());
    CHECK(!old_lp.grad().defined());
    CHECK(!adv.grad().defined());
  }

  TEST_CASE("ppo_value_loss: no gradient into old_values or returns") {
    auto v = mat({{1, 2}}).set_requires_grad(true);
    auto old_v = mat({{0.5, 2.5}}).set_requires_grad(true);
    auto ret = mat({{2, 1}}).set_requires_grad(true);
    ppo_value_loss(v, old_v, ret, at::ones({1, 2}, at::kDouble)).loss.backward();
    CHECK(v.grad().defined());
    CHECK(!old_v.grad().defined());
    CHECK(!ret.grad().defined());
  }

  TEST_CASE("actor_loss with KL loss and entropy: no gradient into ref_log_probs, old_log_probs, advantages") {
    auto lp = mat({{-1, -2}}).set_requires_grad(true);
    auto old_lp = mat({{-1.2, -1.9}}).set_requires_grad(true);
    auto ref = mat({{-1.5, -1.0}}).set_requires_grad(true);
    auto adv = mat({{1, -1}}).set_requires_grad(true);
    TensorBatch b({{keys::log_probs, lp}, {keys::old_log_probs, old_lp}, {keys::ref_log_probs, ref},
                   {keys::advantages, adv}, {keys::response_mask, at::ones({1, 2}, at::kDouble)},
                   {keys::entropy, mat({{0.3, 0.4}})}});
    actor_loss(b, ActorLossOptions{}.use_kl_loss(true).kl_loss_coef(0.5).entropy_coeff(0.1),
               LossCounts{})
        .loss.backward();
    CHECK(lp.grad().defined());
    CHECK(!old_lp.grad().defined());
    CHECK(!ref.grad().defined());
    CHECK(!adv.grad().defined());
  }

  TEST_CASE("dpo_loss and kto_loss: no gradient into the reference log-probs") {
    auto pc = vec({-1, -2}).set_requires_grad(true), pr = vec({-2, -1}).set_requires_grad(true);
    auto rc = vec({-1.5, -2}).set_requires_grad(true), rr = vec({-2, -1.5}).set_requires_grad(true);
    dpo_loss(pc, pr, rc, rr).loss.backward();
    CHECK(pc.grad().defined());
    CHECK(pr.grad().defined());
    CHECK(!rc.grad().defined());
    CHECK(!rr.grad().defined());
    auto p = vec({-1, -2, -3}).set_requires_grad(true), r = vec({-1.5, -2, -2}).set_requires_grad(true);
    auto klp = vec({-1, -1, -1}).set_requires_grad(true), klr = vec({-2, -1, -1}).set_requires_grad(true);
    kto_loss(p, r, klp, klr, bools({1, 0, 1})).loss.backward();
    CHECK(p.grad().defined());
    CHECK(!r.grad().defined());
    CHECK(!klp.grad().defined());
    CHECK(!klr.grad().defined());
  }

  TEST_CASE("advantages carry no graph: GRPO scores, PPO KL-in-reward inputs") {
    auto scores = vec({1, 0, 2}).set_requires_grad(true);
    auto adv = compute_grpo_advantages(scores, at::tensor({0L, 0L, 1L}), at::ones({3, 2}, at::kDouble));
    CHECK(!adv.requires_grad());
    auto old_lp = mat({{-1, -1}}).set_requires_grad(true);
    auto kl = apply_kl_penalty(mat({{0, 1}}), old_lp, mat({{-2, -1}}), at::ones({1, 2}, at::kDouble), 0.1);
    CHECK(!kl.token_level_rewards.requires_grad());
  }
}
