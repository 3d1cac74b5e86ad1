// The Algorithm policies: their hooks on hand-made batches, their options, their place in a
// trainer type, and the aggregation invariance — one batch split into 1, 2 or 4 micro-batches, or
// over 2 Gloo ranks, gives the same loss and the same parameter gradients.

#include <hybridrl/algorithm/algorithm.hpp>
#include <hybridrl/trainer/trainer.hpp>

#include "../../examples/custom_algorithm/rloo.hpp"  // the user-written RLOO policy of the example
#include "../support/gloo.hpp"

#include <cmath>
#include <functional>
#include <string>
#include <vector>
#include <doctest/doctest.h>  // last: c10 defines a CHECK macro of its own

using namespace hybridrl;

namespace {

double val(const at::Tensor& t) { return t.item<double>(); }
at::Tensor bools(std::vector<int64_t> v) { return at::tensor(v, at::kLong).to(at::kBool); }

// ---- a tiny "model": per-token features X [B, T, F] and a parameter w [F] -----------------------

constexpr int64_t B = 8, T = 5, F = 3;

/// Rollout-time data shared by every case (deterministic); row 6 is fully masked.
struct RolloutData {
  at::Tensor x, x2, mask, old_lp, ref_lp, adv, old_values, returns, entropy_x;
  RolloutData() {
    at::manual_seed(7);
    x = at::randn({B, T, F}, at::kDouble) * 0.3;
    x2 = at::randn({B, T, F}, at::kDouble) * 0.3;
    entropy_x = at::randn({B, T, F}, at::kDouble) * 0.3;
    mask = (at::rand({B, T}, at::kDouble) > 0.35).to(at::kDouble);
    mask.select(1, 0).fill_(1.0);
    mask[6].zero_();
    old_lp = -at::rand({B, T}, at::kDouble) * 2 - 0.1;
    ref_lp = old_lp + at::randn({B, T}, at::kDouble) * 0.2;
    adv = at::randn({B, T}, at::kDouble);
    old_values = at::randn({B, T}, at::kDouble);
    returns = old_values + at::randn({B, T}, at::kDouble);
  }
  [[nodiscard]] int64_t tokens() const { return static_cast<int64_t>(val(mask.sum())); }
  [[nodiscard]] int64_t nonempty_rows() const { return static_cast<int64_t>(val((mask.sum(-1) > 0).sum())); }
};

const RolloutData& rollout() {
  static const RolloutData r;
  return r;
}

/// The full batch whose differentiable columns are functions of the parameter w.
TensorBatch make_batch(const at::Tensor& w) {
  const auto& r = rollout();
  auto lp = r.old_lp + at::matmul(r.x, w);  // log_probs move with w
  auto seq = [&](const at::Tensor& feats) { return at::matmul(feats, w).sum(-1) - 3.0; };
  TensorBatch b({{"response_mask", r.mask},
                 {"log_probs", lp},
                 {"old_log_probs", r.old_lp},
                 {"ref_log_probs", r.ref_lp},
                 {"advantages", r.adv},
                 {"entropy", 1.0 + at::matmul(r.entropy_x, w)},
                 {"values", r.old_values + at::matmul(r.x2, w)},
                 {"old_values", r.old_values},
                 {"returns", r.returns},
                 {"chosen_log_probs", seq(r.x)},
                 {"rejected_log_probs", seq(r.x2)},
                 {"ref_chosen_log_probs", seq(r.x).detach() + 0.3},
                 {"ref_rejected_log_probs", seq(r.x2).detach() - 0.1},
                 {"log_probs_sum", seq(r.x)},
                 {"ref_log_probs_sum", seq(r.x2).detach()},
                 {"kl_log_probs_sum", seq(r.entropy_x)},
                 {"kl_ref_log_probs_sum", seq(r.x2).detach() - 0.2},
                 {"desirable", bools({1, 0, 1, 1, 0, 0, 1, 0})}});
  // KTO's reference point over the whole mini-batch, as the trainer sets it before the update.
  b.set_meta("kto_z0", val(kto_kl_estimate(b.tensor("kl_log_probs_sum"), b.tensor("kl_ref_log_probs_sum"))));
  return b;
}

using Hook = std::function<LossOutput(const TensorBatch&, const LossCounts&)>;

struct Case {
  std::string name;
  Hook hook;
  bool sequence_level = false;  ///< DPO / KTO: every sample counts, masks play no part
};

/// Global counts of the whole batch: valid tokens, and sequences (non-empty ones for token-level
/// losses, as verl counts them; every sample for the sequence-level DPO / KTO).
LossCounts global_scale(const Case& c, int64_t dp) {
  const auto& r = rollout();
  return LossCounts{r.tokens(), c.sequence_level ? B : r.nonempty_rows(), dp};
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (auto agg : {LossAgg::token_mean, LossAgg::seq_mean_token_sum, LossAgg::seq_mean_token_mean,
                   LossAgg::seq_mean_token_sum_norm}) {
    auto o = PPOOptions{}.loss_agg(agg).entropy_coeff(0.01).use_kl_loss(true).kl_loss_coef(0.1)
                 .clip_low(0.1).clip_high(0.15);
    out.push_back({"PPO actor " + std::string(to_string(agg)),
                   [o](const TensorBatch& b, const LossCounts& s) { return Algorithm<PPO>::loss(b, o, s); }});
    auto v = PPOOptions{}.value_loss_agg(agg).cliprange_value(0.2);
    out.push_back({"PPO critic " + std::string(to_string(agg)),
                   [v](const TensorBatch& b, const LossCounts& s) { return Algorithm<PPO>::value_loss(b, v, s); }});
  }
  out.push_back({"GRPO (Dr.GRPO)", [](const TensorBatch& b, const LossCounts& s) {
                   return Algorithm<GRPO>::loss(b, GRPOOptions{}.dr_grpo(true), s);
                 }});
  out.push_back({"DPO", [](const TensorBatch& b, const LossCounts& s) {
                   return Algorithm<DPO>::loss(b, DPOOptions{}.beta(0.5).label_smoothing(0.1), s);
                 }, true});
  out.push_back({"KTO", [](const TensorBatch& b, const LossCounts& s) {
                   return Algorithm<KTO>::loss(b, KTOOptions{}.beta(0.5).undesirable_weight(1.2), s);
                 }, true});
  out.push_back({"RLOO (example)", [](const TensorBatch& b, const LossCounts& s) {
                   return Algorithm<RLOO>::loss(b, RLOOOptions{}, s);
                 }});
  return out;
}

at::Tensor w0() { return at::tensor(std::vector<double>{0.3, -0.2, 0.1}, at::kDouble); }

/// Loss and dL/dw of the whole batch in one piece (empty LossCounts: local counts).
std::pair<double, at::Tensor> reference(const Hook& hook) {
  auto w = w0().set_requires_grad(true);
  auto loss = hook(make_batch(w), LossCounts{}).loss;
  loss.backward();
  return {val(loss), w.grad().clone()};
}

}  // namespace

TEST_SUITE("algorithm/invariance") {
  TEST_CASE("1, 2 or 4 micro-batches with global counts: same loss, same gradients") {
    for (const auto& c : cases()) {
      CAPTURE(c.name);
      const auto scale = global_scale(c, 1);
      auto [ref_loss, ref_grad] = reference(c.hook);
      for (int64_t k : {1, 2, 4}) {
        CAPTURE(k);
        auto w = w0().set_requires_grad(true);
        auto micro = make_batch(w).chunk(k);
        auto total = at::zeros({}, at::kDouble);
        for (const auto& m : micro) total = total + c.hook(m, scale).loss;
        total.backward();
        CHECK(val(total) == doctest::Approx(ref_loss).epsilon(1e-12));
        CHECK(at::allclose(w.grad(), ref_grad, 1e-10, 1e-12));
      }
    }
  }

  TEST_CASE("2 Gloo ranks x 2 micro-batches, gradients all-reduced and averaged: same as 1 rank") {
    for (const auto& c : cases()) {
      CAPTURE(c.name);
      const auto scale = global_scale(c, 2);
      auto [ref_loss, ref_grad] = reference(c.hook);
      std::vector<double> losses(2);
      std::vector<at::Tensor> grads(2);
      testing::run_ranks(2, [&](int rank, hybridrl::testing::TestGroup& group) {
        auto w = w0().set_requires_grad(true);
        auto shard = make_batch(w).chunk(2)[static_cast<size_t>(rank)];
        auto loss = at::zeros({}, at::kDouble);
        for (const auto& m : shard.chunk(2)) loss = loss + c.hook(m, scale).loss;
        loss.backward();
        std::vector<at::Tensor> grad{w.grad()}, sum{loss.detach().reshape({1})};
        group.allreduce(grad)->wait();
        group.allreduce(sum)->wait();
        grads[static_cast<size_t>(rank)] = grad[0] / 2.0;  // data-parallel average, as FSDP/DDP
        losses[static_cast<size_t>(rank)] = val(sum[0]) / 2.0;
      });
      for (int rank = 0; rank < 2; ++rank) {
        CHECK(losses[static_cast<size_t>(rank)] == doctest::Approx(ref_loss).epsilon(1e-12));
        CHECK(at::allclose(grads[static_cast<size_t>(rank)], ref_grad, 1e-10, 1e-12));
      }
    }
  }

  TEST_CASE("KTO z0 averaged over the data-parallel group, then clamped") {
    // rank 0: KL terms {0.4, 0.2} (mean 0.3); rank 1: {-0.5, -0.3} (mean -0.4) -> group mean -0.05 -> 0
    // rank 1 alone would give 0, rank 0 alone 0.3: only the group mean is correct.
    for (double shift : {0.0, 0.2}) {
      std::vector<double> z0(2), loss(2);
      testing::run_ranks(2, [&](int rank, hybridrl::testing::TestGroup& group) {
        auto klp = rank == 0 ? at::tensor(std::vector<double>{0.4, 0.2})
                             : at::tensor(std::vector<double>{-0.5, -0.3});
        klp = klp + shift;
        AllReduceMean mean = [&](const at::Tensor& t) {
          std::vector<at::Tensor> buf{t.clone().reshape({1})};
          group.allreduce(buf)->wait();
          return (buf[0] / 2.0).reshape({});
        };
        auto out = kto_loss(at::zeros({2}, at::kDouble), at::zeros({2}, at::kDouble), klp,
                            at::zeros({2}, at::kDouble), bools({1, 0}), KTOOptions{}.beta(1.0),
                            LossCounts{0, 4, 2}, mean);
        z0[static_cast<size_t>(rank)] = val(out.z0);
        loss[static_cast<size_t>(rank)] = val(out.loss);
      });
      const double want = std::max(0.0, -0.05 + shift);
      // ratios are 0: desirable 1 - s(-z0), undesirable 1 - s(z0); sum / 4 * 2
      const double per_rank = ((1 - 1 / (1 + std::exp(want))) + (1 - 1 / (1 + std::exp(-want)))) / 2;
      for (int rank = 0; rank < 2; ++rank) {
        CHECK(z0[static_cast<size_t>(rank)] == doctest::Approx(want));
        CHECK(loss[static_cast<size_t>(rank)] == doctest::Approx(per_rank));
      }
    }
  }
}

TEST_SUITE("algorithm/policies") {
  TEST_CASE("PPO compute_advantages: KL in the reward, then GAE (gamma = lam = 1 by hand)") {
    // one sequence of 3 valid tokens + 1 pad, one of 2 valid tokens
    auto scores = at::tensor(std::vector<double>{0, 0, 1, 0, 0, 2, 0, 0}).reshape({2, 4});
    auto old_lp = at::full({2, 4}, -1.0, at::kDouble);
    auto ref_lp = at::tensor(std::vector<double>{-1.5, -1, -0.5, -9, -1, -2, -9, -9}).reshape({2, 4});
    auto mask = at::tensor(std::vector<double>{1, 1, 1, 0, 1, 1, 0, 0}).reshape({2, 4});
    auto values = at::zeros({2, 4}, at::kDouble);
    TensorBatch b({{"token_level_scores", scores}, {"old_log_probs", old_lp}, {"ref_log_probs", ref_lp},
                   {"response_mask", mask}, {"old_values", values}});
    b.set_meta("kl_coef", 0.1);
    Algorithm<PPO>::compute_advantages(b, PPOOptions{}.use_kl_in_reward(true));
    // k1 = old - ref: row 0 {0.5, 0, -0.5, -}, row 1 {0, 1, -, -}
    // rewards row 0 {-0.05, 0, 1.05, 0}, row 1 {0, 1.9, 0, 0}; returns = reverse sums (V = 0)
    const auto& ret = b.tensor("returns");
    CHECK(val(ret[0][0]) == doctest::Approx(1.0));
    CHECK(val(ret[0][1]) == doctest::Approx(1.05));
    CHECK(val(ret[0][2]) == doctest::Approx(1.05));
    CHECK(val(ret[1][0]) == doctest::Approx(1.9));
    CHECK(val(ret[1][1]) == doctest::Approx(1.9));
    CHECK(val(b.tensor("token_level_rewards")[0][0]) == doctest::Approx(-0.05));
    // reward_kl = mean(row means) = mean(0/3, 1/2) = 0.25
    CHECK(b.meta()["reward_kl"].get<double>() == doctest::Approx(0.25));
    CHECK(b.has_tensor("advantages"));
  }

  TEST_CASE("PPO loss hook = pg - entropy_coeff * H + kl_coef * k3 (hand values)") {
    auto lp = at::tensor(std::vector<double>{-1, -1}).reshape({1, 2});
    TensorBatch b({{"log_probs", lp}, {"old_log_probs", lp}, {"advantages", at::tensor(std::vector<double>{1, 3}).reshape({1, 2})},
                   {"response_mask", at::ones({1, 2}, at::kDouble)},
                   {"entropy", at::tensor(std::vector<double>{0.5, 1.5}).reshape({1, 2})},
                   {"ref_log_probs", at::tensor(std::vector<double>{-1, -1.5}).reshape({1, 2})}});
    auto o = PPOOptions{}.entropy_coeff(0.01).use_kl_loss(true).kl_loss_coef(0.1);
    auto out = Algorithm<PPO>::loss(b, o, LossCounts{});
    // ratio 1: pg = -(1 + 3) / 2 = -2; H = 1; k3 with d = {0, 0.5}: {0, e^-0.5 - 0.5}
    const double kl = (std::exp(-0.5) - 0.5) / 2;
    CHECK(val(out.loss) == doctest::Approx(-2.0 - 0.01 * 1.0 + 0.1 * kl));
    CHECK(val(out.metrics.at("actor/kl_loss")) == doctest::Approx(kl));
    CHECK(val(out.metrics.at("actor/entropy")) == doctest::Approx(1.0));
    b.erase("entropy");
    CHECK_THROWS_WITH_AS(Algorithm<PPO>::loss(b, o, LossCounts{}), doctest::Contains("entropy"), Error);
  }

  TEST_CASE("GRPO hook: scores or summed token rewards; Dr.GRPO switch") {
    TensorBatch b({{"token_level_rewards", at::tensor(std::vector<float>{0, 1, 0, 0, 0, 3}).reshape({3, 2})},
                   {"group_ids", at::tensor(std::vector<int64_t>{5, 5, 9})},
                   {"response_mask", at::ones({3, 2})}});
    Algorithm<GRPO>::compute_advantages(b, GRPOOptions{}.dr_grpo(true));
    // group 5: scores {1, 0}, mean 0.5 -> {0.5, -0.5}; group 9 singleton: 3 - 0 = 3
    CHECK(val(b.tensor("advantages")[0][1]) == doctest::Approx(0.5));
    CHECK(val(b.tensor("advantages")[1][0]) == doctest::Approx(-0.5));
    CHECK(val(b.tensor("returns")[2][0]) == doctest::Approx(3.0));
    CHECK(GRPOOptions{}.dr_grpo(true).dr_grpo());
    CHECK((GRPOOptions{}.dr_grpo(true).loss_agg() == LossAgg::seq_mean_token_sum_norm));
    CHECK(!GRPOOptions{}.dr_grpo(true).dr_grpo(false).dr_grpo());
    CHECK(GRPOOptions{}.norm_adv_by_std());
  }

  TEST_CASE("KTO hook rejects a batch of 1; DPO hook reports accuracy; defaults validate") {
    TensorBatch one({{"log_probs_sum", at::zeros({1})}, {"ref_log_probs_sum", at::zeros({1})},
                     {"kl_log_probs_sum", at::zeros({1})}, {"kl_ref_log_probs_sum", at::zeros({1})},
                     {"desirable", bools({1})}});
    CHECK_THROWS_WITH_AS(Algorithm<KTO>::loss(one, KTOOptions{}, LossCounts{}),
                         doctest::Contains("at least 2"), Error);
    auto b = make_batch(w0());
    auto out = Algorithm<DPO>::loss(b, DPOOptions{}, LossCounts{});
    CHECK(out.metrics.count("rewards/accuracies") == 1);
    CHECK_NOTHROW(PPOOptions{}.validate());
    CHECK_NOTHROW(GRPOOptions{}.validate());
    CHECK_NOTHROW(DPOOptions{}.validate());
    CHECK_NOTHROW(KTOOptions{}.validate());
    CHECK_THROWS_WITH_AS(GRPOOptions{}.kl_loss_coef(std::nan("")).validate(),
                         doctest::Contains("kl_loss_coef"), Error);
  }

  TEST_CASE("traits drive the trainer's compile-time rules; options are validated at construction") {
    static_assert(trainer_config<Algorithm<PPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>);
    static_assert(trainer_config<Algorithm<GRPO>, Sharding<TP3D>, Rollout<Paged>, Loader<Packed>>);
    static_assert(trainer_config<Algorithm<DPO>, Sharding<FSDP>, NoRollout, Loader<Packed>>);
    static_assert(trainer_config<Algorithm<KTO>, Sharding<FSDP>, NoRollout, Loader<Bucketed>>);
    static_assert(!trainer_config<Algorithm<DPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Packed>>);
    static_assert(!trainer_config<Algorithm<GRPO>, Sharding<FSDP>, NoRollout, Loader<Packed>>);
    static_assert(trainer_config<Algorithm<RLOO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>);
    static_assert(Algorithm<PPO>::needs_critic && !Algorithm<GRPO>::needs_critic);
    using PPOTrainer = Trainer<Algorithm<PPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
    CHECK_THROWS_WITH_AS(PPOTrainer(PPOTrainer::Options{}.algorithm(PPOOptions{}.clip_c(0.5))),
                         doctest::Contains("clip_c"), Error);
    CHECK_NOTHROW(PPOTrainer(PPOTrainer::Options{}));
  }

  TEST_CASE("the example's RLOO policy: leave-one-out advantages by hand") {
    TensorBatch b({{"scores", at::tensor(std::vector<float>{1, 0, 0, 1, 1, 0})},
                   {"group_ids", at::tensor(std::vector<int64_t>{0, 0, 0, 1, 1, 1})},
                   {"response_mask", at::ones({6, 2})}});
    Algorithm<RLOO>::compute_advantages(b, RLOOOptions{});
    // group 0 {1,0,0}: 1 - 0 = 1, 0 - 0.5 = -0.5 ; group 1 {1,1,0}: 1 - 0.5 = 0.5, 0 - 1 = -1
    const std::vector<double> want = {1, -0.5, -0.5, 0.5, 0.5, -1};
    for (int64_t i = 0; i < 6; ++i) CHECK(val(b.tensor("advantages")[i][1]) == doctest::Approx(want[i]));
  }
}
