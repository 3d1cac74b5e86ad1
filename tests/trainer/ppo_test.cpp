// PPO through Trainer::fit: the critic engine's values are the value model's output one position
// back (the state before each token: verl's values[:, -R - 1:-1]), sequence scores land on each
// response's last token, the reward rises with the clipped surrogate and GAE over the critic's
// values, a critic warm-up holds the policy while the value loss falls, and a resumed run (critic,
// its optimizer and the adaptive KL coefficient included) ends bit for bit as the uninterrupted one.
#include <hybridrl/hybridrl.hpp>

#include <cmath>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../support/fit.hpp"
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"

namespace hybridrl::testing {

using FitPPO = Trainer<Algorithm<PPO>, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>;

inline FitPPO::Options ppo_options(int64_t steps) {
  auto o = online_fit_options<FitPPO>(steps, 11);
  o.critic().optim().lr(5e-3).weight_decay(0.0);
  return o;
}

/// share_in_band(·, 100) over a batch: the fixture's learnable reward.
inline std::vector<double> band_reward(std::span<const RewardInput> in) {
  std::vector<double> out;
  for (const auto& x : in) out.push_back(share_in_band(x, 100));
  return out;
}

}  // namespace hybridrl::testing

using namespace hybridrl;
using namespace hybridrl::testing;

TEST_SUITE("trainer/ppo") {
  TEST_CASE("the critic engine's values: the score head one position back, aligned to the responses") {
    auto critic = make_value_model(fit_fixture_model());
    auto engine = Sharding<FSDP>::make_critic(critic, FSDPOptions{}.param_dtype(at::kFloat), OptimizerOptions{}, 1);
    const int64_t T = 7, R = 3;
    auto ids = at::randint(3, 200, {2, T}, at::kLong);
    TensorBatch rows({{"input_ids", ids}, {"responses", ids.narrow(1, T - R, R)}});
    const auto values = engine.forward(rows).tensor(keys::values);
    REQUIRE(values.sizes() == at::IntArrayRef({2, R}));
    at::Tensor raw;
    {
      c10::NoGradGuard g;
      raw = critic->forward(ids);  // [2, T]: the head at every position
    }
    // response token j (position T - R + j) is scored by the state before it: position T - R + j - 1
    for (int64_t j = 0; j < R; ++j) CHECK(at::allclose(values.select(1, j), raw.select(1, T - R + j - 1)));
    // so a value never sees the token it scores: changing the last token changes none of them,
    // changing the first response token changes the values after it only
    auto last = ids.clone();
    last.select(1, T - 1).fill_(5);
    const auto v_last = engine.forward(TensorBatch({{"input_ids", last}, {"responses", last.narrow(1, T - R, R)}}))
                            .tensor(keys::values);
    CHECK(at::equal(v_last, values));
    auto first = ids.clone();
    first.select(1, T - R).fill_(5);
    const auto v_first = engine.forward(TensorBatch({{"input_ids", first}, {"responses", first.narrow(1, T - R, R)}}))
                             .tensor(keys::values);
    CHECK(at::equal(v_first.select(1, 0), values.select(1, 0)));
    CHECK_FALSE(at::allclose(v_first.select(1, 1), values.select(1, 1)));
    CHECK(values.requires_grad());  // the update trains through it
  }

  TEST_CASE("sequence scores land on each response's last token") {
    const auto mask = mat({{1, 1, 0}, {1, 0, 0}, {0, 0, 0}, {1, 1, 1}}).to(at::kLong);
    const auto got = scores_on_last_token(vec({2.0, -1.0, 5.0, 0.5}), mask);
    CHECK((got.scalar_type() == at::kFloat));
    CHECK(at::equal(got, mat({{0, 2, 0}, {-1, 0, 0}, {0, 0, 0}, {0, 0, 0.5}}).to(at::kFloat)));
    CHECK(contains(error_of([&] { (void)scores_on_last_token(vec({1.0}), mask); }), "scores has 1 rows, response_mask 4"));
  }

  TEST_CASE("PPO with Rollout<Naive>: the reward rises; the run writes the critic; a critic warm-up holds the policy") {
    FitTempDir tmp("ppo");
    auto prompts = fixture_prompts(tmp.path);
    std::vector<std::map<std::string, double>> steps;
    FitParts parts;
    parts.progress = nullptr;
    parts.on_step = [&](int64_t, const std::map<std::string, double>& m) { steps.push_back(m); };
    auto policy = fit_fixture_model();
    auto o = ppo_options(15);
    o.trainer().output_dir(tmp.path + "/run");
    const auto r = FitPPO(o).fit(policy, prompts, band_reward, parts);
    CHECK(r.steps == 15);
    REQUIRE(steps.size() == 15);
    for (const std::string k : {"reward_mean", "entropy", "clip_frac", "grad_norm", "critic/vf_loss",
                          "critic/vf_clipfrac", "critic/grad_norm", "critic/lr", "critic/values_mean",
                          "critic/returns_mean", "critic/vf_explained_var", "time/values", "kl_coef"}) {
      CAPTURE(k);
      CHECK(steps[4].count(k) == 1);
    }
    CHECK(steps[4]["critic/lr"] == doctest::Approx(5e-3));
    // returns are the token rewards summed to the end (γ = λ = 1): the score, on every token
    CHECK(steps[0]["critic/returns_mean"] == doctest::Approx(steps[0]["reward_mean"]).epsilon(1e-5));
    const double first = (steps[0]["reward_mean"] + steps[1]["reward_mean"] + steps[2]["reward_mean"]) / 3;
    const double last = (steps[12]["reward_mean"] + steps[13]["reward_mean"] + steps[14]["reward_mean"]) / 3;
    MESSAGE("PPO reward (share of tokens in the band): " << first << " -> " << last);
    CHECK(first < 0.15);
    CHECK(last > first + 0.25);
    // the critic, next to the final model, loads as a ForTokenClassification checkpoint
    auto saved = load_value_model(tmp.path + "/run/critic");
    CHECK(saved->named_parameters().contains("score.weight"));
    CHECK(steps[0].count("kl") == 0);  // no reference: neither KL in the reward nor in the loss

    // warm-up: 4 critic-only steps (the policy as it started), then both train
    steps.clear();
    auto held = fit_fixture_model();
    std::vector<at::Tensor> start;
    for (const auto& p : held->parameters()) start.push_back(p.detach().clone());
    bool moved_in_warmup = false, moved_after = false;
    FitParts warm = parts;
    warm.on_step = [&](int64_t step, const std::map<std::string, double>& m) {
      steps.push_back(m);
      bool same = true;
      const auto now = held->parameters();
      for (size_t i = 0; i < now.size(); ++i) same = same && at::equal(now[i], start[i]);
      if (step <= 4) moved_in_warmup = moved_in_warmup || !same;
      if (step == 5) moved_after = !same;
    };
    auto w = ppo_options(5);
    w.critic().warmup_steps(4);
    // returns near 1 while the fresh critic says about 0: a fixed target the value loss can fall to
    auto offset_reward = [](std::span<const RewardInput> in) {
      auto scores = band_reward(in);
      for (auto& x : scores) x += 1.0;
      return scores;
    };
    FitPPO(w).fit(held, prompts, offset_reward, warm);
    REQUIRE(steps.size() == 5);
    CHECK_FALSE(moved_in_warmup);
    CHECK(moved_after);
    CHECK(steps[0].count("grad_norm") == 0);  // no policy update
    CHECK(steps[4].count("grad_norm") == 1);
    // the policy held still, so the critic fits a fixed return distribution: its loss falls
    MESSAGE("critic warm-up vf_loss: " << steps[0]["critic/vf_loss"] << " -> " << steps[3]["critic/vf_loss"]);
    CHECK(steps[3]["critic/vf_loss"] < 0.5 * steps[0]["critic/vf_loss"]);
  }

  TEST_CASE("PPO resume: critic, its optimizer and the adaptive KL coefficient continue bit for bit") {
    FitTempDir tmp("ppo_resume");
    auto prompts = fixture_prompts(tmp.path);
    auto options = [&](const std::string& out) {
      auto o = ppo_options(4);
      o.trainer().output_dir(out).save_every(2);
      o.algorithm().use_kl_in_reward(true);
      o.algorithm().kl_ctrl().type(KLControl::adaptive).kl_coef(0.05).target_kl(1e-4).horizon(100);
      return o;
    };
    FitParts quiet;
    quiet.progress = nullptr;
    auto whole_model = fit_fixture_model();
    FitPPO(options(tmp.path + "/whole")).fit(whole_model, prompts, band_reward, quiet);
    const auto whole = reproducible_metrics(tmp.path + "/whole");
    REQUIRE(whole.size() == 4);
    CHECK(whole[3]["kl_coef"].get<double>() != whole[0]["kl_coef"].get<double>());  // the controller moved
    const auto out = tmp.path + "/killed";
    FitParts crash = quiet;
    crash.on_step = [](int64_t step, const std::map<std::string, double>&) {
      if (step == 3) throw std::runtime_error("killed");
    };
    CHECK_THROWS_AS(FitPPO(options(out)).fit(fit_fixture_model(), prompts, band_reward, crash), std::runtime_error);
    auto resumed_model = fit_fixture_model();
    const auto r = FitPPO(options(out)).fit(resumed_model, prompts, band_reward, quiet);
    CHECK(r.resumed_from == 2);
    const auto lines = reproducible_metrics(out);
    REQUIRE(lines.size() == whole.size());
    for (size_t i = 0; i < lines.size(); ++i) {
      CAPTURE(i);
      CHECK(lines[i] == whole[i]);  // rewards, values, losses, kl_coef: all of it
    }
    const auto resumed_params = resumed_model->named_parameters();
    for (const auto& p : whole_model->named_parameters()) CHECK(at::equal(p.value(), resumed_params[p.key()]));
    const auto whole_critic = load_value_model(tmp.path + "/whole/critic")->named_parameters();
    const auto resumed_critic = load_value_model(out + "/critic")->named_parameters();
    for (const auto& p : whole_critic) {
      CAPTURE(p.key());
      CHECK(at::equal(p.value(), resumed_critic[p.key()]));
    }
  }
}
