// Sampling: Philox-4x32-10 against Random123's known answers, the kept sets of top-k / top-p /
// min-p against a scalar reference, the draw distribution by a chi-square test, log-probs, and
// the noise being a function of (seed, sample, position) only.
#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "hybridrl/rollout/philox.hpp"
#include "hybridrl/rollout/sampler.hpp"
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using hybridrl::testing::contains;
using hybridrl::testing::error_of;

namespace hybridrl::testing {
// Probabilities of the tokens kept by temperature T, top-k, top-p, min-p (in double, from the
// definitions: HF's TopK keeps ties; top-p keeps the most likely tokens while the mass before
// them is below p, renormalised after top-k; min-p keeps p >= min_p * p_max), renormalised.
inline std::vector<double> reference_kept_probs(const std::vector<double>& logits, double T, int64_t k, double p,
                                                double min_p) {
  const auto V = logits.size();
  std::vector<double> z(V);
  for (size_t i = 0; i < V; ++i) z[i] = logits[i] / T;
  std::vector<bool> keep(V, true);
  if (k > 0) {
    auto sorted = z;
    std::sort(sorted.rbegin(), sorted.rend());
    for (size_t i = 0; i < V; ++i) keep[i] = z[i] >= sorted[static_cast<size_t>(k - 1)];
  }
  auto probs_of = [&](const std::vector<bool>& kept) {
    double mx = -1e300, sum = 0;
    for (size_t i = 0; i < V; ++i) if (kept[i]) mx = std::max(mx, z[i]);
    std::vector<double> q(V, 0.0);
    for (size_t i = 0; i < V; ++i) if (kept[i]) sum += (q[i] = std::exp(z[i] - mx));
    for (auto& x : q) x /= sum;
    return q;
  };
  if (p < 1.0) {
    auto q = probs_of(keep);
    std::vector<size_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return q[a] > q[b]; });
    double before = 0;
    std::vector<bool> kp(V, false);
    for (auto i : order) {
      kp[i] = keep[i] && before < p;
      before += q[i];
    }
    keep = kp;
  }
  if (min_p > 0) {
    auto full = probs_of(std::vector<bool>(V, true));
    const double mx = *std::max_element(full.begin(), full.end());
    for (size_t i = 0; i < V; ++i) keep[i] = keep[i] && full[i] >= min_p * mx;
  }
  return probs_of(keep);
}
}  // namespace hybridrl::testing

TEST_SUITE("rollout/sampler") {
  TEST_CASE("Philox-4x32-10 reproduces Random123's known-answer vectors, scalar and on tensors") {
    // kat_vectors of Random123 1.09: philox4x32 10 <ctr> <key> <expected>
    struct KAT {
      std::array<uint32_t, 4> ctr;
      std::array<uint32_t, 2> key;
      std::array<uint32_t, 4> out;
    };
    const std::array<KAT, 3> kats{{
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu},
         {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u},
         {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    }};
    for (const auto& k : kats) {
      CHECK(philox4x32_10(k.ctr, k.key) == k.out);
      auto t = [](uint32_t v) { return at::full({1}, static_cast<int64_t>(v), at::kLong); };
      auto o = philox4x32_10(t(k.ctr[0]), t(k.ctr[1]), t(k.ctr[2]), t(k.ctr[3]), t(k.key[0]), t(k.key[1]));
      for (size_t lane = 0; lane < 4; ++lane) CHECK(o[lane].item<int64_t>() == static_cast<int64_t>(k.out[lane]));
    }
  }

  TEST_CASE("the kept set of top-k, top-p and min-p equals the scalar reference") {
    const std::vector<double> logits{2.0, 1.5, 1.5, 0.3, -0.2, -1.0, 0.9, 0.0};
    struct Case { double T; int64_t k; double p; double min_p; };
    for (auto c : {Case{1.0, 3, 1.0, 0.0}, Case{0.7, 0, 0.8, 0.0}, Case{1.3, 5, 0.6, 0.0}, Case{1.0, 0, 1.0, 0.2},
                   Case{0.5, 4, 0.9, 0.05}, Case{1.0, 2, 1.0, 0.0}}) {
      CAPTURE(c.T); CAPTURE(c.k); CAPTURE(c.p); CAPTURE(c.min_p);
      const auto ref = hybridrl::testing::reference_kept_probs(logits, c.T, c.k, c.p, c.min_p);
      auto z = at::tensor(std::vector<float>(logits.begin(), logits.end())).view({1, -1}) / c.T;
      auto keep = sampling_keep_mask(z, SamplingOptions{}.temperature(c.T).top_k(c.k).top_p(c.p).min_p(c.min_p));
      for (size_t i = 0; i < logits.size(); ++i) CHECK(keep[0][static_cast<int64_t>(i)].item<bool>() == (ref[i] > 0));
    }
  }

  TEST_CASE("draws follow the kept, renormalised distribution (chi-square over 20000 fixed-seed draws)") {
    const std::vector<double> logits{2.0, 1.5, 1.4, 0.3, -0.2, -1.0, 0.9, 0.0};
    const int64_t V = 8, N = 20000;
    struct Case { double T; int64_t k; double p; double min_p; };
    for (auto c : {Case{1.0, 0, 1.0, 0.0}, Case{0.7, 0, 0.9, 0.0}, Case{1.5, 5, 1.0, 0.0}, Case{1.0, 6, 0.85, 0.1}}) {
      CAPTURE(c.T); CAPTURE(c.k); CAPTURE(c.p);
      const auto ref = hybridrl::testing::reference_kept_probs(logits, c.T, c.k, c.p, c.min_p);
      auto x = at::tensor(std::vector<float>(logits.begin(), logits.end())).view({1, V}).expand({N, V});
      SamplingRows rows;  // N independent draws: one request, one sample, N positions
      rows.seeds = at::full({N}, 12345, at::kLong);
      rows.samples = at::zeros({N}, at::kLong);
      rows.positions = at::arange(N, at::kLong);
      const auto o = SamplingOptions{}.temperature(c.T).top_k(c.k).top_p(c.p).min_p(c.min_p);
      auto counts = at::bincount(sample_tokens(x, o, rows).tokens, {}, V);
      double chi2 = 0;
      int64_t cells = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double expected = ref[static_cast<size_t>(v)] * N;
        const auto seen = counts[v].item<int64_t>();
        if (expected == 0) {
          CHECK(seen == 0);  // never outside the kept set
          continue;
        }
        chi2 += (seen - expected) * (seen - expected) / expected;
        ++cells;
      }
      // 99.9% quantiles of chi-square with cells - 1 degrees of freedom (1..7)
      const std::array<double, 8> crit{0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};
      CHECK(chi2 < crit[static_cast<size_t>(cells - 1)]);
    }
  }

  TEST_CASE("greedy is argmax; log-probs are log_softmax(logits / T) at the token, before filtering") {
    auto logits = at::randn({6, 50}, at::TensorOptions().dtype(at::kFloat).requires_grad(false));
    SamplingRows rows{at::arange(6, at::kLong), at::zeros({6}, at::kLong), at::zeros({6}, at::kLong), {}};
    auto g = sample_tokens(logits, SamplingOptions{}.temperature(0), rows);
    CHECK(at::equal(g.tokens, logits.argmax(-1)));
    CHECK(at::allclose(g.log_probs, at::log_softmax(logits, -1).gather(1, g.tokens.view({6, 1})).view({6})));
    auto s = sample_tokens(logits, SamplingOptions{}.temperature(0.6).top_k(5), rows);
    CHECK(at::allclose(s.log_probs, at::log_softmax(logits / 0.6, -1).gather(1, s.tokens.view({6, 1})).view({6})));
    auto top5 = std::get<1>(logits.topk(5, -1));
    CHECK(top5.eq(s.tokens.view({6, 1})).any(-1).all().item<bool>());
    // a banned token is never drawn, greedy or sampled
    auto banned = at::zeros({6, 50}, at::kBool).scatter_(1, logits.argmax(-1, true), true);
    rows.banned = banned;
    CHECK(sample_tokens(logits, SamplingOptions{}.temperature(0), rows).tokens.ne(logits.argmax(-1)).all().item<bool>());
    CHECK(sample_tokens(logits, SamplingOptions{}.temperature(1.0).top_k(1), rows).tokens.ne(logits.argmax(-1))
              .all().item<bool>());
  }

  TEST_CASE("the noise is a function of (seed, sample, position): a row draws the same in any batch") {
    auto logits = at::randn({1, 64});
    auto draw = [&](std::vector<int64_t> seeds, std::vector<int64_t> samples, std::vector<int64_t> positions) {
      const auto B = static_cast<int64_t>(seeds.size());
      SamplingRows r{at::tensor(seeds, at::kLong), at::tensor(samples, at::kLong), at::tensor(positions, at::kLong), {}};
      return sample_tokens(logits.expand({B, 64}), SamplingOptions{}.temperature(1.0), r).tokens;
    };
    auto alone = draw({77}, {1}, {3});
    auto mixed = draw({5, 77, -9}, {0, 1, 4}, {0, 3, 3});
    CHECK(mixed[1].item<int64_t>() == alone[0].item<int64_t>());
    // different seeds, samples or positions draw independently: over many rows they differ
    auto many = draw(std::vector<int64_t>(200, 77), std::vector<int64_t>(200, 1), [] {
      std::vector<int64_t> p(200);
      std::iota(p.begin(), p.end(), 0);
      return p;
    }());
    CHECK(std::get<0>(at::_unique(many)).numel() > 20);
    CHECK(request_seed(7, 1) != request_seed(7, 2));
    CHECK(request_seed(7, 1) != request_seed(8, 1));
  }

  TEST_CASE("CUDA draws the same tokens as the CPU for the same logits and rows (where CUDA exists)") {
    if (!at::hasCUDA()) return;
    auto logits = at::randn({16, 1000});
    SamplingRows rows{at::arange(16, at::kLong) * 977 - 5000, at::arange(16, at::kLong).remainder(3),
                      at::arange(16, at::kLong) * 11, {}};
    const auto o = SamplingOptions{}.temperature(0.9).top_k(50).top_p(0.9);
    auto cpu = sample_tokens(logits, o, rows);
    SamplingRows dev{rows.seeds.cuda(), rows.samples.cuda(), rows.positions.cuda(), {}};
    auto gpu = sample_tokens(logits.cuda(), o, dev);
    CHECK(at::equal(cpu.tokens, gpu.tokens.cpu()));
    CHECK(at::allclose(cpu.log_probs, gpu.log_probs.cpu(), 1e-5, 1e-5));
    CHECK(at::equal(hybridrl::detail::sampling_uniforms(rows, 1000), hybridrl::detail::sampling_uniforms(dev, 1000).cpu()));
  }

  TEST_CASE("bad sampling options are refused with the key and a fix") {
    CHECK(contains(error_of([] { SamplingOptions{}.min_p(1.5).validate(); }), "min_p = 1.5 is outside [0, 1)"));
    CHECK(contains(error_of([] { SamplingOptions{}.max_new_tokens(4).min_new_tokens(5).validate(); }),
                   "min_new_tokens = 5 is outside [0, max_new_tokens = 4]"));
    CHECK(contains(error_of([] { SamplingOptions{}.stop_token_ids({3, -1}).validate(); }), "negative id"));
    CHECK(contains(error_of([] { SamplingOptions{}.max_new_tokens(0).validate(); }), "max_new_tokens = 0 is below 1"));
  }
}
