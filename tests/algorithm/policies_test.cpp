// The Algorithm policies: their hooks on hand-made batches, their options, their place in a
// trainer type, and the aggregation invariance — one batch split into 1, 2 or 4 micro-batches, or
// over 2 Gloo ranks, gives the same loss, the same parameter gradients and the same aggregated
// metrics.

#include <hybridrl/algorithm/algorithm.hpp>
#include <hybridrl/trainer/trainer.hpp>

#include "../../examples/custom_algorithm/rloo.hpp"  // the user-written RLOO policy of the example
#include "../support/gloo.hpp"

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using namespace hybridrl::testing;

namespace {


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
  return TensorBatch({{keys::response_mask, r.mask},
                      {keys::log_probs, lp},
                      {keys::old_log_probs, r.old_lp},
                      {keys::ref_log_probs, r.ref_lp},
                      {keys::advantages, r.adv},
                      {keys::entropy, 1.0 + at::matmul(r.entropy_x, w)},
                      {keys::values, r.old_values + at::matmul(r.x2, w)},
                      {keys::old_values, r.old_values},
                      {keys::returns, r.returns},
                      {keys::chosen_log_probs_sum, seq(r.x)},
                      {keys::rejected_log_probs_sum, seq(r.x2)},
                      {keys::ref_chosen_log_probs_sum, seq(r.x).detach() + 0.3},
                      {keys::ref_rejected_log_probs_sum, seq(r.x2).detach() - 0.1},
                      {keys::log_probs_sum, seq(r.x)},
                      {keys::ref_log_probs_sum, seq(r.x2).detach()},
                      {keys::kl_log_probs_sum, seq(r.entropy_x).detach()},
                      {keys::ref_kl_log_probs_sum, seq(r.x2).detach() - 0.2},
                      {keys::desirable, bools({1, 0, 1, 1, 0, 0, 1, 0})}});
}

/// One hook of one algorithm with fixed options, as the trainer drives it: a state per run (per
/// rank), `prepare` once per mini-batch (on this rank's part, reduced over `comm`), then `loss`
/// per micro-batch.
struct Case {
  std::string name;
  std::function<std::shared_ptr<void>()> new_state;
  std::function<void(void*, TensorBatch&, Communicator*)> prepare;
  std::function<LossOutput(void*, const TensorBatch&, const LossCounts&)> loss;
  bool sequence_level = false;  ///< DPO / KTO: every sample counts, masks play no part
};

/// A Case for hook `which` (0 = loss, 1 = value_loss) of algorithm A.
template <class A>
Case make_case(std::string name, typename A::options_type o, int which = 0, bool seq = false) {
  using S = typename A::state_type;
  Case c;
  c.name = std::move(name);
  c.sequence_level = seq;
  c.new_state = [o] { return std::shared_ptr<void>(std::make_shared<S>(A::make_state(o))); };
  c.prepare = [o](void* s, TensorBatch& b, Communicator* comm) {
    A::prepare_mini_batch(b, o, *static_cast<S*>(s), comm);
  };
  c.loss = [o, which](void* s, const TensorBatch& b, const LossCounts& n) {
    if constexpr (A::needs_critic) {
      if (which == 1) return A::value_loss(b, o, *static_cast<const S*>(s), n);
    }
    return A::loss(b, o, *static_cast<const S*>(s), n);
  };
  return c;
}

/// Global counts of the whole batch: valid tokens, and sequences (non-empty ones for token-level
/// losses, as verl counts them; every sample for the sequence-level DPO / KTO).
LossCounts global_counts(const Case& c, int64_t dp) {
  const auto& r = rollout();
  return LossCounts{r.tokens(), c.sequence_level ? B : r.nonempty_rows(), dp};
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (auto agg : {LossAgg::token_mean, LossAgg::seq_mean_token_sum, LossAgg::seq_mean_token_mean,
                   LossAgg::seq_mean_token_sum_norm}) {
    auto o = PPOOptions{};
    o.actor().loss_agg(agg).entropy_coeff(0.01).use_kl_loss(true).kl_loss_coef(0.1).clip_low(0.1)
        .clip_high(0.15);
    out.push_back(make_case<Algorithm<PPO>>("PPO actor " + std::string(enum_name(agg)), o));
    auto v = PPOOptions{}.value_loss_agg(agg).cliprange_value(0.2);
    out.push_back(make_case<Algorithm<PPO>>("PPO critic " + std::string(enum_name(agg)), v, 1));
  }
  out.push_back(make_case<Algorithm<GRPO>>("GRPO (Dr.GRPO)", GRPOOptions{}.dr_grpo(true)));
  out.push_back(make_case<Algorithm<GRPO>>("GRPO", GRPOOptions{}));
  out.push_back(make_case<Algorithm<DPO>>("DPO", DPOOptions{}.beta(0.5).label_smoothing(0.1), 0, true));
  out.push_back(make_case<Algorithm<KTO>>("KTO", KTOOptions{}.beta(0.5).undesirable_weight(1.2), 0, true));
  out.push_back(make_case<Algorithm<RLOO>>("RLOO (example)", RLOOOptions{}));
  return out;
}

at::Tensor w0() { return at::tensor(std::vector<double>{0.3, -0.2, 0.1}, at::kDouble); }

/// Loss and dL/dw of the whole batch in one piece (empty LossCounts: local counts), and its
/// metrics through the aggregator.
struct Reference {
  double loss;
  at::Tensor grad;
  std::map<std::string, double> metrics;
};
Reference reference(const Case& c) {
  auto w = w0().set_requires_grad(true);
  auto batch = make_batch(w);
  auto state = c.new_state();
  c.prepare(state.get(), batch, nullptr);
  auto out = c.loss(state.get(), batch, LossCounts{});
  out.loss.backward();
  MetricAggregator agg;
  agg.add(out);
  return {val(out.loss), w.grad().clone(), agg.result()};
}

void check_same_metrics(const std::map<std::string, double>& got, const std::map<std::string, double>& want) {
  CHECK(got.size() == want.size());
  for (const auto& [name, v] : want) {
    CAPTURE(name);
    REQUIRE(got.count(name) == 1);
    CHECK(got.at(name) == doctest::Approx(v).epsilon(1e-12).scale(1e-12));
  }
}

}  // namespace

TEST_SUITE("algorithm/invariance") {
  TEST_CASE("1, 2 or 4 micro-batches with global counts: same loss, same gradients, same metrics") {
    for (const auto& c : cases()) {
      CAPTURE(c.name);
      const auto counts = global_counts(c, 1);
      const auto ref = reference(c);
      CHECK(!ref.metrics.empty());
      for (int64_t k : {1, 2, 4}) {
        CAPTURE(k);
        auto w = w0().set_requires_grad(true);
        auto mini = make_batch(w);
        auto state = c.new_state();
        c.prepare(state.get(), mini, nullptr);  // once per mini-batch, before the micro-batch loop
        auto total = at::zeros({}, at::kDouble);
        MetricAggregator agg;
        for (const auto& m : mini.chunk(k)) {
          auto out = c.loss(state.get(), m, counts);
          total = total + out.loss;
          agg.add(out);
        }
        total.backward();
        CHECK(val(total) == doctest::Approx(ref.loss).epsilon(1e-12));
        CHECK(at::allclose(w.grad(), ref.grad, 1e-10, 1e-12));
        check_same_metrics(agg.result(), ref.metrics);
      }
    }
  }

  TEST_CASE("the weights matter: an unweighted mean of micro-batch means is not the batch mean") {
    // PPO's clip fraction over 4 micro-batches of unequal token counts (row 6 is fully masked).
    auto o = PPOOptions{};
    o.actor().clip_low(0.1).clip_high(0.15);
    const auto c = make_case<Algorithm<PPO>>("PPO", o);
    const auto ref = reference(c);
    double naive = 0;
    MetricAggregator agg;
    auto state = c.new_state();
    for (const auto& m : make_batch(w0()).chunk(4)) {
      auto out = c.loss(state.get(), m, global_counts(c, 1));
      naive += val(out.metrics.at("actor/pg_clipfrac").value) / 4;
      agg.add(out);
    }
    const double want = ref.metrics.at("actor/pg_clipfrac");
    CHECK(agg.result().at("actor/pg_clipfrac") == doctest::Approx(want).epsilon(1e-12));
    CHECK(std::abs(naive - want) > 1e-3);
  }

  TEST_CASE("2 ranks x 2 micro-batches, gradients all-reduced and averaged: same as 1 rank, metrics too") {
    for (const auto& c : cases()) {
      CAPTURE(c.name);
      const auto counts = global_counts(c, 2);
      const auto ref = reference(c);
      std::vector<double> losses(2);
      std::vector<at::Tensor> grads(2);
      std::vector<std::map<std::string, double>> metrics(2);
      testing::run_on(testing::backends().back(), 2, [&](Communicator& comm) {  // Gloo where present
        const int rank = comm.rank();
        auto w = w0().set_requires_grad(true);
        auto shard = make_batch(w).chunk(2)[static_cast<size_t>(rank)];
        auto state = c.new_state();
        c.prepare(state.get(), shard, &comm);  // KTO: z0 over both ranks' rows
        auto loss = at::zeros({}, at::kDouble);
        MetricAggregator agg;
        for (const auto& m : shard.chunk(2)) {
          auto out = c.loss(state.get(), m, counts);
          loss = loss + out.loss;
          agg.add(out);
        }
        loss.backward();
        auto grad = w.grad().clone();
        auto sum = loss.detach().clone();
        comm.all_reduce(grad, ReduceOp::sum);
        comm.all_reduce(sum, ReduceOp::sum);
        grads[static_cast<size_t>(rank)] = grad / 2.0;  // data-parallel average, as FSDP/DDP
        losses[static_cast<size_t>(rank)] = val(sum) / 2.0;
        metrics[static_cast<size_t>(rank)] = agg.result(&comm);
      });
      for (int rank = 0; rank < 2; ++rank) {
        CHECK(losses[static_cast<size_t>(rank)] == doctest::Approx(ref.loss).epsilon(1e-12));
        CHECK(at::allclose(grads[static_cast<size_t>(rank)], ref.grad, 1e-10, 1e-12));
        check_same_metrics(metrics[static_cast<size_t>(rank)], ref.metrics);
      }
    }
  }

  TEST_CASE("KTO z0: the exact mean over all rows of all ranks, then clamped") {
    // rank 0: KL terms {0.4, 0.2, 0.3}; rank 1: {-1.3}. Row mean (0.9 - 1.3) / 4 = -0.1 -> 0;
    // shifted by 0.2: 0.1. (The mean of the ranks' means, (0.3 - 1.3) / 2 + 0.2 = -0.3, would clamp
    // to 0, and rank 0 alone would give 0.5.)
    for (double shift : {0.0, 0.2}) {
      std::vector<double> z0(2), loss(2);
      testing::run_on(testing::backends().back(), 2, [&](Communicator& comm) {  // Gloo where present
        const int rank = comm.rank();
        auto klp = rank == 0 ? at::tensor(std::vector<double>{0.4, 0.2, 0.3})
                             : at::tensor(std::vector<double>{-1.3});
        const int64_t n = klp.size(0);
        TensorBatch mini({{keys::kl_log_probs_sum, klp + shift},
                          {keys::ref_kl_log_probs_sum, at::zeros({n}, at::kDouble)},
                          {keys::log_probs_sum, at::zeros({n}, at::kDouble)},
                          {keys::ref_log_probs_sum, at::zeros({n}, at::kDouble)},
                          {keys::desirable, rank == 0 ? bools({1, 0, 1}) : bools({0})}});
        const auto o = KTOOptions{}.beta(1.0);
        auto state = Algorithm<KTO>::make_state(o);
        Algorithm<KTO>::prepare_mini_batch(mini, o, state, &comm);
        z0[static_cast<size_t>(rank)] = val(state.z0);
        // rank 1 holds a single row: no "at least 2" error, z0 comes from the group
        loss[static_cast<size_t>(rank)] = val(Algorithm<KTO>::loss(mini, o, state, LossCounts{0, 4, 2}).loss);
      });
      const double want = std::max(0.0, -0.1 + shift);
      // ratios are 0: desirable 1 - s(-z0), undesirable 1 - s(z0); each rank's sum / 4 * 2
      const double d = 1 - 1 / (1 + std::exp(want)), u = 1 - 1 / (1 + std::exp(-want));
      CHECK(z0[0] == doctest::Approx(want));
      CHECK(z0[1] == doctest::Approx(want));
      CHECK(loss[0] == doctest::Approx((2 * d + u) / 2));
      CHECK(loss[1] == doctest::Approx(u / 2));
    }
  }
}

