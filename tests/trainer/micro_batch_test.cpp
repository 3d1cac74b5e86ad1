// The adaptive micro-batch sizer (trainer/micro_batch.hpp): the largest divisor under a limit, the
// token cap, the memory fit from measured micro-batches (one point: all of it per token; two
// sizes: slope and the intercept bounding every point), each pass its own fit; and through
// fit(): the sizes a step chose reported as metrics, and an update with other micro-batch sizes
// equal to the configured one's up to float rounding (losses are normalised by the mini-batch).
#include <hybridrl/hybridrl.hpp>
#include <hybridrl/trainer/micro_batch.hpp>

#include <cmath>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "../support/fit.hpp"
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"

using namespace hybridrl;
using namespace hybridrl::testing;

TEST_SUITE("trainer/micro_batch") {
  TEST_CASE("largest_divisor_at_most: by hand") {
    CHECK(largest_divisor_at_most(512, 42) == 32);
    CHECK(largest_divisor_at_most(512, 512) == 512);
    CHECK(largest_divisor_at_most(512, 10'000) == 512);
    CHECK(largest_divisor_at_most(1000, 156) == 125);
    CHECK(largest_divisor_at_most(97, 96) == 1);  // a prime: one row at a time
    CHECK(largest_divisor_at_most(12, 0) == 1);
    static_assert(largest_divisor_at_most(24, 7) == 6);
  }

  TEST_CASE("the sizer: configured size, token cap, memory fit from measurements") {
    // off: the configured size whatever is measured or capped
    MicroBatchSizer off(MicroBatchOptions{}.adaptive(false).max_tokens(1 << 20), 4, true);
    off.observe(MicroPass::update, 1000, 1000);
    CHECK(off.choose(MicroPass::update, 512, 384, int64_t{1} << 40) == 4);
    CHECK_FALSE(off.measures());

    // adaptive on the CPU (no memory measured), no cap: the configured size (at most the rows)
    MicroBatchSizer cpu(MicroBatchOptions{}, 16, false);
    CHECK_FALSE(cpu.measures());
    CHECK(cpu.choose(MicroPass::scoring, 512, 384, std::nullopt) == 16);
    CHECK(cpu.choose(MicroPass::scoring, 8, 384, std::nullopt) == 8);
    // a token cap: 16384 / 384 = 42 rows fit, the largest divisor of 512 under it is 32
    MicroBatchSizer capped(MicroBatchOptions{}.max_tokens(16384), 4, false);
    CHECK(capped.choose(MicroPass::update, 512, 384, std::nullopt) == 32);
    CHECK(capped.choose(MicroPass::update, 512, 100'000, std::nullopt) == 1);  // one row over the cap still runs

    // memory: nothing measured yet → the configured size (the first pass is the measurement)
    MicroBatchSizer s(MicroBatchOptions{}.memory_fraction(0.8), 32, true);
    CHECK(s.measures());
    CHECK(s.choose(MicroPass::update, 1000, 1000, int64_t{100'000'000}) == 32);
    // one point: 10000 tokens peaked 7e6 bytes above the start → 700 bytes per token, no intercept
    s.observe(MicroPass::update, 10'000, 7'000'000);
    auto f = s.fit(MicroPass::update);
    REQUIRE(f.has_value());
    CHECK(f->first == doctest::Approx(0.0));
    CHECK(f->second == doctest::Approx(700.0));
    // 0.8 × 1e8 / 700 = 114285 tokens = 114 rows of 1000 → the largest divisor of 1000 under it: 100
    CHECK(s.choose(MicroPass::update, 1000, 1000, int64_t{100'000'000}) == 100);
    // a second size on the line 2e6 + 500 · tokens: slope 500, intercept 2e6
    s.observe(MicroPass::update, 40'000, 22'000'000);
    f = s.fit(MicroPass::update);
    CHECK(f->second == doctest::Approx(500.0));
    CHECK(f->first == doctest::Approx(2'000'000.0));
    // (0.8 × 1e8 − 2e6) / 500 = 156000 tokens = 156 rows → 125 divides 1000
    CHECK(s.choose(MicroPass::update, 1000, 1000, int64_t{100'000'000}) == 125);
    // everything fits: the whole batch
    CHECK(s.choose(MicroPass::update, 512, 100, int64_t{100'000'000}) == 512);
    // too little memory for one row: one row (the pass runs, as it would have)
    CHECK(s.choose(MicroPass::update, 512, 100, int64_t{1'000'000}) == 1);
    // the token cap still bounds a memory choice
    MicroBatchSizer both(MicroBatchOptions{}.max_tokens(4096), 32, true);
    both.observe(MicroPass::scoring, 10'000, 1'000'000);
    CHECK(both.choose(MicroPass::scoring, 512, 384, int64_t{1} << 40) == 8);  // 4096 / 384 = 10 → 8
    // each pass has its own fit: the scoring pass is unmeasured in `s`
    CHECK_FALSE(s.fit(MicroPass::scoring).has_value());
    CHECK(s.choose(MicroPass::scoring, 1000, 1000, int64_t{100'000'000}) == 32);
    // a noisy second point below the line (slope ≤ 0): all of the larger point per token, and the
    // intercept still bounds the first point
    MicroBatchSizer noisy(MicroBatchOptions{}, 8, true);
    noisy.observe(MicroPass::scoring, 1000, 900'000);
    noisy.observe(MicroPass::scoring, 4000, 800'000);
    f = noisy.fit(MicroPass::scoring);
    CHECK(f->second == doctest::Approx(200.0));         // 800000 / 4000
    CHECK(f->first == doctest::Approx(700'000.0));      // 900000 − 200 · 1000
    // a repeated size keeps its largest peak
    noisy.observe(MicroPass::update, 1000, 5000);
    noisy.observe(MicroPass::update, 1000, 3000);
    CHECK(noisy.fit(MicroPass::update)->second == doctest::Approx(5.0));
  }

  TEST_CASE("geometry keys: the sizer's options and their errors") {
    auto g = BatchGeometry{}.train_batch_size(4).rollout_n(8).ppo_mini_batch_size(4).micro_batch_size_per_gpu(4);
    const auto o = micro_batch_options(g.adaptive_micro_batch(false).micro_batch_memory_fraction(0.5).max_tokens_per_micro_batch(99));
    CHECK_FALSE(o.adaptive());
    CHECK(o.memory_fraction() == 0.5);
    CHECK(o.max_tokens() == 99);
    CHECK(contains(error_of([&] { auto b = g; b.micro_batch_memory_fraction(1.5).validate(); }),
                   "micro_batch_memory_fraction = 1.5 is outside (0, 1]"));
    CHECK(contains(error_of([&] { auto b = g; b.max_tokens_per_micro_batch(-1).validate(); }),
                   "max_tokens_per_micro_batch = -1 is negative"));
  }

  TEST_CASE("fit(): the chosen sizes are metrics, and the update equals the configured micro-batches' up to rounding") {
    using FitGRPO = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>;
    FitTempDir tmp("micro_batch");
    auto run = [&](bool adaptive, int64_t max_tokens) {
      auto o = online_fit_options<FitGRPO>(1, 3);
      o.geometry().micro_batch_size_per_gpu(4).adaptive_micro_batch(adaptive).max_tokens_per_micro_batch(max_tokens);
      // AdamW's first step is lr · g / (|g| + eps): with eps = 1 it is linear in small gradients, so
      // rounding-level differences stay rounding-level (eps = 1e-8 makes it a sign, flipping on them)
      o.optim().eps(1.0).lr(1e-1);
      std::map<std::string, double> got;
      FitParts parts;
      parts.progress = nullptr;
      parts.on_step = [&](int64_t, const std::map<std::string, double>& m) { got = m; };
      auto reward = [](std::span<const RewardInput> in) {
        std::vector<double> out;
        for (const auto& x : in) out.push_back(share_in_band(x, 100));
        return out;
      };
      auto policy = fit_fixture_model();
      FitGRPO(o).fit(policy, fixture_prompts(tmp.path), reward, parts);
      std::vector<at::Tensor> params;
      for (const auto& p : policy->parameters()) params.push_back(p.detach().clone());
      return std::make_pair(got, params);
    };
    const auto [fixed, fixed_params] = run(false, 0);
    const auto [whole, whole_params] = run(true, 1 << 30);  // no cap that binds: the whole batch at once
    const auto [cpu, cpu_params] = run(true, 0);            // adaptive on the CPU without a cap: the configured 4
    const auto [one, one_params] = run(true, 1);            // a cap under one row: one sequence at a time
    CHECK(fixed.at("geometry/micro_batch_update") == 4);
    CHECK(fixed.at("geometry/micro_batch_scoring") == 4);
    CHECK(whole.at("geometry/micro_batch_update") == 32);  // 4 prompts × 8 samples in one mini-batch
    CHECK(whole.at("geometry/micro_batch_scoring") == 32);
    CHECK(cpu.at("geometry/micro_batch_update") == 4);
    CHECK(one.at("geometry/micro_batch_update") == 1);
    // the same rollout (step 1 samples from the same weights) and the same update up to rounding
    CHECK(whole.at("reward_mean") == fixed.at("reward_mean"));
    for (const std::string k : {"loss", "grad_norm", "clip_frac", "kl"}) {
      CAPTURE(k);
      const double want = fixed.at(k), tol = 1e-6 + 1e-4 * std::abs(want);
      CHECK(std::abs(whole.at(k) - want) <= tol);
      CHECK(std::abs(one.at(k) - want) <= tol);
    }
    CHECK(fixed.at("grad_norm") > 1e-3);  // a real gradient
    for (size_t i = 0; i < fixed_params.size(); ++i) {
      CHECK(at::allclose(whole_params[i], fixed_params[i], 1e-5, 1e-6));
      CHECK(at::allclose(one_params[i], fixed_params[i], 1e-5, 1e-6));
      CHECK(at::equal(cpu_params[i], fixed_params[i]));  // the same micro-batches: bit for bit
    }
    // and the update moved the weights (the comparison is not between untouched copies)
    CHECK_FALSE(at::equal(fixed_params[0], fit_fixture_model()->parameters()[0]));
  }
}
