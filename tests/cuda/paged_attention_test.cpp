// The paged decode kernel (src/cuda/paged_attention.cu) against the reference path
// (paged_attention_reference, computed in fp32 from the same cache contents): head sizes 64 and
// 128, group sizes 1, 3, 4, 7 and 8, contexts from 1 token to several thousand (one split and many), a
// sliding window, fp32 / fp16 / bf16; shapes the kernel does not cover fall back to the reference.
// The varlen path (FlashAttention-2 over packed chunks, LibTorch 2.x) against the same reference for
// fresh prompts, chunks after cached keys and prefill mixed with decodes, fp16 / bf16.
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
inline DecodeCase step_case(const std::vector<int64_t>& qlens, const std::vector<int64_t>& ctx, int64_t H, int64_t Hkv,
                            int64_t D, int64_t bs, at::ScalarType dtype, std::optional<int64_t> window, uint32_t seed,
                            PagedAttentionPath path = PagedAttentionPath::reference);
inline DecodeCase decode_case(const std::vector<int64_t>& ctx, int64_t H, int64_t Hkv, int64_t D, int64_t bs,
                              at::ScalarType dtype, std::optional<int64_t> window, uint32_t seed) {
  return step_case(std::vector<int64_t>(ctx.size(), 1), ctx, H, Hkv, D, bs, dtype, window, seed);
}
// A random step: sequence s has qlens[s] queries at the end of its ctx[s] cached tokens.
inline DecodeCase step_case(const std::vector<int64_t>& qlens, const std::vector<int64_t>& ctx, int64_t H, int64_t Hkv,
                            int64_t D, int64_t bs, at::ScalarType dtype, std::optional<int64_t> window, uint32_t seed,
                            PagedAttentionPath path) {
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
  int64_t T = 0;
  for (auto q : qlens) T += q;
  d.q = at::randn({T, H, D}, at::TensorOptions().device(dev)).to(dtype);
  d.meta = PagedAttentionMetadata::make(tables, qlens, ctx, bs, window, dev, path);
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
    // both pipeline depths of the tensor-core kernel (the launcher picks one from the grid size)
    for (int stages : {2, 3}) {
      for (auto [H, Hkv, D] : {std::tuple<int64_t, int64_t, int64_t>{32, 4, 64}, {32, 8, 128}, {12, 4, 128}}) {
        CAPTURE(stages);
        CAPTURE(D);
        auto d = decode_case({1, 70, 2500, 16, 17}, H, Hkv, D, 16, at::kBFloat16, {}, static_cast<uint32_t>(stages));
        const double scale = 1.0 / std::sqrt(static_cast<double>(D));
        for (int64_t splits : {1, 3}) {
          auto out = at::empty_like(d.q);
          auto ws = at::empty({d.q.size(0) * H * splits * (D + 2)}, d.q.options().dtype(at::kFloat));
          const int rc = hybridrl::cuda::launch_paged_decode_attention(
              d.q.data_ptr(), d.kc.data_ptr(), d.vc.data_ptr(), d.meta.block_tables.data_ptr<int32_t>(),
              d.meta.context_lens.data_ptr<int32_t>(), out.data_ptr(), d.q.size(0), H, Hkv, D, 16,
              d.meta.block_tables.size(1), splits, 0, static_cast<float>(scale), hybridrl::cuda::KernelDtype::bf16,
              ws.data_ptr<float>(), at::cuda::getCurrentCUDAStream().stream(), stages);
          REQUIRE(rc == 0);
          auto ref = hybridrl::paged_attention_reference(d.q.to(at::kFloat), d.kc.to(at::kFloat), d.vc.to(at::kFloat),
                                                         d.meta, scale);
          CHECK((out.to(at::kFloat) - ref).abs().max().item<double>() <= 1.6e-2);
        }
      }
    }
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

  TEST_CASE("the varlen path equals the reference path (fresh prompts, chunks after cached keys, mixed, windows)") {
#if HYBRIDRL_HAS_VARLEN_FLASH
    if (!at::hasCUDA()) {
      MESSAGE("no CUDA device: varlen path not run");
      return;
    }
    using hybridrl::PagedAttentionPath;
    using hybridrl::testing::step_case;
    const at::Device dev(at::kCUDA, 0);
    struct Step {
      std::vector<int64_t> qlens, ctx;
    };
    // fresh prompts (the step's own keys), a chunk after a cached prefix, prefill mixed with decodes
    const std::vector<Step> steps{{{7, 130, 1000}, {7, 130, 1000}},
                                  {{64, 5}, {300, 5}},
                                  {{1, 1, 257, 1}, {40, 900, 257, 3}},
                                  {{33}, {2048}}};
    int cases = 0;
    for (auto dtype : {at::kHalf, at::kBFloat16}) {
      const double tol = dtype == at::kHalf ? 2e-3 : 1.6e-2;
      for (auto [H, Hkv, D] : {std::tuple<int64_t, int64_t, int64_t>{32, 4, 64}, {12, 12, 128}, {14, 2, 64}}) {
        for (const auto& st : steps) {
          for (std::optional<int64_t> window : {std::optional<int64_t>{}, std::optional<int64_t>{100}}) {
            CAPTURE(c10::toString(dtype));
            CAPTURE(H);
            CAPTURE(D);
            CAPTURE(st.ctx.front());
            CAPTURE(window.value_or(0));
            const auto seed = static_cast<uint32_t>(1000 + cases);
            auto d = step_case(st.qlens, st.ctx, H, Hkv, D, 16, dtype, window, seed, PagedAttentionPath::varlen);
            auto r = step_case(st.qlens, st.ctx, H, Hkv, D, 16, dtype, window, seed, PagedAttentionPath::reference);
            CHECK(d.meta.fresh == (st.qlens == st.ctx));
            const double scale = 1.0 / std::sqrt(static_cast<double>(D));
            auto ref = hybridrl::paged_attention_reference(r.q.to(at::kFloat), r.kc.to(at::kFloat), r.vc.to(at::kFloat),
                                                           r.meta, scale);
            // from the blocks, and from the step's own keys (the cache rows at the step's slots)
            auto got = hybridrl::paged_attention(d.q, d.kc, d.vc, d.meta, scale).to(at::kFloat);
            CHECK((got - ref).abs().max().item<double>() <= tol);
            const auto slots = d.kc.size(0) * d.kc.size(1);
            auto ks = d.kc.view({slots, Hkv, D}).index_select(0, d.meta.slot_mapping);
            auto vs = d.vc.view({slots, Hkv, D}).index_select(0, d.meta.slot_mapping);
            auto own = hybridrl::paged_attention(d.q, d.kc, d.vc, d.meta, scale, ks, vs).to(at::kFloat);
            CHECK((own - ref).abs().max().item<double>() <= tol);
            ++cases;
          }
        }
      }
    }
    CHECK(cases == 2 * 3 * 4 * 2);
    // the path choice: decode steps the kernel covers take it, other CUDA bf16 steps take varlen,
    // fp32 prefill and CPU steps the reference
    CHECK((hybridrl::paged_attention_path(dev, at::kBFloat16, false, 32, 4, 64, true) == PagedAttentionPath::varlen));
    CHECK((hybridrl::paged_attention_path(dev, at::kFloat, false, 32, 4, 64, true) == PagedAttentionPath::reference));
    CHECK((hybridrl::paged_attention_path(at::kCPU, at::kBFloat16, false, 32, 4, 64, true) ==
           PagedAttentionPath::reference));
#else
    MESSAGE("LibTorch without the varlen flash op: the reference serves every prefill");
#endif
  }
}
