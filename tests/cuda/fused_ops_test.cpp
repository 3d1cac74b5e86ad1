// The fused inference kernels (cuda/fused.hpp, src/cuda/fused_ops.cu) against the eager ops they
// replace: the rotary and SiLU·up bit for bit in every dtype, RMSNorm within one unit in the last
// place of its dtype (another summation order), the sampler drawing the very tokens of the tensor
// path (rollout/sampler.hpp) with its log-probs within float rounding; a whole model forward and a
// Paged generation with the kernels on and off. Where they do not apply (CPU, autograd recording,
// switched off) the functions return nothing and the modules run their eager ops.

#include <hybridrl/core/device.hpp>
#include <hybridrl/cuda/fused.hpp>
#include <hybridrl/detail/compat.hpp>
#include <hybridrl/cuda/paged_kv.hpp>
#include <hybridrl/model/causal_lm.hpp>
#include <hybridrl/model/layers.hpp>
#include <hybridrl/model/log_probs.hpp>
#include <hybridrl/rollout/paged.hpp>
#include <hybridrl/rollout/sampler.hpp>
#include <hybridrl/sharding/optimizer.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../support/doctest.hpp"
#include "../support/rollout.hpp"

namespace hybridrl::testing {

/// Runs `f` with the fused kernels switched `on` (restored after).
template <class F>
auto with_fused(bool on, F&& f) {
  const bool was = fused::enabled();
  fused::set_enabled(on);
  struct Restore {
    bool was;
    ~Restore() { fused::set_enabled(was); }
  } restore{was};
  return f();
}

/// The largest difference of `a` and `b` in units of the last place of `dtype` at their magnitude
/// (bf16: 8 bits of mantissa, fp16: 11, fp32: 24).
inline double max_ulps(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype) {
  const double bits = dtype == at::kBFloat16 ? 8 : dtype == at::kHalf ? 11 : 24;
  auto x = a.to(at::kDouble), y = b.to(at::kDouble);
  auto ulp = at::pow(2.0, at::floor(at::log2(at::maximum(x.abs(), y.abs()).clamp_min(1e-30))) - (bits - 1));
  return ((x - y).abs() / ulp).max().item<double>();
}

/// Rotary tables cos / sin [N, D] on CUDA in `dtype`, at N random positions below 500.
inline std::pair<at::Tensor, at::Tensor> rope_rows(int64_t N, int64_t D, at::ScalarType dtype) {
  auto pos = at::randint(0, 500, {1, N}, at::TensorOptions().device(at::kCUDA).dtype(at::kLong));
  ModelConfig c;
  c.head_dim = D;
  auto [cos3, sin3] = rope_cos_sin(rope_inverse_frequencies(c), pos, dtype);
  return {cos3[0], sin3[0]};
}

inline bool fused_cuda_here() {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (at::hasCUDA()) return true;
  MESSAGE("no CUDA device: fused kernels not run");
#else
  MESSAGE("not linked with hybridrl::cuda: fused kernels not run");
#endif
  return false;
}

}  // namespace hybridrl::testing

TEST_SUITE("cuda/fused") {
  using namespace hybridrl;
  using hybridrl::testing::max_ulps;
  using hybridrl::testing::with_fused;

  TEST_CASE("nothing fused where the kernels do not apply: the CPU, autograd recording, switched off") {
    c10::NoGradGuard ng;
    auto x = at::randn({3, 8});
    CHECK_FALSE(fused::applies(x));
    CHECK_FALSE(fused::rms_norm(x, at::ones({8}), 1e-6).defined());
    CHECK_FALSE(fused::silu_mul(x, x).defined());
    // the modules still compute (eagerly) on the CPU
    RMSNorm norm(8, 1e-6);
    auto want = x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6);
    CHECK(at::allclose(norm(x), want, 1e-6, 1e-6));
    auto [h, n] = norm->forward_add(x, x);
    CHECK(at::equal(h, x + x));
    CHECK(at::allclose(n, norm(x + x), 1e-6, 1e-6));
    if (!hybridrl::testing::fused_cuda_here()) return;
    auto xc = x.cuda();
    CHECK(fused::applies(xc));
    with_fused(false, [&] { CHECK_FALSE(fused::applies(xc)); return 0; });
    c10::AutoGradMode grad(true);
    CHECK_FALSE(fused::applies(xc));  // autograd recording: the kernels have no backward
  }

  TEST_CASE("a unit's gradients packed into its flat float buffer in one kernel: the per-piece copies, bit for bit") {
    const auto flat_cpu = at::empty({10});
    CHECK_FALSE(fused::pack_flat(const_cast<at::Tensor&>(flat_cpu), {}, {}, {}, 0));  // the CPU: not taken
    if (!hybridrl::testing::fused_cuda_here()) return;
    at::manual_seed(11);
    for (auto dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
      CAPTURE(dtype);
      // odd sizes (no 16-byte loads), aligned ones, an undefined gradient, padding after the
      // pieces, and 40 pieces (more than one launch's 32)
      std::vector<int64_t> numels{4096, 3, 1000, 64, 7, 8192, 1};
      while (numels.size() < 40) numels.push_back(static_cast<int64_t>(numels.size()) * 13 % 97 + 1);
      std::vector<int64_t> offsets;
      int64_t covered = 0;
      for (auto n : numels) offsets.push_back(covered), covered += n;
      std::vector<at::Tensor> parts;
      for (size_t i = 0; i < numels.size(); ++i) {
        parts.push_back(i == 2 ? at::Tensor()
                               : at::randn({numels[i]}, at::TensorOptions().device(at::kCUDA).dtype(dtype)) * 10);
      }
      auto flat = at::full({covered + 5}, 7.0f, at::TensorOptions().device(at::kCUDA));
      REQUIRE(fused::pack_flat(flat, parts, offsets, numels, covered));
      auto want = at::zeros({covered + 5});
      for (size_t i = 0; i < numels.size(); ++i) {
        if (parts[i].defined()) want.narrow(0, offsets[i], numels[i]).copy_(parts[i].cpu().to(at::kFloat));
      }
      CHECK(at::equal(flat.cpu(), want));
      // mixed dtypes or a non-contiguous part: not taken (the caller copies piece by piece)
      auto mixed = parts;
      mixed[0] = mixed[0].to(dtype == at::kFloat ? at::kHalf : at::kFloat);
      CHECK_FALSE(fused::pack_flat(flat, mixed, offsets, numels, covered));
      auto strided = parts;
      strided[0] = at::randn({numels[0] * 2}, parts[0].options()).slice(0, 0, numels[0] * 2, 2);
      CHECK_FALSE(fused::pack_flat(flat, strided, offsets, numels, covered));
    }
  }

  TEST_CASE("the AdamW kernel writes the bf16 / fp16 copy of the stepped parameter: the cast of the result, bit for bit") {
    if (!hybridrl::testing::fused_cuda_here()) return;
    at::manual_seed(12);
    const auto f32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
    for (auto dtype : {at::kBFloat16, at::kHalf}) {
      for (int64_t n : {int64_t{4099}, int64_t{8192}}) {  // the one-by-one and the 16-byte paths
        CAPTURE(dtype);
        CAPTURE(n);
        auto p = at::randn({n}, f32), g = at::randn({n}, f32), m = at::zeros({n}, f32), v = at::zeros({n}, f32);
        auto p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
        auto copy = at::full({n}, 3.0, f32.dtype(dtype));
        const auto v0 = hybridrl::detail::version_of(p);
        fused::adamw_step(p, g, m, v, 1e-2, 0.9, 0.999, 0.01, 1e-8, 1, {}, copy);
        fused::adamw_step(p2, g, m2, v2, 1e-2, 0.9, 0.999, 0.01, 1e-8, 1);
        CHECK(at::equal(p, p2));  // the parameter's step is the same with or without the copy
        CHECK(at::equal(copy, p.to(dtype)));
        CHECK(hybridrl::detail::version_of(p) > v0);  // an in-place write, as ATen's would count it
      }
    }
  }

  TEST_CASE("the training rotary of q and k: bit-identical to the eager ops, forward and backward") {
    if (!hybridrl::testing::fused_cuda_here()) return;
    at::manual_seed(5);
    const int64_t N = 77, H = 6, Hkv = 2, D = 64;
    for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
      CAPTURE(dtype);
      const auto o = at::TensorOptions().device(at::kCUDA).dtype(dtype);
      const auto tables = hybridrl::testing::rope_rows(N, D, dtype);
      const auto &cos = tables.first, &sin = tables.second;
      const auto wide = at::randn({N, (H + 1) * D}, o.dtype(at::kFloat)).to(dtype);
      const auto q0 = wide.narrow(1, 0, H * D).view({N, H, D});
      const auto k0 = at::randn({N, Hkv, D}, o.dtype(at::kFloat)).to(dtype);
      const auto gq = at::randn({N, H, D}, o.dtype(at::kFloat)).to(dtype), gk = at::randn({N, Hkv, D}, o.dtype(at::kFloat)).to(dtype);
      auto run = [&](bool fused_on) {
        auto q = q0.detach().clone().requires_grad_(true), k = k0.detach().clone().requires_grad_(true);
        at::Tensor rq, rk;
        if (fused_on) {
          auto r = fused::rope(q, k, cos, sin);
          REQUIRE(r.first.defined());
          rq = r.first, rk = r.second;
        } else {
          rq = apply_rope_rows(q, cos, sin), rk = apply_rope_rows(k, cos, sin);
        }
        ((rq * gq).sum() + (rk * gk).sum()).backward();
        return std::vector<at::Tensor>{rq.detach(), rk.detach(), q.grad(), k.grad()};
      };
      auto f = run(true), e = run(false);
      for (size_t i = 0; i < 2; ++i) CHECK(at::equal(f[i], e[i]));
      // the gradients: the eager backward sums the two products' gradients as the kernel does
      for (size_t i = 2; i < 4; ++i) CHECK(max_ulps(f[i], e[i], dtype) <= 1.0);
    }
    // a strided q is read in place: the same rotation as its contiguous copy
    c10::NoGradGuard ng;
    const auto o = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
    auto wide = at::randn({9, 3 * 8}, o);
    auto cs = at::randn({9, 8}, o), sn = at::randn({9, 8}, o);
    auto strided = fused::rope(wide.narrow(1, 0, 16).view({9, 2, 8}), wide.narrow(1, 16, 8).view({9, 1, 8}), cs, sn);
    auto packed = fused::rope(wide.narrow(1, 0, 16).contiguous().view({9, 2, 8}), wide.narrow(1, 16, 8).contiguous().view({9, 1, 8}), cs, sn);
    CHECK(at::equal(strided.first, packed.first));
    CHECK(at::equal(strided.second, packed.second));
    CHECK_FALSE(fused::rope(wide.cpu().view({9, 3, 8}), wide.cpu().view({9, 3, 8}), cs.cpu(), sn.cpu()).first.defined());
  }

  TEST_CASE("the head's fused log-prob and entropy: the eager fp32 log-softmax's values and gradients") {
    if (!hybridrl::testing::fused_cuda_here()) return;
    at::manual_seed(11);
    const int64_t B = 3, T = 37, H = 64;
    // 1003: no vector width divides it (element by element); 4104 = 8 · 513: 16-byte rows in
    // bf16 and fp32 (loads and stores of 16 bytes), a vector count that the block's 512 threads
    // do not divide; chunks of 16
    for (const int64_t V : {int64_t{1003}, int64_t{4104}})
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      for (double temp : {1.0, 0.7}) {
        for (bool ent : {true, false}) {
          CAPTURE(V);
          CAPTURE(dtype);
          CAPTURE(temp);
          CAPTURE(ent);
          const auto o = at::TensorOptions().device(at::kCUDA).dtype(dtype);
          const auto h0 = (at::randn({B, T, H}, o.dtype(at::kFloat)) * 2).to(dtype);
          const auto w0 = (at::randn({V, H}, o.dtype(at::kFloat)) * 0.3).to(dtype);
          const auto labels = at::randint(0, V, {B, T}, o.dtype(at::kLong));
          const auto g_lp = at::randn({B, T}, o.dtype(at::kFloat)), g_h = at::randn({B, T}, o.dtype(at::kFloat));
          auto run = [&](bool on) {
            return with_fused(on, [&] {
              auto h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
              auto r = hybridrl::detail::chunked_log_probs(h, w, labels, LogProbOptions{}.chunk_size(16).temperature(temp).with_entropy(ent));
              auto loss = (r.log_probs * g_lp).sum();
              if (ent) loss = loss + (r.entropy * g_h).sum();
              loss.backward();
              return std::vector<at::Tensor>{r.log_probs.detach(), ent ? r.entropy.detach() : at::zeros({1}),
                                             h.grad().to(at::kFloat), w.grad().to(at::kFloat)};
            });
          };
          const auto fused = run(true), eager = run(false);
          // the same logits (one GEMM) in fp32 arithmetic: float rounding of the softmax sums
          CHECK((fused[0] - eager[0]).abs().max().item<double>() <= 2e-5);
          CHECK((fused[1] - eager[1]).abs().max().item<double>() <= 2e-5);
          // the logits' gradient rounded once to the logits' dtype (eager: in fp32, then cast)
          const double tol = dtype == at::kFloat ? 1e-5 : 1e-2;
          for (size_t i = 2; i < 4; ++i) {
            CHECK(((fused[i] - eager[i]).norm() / eager[i].norm()).item<double>() <= tol);
          }
        }
      }
    }
    // a label outside the vocabulary gives NaN, never a read past the row
    c10::NoGradGuard ng;
    auto l = at::randn({2, 5}, at::TensorOptions().device(at::kCUDA));
    auto [lp, en] = fused::token_log_prob(l, at::tensor(std::vector<int64_t>{1, 7}, at::kLong).cuda(), 1.0, false);
    CHECK(std::isfinite(lp[0].item<double>()));
    CHECK(std::isnan(lp[1].item<double>()));
    CHECK_FALSE(en.defined());
    CHECK_FALSE(fused::token_log_prob(l.cpu(), at::zeros({2}, at::kLong), 1.0, false).first.defined());
  }

  TEST_CASE("SiLU(gate)·up in training: the eager forward bit for bit, gradients nearer the exact ones than eager's") {
    if (!hybridrl::testing::fused_cuda_here()) return;
    at::manual_seed(9);
    // [3, 5, 304]: 16-byte packs in every dtype; [7, 300]: element by element in bf16 and fp16;
    // [70000, 8]: more rows than one grid's y dimension holds
    for (const auto& shape : {std::vector<int64_t>{3, 5, 304}, std::vector<int64_t>{7, 300}, std::vector<int64_t>{70000, 8}}) {
      for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
        CAPTURE(dtype);
        CAPTURE(shape.front());
        const auto g0 = (at::randn(shape) * 4).to(at::kCUDA, dtype), u0 = at::randn(shape).to(at::kCUDA, dtype);
        const auto go = at::randn(shape).to(at::kCUDA, dtype);
        auto run = [&](bool on) {
          return with_fused(on, [&] {
            auto g = g0.clone().requires_grad_(true), u = u0.clone().requires_grad_(true);
            auto out = on ? fused::silu_mul_train(g, u) : at::silu(g) * u;
            REQUIRE(out.defined());
            REQUIRE(out.requires_grad());
            out.backward(go);
            return std::vector<at::Tensor>{out.detach(), g.grad(), u.grad()};
          });
        };
        const auto fz = run(true), eager = run(false);
        CHECK(at::equal(fz[0], eager[0]));
        // the exact gradients, in double from the same inputs
        const auto gd = g0.to(at::kDouble), ud = u0.to(at::kDouble), dd = go.to(at::kDouble);
        const auto sig = at::sigmoid(gd);
        const std::vector<at::Tensor> exact{dd * ud * sig * (1 + gd * (1 - sig)), dd * gd * sig};
        const double tol = dtype == at::kFloat ? 1e-6 : dtype == at::kHalf ? 1e-3 : 5e-3;
        for (size_t i = 0; i < 2; ++i) {
          const auto err = [&](const at::Tensor& t) {
            return ((t.to(at::kDouble) - exact[i]).norm() / exact[i].norm()).item<double>();
          };
          const double e_fused = err(fz[1 + i]), e_eager = err(eager[1 + i]);
          CAPTURE(i);
          CAPTURE(e_fused);
          CAPTURE(e_eager);
          CHECK(e_fused <= tol);
          // one rounding instead of two: no further from the exact gradient than eager (bf16, fp16)
          if (dtype != at::kFloat) CHECK(e_fused <= e_eager * 1.02);
        }
      }
    }
    // where the kernel does not apply: the CPU, switched off
    CHECK_FALSE(fused::silu_mul_train(at::randn({2, 8}), at::randn({2, 8})).defined());
    with_fused(false, [] {
      CHECK_FALSE(fused::silu_mul_train(at::randn({2, 8}).cuda(), at::randn({2, 8}).cuda()).defined());
      return 0;
    });
  }

  TEST_CASE("q|k|v and gate|up from one fused projection in training: the split eager ops, forward and backward") {
    if (!hybridrl::testing::fused_cuda_here()) return;
    at::manual_seed(13);
    const int64_t N = 77, H = 6, Hkv = 2, D = 64, row = (H + 2 * Hkv) * D, I = 304;
    for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
      CAPTURE(dtype);
      const auto o = at::TensorOptions().device(at::kCUDA).dtype(dtype);
      const auto tables = hybridrl::testing::rope_rows(N, D, dtype);
      const auto &cos = tables.first, &sin = tables.second;
      auto rnd = [&](std::vector<int64_t> shape, double scale = 1.0) {
        return (at::randn(shape, o.dtype(at::kFloat)) * scale).to(dtype);
      };
      const auto qkv0 = rnd({N, row});
      const auto gq = rnd({N, H, D}), gk = rnd({N, Hkv, D}), gv = rnd({N, Hkv, D});
      auto run_qkv = [&](bool fused_on) {
        auto qkv = qkv0.clone().requires_grad_(true);
        at::Tensor q, k, v;
        if (fused_on) {
          std::tie(q, k, v) = fused::qkv_rope_train(qkv, H, Hkv, D, cos, sin);
          REQUIRE(q.defined());
          CHECK((q.is_contiguous() && k.is_contiguous() && v.is_contiguous()));
        } else {
          const auto parts = qkv.split_with_sizes({H * D, Hkv * D, Hkv * D}, -1);
          q = apply_rope_rows(parts[0].view({N, H, D}), cos, sin);
          k = apply_rope_rows(parts[1].view({N, Hkv, D}), cos, sin);
          v = parts[2].view({N, Hkv, D});
        }
        ((q * gq).sum() + (k * gk).sum() + (v * gv).sum()).backward();
        return std::vector<at::Tensor>{q.detach(), k.detach(), v.detach(), qkv.grad()};
      };
      auto f = run_qkv(true), e = run_qkv(false);
      for (size_t i = 0; i < 3; ++i) CHECK(at::equal(f[i], e[i]));
      // the gradient: v's copied, q's and k's rotated back (the eager backward sums the two
      // products' gradients as the kernel does: within one unit in the last place)
      CHECK(at::equal(f[3].narrow(1, (H + Hkv) * D, Hkv * D), gv.view({N, Hkv * D})));
      CHECK(max_ulps(f[3], e[3], dtype) <= 1.0);

      // gate|up: the forward of silu(gate) · up on the halves, the backward silu_mul_train's
      // gradients of the two halves, bit for bit, written into one tensor
      const auto gu0 = at::cat({rnd({N, I}, 4.0), rnd({N, I})}, 1);
      const auto go = rnd({N, I});
      auto gu = gu0.clone().requires_grad_(true);
      auto out = fused::silu_mul_halves_train(gu);
      REQUIRE(out.defined());
      out.backward(go);
      auto g = gu0.narrow(1, 0, I).contiguous().requires_grad_(true), u = gu0.narrow(1, I, I).contiguous().requires_grad_(true);
      auto sep = fused::silu_mul_train(g, u);
      REQUIRE(sep.defined());
      sep.backward(go);
      CHECK(at::equal(out.detach(), sep.detach()));
      CHECK(at::equal(out.detach(), at::silu(gu0.narrow(1, 0, I)) * gu0.narrow(1, I, I)));
      CHECK(at::equal(gu.grad().narrow(1, 0, I), g.grad()));
      CHECK(at::equal(gu.grad().narrow(1, I, I), u.grad()));
    }
    // where the kernels do not apply: the CPU, switched off
    CHECK_FALSE(std::get<0>(fused::qkv_rope_train(at::randn({3, 40}), 3, 1, 8, at::randn({3, 8}), at::randn({3, 8}))).defined());
    CHECK_FALSE(fused::silu_mul_halves_train(at::randn({2, 8})).defined());
    with_fused(false, [] {
      CHECK_FALSE(fused::silu_mul_halves_train(at::randn({2, 8}).cuda()).defined());
      return 0;
    });
  }

  TEST_CASE("a model trained with fused q|k|v and gate|up GEMMs: the unfused model's values and gradients") {
    // fp32 through the padded path (stacked_rows' autograd, split views), and bf16 with padding
    // through the varlen trunk (qkv_rope_train, silu_mul_halves_train): there no further from
    // the exact values and gradients (double, on the CPU, from the same bf16 weights) than the
    // unfused model
    if (!hybridrl::testing::fused_cuda_here()) return;
    const auto c = hybridrl::testing::kernel_shaped_config();
    at::manual_seed(22);
    const auto ids = at::randint(0, c.vocab_size, {3, 11});
    auto mask = at::ones({3, 11}, at::kLong);
    mask[1].narrow(0, 0, 4).fill_(0);
    mask[2].narrow(0, 8, 3).fill_(0);
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      CAPTURE(dtype);
      const bool padded = dtype == at::kBFloat16;
      auto make = [&](bool fuse, at::Device dev, at::ScalarType dt) {
        at::manual_seed(21);
        CausalLM m(c);
        m->to(dtype);  // the weights rounded to `dtype` first, then cast (exactly) for the reference
        m->to(dev, dt);
        if (fuse) m->model->fuse_projections();
        m->train();
        return m;
      };
      auto run = [&](CausalLM m) {
        const auto dev = m->parameters().front().device();
        auto args = ForwardArgs{};
        if (padded) args.attention_mask(mask.to(dev));
        auto lp = token_log_probs(m, ids.to(dev), args).log_probs;
        const auto valid = (padded ? mask : at::ones_like(mask)).to(dev, lp.scalar_type());
        (-(lp * valid).sum() / valid.sum()).backward();
        std::map<std::string, at::Tensor> g;
        for (const auto& item : m->named_parameters()) g[item.key()] = item.value().grad().to(at::kCPU, at::kDouble);
        return std::make_pair((lp * valid).detach().to(at::kCPU, at::kDouble), g);
      };
      auto [l0, g0] = run(make(false, at::kCUDA, dtype));
      auto [l1, g1] = run(make(true, at::kCUDA, dtype));
      auto rel = [](const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
        double worst = 0;
        for (const auto& [k, g] : b) worst = std::max(worst, ((a.at(k) - g).norm() / g.norm().clamp_min(1e-30)).item<double>());
        return worst;
      };
      if (!padded) {
        CHECK((l0 - l1).abs().max().item<double>() < 1e-5);
        CHECK(rel(g1, g0) < 1e-5);
        continue;
      }
      auto [le, ge] = run(make(false, at::kCPU, at::kDouble));
      // bf16 is judged against the unfused bf16 model's own distance from the exact values: on
      // the H100 (2026-12-07) both models' worst tensor gradient lay 0.387 (relative) from the
      // exact one and their log-probs up to ~1 apart from it — the bf16 floor of this tiny config,
      // not a bound either model can beat
      const double e_plain = rel(g0, ge), e_fused = rel(g1, ge);
      const double d_plain = (l0 - le).abs().max().item<double>(), d_fused = (l1 - le).abs().max().item<double>();
      CAPTURE(e_plain);
      CAPTURE(e_fused);
      CAPTURE(d_plain);
      CAPTURE(d_fused);
      CHECK(d_fused <= d_plain * 1.25 + 1e-3);
      CHECK(e_fused <= e_plain * 1.25);
      CHECK(e_plain < 1.0);  // the reference itself is not broken
    }
  }

  TEST_CASE("RMSNorm and the residual add + RMSNorm: within one unit in the last place of the eager ops") {
    if (!hybridrl::testing::fused_cuda_here()) return;
    c10::NoGradGuard ng;
    at::manual_seed(3);
    for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
      // 16-byte packs, one, two and four per thread (64 ... 16384), and element by element (100;
      // 40000: more packs than the packed kernel takes)
      for (int64_t dim : {64, 768, 2048, 100, 16384, 40000}) {
        CAPTURE(dtype);
        CAPTURE(dim);
        RMSNorm norm(dim, 1e-5);
        norm->weight.copy_(at::rand({dim}) + 0.5);
        norm->to(at::kCUDA, dtype);
        auto x = (at::randn({37, dim}) * 3).to(at::kCUDA, dtype);
        auto r = at::randn({37, dim}).to(at::kCUDA, dtype);
        const auto eager = with_fused(false, [&] { return norm(x); });
        const auto got = norm(x);
        CHECK(fused::rms_norm(x, norm->weight, 1e-5).defined());
        // fp32 keeps every bit of the order-dependent sum (a few units apart); bf16/fp16 round it
        // away but where x̂ lands near a rounding boundary: one unit of x̂, which the multiply by a
        // weight below 1 makes two units of the output's (lower) binade, a little more as this
        // measures at the larger of the two values (seen up to 2.2 at 16384 and 40000 in the
        // element-by-element kernel too); and ≥ 98 % of the values equal below
        const double ulps = dtype == at::kFloat ? 8.0 : 3.0;
        CHECK(max_ulps(got, eager, dtype) <= ulps);
        if (dtype != at::kFloat) CHECK(got.eq(eager).to(at::kFloat).mean().item<double>() >= 0.98);
        const auto [h_e, n_e] = with_fused(false, [&] { return norm->forward_add(x, r); });
        const auto [h, n] = norm->forward_add(x, r);
        CHECK(at::equal(h, h_e));  // the residual add rounds as the eager add
        CHECK(max_ulps(n, n_e, dtype) <= ulps);
        // and the fp32 formula by hand
        auto hf = h.to(at::kDouble);
        auto want = norm->weight.to(at::kDouble) * (hf * at::rsqrt(hf.pow(2).mean(-1, true) + 1e-5));
        CHECK(max_ulps(n, want, dtype) <= ulps + 1.0);
      }
    }
  }

  TEST_CASE("RMSNorm in training, alone, after the residual add, and passing x on: the eager forward, gradients at least as near the exact ones as eager's") {
    if (!hybridrl::testing::fused_cuda_here()) return;
    at::manual_seed(21);
    const double eps = 1e-5;
    // rows: 37, and 3000 (more than the backward's blocks: a block walks several rows); dims up to
    // the largest row the kernel takes, 1024 packs of 16 bytes (bf16 / fp16 8192, fp32 4096)
    const std::vector<std::pair<int64_t, int64_t>> shapes{{37, 768}, {3000, 768}, {37, 2048}, {5, 4096}, {3, 8192}};
    for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
      for (const auto& [rows, dim] : shapes) {
        if (dim == 8192 && dtype == at::kFloat) continue;
        // 0: the norm alone; 1: after the residual add; 2: x passed on through the op (keep), which
        // then receives the stream's gradient of x as h's
        for (int mode : {0, 1, 2}) {
          const bool add = mode == 1, stream = mode != 0;
          CAPTURE(dtype);
          CAPTURE(rows);
          CAPTURE(dim);
          CAPTURE(mode);
          const auto x0 = (at::randn({rows, dim}) * 2).to(at::kCUDA, dtype);
          const auto r0 = at::randn({rows, dim}).to(at::kCUDA, dtype);
          const auto w0 = (at::rand({dim}) + 0.5).to(at::kCUDA, dtype);
          const auto dy = at::randn({rows, dim}).to(at::kCUDA, dtype);
          const auto dh = at::randn({rows, dim}).to(at::kCUDA, dtype);  // the stream's gradient of h
          // {h, y, dx, dr, dw} through the fused op or the eager ops
          auto run = [&](bool fused_on) {
            return with_fused(fused_on, [&] {
              auto x = x0.clone().requires_grad_(true), r = r0.clone().requires_grad_(true);
              auto w = w0.clone().requires_grad_(true);
              at::Tensor h, y;
              if (fused_on) {
                std::tie(h, y) = fused::rms_norm_train(x, add ? r : at::Tensor(), w, eps, /*keep=*/mode == 2);
                REQUIRE(y.defined());
              } else {
                h = add ? x + r : x;
                auto hf = h.to(at::kFloat);
                y = w * (hf * at::rsqrt(hf.pow(2).mean(-1, true) + eps)).to(dtype);
              }
              auto loss = (y.to(at::kFloat) * dy.to(at::kFloat)).sum();
              if (stream) loss = loss + (h.to(at::kFloat) * dh.to(at::kFloat)).sum();
              loss.backward();
              return std::vector<at::Tensor>{h.detach(), y.detach(), x.grad(), add ? r.grad() : at::Tensor(), w.grad()};
            });
          };
          const auto fz = run(true), eager = run(false);
          CHECK(at::equal(fz[0], eager[0]));  // the add rounds as the eager add
          CHECK(max_ulps(fz[1], eager[1], dtype) <= (dtype == at::kFloat ? 8.0 : 3.0));
          if (dtype != at::kFloat) CHECK(fz[1].eq(eager[1]).to(at::kFloat).mean().item<double>() >= 0.98);
          // the exact gradients, in double, of the function of the rounded h
          auto hd = fz[0].to(at::kDouble).requires_grad_(true);
          auto wd = w0.to(at::kDouble).requires_grad_(true);
          auto yd = wd * (hd * at::rsqrt(hd.pow(2).mean(-1, true) + eps));
          (yd * dy.to(at::kDouble)).sum().backward();
          const auto dx_exact = stream ? hd.grad() + dh.to(at::kDouble) : hd.grad();
          const auto dw_exact = wd.grad();
          const auto err = [](const at::Tensor& t, const at::Tensor& exact) {
            return ((t.to(at::kDouble) - exact).norm() / exact.norm()).item<double>();
          };
          const double tol = dtype == at::kFloat ? 1e-5 : dtype == at::kHalf ? 2e-3 : 1e-2;
          const double ex_f = err(fz[2], dx_exact), ex_e = err(eager[2], dx_exact);
          const double ew_f = err(fz[4], dw_exact), ew_e = err(eager[4], dw_exact);
          CAPTURE(ex_f);
          CAPTURE(ex_e);
          CAPTURE(ew_f);
          CAPTURE(ew_e);
          CHECK(ex_f <= tol);
          CHECK(ew_f <= tol);
          // rounded once, in float: no further from the exact gradient than the eager graph's
          if (dtype != at::kFloat) CHECK(ex_f <= ex_e * 1.05);
          CHECK(ew_f <= ew_e * 1.05 + (dtype == at::kFloat ? 1e-6 : 1e-3));
          if (add) CHECK(at::equal(fz[3], fz[2]));  // x and the residual get the same gradient
        }
      }
    }
    // the module's training forward takes it, the backward runs through it
    RMSNorm norm(768, eps);
    norm->to(at::kCUDA, at::kBFloat16);
    auto x = at::randn({4, 768}).to(at::kCUDA, at::kBFloat16).requires_grad_(true);
    auto [h, y] = norm->forward_add(x, at::randn({4, 768}).to(at::kCUDA, at::kBFloat16));
    CHECK(y.grad_fn() != nullptr);
    CHECK(std::string(y.grad_fn()->name()).find("AddRmsNormTrain") != std::string::npos);
    CHECK(std::string(norm(x).grad_fn()->name()).find("RmsNormTrain") != std::string::npos);
    auto [hk, yk] = norm->forward_keep(x);
    CHECK(std::string(yk.grad_fn()->name()).find("RmsNormKeepTrain") != std::string::npos);
    CHECK(hk.data_ptr() == x.data_ptr());  // x itself, passed through (a view)
    // where it does not apply: the CPU, a row not a multiple of 16 bytes or over 16 KB, switched off
    CHECK_FALSE(fused::rms_norm_train(at::randn({2, 8}), {}, at::ones({8}), eps).second.defined());
    CHECK_FALSE(fused::rms_norm_train(at::randn({2, 8192}).cuda(), {}, at::ones({8192}).cuda(), eps).second.defined());
    CHECK_FALSE(fused::rms_norm_train(at::randn({2, 100}).cuda().to(at::kBFloat16), {},
                                      at::ones({100}).cuda().to(at::kBFloat16), eps)
                    .second.defined());
    with_fused(false, [&] {
      CHECK_FALSE(fused::rms_norm_train(at::randn({2, 8}).cuda(), {}, at::ones({8}).cuda(), eps).second.defined());
      return 0;
    });
  }

  TEST_CASE("rotary embeddings of q and k in place and SiLU(gate)·up: bit-identical to the eager ops") {
    if (!hybridrl::testing::fused_cuda_here()) return;
    c10::NoGradGuard ng;
    at::manual_seed(5);
    for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
      CAPTURE(dtype);
      const int64_t B = 2, T = 7, H = 8, Hkv = 2, D = 64;
      auto inv = 1.0 / at::pow(10000.0, at::arange(0, D, 2).to(at::kFloat) / static_cast<double>(D));
      auto pos = at::randint(0, 4000, {B, T}, at::kLong).cuda();
      auto [cos, sin] = rope_cos_sin(inv.cuda(), pos, dtype);
      auto q = at::randn({B, T, H, D}).to(at::kCUDA, dtype);
      auto k = at::randn({B, T, Hkv, D}).to(at::kCUDA, dtype);
      const auto q_e = apply_rope(q.transpose(1, 2), cos, sin).transpose(1, 2);
      const auto k_e = apply_rope(k.transpose(1, 2), cos, sin).transpose(1, 2);
      CHECK(fused::rope_(q, k, cos, sin));
      CHECK(at::equal(q, q_e));
      CHECK(at::equal(k, k_e));
      auto g = (at::randn({5, 300}) * 4).to(at::kCUDA, dtype);
      auto u = at::randn({5, 300}).to(at::kCUDA, dtype);
      CHECK(at::equal(fused::silu_mul(g, u), at::silu(g) * u));
      // the fused projections' forms: one q|k|v row split, rotated and copied; one gate|up row
      auto qkv = at::randn({B, T, (H + 2 * Hkv) * D}).to(at::kCUDA, dtype);
      const auto [fq, fk, fv] = fused::qkv_rope(qkv, H, Hkv, D, cos, sin);
      REQUIRE(fq.defined());
      CHECK(fq.is_contiguous());
      CHECK(at::equal(fq, apply_rope(qkv.narrow(2, 0, H * D).view({B, T, H, D}).transpose(1, 2), cos, sin).transpose(1, 2)));
      CHECK(at::equal(fk, apply_rope(qkv.narrow(2, H * D, Hkv * D).reshape({B, T, Hkv, D}).transpose(1, 2), cos, sin)
                              .transpose(1, 2)));
      CHECK(at::equal(fv, qkv.narrow(2, (H + Hkv) * D, Hkv * D).reshape({B, T, Hkv, D})));
      auto gu = at::cat({g, u}, -1);
      CHECK(at::equal(fused::silu_mul_halves(gu), at::silu(g) * u));
    }
    // a transposed (non-contiguous) q is left to the eager ops
    auto q = at::randn({2, 8, 7, 64}).cuda().transpose(1, 2);
    auto k = at::randn({2, 7, 2, 64}).cuda();
    auto cs = at::ones({2, 7, 64}).cuda();
    CHECK_FALSE(fused::rope_(q, k, cs, cs));
  }

  TEST_CASE("q|k|v rotated and stored in a paged cache in one pass: write_kv_to_cache's cache, bit for bit") {
    if (!hybridrl::testing::fused_cuda_here()) return;
    c10::NoGradGuard ng;
    at::manual_seed(17);
    // D = 64: 16-byte packs; D = 6: element by element (fp32 and bf16 each)
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      for (int64_t D : {64, 6}) {
        CAPTURE(dtype);
        CAPTURE(D);
        const int64_t B = 2, T = 5, H = 4, Hkv = 2, blocks = 6, block_size = 4;
        auto inv = 1.0 / at::pow(10000.0, at::arange(0, D, 2).to(at::kFloat) / static_cast<double>(D));
        auto [cos, sin] = rope_cos_sin(inv.cuda(), at::randint(0, 500, {B, T}, at::kLong).cuda(), dtype);
        auto qkv = at::randn({B, T, (H + 2 * Hkv) * D}).to(at::kCUDA, dtype);
        // distinct slots in scrambled order; −1 (padding) and one past the cache are not stored
        auto slots = at::randperm(blocks * block_size, at::kLong).narrow(0, 0, B * T).clone();
        slots[3] = -1;
        slots[7] = blocks * block_size;
        slots = slots.cuda();
        const auto fill = at::full({blocks, block_size, Hkv, D}, 7.0).to(at::kCUDA, dtype);
        fused::CacheRows rows{fill.clone(), fill.clone(), slots};
        const auto [q, k, v] = fused::qkv_rope(qkv, H, Hkv, D, cos, sin, &rows);
        REQUIRE(q.defined());
        const auto [q0, k0, v0] = fused::qkv_rope(qkv, H, Hkv, D, cos, sin);
        CHECK(at::equal(q, q0));  // the outputs are the ones without the cache
        CHECK(at::equal(k, k0));
        CHECK(at::equal(v, v0));
        auto kc = fill.clone(), vc = fill.clone();
        write_kv_to_cache(k.reshape({B * T, Hkv, D}), v.reshape({B * T, Hkv, D}), kc, vc, slots);
        CHECK(at::equal(rows.key_cache, kc));
        CHECK(at::equal(rows.value_cache, vc));
        CHECK(rows.key_cache.ne(fill).any().item<bool>());
        // a cache of another dtype is refused (nothing written), as is a slot_mapping of the wrong length
        fused::CacheRows other{at::zeros({blocks, block_size, Hkv, D}, at::TensorOptions(at::kCUDA).dtype(at::kHalf)),
                               at::zeros({blocks, block_size, Hkv, D}, at::TensorOptions(at::kCUDA).dtype(at::kHalf)), slots};
        CHECK_FALSE(std::get<0>(fused::qkv_rope(qkv, H, Hkv, D, cos, sin, &other)).defined());
        CHECK_FALSE(other.key_cache.ne(0).any().item<bool>());
        fused::CacheRows short_map{fill.clone(), fill.clone(), slots.narrow(0, 0, 3)};
        CHECK_FALSE(std::get<0>(fused::qkv_rope(qkv, H, Hkv, D, cos, sin, &short_map)).defined());
      }
    }
  }

  TEST_CASE("the one-pass sampler draws the tensor path's tokens (T = 1, 0.7, greedy; fp32, bf16)") {
    if (!hybridrl::testing::fused_cuda_here()) return;
    c10::NoGradGuard ng;
    at::manual_seed(11);
    const int64_t B = 96;
    for (int64_t V : {1001, 32000}) {
      for (auto dtype : {at::kFloat, at::kBFloat16}) {
        for (double T : {1.0, 0.7, 0.0}) {
          CAPTURE(V);
          CAPTURE(dtype);
          CAPTURE(T);
          auto logits = (at::randn({B, V}) * 2).to(at::kCUDA, dtype);
          SamplingRows rows;
          rows.seeds = (at::randint(-(1LL << 62), 1LL << 62, {B}, at::kLong)).cuda();
          rows.samples = at::randint(0, 8, {B}, at::kLong).cuda();
          rows.positions = at::randint(0, 300, {B}, at::kLong).cuda();
          SamplingOptions o;
          o.temperature(T);
          const auto want = with_fused(false, [&] { return sample_tokens(logits, o, rows); });
          const auto [tok, lp] = fused::sample(logits, T, rows.seeds, rows.samples, rows.positions);
          REQUIRE(tok.defined());
          CHECK(at::equal(tok, want.tokens));
          CHECK((lp - want.log_probs).abs().max().item<double>() <= 2e-5);
          // sample_tokens takes the kernel for these options
          const auto got = sample_tokens(logits, o, rows);
          CHECK(at::equal(got.tokens, want.tokens));
        }
      }
    }
    // top-k / top-p / min-p and banned tokens stay on the tensor path: sample_tokens with top_p
    // draws what it drew with the kernels off
    auto logits = at::randn({8, 500}).cuda();
    SamplingRows rows;
    rows.seeds = at::arange(8, at::kLong).cuda();
    rows.samples = at::zeros({8}, at::kLong).cuda();
    rows.positions = at::zeros({8}, at::kLong).cuda();
    SamplingOptions o;
    o.top_p(0.5);
    CHECK(at::equal(sample_tokens(logits, o, rows).tokens,
                    with_fused(false, [&] { return sample_tokens(logits, o, rows); }).tokens));
  }

  TEST_CASE("a model forward and a Paged generation: the same with the kernels on and off") {
    if (!hybridrl::testing::fused_cuda_here()) return;
    c10::NoGradGuard ng;
    const auto c = hybridrl::testing::kernel_shaped_config();  // the generation replays CUDA graphs
    at::manual_seed(1);
    auto m = CausalLM(c);
    m->to(at::kCUDA);
    m->eval();
    auto ids = at::randint(0, 320, {3, 40}, at::kLong).cuda();
    const auto off = with_fused(false, [&] { return m->forward(ids); });
    const auto on = m->forward(ids);
    CHECK((on - off).abs().max().item<double>() <= 1e-5);
    // one GEMM for q|k|v and for gate|up: the parameters keep names, shapes and values, the
    // forward its result; a weight written into a parameter is what the fused GEMM reads
    {
      auto before = m->named_parameters();
      std::vector<std::pair<std::string, at::Tensor>> copies;
      for (const auto& p : before) copies.emplace_back(p.key(), p.value().clone());
      m->model->fuse_projections();
      auto after = m->named_parameters();
      REQUIRE(after.size() == copies.size());
      for (const auto& [name, value] : copies) CHECK(at::equal(after[name], value));
      CHECK(after["model.layers.0.self_attn.k_proj.weight"].is_alias_of(after["model.layers.0.self_attn.q_proj.weight"]));
      CHECK(after["model.layers.1.mlp.up_proj.weight"].is_alias_of(after["model.layers.1.mlp.gate_proj.weight"]));
      const auto fused_out = m->forward(ids);
      CHECK((fused_out - off).abs().max().item<double>() <= 1e-5);
      auto w = after["model.layers.1.self_attn.v_proj.weight"];
      const auto saved = w.clone();
      w.mul_(0.5);
      const auto halved = m->forward(ids);
      const auto halved_eager = with_fused(false, [&] { return m->forward(ids); });
      CHECK((halved - halved_eager).abs().max().item<double>() <= 1e-5);
      CHECK((halved - fused_out).abs().max().item<double>() > 1e-3);  // the change reached the fused GEMM
      w.copy_(saved);
    }
    // bf16: the norm's last place may differ, so the logits agree within bf16's noise
    auto mb = CausalLM(c);
    {
      auto src = m->named_parameters();
      for (auto& p : mb->named_parameters()) p.value().copy_(src[p.key()]);
    }
    mb->to(at::kCUDA, at::kBFloat16);
    mb->eval();
    mb->model->fuse_projections();
    const auto off16 = with_fused(false, [&] { return mb->forward(ids).to(at::kFloat); });
    const auto on16 = mb->forward(ids).to(at::kFloat);
    CHECK((on16 - off16).abs().max().item<double>() <= 0.05 * off.abs().max().item<double>());
    CHECK(on16.argmax(-1).eq(off16.argmax(-1)).to(at::kFloat).mean().item<double>() >= 0.95);
    // fp32 generation: the same tokens either way (CUDA graphs, fused sampler)
    const auto prompts = hybridrl::testing::prompt_batch({{5, 9, 33, 2, 71, 8}, {17, 3}, {100, 101, 102, 103, 104, 105, 106}});
    const auto s = SamplingOptions{}.temperature(1.0).max_new_tokens(24).ignore_eos(true).seed(9);
    auto gen = [&] {
      PagedEngine e(m, PagedOptions{}.kv_cache_tokens(4096));
      auto out = e.generate(prompts, s);
      CHECK(e.stats().graph_steps >= 20);
      return out.tensor(keys::responses);
    };
    const auto a = with_fused(false, gen);
    const auto b = gen();
    CHECK(at::equal(a, b));
  }

  TEST_CASE("programmatic dependent launches (HYBRIDRL_PDL=1): a bf16 Paged generation in CUDA graphs, a training forward and its gradients, as plain launches") {
    // each kernel waits for the one before it at its first instruction: the same kernels on the
    // same data, so generation (tokens and log-probs) is the same bit for bit; the training
    // gradients differ only as much as two plain runs differ (atomics in the attention's backward)
    if (!hybridrl::testing::fused_cuda_here()) return;
    struct Restore {
      bool was = fused::programmatic_launch();
      ~Restore() { fused::set_programmatic_launch(was); }
    } restore;
    const auto devices = device_info().devices;
    if (!devices.empty() && devices.front().compute_major < 9) {
      MESSAGE("compute capability " << devices.front().compute_major << ": plain launches either way (PDL needs sm_90)");
    }
    const auto c = hybridrl::testing::kernel_shaped_config();
    at::manual_seed(5);
    CausalLM m(c);
    m->to(at::kCUDA, at::kBFloat16);
    m->model->fuse_projections();
    m->eval();
    const auto prompts = hybridrl::testing::prompt_batch({{5, 9, 33, 2, 71, 8}, {17, 3}, {100, 101, 102, 103, 104, 105, 106}});
    const auto s = SamplingOptions{}.temperature(1.0).max_new_tokens(24).ignore_eos(true).seed(9);
    auto gen = [&](bool pdl) {
      fused::set_programmatic_launch(pdl);
      c10::NoGradGuard ng;
      PagedEngine e(m, PagedOptions{}.kv_cache_tokens(4096));
      auto out = e.generate(prompts, s);
      CHECK(e.stats().graph_steps >= 20);
      return std::make_pair(out.tensor(keys::responses).cpu(), out.tensor(keys::rollout_log_probs).cpu());
    };
    const auto [r0, l0] = gen(false);
    const auto [r1, l1] = gen(true);
    CHECK(fused::programmatic_launch());
    CHECK(at::equal(r0, r1));
    CHECK(at::equal(l0, l1));
    // training: rows with padding through the varlen trunk and the training kernels (rotary, norms,
    // SiLU·up, the head's log-prob), forward and backward
    const auto ids = at::randint(0, c.vocab_size, {3, 11}).cuda();
    auto mask = at::ones({3, 11}, at::kLong);
    mask[1].narrow(0, 0, 4).fill_(0);
    mask = mask.cuda();
    m->train();
    auto step = [&](bool pdl) {
      fused::set_programmatic_launch(pdl);
      for (auto& p : m->parameters()) p.mutable_grad().reset();
      auto lp = token_log_probs(m, ids, ForwardArgs{}.attention_mask(mask)).log_probs;
      const auto valid = mask.to(lp.scalar_type());
      (-(lp * valid).sum() / valid.sum()).backward();
      std::map<std::string, at::Tensor> g;
      for (const auto& item : m->named_parameters()) g[item.key()] = item.value().grad().to(at::kDouble);
      return std::make_pair((lp * valid).detach(), g);
    };
    const auto [f0, g0] = step(false);
    const auto [f0b, g0b] = step(false);
    const auto [f1, g1] = step(true);
    CHECK(at::equal(f0, f1));  // the forward has no atomics
    for (const auto& [k, g] : g0) {
      CAPTURE(k);
      const double n = g.norm().item<double>();
      const double spread = (g0b.at(k) - g).norm().item<double>(), d = (g1.at(k) - g).norm().item<double>();
      CAPTURE(spread);
      CAPTURE(d);
      CHECK(d <= 2.0 * spread + 1e-6 * n);
    }
  }
}

TEST_SUITE("cuda/varlen") {
  using namespace hybridrl;
  using hybridrl::testing::with_fused;

#if HYBRIDRL_HAS_VARLEN_FLASH
  TEST_CASE("rows of one length through cuDNN's dense attention: FlashAttention-2's values and gradients, as near the exact ones (MHA and GQA)") {
    if (!hybridrl::testing::fused_cuda_here()) return;
    namespace compat = hybridrl::detail::compat;
    struct Restore {
      bool was = compat::cudnn_attention_enabled();
      ~Restore() { compat::set_cudnn_attention(was); }
    } restore;
    at::manual_seed(21);
    const int64_t rows = 3, L = 160, D = 64, N = rows * L;
    for (int64_t Hkv : {int64_t{4}, int64_t{2}}) {  // H = 4: MHA, then two query heads per KV head
      CAPTURE(Hkv);
      compat::set_cudnn_attention(true);
      const int64_t H = 4;
      const auto o = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
      const auto q0 = at::randn({N, H, D}, o), k0 = at::randn({N, Hkv, D}, o), v0 = at::randn({N, Hkv, D}, o);
      const auto go = at::randn({N, H, D}, o);
      const auto cu = at::arange(0, N + 1, L, at::TensorOptions().device(at::kCUDA).dtype(at::kInt));
      const double scale = 1.0 / std::sqrt(static_cast<double>(D));
      auto run = [&](auto&& attend) {
        auto q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true), v = v0.clone().requires_grad_(true);
        auto out = attend(q, k, v);
        out.backward(go);
        return std::vector<at::Tensor>{out.detach().to(at::kFloat), q.grad().to(at::kFloat), k.grad().to(at::kFloat),
                                       v.grad().to(at::kFloat)};
      };
      const auto dense = run([&](auto& q, auto& k, auto& v) { return compat::dense_cudnn_attention(q, k, v, rows, scale); });
      if (!compat::cudnn_attention_enabled()) {
        MESSAGE("cuDNN refused these shapes: the varlen kernel serves them (dense_cudnn_attention returned nothing)");
        continue;
      }
      const auto flash = run([&](auto& q, auto& k, auto& v) {
        return compat::varlen_flash_attention(q, k, v, cu, cu, L, L, scale, std::nullopt);
      });
      // the exact values: float math on the same bf16 inputs, K/V heads repeated for their groups
      const auto exact = run([&](auto& q, auto& k, auto& v) {
        auto qf = q.to(at::kFloat).view({rows, L, H, D}).transpose(1, 2);
        auto kf = k.to(at::kFloat).view({rows, L, Hkv, D}).transpose(1, 2).repeat_interleave(H / Hkv, 1);
        auto vf = v.to(at::kFloat).view({rows, L, Hkv, D}).transpose(1, 2).repeat_interleave(H / Hkv, 1);
        auto s = at::matmul(qf, kf.transpose(-1, -2)) * scale;
        s = s.masked_fill(at::ones({L, L}, s.options().dtype(at::kBool)).triu(1), -INFINITY);
        return at::matmul(at::softmax(s, -1), vf).transpose(1, 2).reshape({N, H, D}).to(at::kBFloat16);
      });
      for (size_t i = 0; i < exact.size(); ++i) {
        CAPTURE(i);  // 0: output, 1-3: gradients of q, k, v
        CHECK(dense[i].isfinite().all().item<bool>());
        const double n = exact[i].norm().item<double>();
        const double d_dense = (dense[i] - exact[i]).norm().item<double>() / n;
        const double d_flash = (flash[i] - exact[i]).norm().item<double>() / n;
        CAPTURE(d_dense);
        CAPTURE(d_flash);
        CHECK(d_dense <= 1.5 * d_flash + 1e-3);  // bf16 rounding of either kernel, no more
        CHECK(d_dense <= 0.02);
      }
    }
  }
#endif

  TEST_CASE("padded and packed rows through the unpadded varlen trunk = the masked path (bf16; autocast gradients)") {
    if (!hybridrl::testing::fused_cuda_here()) return;
    const auto c = hybridrl::testing::kernel_shaped_config();
    at::manual_seed(4);
    CausalLM m(c);
    m->to(at::kCUDA);
    const auto ids = at::randint(3, 320, {3, 20}, at::kLong).cuda();
    auto mask = at::ones({3, 20}, at::kLong);
    mask[1].narrow(0, 0, 5).zero_();   // left padding
    mask[2].narrow(0, 13, 7).zero_();  // right padding
    mask = mask.cuda();
    // fp32 weights without autocast: the masked path
    CHECK_FALSE(m->model->varlen_dtype(ids).has_value());
    // padded rows, and rows without padding (the trunk then skips its gather and scatter back)
    for (const auto& attn : {mask, at::ones_like(mask)}) {
      const auto valid = attn.to(at::kBool);
      CAPTURE(valid.all().item<bool>());
      const auto args = ForwardArgs{}.attention_mask(attn);
      // bf16 under autocast (the training engines' mixed precision): the varlen path, forward and gradients
      auto run = [&](bool on) {
        return with_fused(on, [&] {
          m->zero_grad();
          hybridrl::detail::compat::AutocastGuard cast(at::kCUDA, at::kBFloat16);
          if (on) CHECK(m->model->varlen_dtype(ids) == at::kBFloat16);
          auto logits = m->forward(ids, args).to(at::kFloat);
          auto lp = at::log_softmax(logits.narrow(1, 0, 19), -1).gather(-1, ids.narrow(1, 1, 19).unsqueeze(-1)).squeeze(-1);
          auto keep = valid.narrow(1, 0, 19).logical_and(valid.narrow(1, 1, 19));
          (lp * keep).sum().backward();
          std::vector<at::Tensor> grads;
          for (const auto& p : m->parameters()) grads.push_back(p.grad().clone());
          return std::make_pair(logits.detach(), grads);
        });
      };
      const auto [l_var, g_var] = run(true);
      const auto [l_mask, g_mask] = run(false);
      const auto scale = l_mask.masked_select(valid.unsqueeze(-1)).abs().max().item<double>();
      CHECK((l_var - l_mask).abs().masked_select(valid.unsqueeze(-1)).max().item<double>() <= 0.03 * scale);
      CHECK(l_var.argmax(-1).eq(l_mask.argmax(-1)).masked_select(valid).to(at::kFloat).mean().item<double>() >= 0.95);
      if (!valid.all().item<bool>()) {
        CHECK(l_var.masked_select(valid.logical_not().unsqueeze(-1)).abs().max().item<double>() == 0.0);  // padding: no work
      }
      for (size_t i = 0; i < g_var.size(); ++i) {
        CAPTURE(i);
        const auto d = (g_var[i] - g_mask[i]).norm().item<double>(), n = g_mask[i].norm().item<double>();
        CHECK(d <= 0.05 * n + 1e-6);
      }
    }
    // packed rows (Loader<Packed>'s cu_seqlens): two sequences in one row and a padded tail
    auto mb = CausalLM(c);
    {
      auto src = m->named_parameters();
      c10::NoGradGuard ng;
      for (auto& p : mb->named_parameters()) p.value().copy_(src[p.key()]);
    }
    mb->to(at::kCUDA, at::kBFloat16);
    c10::NoGradGuard ng;
    const auto row = ids.narrow(0, 0, 1);
    const auto packed = ForwardArgs{}.cu_seqlens(at::tensor(std::vector<int64_t>{0, 8, 15}, at::kLong).cuda());
    CHECK(mb->model->varlen_dtype(row) == at::kBFloat16);
    const auto got = mb->forward(row, packed).to(at::kFloat);
    const auto want = with_fused(false, [&] { return mb->forward(row, packed).to(at::kFloat); });
    // each sequence alone (no mask: plain causal attention): the same logits as its slice of the packed row
    const auto first = mb->forward(row.narrow(1, 0, 8)).to(at::kFloat);
    const auto s = want.abs().max().item<double>();
    CHECK((got.narrow(1, 0, 15) - want.narrow(1, 0, 15)).abs().max().item<double>() <= 0.03 * s);
    CHECK((got.narrow(1, 0, 8) - first).abs().max().item<double>() <= 0.03 * s);
    CHECK(got.narrow(1, 15, 5).abs().max().item<double>() == 0.0);
  }
}
