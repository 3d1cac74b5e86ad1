// rollout_agreement_metrics (algorithm/metrics.hpp): the rollout–training log-prob mismatch
// metrics on a batch worked out by hand.
#include <hybridrl/algorithm/metrics.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "../support/doctest.hpp"
#include "../support/tensors.hpp"

TEST_SUITE("algorithm/agreement") {
  using hybridrl::rollout_agreement_metrics;
  using hybridrl::testing::mat;

  TEST_CASE("mean and max |d|, |p diff|, the ratio's mean, spread and extremes, k3 KL: by hand") {
    // two rows; the masked-out token (row 1, col 2) carries a huge difference that must not count
    const auto rollout = mat({{-1.0, -2.0, -0.5}, {-3.0, -0.1, -9.0}});
    const auto train = mat({{-1.1, -2.0, -0.3}, {-3.0, -0.2, 5.0}});
    const auto mask = mat({{1, 1, 1}, {1, 1, 0}});
    const auto m = rollout_agreement_metrics(rollout.to(at::kFloat), train, mask.to(at::kLong));
    // d = train - rollout over the kept tokens
    const std::vector<double> d{-0.1, 0.0, 0.2, 0.0, -0.1};
    const std::vector<double> r{-1.0, -2.0, -0.5, -3.0, -0.1};
    double abs_sum = 0, abs_max = 0, p_sum = 0, rho_sum = 0, k3 = 0, lo = 1e9, hi = -1e9;
    for (size_t i = 0; i < d.size(); ++i) {
      abs_sum += std::abs(d[i]);
      abs_max = std::max(abs_max, std::abs(d[i]));
      p_sum += std::abs(std::exp(r[i] + d[i]) - std::exp(r[i]));
      const double rho = std::exp(d[i]);
      rho_sum += rho;
      k3 += rho - 1 - d[i];
      lo = std::min(lo, rho);
      hi = std::max(hi, rho);
    }
    const double mean = rho_sum / 5;
    double var = 0;
    for (double x : d) var += (std::exp(x) - mean) * (std::exp(x) - mean);
    const double tol = 1e-6;  // the rollout side went through float32
    CHECK(m.at("rollout/log_prob_diff") == doctest::Approx(abs_sum / 5).epsilon(tol));
    CHECK(m.at("rollout/log_prob_diff_max") == doctest::Approx(abs_max).epsilon(tol));
    CHECK(m.at("rollout/probs_diff_mean") == doctest::Approx(p_sum / 5).epsilon(tol));
    CHECK(m.at("rollout/ratio_mean") == doctest::Approx(mean).epsilon(tol));
    CHECK(m.at("rollout/ratio_std") == doctest::Approx(std::sqrt(var / 4)).epsilon(tol));  // unbiased, as torch.std
    CHECK(m.at("rollout/ratio_min") == doctest::Approx(lo).epsilon(tol));
    CHECK(m.at("rollout/ratio_max") == doctest::Approx(hi).epsilon(tol));
    CHECK(m.at("rollout/k3_kl") == doctest::Approx(k3 / 5).epsilon(tol));
    CHECK(m.at("rollout/k3_kl") > 0.0);
  }

  TEST_CASE("equal log-probs: zero differences, ratios 1; an empty mask reports the same") {
    const auto lp = mat({{-1.0, -2.0}, {-0.5, -4.0}});
    for (const auto& mask : {mat({{1, 1}, {1, 0}}), mat({{0, 0}, {0, 0}})}) {
      const auto m = rollout_agreement_metrics(lp, lp, mask);
      CHECK(m.at("rollout/log_prob_diff") == 0.0);
      CHECK(m.at("rollout/log_prob_diff_max") == 0.0);
      CHECK(m.at("rollout/probs_diff_mean") == 0.0);
      CHECK(m.at("rollout/ratio_mean") == 1.0);
      CHECK(m.at("rollout/ratio_std") == 0.0);
      CHECK(m.at("rollout/ratio_min") == 1.0);
      CHECK(m.at("rollout/ratio_max") == 1.0);
      CHECK(m.at("rollout/k3_kl") == 0.0);
    }
    CHECK(hybridrl::testing::error_of([&] { rollout_agreement_metrics(lp, lp.narrow(1, 0, 1), lp); })
              .find("differ in shape") != std::string::npos);
  }
}
