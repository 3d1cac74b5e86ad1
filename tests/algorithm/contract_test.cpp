// The Algorithm contract a fit loop consumes: each hook's declared keys against what it really
// reads and writes; typed state (PPO's KL controller, KTO's z0); uses_reference; the metrics'
// values by hand and their aggregation; the built-ins' place in a trainer type.

#include <hybridrl/algorithm/algorithm.hpp>
#include <hybridrl/trainer/trainer.hpp>

#include "../../examples/custom_algorithm/rloo.hpp"  // the user-written RLOO policy of the example
#include "../support/gloo.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>
#include <set>
#include <string>
#include <vector>
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using namespace hybridrl::testing;

namespace {


/// A batch holding every key any built-in hook may read (B = 4, R = 3).
TensorBatch full_batch() {
  at::manual_seed(11);
  auto tok = [] { return at::randn({4, 3}, at::kDouble) * 0.3; };
  auto seq = [] { return at::randn({4}, at::kDouble) - 2.0; };
  auto old_lp = -at::rand({4, 3}, at::kDouble) - 0.5;
  return TensorBatch({{keys::response_mask, at::ones({4, 3}, at::kDouble)},
                      {keys::log_probs, old_lp + tok()},
                      {keys::old_log_probs, old_lp},
                      {keys::ref_log_probs, old_lp + tok()},
                      {keys::advantages, tok()},
                      {keys::entropy, tok().abs()},
                      {keys::values, tok()},
                      {keys::old_values, tok()},
                      {keys::returns, tok()},
                      {keys::token_level_scores, tok()},
                      {keys::scores, vec({1, 0, 1, 1})},
                      {keys::group_ids, at::tensor(std::vector<int64_t>{0, 0, 1, 1})},
                      {keys::chosen_log_probs_sum, seq()},
                      {keys::rejected_log_probs_sum, seq()},
                      {keys::ref_chosen_log_probs_sum, seq()},
                      {keys::ref_rejected_log_probs_sum, seq()},
                      {keys::log_probs_sum, seq()},
                      {keys::ref_log_probs_sum, seq()},
                      {keys::kl_log_probs_sum, seq()},
                      {keys::ref_kl_log_probs_sum, seq()},
                      {keys::desirable, bools({1, 0, 0, 1})}});
}

std::vector<std::string> names(const std::vector<Key>& ks) {
  std::vector<std::string> out;
  for (const auto& k : ks) out.emplace_back(k.name);
  return out;
}

/// A hook run on a batch that holds exactly `declared` (it may add keys).
struct HookCase {
  std::string name;
  std::vector<Key> reads;
  std::vector<Key> writes;  ///< checked for compute_advantages only
  std::function<void(TensorBatch&)> run;
};

template <class A>
void add_cases(std::vector<HookCase>& out, const std::string& name, const typename A::options_type& o) {
  if constexpr (is_online_v<A>) {
    out.push_back({name + " compute_advantages", A::advantage_reads(o), A::advantage_writes(o),
                   [o](TensorBatch& b) {
                     auto s = A::make_state(o);
                     A::compute_advantages(b, o, s);
                   }});
  }
  auto prepare_reads = A::prepare_reads(o);
  auto loss_reads = A::loss_reads(o);
  // The loss runs after prepare_mini_batch in the trainer: test prepare alone, and the loss with
  // the state prepare left (prepared on the full batch, so only the loss's keys are removed).
  if (!prepare_reads.empty()) {
    out.push_back({name + " prepare_mini_batch", prepare_reads, {}, [o](TensorBatch& b) {
                     auto s = A::make_state(o);
                     A::prepare_mini_batch(b, o, s, nullptr);
                   }});
  }
  out.push_back({name + " loss", loss_reads, {}, [o](TensorBatch& b) {
                   auto s = A::make_state(o);
                   auto full = full_batch();
                   A::prepare_mini_batch(full, o, s, nullptr);
                   (void)A::loss(b, o, s, LossCounts{});
                 }});
  if constexpr (A::needs_critic) {
    out.push_back({name + " value_loss", A::value_loss_reads(o), {}, [o](TensorBatch& b) {
                     (void)A::value_loss(b, o, A::make_state(o), LossCounts{});
                   }});
  }
}

std::vector<HookCase> hook_cases() {
  std::vector<HookCase> out;
  add_cases<Algorithm<PPO>>(out, "PPO (defaults)", PPOOptions{});
  auto ppo = PPOOptions{}.use_kl_in_reward(true);
  ppo.actor().entropy_coeff(0.01).use_kl_loss(true);
  add_cases<Algorithm<PPO>>(out, "PPO (KL in reward, entropy, KL loss)", ppo);
  add_cases<Algorithm<GRPO>>(out, "GRPO (defaults)", GRPOOptions{});
  auto grpo = GRPOOptions{};
  grpo.actor().use_kl_loss(false);
  add_cases<Algorithm<GRPO>>(out, "GRPO (no KL loss)", grpo);
  add_cases<Algorithm<DPO>>(out, "DPO", DPOOptions{});
  add_cases<Algorithm<KTO>>(out, "KTO", KTOOptions{});
  add_cases<Algorithm<RLOO>>(out, "RLOO (example)", RLOOOptions{});
  return out;
}

}  // namespace

TEST_SUITE("algorithm/contract") {
  TEST_CASE("every hook runs on exactly its declared keys, and fails without any one of them") {
    const auto full = full_batch();
    for (const auto& c : hook_cases()) {
      CAPTURE(c.name);
      REQUIRE(!c.reads.empty());
      auto only = full.select(names(c.reads));
      CHECK_NOTHROW(c.run(only));
      if (!c.writes.empty()) {  // it wrote exactly what it declared
        const auto read = names(c.reads);
        std::set<std::string> added;
        for (const auto& k : only.tensor_keys()) {
          if (std::find(read.begin(), read.end(), k) == read.end()) added.insert(k);
        }
        auto w = names(c.writes);
        CHECK(added == std::set<std::string>(w.begin(), w.end()));
      }
      for (const auto& missing : c.reads) {
        CAPTURE(missing.name);
        std::vector<Key> rest;
        for (const auto& k : c.reads) {
          if (!(k == missing)) rest.push_back(k);
        }
        auto partial = full.select(names(rest));
        const std::string missing_name(missing.name);
        CHECK_THROWS_WITH_AS(c.run(partial), doctest::Contains(missing_name.c_str()), Error);
      }
    }
  }

  TEST_CASE("every declared key is a cross-axis key of core/keys.hpp") {
    for (const auto& c : hook_cases()) {
      CAPTURE(c.name);
      for (const auto& k : c.reads) CHECK(keys::find(k.name) != nullptr);
      for (const auto& k : c.writes) CHECK(keys::find(k.name) != nullptr);
    }
  }

  TEST_CASE("docs/algorithms.md's key table is the hooks' declarations") {
    std::ifstream in(std::string(HYBRIDRL_FIXTURES_DIR) + "/../../docs/algorithms.md");
    REQUIRE(in.good());
    std::stringstream doc;
    doc << in.rdbuf();
    auto list = [](const std::vector<Key>& ks) {
      if (ks.empty()) return std::string("—");
      std::string out;
      for (const auto& k : ks) out += (out.empty() ? "`" : ", `") + std::string(k.name) + "`";
      return out;
    };
    auto row = [&](const char* alg, const char* hook, const char* opts, const std::vector<Key>& reads,
                   const std::vector<Key>& writes) {
      return fmt::format("| {} | {} | {} | {} | {} |", alg, hook, opts, list(reads), list(writes));
    };
    using P = Algorithm<PPO>;
    using G = Algorithm<GRPO>;
    auto kl_reward = PPOOptions{}.use_kl_in_reward(true);
    auto ppo_full = PPOOptions{};
    ppo_full.actor().entropy_coeff(0.01).use_kl_loss(true);
    auto grpo_no_kl = GRPOOptions{};
    grpo_no_kl.actor().use_kl_loss(false);
    const PPOOptions ppo;
    const GRPOOptions grpo;
    const std::vector<std::string> rows = {
        row("PPO", "compute_advantages", "defaults", P::advantage_reads(ppo), P::advantage_writes(ppo)),
        row("PPO", "compute_advantages", "use_kl_in_reward", P::advantage_reads(kl_reward),
            P::advantage_writes(kl_reward)),
        row("PPO", "loss", "defaults", P::loss_reads(ppo), {}),
        row("PPO", "loss", "entropy_coeff ≠ 0, use_kl_loss", P::loss_reads(ppo_full), {}),
        row("PPO", "value_loss", "defaults", P::value_loss_reads(ppo), {}),
        row("GRPO", "compute_advantages", "defaults", G::advantage_reads(grpo), G::advantage_writes(grpo)),
        row("GRPO", "loss", "defaults", G::loss_reads(grpo), {}),
        row("GRPO", "loss", "use_kl_loss = false", G::loss_reads(grpo_no_kl), {}),
        row("DPO", "loss", "defaults", Algorithm<DPO>::loss_reads(DPOOptions{}), {}),
        row("KTO", "prepare_mini_batch", "defaults", Algorithm<KTO>::prepare_reads(KTOOptions{}), {}),
        row("KTO", "loss", "defaults", Algorithm<KTO>::loss_reads(KTOOptions{}), {}),
    };
    for (const auto& r : rows) {
      CAPTURE(r);
      CHECK(doc.str().find(r) != std::string::npos);
    }
  }

  TEST_CASE("uses_reference follows the options; the base's default follows needs_reference") {
    auto ppo_kl_loss = PPOOptions{};
    ppo_kl_loss.actor().use_kl_loss(true);
    auto grpo_no_kl = GRPOOptions{};
    grpo_no_kl.actor().use_kl_loss(false);
    CHECK(!Algorithm<PPO>::uses_reference(PPOOptions{}));  // default PPO never reads the reference
    CHECK(Algorithm<PPO>::uses_reference(PPOOptions{}.use_kl_in_reward(true)));
    CHECK(Algorithm<PPO>::uses_reference(ppo_kl_loss));
    CHECK(Algorithm<GRPO>::uses_reference(GRPOOptions{}));
    CHECK(!Algorithm<GRPO>::uses_reference(grpo_no_kl));
    CHECK(Algorithm<DPO>::uses_reference(DPOOptions{}));
    CHECK(Algorithm<KTO>::uses_reference(KTOOptions{}));
    CHECK(!Algorithm<RLOO>::uses_reference(RLOOOptions{}));
  }
}

TEST_SUITE("algorithm/policies") {
  TEST_CASE("PPO: KL in the reward with the state's controller, GAE, then after_step adapts beta") {
    // one sequence of 3 valid tokens + 1 pad, one of 2 valid tokens
    auto scores = vec({0, 0, 1, 0, 0, 2, 0, 0}).reshape({2, 4});
    auto old_lp = at::full({2, 4}, -1.0, at::kDouble);
    auto ref_lp = vec({-1.5, -1, -0.5, -9, -1, -2, -9, -9}).reshape({2, 4});
    auto mask = vec({1, 1, 1, 0, 1, 1, 0, 0}).reshape({2, 4});
    TensorBatch b({{keys::token_level_scores, scores}, {keys::old_log_probs, old_lp},
                   {keys::ref_log_probs, ref_lp}, {keys::response_mask, mask},
                   {keys::old_values, at::zeros({2, 4}, at::kDouble)}});
    auto o = PPOOptions{}.use_kl_in_reward(true).kl_ctrl(
        KLControlOptions{}.type(KLControl::adaptive).kl_coef(0.1).target_kl(0.2).horizon(1000));
    auto state = Algorithm<PPO>::make_state(o);
    CHECK(state.kl_ctrl.value() == doctest::Approx(0.1));
    Algorithm<PPO>::compute_advantages(b, o, state);
    // k1 = old - ref: row 0 {0.5, 0, -0.5, -}, row 1 {0, 1, -, -}
    // rewards row 0 {-0.05, 0, 1.05, 0}, row 1 {0, 1.9, 0, 0}; returns = reverse sums (V = 0)
    const auto& ret = b.tensor(keys::returns);
    CHECK(val(ret[0][0]) == doctest::Approx(1.0));
    CHECK(val(ret[0][1]) == doctest::Approx(1.05));
    CHECK(val(ret[0][2]) == doctest::Approx(1.05));
    CHECK(val(ret[1][0]) == doctest::Approx(1.9));
    CHECK(val(ret[1][1]) == doctest::Approx(1.9));
    CHECK(val(b.tensor(keys::token_level_rewards)[0][0]) == doctest::Approx(-0.05));
    // reward KL = mean(row means) = mean(0/3, 1/2) = 0.25, kept in the state (not in meta)
    CHECK(val(state.reward_kl) == doctest::Approx(0.25));
    CHECK(b.meta().empty());
    // after_step: e = clip(0.25 / 0.2 - 1, ±0.2) = 0.2; beta = 0.1 (1 + 0.2 * 2 / 1000) = 0.10004
    Algorithm<PPO>::after_step(b, o, state, nullptr);
    CHECK(state.kl_ctrl.value() == doctest::Approx(0.10004).epsilon(1e-12));
    CHECK(!state.reward_kl.defined());
    // the next compute_advantages uses the new beta: reward[0][0] = -0.10004 * 0.5
    Algorithm<PPO>::compute_advantages(b, o, state);
    CHECK(val(b.tensor(keys::token_level_rewards)[0][0]) == doctest::Approx(-0.05002).epsilon(1e-12));
    // without KL in the reward the token rewards are the scores
    TensorBatch plain = b.select(names(Algorithm<PPO>::advantage_reads(PPOOptions{})));
    auto s0 = Algorithm<PPO>::make_state(PPOOptions{});
    Algorithm<PPO>::compute_advantages(plain, PPOOptions{}, s0);
    CHECK(plain.tensor(keys::token_level_rewards).equal(scores));
  }

  TEST_CASE("PPO after_step over 2 ranks: sequence-weighted KL, total samples") {
    // rank 0: KL 0.1 over 3 sequences; rank 1: KL 0.5 over 1 -> (0.3 + 0.5) / 4 = 0.2 = target,
    // so an adaptive controller keeps beta; the unweighted mean 0.3 would raise it.
    std::vector<double> beta(2);
    testing::run_on(testing::backends().back(), 2, [&](Communicator& comm) {  // Gloo where present
      const int rank = comm.rank();
      auto o = PPOOptions{}.use_kl_in_reward(true).kl_ctrl(
          KLControlOptions{}.type(KLControl::adaptive).kl_coef(0.1).target_kl(0.2).horizon(100));
      auto state = Algorithm<PPO>::make_state(o);
      state.reward_kl = at::scalar_tensor(rank == 0 ? 0.1 : 0.5, at::kDouble);
      state.reward_kl_sequences = rank == 0 ? 3 : 1;
      Algorithm<PPO>::after_step(TensorBatch{}, o, state, &comm);
      beta[static_cast<size_t>(rank)] = state.kl_ctrl.value();
    });
    CHECK(beta[0] == doctest::Approx(0.1).epsilon(1e-12));
    CHECK(beta[1] == doctest::Approx(0.1).epsilon(1e-12));
  }

  TEST_CASE("PPO loss hook = pg - entropy_coeff * H + kl_coef * k3 (hand values, metrics too)") {
    auto lp = vec({-1, -1}).reshape({1, 2});
    TensorBatch b({{keys::log_probs, lp}, {keys::old_log_probs, lp},
                   {keys::advantages, vec({1, 3}).reshape({1, 2})},
                   {keys::response_mask, at::ones({1, 2}, at::kDouble)},
                   {keys::entropy, vec({0.5, 1.5}).reshape({1, 2})},
                   {keys::ref_log_probs, vec({-1, -1.5}).reshape({1, 2})}});
    auto o = PPOOptions{};
    o.actor().entropy_coeff(0.01).use_kl_loss(true).kl_loss_coef(0.1);
    const auto state = Algorithm<PPO>::make_state(o);
    // 2 data-parallel ranks, this rank holds 2 of the 4 global tokens (1 of 2 sequences)
    auto out = Algorithm<PPO>::loss(b, o, state, LossCounts{4, 2, 2});
    // ratio 1: pg = -(1 + 3) / 4 * 2 = -2; H = (0.5 + 1.5) / 4 * 2 = 1; k3 with d = {0, 0.5}:
    // {0, e^-0.5 - 0.5} / 4 * 2
    const double kl = (std::exp(-0.5) - 0.5) / 2;
    CHECK(val(out.loss) == doctest::Approx(-2.0 - 0.01 * 1.0 + 0.1 * kl));
    // shares are the loss terms divided by the data-parallel size (sum over ranks = global value)
    CHECK(val(out.metrics.at("actor/pg_loss").value) == doctest::Approx(-1.0));
    CHECK(out.metrics.at("actor/pg_loss").reduce == Reduce::sum);
    CHECK(val(out.metrics.at("actor/kl_loss").value) == doctest::Approx(kl / 2));
    CHECK(val(out.metrics.at("actor/entropy").value) == doctest::Approx(0.5));
    CHECK(val(out.metrics.at("actor/pg_clipfrac").value) == 0.0);
    CHECK(out.metrics.at("actor/pg_clipfrac").reduce == Reduce::token_mean);
    CHECK(val(out.metrics.at("actor/pg_clipfrac").weight) == 2.0);  // this micro-batch's tokens
    CHECK(val(out.metrics.at("actor/kl_coef").value) == doctest::Approx(0.1));
    b.erase(keys::entropy);
    CHECK_THROWS_WITH_AS(Algorithm<PPO>::loss(b, o, state, LossCounts{}), doctest::Contains("entropy"), Error);
  }

  TEST_CASE("GRPO hook: group advantages of the scores; an all-equal group gets 0; Dr.GRPO switch") {
    TensorBatch b({{keys::scores, vec({1, 0, 3, 3})},
                   {keys::group_ids, at::tensor(std::vector<int64_t>{5, 5, 9, 9})},
                   {keys::response_mask, at::ones({4, 2}, at::kDouble)}});
    auto s = Algorithm<GRPO>::make_state(GRPOOptions{});
    Algorithm<GRPO>::compute_advantages(b, GRPOOptions{}.dr_grpo(true), s);
    // group 5: {1, 0}, mean 0.5 -> {0.5, -0.5}; group 9 {3, 3}: 0
    CHECK(val(b.tensor(keys::advantages)[0][1]) == doctest::Approx(0.5));
    CHECK(val(b.tensor(keys::advantages)[1][0]) == doctest::Approx(-0.5));
    CHECK(val(b.tensor(keys::returns)[2][0]) == 0.0);
    Algorithm<GRPO>::compute_advantages(b, GRPOOptions{}, s);
    // std normalised: 0.5 / (sqrt(0.5) + 1e-6); the all-equal group is 0, not NaN
    CHECK(val(b.tensor(keys::advantages)[0][0]) == doctest::Approx(0.5 / (std::sqrt(0.5) + 1e-6)).epsilon(1e-12));
    CHECK(val(b.tensor(keys::advantages)[3][1]) == 0.0);
    CHECK(GRPOOptions{}.dr_grpo(true).dr_grpo());
    CHECK((GRPOOptions{}.dr_grpo(true).actor().loss_agg() == LossAgg::seq_mean_token_sum_norm));
    CHECK(!GRPOOptions{}.dr_grpo(true).dr_grpo(false).dr_grpo());
    CHECK(GRPOOptions{}.norm_adv_by_std());
    CHECK(GRPOOptions{}.actor().use_kl_loss());
  }

  TEST_CASE("DPO hook: loss and reward metrics by hand") {
    // pair 0: chosen ratio -1-(-2) = 1, rejected ratio -3-(-2) = -1 -> h = 2
    // pair 1: chosen ratio 0, rejected ratio -2.5-(-3) = 0.5 -> h = -0.5
    TensorBatch b({{keys::chosen_log_probs_sum, vec({-1.0, -4.0})},
                   {keys::rejected_log_probs_sum, vec({-3.0, -2.5})},
                   {keys::ref_chosen_log_probs_sum, vec({-2.0, -4.0})},
                   {keys::ref_rejected_log_probs_sum, vec({-2.0, -3.0})}});
    const auto o = DPOOptions{}.beta(0.1);
    auto out = Algorithm<DPO>::loss(b, o, Algorithm<DPO>::make_state(o), LossCounts{});
    const auto& m = out.metrics;
    CHECK(val(out.loss) == doctest::Approx((softplus(-0.2) + softplus(0.05)) / 2));
    CHECK(val(m.at("dpo/loss").value) == doctest::Approx((softplus(-0.2) + softplus(0.05)) / 2));
    // rewards: chosen beta * {1, 0} = {0.1, 0}, rejected beta * {-1, 0.5} = {-0.1, 0.05}
    CHECK(val(m.at("rewards/chosen").value) == doctest::Approx(0.05));
    CHECK(val(m.at("rewards/rejected").value) == doctest::Approx(-0.025));
    CHECK(val(m.at("rewards/margins").value) == doctest::Approx((0.2 - 0.05) / 2));
    CHECK(val(m.at("rewards/accuracies").value) == doctest::Approx(0.5));
    CHECK(m.at("rewards/chosen").reduce == Reduce::sequence_mean);
    CHECK(val(m.at("rewards/chosen").weight) == 2.0);
  }

  TEST_CASE("KTO hook: z0 from prepare_mini_batch, loss and metrics by hand; no z0 is an error") {
    // ratios 1, 0.4, -2, 0; desirable rows 0 and 2; mismatched KL terms 0.5, 0.2, -0.2, 0 -> z0 0.125
    TensorBatch b({{keys::log_probs_sum, vec({-1, -2, -3, -4})},
                   {keys::ref_log_probs_sum, vec({-2, -2.4, -1, -4})},
                   {keys::kl_log_probs_sum, vec({-1, -1, -1, -1})},
                   {keys::ref_kl_log_probs_sum, vec({-1.5, -1.2, -0.8, -1.0})},
                   {keys::desirable, bools({1, 0, 1, 0})}});
    const double beta = 0.5, wu = 1.5, z0 = 0.125;
    const auto o = KTOOptions{}.beta(beta).undesirable_weight(wu);
    auto state = Algorithm<KTO>::make_state(o);
    CHECK_THROWS_WITH_AS(Algorithm<KTO>::loss(b, o, state, LossCounts{}),
                         doctest::Contains("prepare_mini_batch"), Error);
    Algorithm<KTO>::prepare_mini_batch(b, o, state, nullptr);
    CHECK(val(state.z0) == doctest::Approx(z0));
    auto out = Algorithm<KTO>::loss(b, o, state, LossCounts{});
    const double want = ((1 - sigmoid(beta * (1 - z0))) + wu * (1 - sigmoid(beta * (z0 - 0.4))) +
                         (1 - sigmoid(beta * (-2 - z0))) + wu * (1 - sigmoid(beta * z0))) / 4;
    CHECK(val(out.loss) == doctest::Approx(want));
    CHECK(val(out.metrics.at("kto/loss").value) == doctest::Approx(want));
    CHECK(val(out.metrics.at("kto/kl").value) == doctest::Approx(z0));
    // implied rewards beta * ratio = {0.5, 0.2, -1, 0}: desirable mean (0.5 - 1) / 2 = -0.25,
    // undesirable mean (0.2 + 0) / 2 = 0.1 (swapping the labels would swap these)
    CHECK(val(out.metrics.at("rewards/chosen").value) == doctest::Approx(-0.25));
    CHECK(val(out.metrics.at("rewards/rejected").value) == doctest::Approx(0.1));
    CHECK(val(out.metrics.at("rewards/chosen").weight) == 2.0);
    // a micro-batch of one row works with the mini-batch's z0 (the B >= 2 check is for local z0)
    CHECK_NOTHROW((void)Algorithm<KTO>::loss(b.slice(0, 1), o, state, LossCounts{0, 4, 1}));
    TensorBatch one = b.slice(0, 1);
    CHECK_THROWS_WITH_AS(Algorithm<KTO>::prepare_mini_batch(one, o, state, nullptr),
                         doctest::Contains("at least 2"), Error);
  }

  TEST_CASE("defaults validate; options name the field") {
    CHECK_NOTHROW(PPOOptions{}.validate());
    CHECK_NOTHROW(GRPOOptions{}.validate());
    CHECK_NOTHROW(DPOOptions{}.validate());
    CHECK_NOTHROW(KTOOptions{}.validate());
    CHECK_NOTHROW(RLOOOptions{}.validate());
    auto g = GRPOOptions{};
    g.actor().kl_loss_coef(std::nan(""));
    CHECK_THROWS_WITH_AS(g.validate(), doctest::Contains("kl_loss_coef = nan"), Error);
    CHECK_THROWS_WITH_AS(KTOOptions{}.undesirable_weight(-1).validate(),
                         doctest::Contains("undesirable_weight = -1 must"), Error);
  }

  TEST_CASE("every algorithm Options struct has a field visitor") {
    static_assert(reflectable_options<ActorLossOptions> && reflectable_options<KLControlOptions>);
    static_assert(reflectable_options<PPOOptions> && reflectable_options<GRPOOptions>);
    static_assert(reflectable_options<DPOOptions> && reflectable_options<KTOOptions>);
    static_assert(reflectable_options<RLOOOptions>);
    std::vector<std::string> fields;
    const PPOOptions ppo;
    PPOOptions::visit_fields(ppo, [&](std::string_view n, const auto&) { fields.emplace_back(n); });
    CHECK(fields == std::vector<std::string>{"actor", "gamma", "lam", "use_kl_in_reward", "kl_penalty",
                                             "kl_ctrl", "cliprange_value", "value_loss_agg"});
    CHECK(enum_from_name<DPOLoss>("ipo") == DPOLoss::ipo);
    CHECK(enum_name(Reduce::sequence_mean) == "sequence_mean");
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
    static_assert(!Algorithm<RLOO>::needs_reference && !Algorithm<RLOO>::needs_critic);
    static_assert(std::is_same_v<Algorithm<RLOO>::state_type, NoAlgorithmState>);
    using PPOTrainer = Trainer<Algorithm<PPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
    CHECK_THROWS_WITH_AS(PPOTrainer(PPOTrainer::Options{}.algorithm(
                             PPOOptions{}.actor(ActorLossOptions{}.clip_c(0.5)))),
                         doctest::Contains("clip_c"), Error);
    CHECK_NOTHROW(PPOTrainer(PPOTrainer::Options{}));
  }

  TEST_CASE("the example's RLOO policy: leave-one-out advantages by hand") {
    TensorBatch b({{keys::scores, at::tensor(std::vector<float>{1, 0, 0, 1, 1, 0})},
                   {keys::group_ids, at::tensor(std::vector<int64_t>{0, 0, 0, 1, 1, 1})},
                   {keys::response_mask, at::ones({6, 2})}});
    auto s = Algorithm<RLOO>::make_state(RLOOOptions{});
    Algorithm<RLOO>::compute_advantages(b, RLOOOptions{}, s);
    // group 0 {1,0,0}: 1 - 0 = 1, 0 - 0.5 = -0.5 ; group 1 {1,1,0}: 1 - 0.5 = 0.5, 0 - 1 = -1
    const std::vector<double> want = {1, -0.5, -0.5, 0.5, 0.5, -1};
    for (int64_t i = 0; i < 6; ++i) CHECK(val(b.tensor(keys::advantages)[i][1]) == doctest::Approx(want[i]));
  }
}

TEST_SUITE("algorithm/metrics") {
  TEST_CASE("the aggregator by hand: sums add, means weigh, maxima max") {
    MetricAggregator agg;
    auto s = [](double v) { return at::scalar_tensor(v, at::kDouble); };
    agg.add({{"loss", Metric::sum(s(1.0))}, {"frac", Metric::token_mean(s(0.5), s(2))},
             {"acc", Metric::sequence_mean(s(1.0), 1)}, {"peak", Metric::max(s(3.0))}});
    agg.add({{"loss", Metric::sum(s(2.0))}, {"frac", Metric::token_mean(s(1.0), s(6))},
             {"acc", Metric::sequence_mean(s(0.0), 3)}, {"peak", Metric::max(s(-1.0))}});
    agg.add({{"frac", Metric::token_mean(s(0.0), s(0))}});  // an all-padding micro-batch
    auto r = agg.result();
    CHECK(r.at("loss") == 3.0);
    CHECK(r.at("frac") == doctest::Approx((0.5 * 2 + 1.0 * 6) / 8));  // 0.875, not (0.5 + 1) / 2
    CHECK(r.at("acc") == doctest::Approx(0.25));                      // (1 + 0) / 4
    CHECK(r.at("peak") == 3.0);
    CHECK_THROWS_WITH_AS(agg.add({{"loss", Metric::max(s(1.0))}}), doctest::Contains("loss"), Error);
    CHECK_THROWS_WITH_AS(agg.add({{"x", Metric{s(1.0), Reduce::token_mean, {}}}}),
                         doctest::Contains("without a weight"), Error);
    agg.clear();
    CHECK(agg.empty());
    CHECK(agg.result().empty());
  }

  TEST_CASE("over ranks: shares summed, means weighted by every rank's counts, maxima over ranks") {
    std::vector<std::map<std::string, double>> r(2);
    testing::run_on(testing::backends().back(), 2, [&](Communicator& comm) {  // Gloo where present
      const int rank = comm.rank();
      auto s = [](double v) { return at::scalar_tensor(v, at::kDouble); };
      MetricAggregator agg;
      if (rank == 0) {
        agg.add({{"loss", Metric::sum(s(1.0))}, {"frac", Metric::token_mean(s(0.5), s(2))},
                 {"peak", Metric::max(s(3.0))}});
      } else {
        agg.add({{"loss", Metric::sum(s(0.5))}, {"frac", Metric::token_mean(s(0.2), s(8))},
                 {"peak", Metric::max(s(7.0))}});
      }
      r[static_cast<size_t>(rank)] = agg.result(&comm);
    });
    for (const auto& m : r) {
      CHECK(m.at("loss") == 1.5);
      CHECK(m.at("frac") == doctest::Approx((0.5 * 2 + 0.2 * 8) / 10));  // 0.26
      CHECK(m.at("peak") == 7.0);
    }
  }
}
