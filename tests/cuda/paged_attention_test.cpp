// The paged decode kernel (src/cuda/paged_attention.cu) against the reference path
// (paged_attention_reference, computed in fp32 from the same cache contents): head sizes 64 and
// 128, group sizes 1, 3, 4, 7 and 8, contexts from 1 token to several thousand (one split and many), a
// sliding window, fp32 / fp16 / bf16; shapes the kernel does not cover fall back to the reference.
// Runs where a CUDA device and hybridrl::cuda exist; elsewhere it says so.
#include <hybridrl/cuda/paged_attention.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <tuple>
#include <vector>

#include "../support/doctest.hpp"

namespace hybridrl::testing {
// A random decode step: S sequences with the given contexts, block tables drawn from a shuffled
// pool of blocks, caches and queries ~ N(0, 1).
struct DecodeCase {
  at::Tensor q, kc, vc;
  PagedAttentionMetadata meta;
};
inline DecodeCase decode_case(const std::vector<int64_t>& ctx, int64_t H, int64_t Hkv, int64_t D, int64_t bs,
                              at::ScalarType dtype, std::optional<int64_t> window, uint32_t seed) {
  const at::Device dev(at::kCUDA, 0);
  int64_t blocks = 0;
  for (auto c : ctx) blocks += (c + bs - 1) / bs;
  blocks += 3;
  std::vector<int32_t> ids(static_cast<size_t>(blocks));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::mt19937 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::vector<int32_t>> tables;
  size_t next = 0;
  for (auto c : ctx) {
    std::vector<int32_t> t;
    for (int64_t b = 0; b < (c + bs - 1) / bs; ++b) t.push_back(ids[next++]);
    tables.push_back(t);
  }
  at::manual_seed(seed);
  DecodeCase d;
  d.kc = at::randn({blocks, bs, Hkv, D}, at::TensorOptions().device(dev)).to(dtype);
  d.vc = at::randn({blocks, bs, Hkv, D}, at::TensorOptions().device(dev)).to(dtype);
  d.q = at::randn({static_cast<int64_t>(ctx.size()), H, D}, at::TensorOptions().device(dev)).to(dtype);
  d.meta = PagedAttentionMetadata::make(tables, std::vector<int64_t>(ctx.size(), 1), ctx, bs, window, dev);
  return d;
}
}  // namespace hybridrl::testing

TEST_SUITE("cuda/paged_attention") {
  TEST_CASE("the decode kernel equals the reference path (fp32, fp16, bf16; splits; windows; GQA)") {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
    if (!at::hasCUDA()) {
      MESSAGE("no CUDA device: kernel not run");
      return;
    }
    using hybridrl::testing::decode_case;
    struct Shape {
      int64_t H, Hkv, D, bs;
    };
    const std::vector<Shape> shapes{{8, 8, 64, 16}, {32, 4, 64, 16}, {14, 2, 64, 16}, {32, 8, 128, 16},
                                    {28, 4, 128, 32}, {12, 4, 128, 16}};
    const std::vector<std::vector<int64_t>> contexts{{1}, {5, 17, 300}, {4000, 33}, std::vector<int64_t>(64, 129)};
    int cases = 0;
    for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
      const double tol = dtype == at::kFloat ? 2e-5 : (dtype == at::kHalf ? 2e-3 : 1.6e-2);
      for (const auto& sh : shapes) {
        for (const auto& ctx : contexts) {
          for (std::optional<int64_t> window : {std::optional<int64_t>{}, std::optional<int64_t>{100}}) {
            CAPTURE(c10::toString(dtype));
            CAPTURE(sh.H);
            CAPTURE(sh.Hkv);
            CAPTURE(sh.D);
            CAPTURE(ctx.size());
            CAPTURE(ctx.front());
            CAPTURE(window.value_or(0));
            auto d = decode_case(ctx, sh.H, sh.Hkv, sh.D, sh.bs, dtype, window, static_cast<uint32_t>(cases));
            const double scale = 1.0 / std::sqrt(static_cast<double>(sh.D));
            auto got = hybridrl::paged_attention(d.q, d.kc, d.vc, d.meta, scale).to(at::kFloat);
            auto ref = hybridrl::paged_attention_reference(d.q.to(at::kFloat), d.kc.to(at::kFloat), d.vc.to(at::kFloat),
                                                           d.meta, scale);
            CHECK((got - ref).abs().max().item<double>() <= tol);
            ++cases;
          }
        }
      }
    }
    CHECK(cases == 3 * 6 * 4 * 2);
    // a group of 16 query heads per KV head and a head size of 16 are not kernel shapes: the
    // reference does them, with the same result
    for (auto [H, Hkv, D] : {std::tuple<int64_t, int64_t, int64_t>{16, 1, 64}, {4, 2, 16}}) {
      auto d = decode_case({40, 3}, H, Hkv, D, 16, at::kFloat, {}, 99);
      auto got = hybridrl::paged_attention(d.q, d.kc, d.vc, d.meta, 0.125);
      CHECK((got - hybridrl::paged_attention_reference(d.q, d.kc, d.vc, d.meta, 0.125)).abs().max().item<double>() < 1e-6);
    }
#else
    MESSAGE("built without hybridrl::cuda: the kernel is tested on CUDA builds");
#endif
  }
}
