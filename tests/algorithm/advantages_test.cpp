// Advantage estimators and KL: every expected value is computed here independently, by hand or
// by a plain scalar loop over std::vector<double> that follows the paper / verl formula.

#include <hybridrl/algorithm/advantages.hpp>
#include <hybridrl/algorithm/grpo.hpp>
#include <hybridrl/algorithm/kl.hpp>

#include <cmath>
#include <map>
#include <vector>
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;

namespace {

using Mat = std::vector<std::vector<double>>;

at::Tensor to_tensor(const Mat& m, at::ScalarType dtype = at::kDouble) {
  auto t = at::zeros({static_cast<int64_t>(m.size()), static_cast<int64_t>(m[0].size())}, at::kDouble);
  for (size_t i = 0; i < m.size(); ++i)
    for (size_t j = 0; j < m[i].size(); ++j) t[i][j] = m[i][j];
  return t.to(dtype);
}
at::Tensor to_tensor(const std::vector<double>& v, at::ScalarType dtype = at::kDouble) {
  auto t = at::zeros({static_cast<int64_t>(v.size())}, at::kDouble);
  for (size_t i = 0; i < v.size(); ++i) t[i] = v[i];
  return t.to(dtype);
}
double at2(const at::Tensor& t, int64_t i, int64_t j) { return t[i][j].item<double>(); }

void check_close(const at::Tensor& got, const Mat& want, double tol) {
  REQUIRE(got.size(0) == static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    for (size_t j = 0; j < want[i].size(); ++j)
      CHECK(at2(got, i, j) == doctest::Approx(want[i][j]).epsilon(tol));
}

// Whitening over mask entries, unbiased variance, as the verl formula (reference, scalar loops).
Mat whiten_ref(const Mat& x, const Mat& mask) {
  double n = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = 0; j < x[i].size(); ++j) { n += mask[i][j]; s += x[i][j] * mask[i][j]; }
  const double mean = s / n;
  double ss = 0;
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = 0; j < x[i].size(); ++j) ss += (x[i][j] - mean) * (x[i][j] - mean) * mask[i][j];
  const double var = ss / n * n / (n - 1);
  Mat out = x;
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = 0; j < x[i].size(); ++j)
      out[i][j] = (x[i][j] - mean) / std::sqrt(var + 1e-8) * mask[i][j];
  return out;
}

}  // namespace

TEST_SUITE("algorithm/advantages") {
  TEST_CASE("GAE on one token by hand: A = r - V, returns = r") {
    // two sequences of one valid token each: delta = r - V; returns = A + V = r
    auto r = to_tensor(Mat{{1.0, 0.0}, {3.0, 0.0}});
    auto v = to_tensor(Mat{{0.5, 9.0}, {1.0, 9.0}});
    auto m = to_tensor(Mat{{1, 0}, {1, 0}});
    auto out = compute_gae(r, v, m, 1.0, 1.0);
    CHECK(at2(out.returns, 0, 0) == doctest::Approx(1.0));
    CHECK(at2(out.returns, 1, 0) == doctest::Approx(3.0));
    // raw A = {0.5, 2.0}: mean 1.25, unbiased var = 2 * 0.75^2 / 1 = 1.125
    CHECK(at2(out.advantages, 0, 0) == doctest::Approx(-0.75 / std::sqrt(1.125 + 1e-8)));
    CHECK(at2(out.advantages, 1, 0) == doctest::Approx(0.75 / std::sqrt(1.125 + 1e-8)));
    CHECK(at2(out.advantages, 0, 1) == 0.0);  // masked positions are zeroed
  }

  TEST_CASE("GAE matches the scalar recursion, with padding, an observation gap and a fully masked row") {
    const double gamma = 0.9, lam = 0.8;
    Mat r = {{0.1, -0.2, 0.3, 1.0, 0.0}, {0.0, 0.5, 0.0, 0.0, 0.0}, {0.2, 0.2, 0.2, 0.2, 0.2},
             {0.7, 0.7, 0.7, 0.7, 0.7}};
    Mat v = {{0.3, 0.1, -0.4, 0.2, 5.0}, {1.0, -1.0, 0.5, 7.0, 7.0}, {0.1, 0.2, 0.3, 0.4, 0.5},
             {2.0, 2.0, 2.0, 2.0, 2.0}};
    Mat m = {{1, 1, 1, 1, 0}, {1, 1, 0, 0, 0}, {1, 0, 1, 1, 1}, {0, 0, 0, 0, 0}};
    // Reference: per sequence, walk back over the VALID tokens only; a masked token keeps the
    // running advantage (verl's observation-token rule) and has no value / TD error of its own.
    Mat raw = r;
    for (size_t i = 0; i < r.size(); ++i) {
      double next_v = 0, last = 0;
      for (int t = static_cast<int>(r[i].size()) - 1; t >= 0; --t) {
        if (m[i][t] == 1) {
          const double delta = r[i][t] + gamma * next_v - v[i][t];
          last = delta + gamma * lam * last;
          next_v = v[i][t];
        }
        raw[i][t] = last;
      }
    }
    Mat ret = raw;
    for (size_t i = 0; i < r.size(); ++i)
      for (size_t t = 0; t < r[i].size(); ++t) ret[i][t] = raw[i][t] + v[i][t];
    for (auto dtype : {at::kDouble, at::kFloat}) {
      auto out = compute_gae(to_tensor(r, dtype), to_tensor(v, dtype), to_tensor(m, at::kBool),
                             gamma, lam);
      const double tol = dtype == at::kDouble ? 1e-12 : 1e-5;
      check_close(out.returns, ret, tol);
      check_close(out.advantages, whiten_ref(raw, m), tol);
      CHECK(out.advantages[3].abs().sum().item<double>() == 0.0);  // fully masked row
    }
  }

  TEST_CASE("GAE rejects NaN rewards, bad shapes, gamma outside [0,1] and a mask under 2 tokens") {
    auto r = at::zeros({2, 3}, at::kDouble);
    auto v = at::zeros({2, 3}, at::kDouble);
    auto m = at::ones({2, 3}, at::kDouble);
    r[0][1] = std::nan("");
    CHECK_THROWS_WITH_AS(compute_gae(r, v, m, 1.0, 1.0), doctest::Contains("NaN"), Error);
    r[0][1] = 0.0;
    CHECK_THROWS_AS(compute_gae(r, at::zeros({2, 4}, at::kDouble), m, 1.0, 1.0), Error);
    CHECK_THROWS_AS(compute_gae(r, v, m, 1.5, 1.0), Error);
    auto one = at::zeros({2, 3}, at::kDouble);
    one[0][0] = 1;
    CHECK_THROWS_WITH_AS(compute_gae(r, v, one, 1.0, 1.0), doctest::Contains("at least 2"), Error);
  }

  TEST_CASE("masked_whiten: mean 0, unbiased variance 1 over the mask") {
    auto x = to_tensor(Mat{{1, 2, 3, 100}});
    auto m = to_tensor(Mat{{1, 1, 1, 0}});
    auto w = masked_whiten(x, m);
    // mean 2, unbiased var 1 -> (x - 2) / sqrt(1 + 1e-8)
    CHECK(at2(w, 0, 0) == doctest::Approx(-1.0 / std::sqrt(1 + 1e-8)));
    CHECK(at2(w, 0, 2) == doctest::Approx(1.0 / std::sqrt(1 + 1e-8)));
    CHECK(at2(masked_whiten(x, m, false), 0, 1) == doctest::Approx(2.0));
  }

  TEST_CASE("GRPO: groups in any order, singleton mean 0 std 1, unbiased std, Dr.GRPO") {
    std::vector<double> s = {1.0, 0.0, 2.0, 5.0, 1.0, -3.0};
    std::vector<int64_t> g = {7, 3, 7, 42, 3, 7};  // group 7: {1,2,-3}, group 3: {0,1}, 42 alone
    auto mask = at::ones({6, 3}, at::kFloat);
    mask[1][2] = 0;
    mask[5].zero_();  // fully masked row
    auto gid = at::tensor(std::vector<int64_t>(g), at::kLong);
    auto want = [&](bool norm) {
      std::map<int64_t, std::vector<double>> groups;
      for (size_t i = 0; i < s.size(); ++i) groups[g[i]].push_back(s[i]);
      std::vector<double> a(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        const auto& xs = groups[g[i]];
        double mean = 0, sd = 1;
        if (xs.size() > 1) {
          for (double x : xs) mean += x / xs.size();
          double ss = 0;
          for (double x : xs) ss += (x - mean) * (x - mean);
          sd = std::sqrt(ss / (xs.size() - 1));
        }
        a[i] = norm ? (s[i] - mean) / (sd + 1e-6) : s[i] - mean;
      }
      return a;
    };
    for (bool norm : {true, false}) {
      auto adv = compute_grpo_advantages(to_tensor(s, at::kFloat), gid, mask, 1e-6, norm);
      auto a = want(norm);
      for (int64_t i = 0; i < 6; ++i)
        for (int64_t t = 0; t < 3; ++t)
          CHECK(at2(adv, i, t) ==
                doctest::Approx(a[i] * mask[i][t].item<double>()).epsilon(1e-5));
    }
    // hand values: singleton 42 -> (5 - 0) / (1 + 1e-6); group 3 {0,1}: mean .5, std sqrt(.5)
    auto adv = compute_grpo_advantages(to_tensor(s), gid, mask.to(at::kDouble));
    CHECK(at2(adv, 3, 0) == doctest::Approx(5.0 / (1.0 + 1e-6)));
    CHECK(at2(adv, 4, 0) == doctest::Approx(0.5 / (std::sqrt(0.5) + 1e-6)));
  }

  TEST_CASE("GRPO: epsilon pinned exactly (std + eps, not sqrt(var + eps)); an all-equal group gives 0") {
    // group {0, 1}: mean 0.5, unbiased std sqrt(0.5); with eps = 0.5 the three candidate formulas
    // differ by 20 %: 0.5 / (sqrt(0.5) + 0.5) = 0.41421..., 0.5 / sqrt(0.5 + 0.5) = 0.5, 0.5 / sqrt(0.5) = 0.7071
    auto ids = at::tensor(std::vector<int64_t>{0, 0, 1, 1, 1});
    auto scores = to_tensor(std::vector<double>{0.0, 1.0, 1.0, 1.0, 1.0});  // group 1: three samples, all correct
    auto adv = compute_grpo_advantages(scores, ids, at::ones({5, 1}, at::kDouble), 0.5);
    CHECK(at2(adv, 1, 0) == doctest::Approx(0.5 / (std::sqrt(0.5) + 0.5)).epsilon(1e-12));
    CHECK(at2(adv, 0, 0) == doctest::Approx(-0.5 / (std::sqrt(0.5) + 0.5)).epsilon(1e-12));
    // std 0: (1 - 1) / (0 + eps) = 0 exactly, for the default eps and through the policy hook
    auto adv_default = compute_grpo_advantages(scores, ids, at::ones({5, 1}, at::kDouble));
    for (int64_t i = 2; i < 5; ++i) CHECK(at2(adv_default, i, 0) == 0.0);
    CHECK(at2(adv_default, 1, 0) == doctest::Approx(0.5 / (std::sqrt(0.5) + 1e-6)).epsilon(1e-12));
    // eps = 0 would give 0 / 0 = NaN for that group: the options refuse it (unless Dr.GRPO)
    CHECK_THROWS_WITH_AS(GRPOOptions{}.epsilon(0).validate(), doctest::Contains("epsilon = 0"), Error);
    CHECK_NOTHROW(GRPOOptions{}.dr_grpo(true).epsilon(0).validate());
  }

  TEST_CASE("GRPO rejects NaN scores and non-int64 group ids") {
    auto m = at::ones({2, 2});
    auto s = at::tensor({1.0f, std::nanf("")});
    CHECK_THROWS_WITH_AS(compute_grpo_advantages(s, at::tensor({0L, 0L}), m),
                         doctest::Contains("NaN"), Error);
    CHECK_THROWS_WITH_AS(compute_grpo_advantages(at::ones({2}), at::zeros({2}, at::kInt), m),
                         doctest::Contains("int64"), Error);
    CHECK_THROWS_AS(compute_grpo_advantages(at::ones({3}), at::zeros({3}, at::kLong), m), Error);
  }

  TEST_CASE("RLOO: score minus the mean of the others; a singleton keeps its score") {
    // group 0: {1, 4, 7}: 1 - 5.5, 4 - 4, 7 - 2.5; group 1: {2}: 2
    auto s = to_tensor(std::vector<double>{1, 2, 4, 7});
    auto g = at::tensor({0L, 1L, 0L, 0L});
    auto adv = compute_rloo_advantages(s, g, at::ones({4, 2}, at::kDouble));
    CHECK(at2(adv, 0, 1) == doctest::Approx(-4.5));
    CHECK(at2(adv, 1, 0) == doctest::Approx(2.0));
    CHECK(at2(adv, 2, 0) == doctest::Approx(0.0));
    CHECK(at2(adv, 3, 0) == doctest::Approx(4.5));
  }

  TEST_CASE("REINFORCE++: discounted return reset at masked tokens, whitened") {
    const double gamma = 0.5;
    Mat r = {{0, 0, 1, 9}, {1, 1, 0, 0}, {0.5, 0, 0, 2}};
    Mat m = {{1, 1, 1, 0}, {1, 1, 0, 0}, {1, 1, 1, 1}};
    Mat ret = r;
    for (size_t i = 0; i < r.size(); ++i) {
      double running = 0;
      for (int t = 3; t >= 0; --t) {
        ret[i][t] = r[i][t] + gamma * running;
        running = m[i][t] == 1 ? ret[i][t] : 0.0;
      }
    }
    // by hand for row 0: G = {0.25, 0.5, 1, 9}
    CHECK(ret[0][0] == doctest::Approx(0.25));
    auto out = compute_reinforce_pp_advantages(to_tensor(r), to_tensor(m), gamma);
    check_close(out.returns, ret, 1e-12);
    check_close(out.advantages, whiten_ref(ret, m), 1e-12);
  }
}

TEST_SUITE("algorithm/kl") {
  TEST_CASE("estimators by hand, with k3's clamps") {
    auto lp = to_tensor(std::vector<double>{-1.0, -2.0, 0.0, -30.0});
    auto ref = to_tensor(std::vector<double>{-1.5, -1.0, -25.0, 0.0});
    // d = lp - ref = {0.5, -1, 25, -30}
    auto k1 = kl_penalty(lp, ref, KLEstimator::k1);
    auto k2 = kl_penalty(lp, ref, KLEstimator::k2);
    auto ab = kl_penalty(lp, ref, KLEstimator::abs);
    auto k3 = kl_penalty(lp, ref, KLEstimator::k3);
    CHECK(k1[1].item<double>() == doctest::Approx(-1.0));
    CHECK(k2[1].item<double>() == doctest::Approx(0.5));
    CHECK(ab[1].item<double>() == doctest::Approx(1.0));
    CHECK(k3[0].item<double>() == doctest::Approx(std::exp(-0.5) - 1 + 0.5));
    CHECK(k3[1].item<double>() == doctest::Approx(std::exp(1.0) - 1 - 1.0));
    // d = 25: -d clamped to -20 -> e^-20 + 20 - 1 = 19.000000002 -> clamped to 10
    CHECK(k3[2].item<double>() == doctest::Approx(10.0));
    // d = -30: -d clamped to 20 -> e^20 - 21, clamped to 10
    CHECK(k3[3].item<double>() == doctest::Approx(10.0));
    CHECK(enum_from_name<KLEstimator>("k3") == KLEstimator::k3);
    CHECK(enum_name(KLEstimator::k3_plus) == "k3_plus");
    CHECK(enum_from_name<KLControl>("adaptive") == KLControl::adaptive);
    CHECK(!enum_from_name<KLEstimator>("k4").has_value());
  }

  TEST_CASE("straight-through k1+ / k3+: forward value of k1 / k3, gradient of k2 (= d)") {
    for (auto [est, base] : {std::pair{KLEstimator::k1_plus, KLEstimator::k1},
                             std::pair{KLEstimator::k3_plus, KLEstimator::k3}}) {
      auto lp = to_tensor(std::vector<double>{-1.0, -0.2}).requires_grad_();
      auto ref = to_tensor(std::vector<double>{-1.5, -0.7});
      auto kl = kl_penalty(lp, ref, est);
      CHECK(at::allclose(kl, kl_penalty(lp.detach(), ref, base)));
      kl.sum().backward();
      // d/dlp of 0.5 d^2 = d = {0.5, 0.5}
      CHECK(lp.grad()[0].item<double>() == doctest::Approx(0.5));
      CHECK(lp.grad()[1].item<double>() == doctest::Approx(0.5));
    }
  }

  TEST_CASE("k3 gradient: d/dlp (e^-d - 1 + d) = 1 - e^-d") {
    auto lp = to_tensor(std::vector<double>{0.3}).requires_grad_();
    auto ref = to_tensor(std::vector<double>{0.0});
    kl_penalty(lp, ref, KLEstimator::k3).sum().backward();
    CHECK(lp.grad()[0].item<double>() == doctest::Approx(1 - std::exp(-0.3)));
  }

  TEST_CASE("apply_kl_penalty: rewards = scores - beta * kl * mask; mean of per-sequence means") {
    auto scores = to_tensor(Mat{{0, 0, 1}, {0, 2, 0}});
    auto old_lp = to_tensor(Mat{{-1, -1, -1}, {-2, -2, -2}});
    auto ref_lp = to_tensor(Mat{{-1.5, -0.5, -1}, {-1, -2, -9}});
    auto mask = to_tensor(Mat{{1, 1, 1}, {1, 1, 0}});
    auto r = apply_kl_penalty(scores, old_lp, ref_lp, mask, 0.1, KLEstimator::k1);
    // kl row0 = {0.5, -0.5, 0}, row1 = {-1, 0, (masked) 0}
    CHECK(at2(r.token_level_rewards, 0, 0) == doctest::Approx(-0.05));
    CHECK(at2(r.token_level_rewards, 0, 1) == doctest::Approx(0.05));
    CHECK(at2(r.token_level_rewards, 1, 0) == doctest::Approx(0.1));
    CHECK(at2(r.token_level_rewards, 1, 2) == doctest::Approx(0.0));
    // per-seq means {0/3, -1/2} -> mean -0.25
    CHECK(r.mean_kl.item<double>() == doctest::Approx(-0.25));
  }

  TEST_CASE("KL controllers: fixed stays, adaptive follows verl's clipped proportional rule") {
    KLController fixed(KLControlOptions{}.kl_coef(0.05));
    fixed.update(10.0, 1000);
    CHECK(fixed.value() == doctest::Approx(0.05));
    KLController adaptive(
        KLControlOptions{}.type(KLControl::adaptive).kl_coef(0.1).target_kl(0.2).horizon(1000));
    adaptive.update(0.3, 100);  // error = clip(0.5, ±0.2) = 0.2 -> x(1 + 0.2*100/1000) = 1.02
    CHECK(adaptive.value() == doctest::Approx(0.102));
    adaptive.update(0.19, 100);  // error = -0.05 -> x(1 - 0.005)
    CHECK(adaptive.value() == doctest::Approx(0.102 * 0.995));
    CHECK_THROWS_WITH_AS(KLController(KLControlOptions{}.kl_coef(-1)),
                         doctest::Contains("kl_coef = -1 is negative"), Error);
    CHECK_THROWS_AS(KLController(KLControlOptions{}.type(KLControl::adaptive).horizon(0)), Error);
  }
}
