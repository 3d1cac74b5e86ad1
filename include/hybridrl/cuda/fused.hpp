#pragma once
/// \file
/// Fused CUDA kernels for inference forwards (generation, and the no-grad log-prob passes): RMSNorm
/// with the residual add before it, rotary embeddings on q and k in place, SiLU(gate) · up, and
/// one-pass token sampling (src/cuda/fused_ops.cu). Each function here returns an undefined tensor
/// (or false) where its kernel does not apply, and the caller runs its eager ops instead: on the
/// CPU, in a target not linked with hybridrl::cuda, with autograd recording (the kernels have no
/// backward), for mixed dtypes or non-contiguous inputs, or when switched off.
///
/// The kernels round where the eager ops round: the rotary and the activation are bit-identical to
/// them, the norm may differ in the last place of its output (another summation order), the
/// sampler draws the tokens of rollout/sampler.hpp's tensor path. Switch them off for a whole
/// process with the environment variable HYBRIDRL_FUSED_KERNELS=0, or with
/// `hybridrl::fused::set_enabled(false)`.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/cuda/launchers.hpp"

#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
#include <ATen/cuda/CUDAContext.h>
#include <torch/csrc/autograd/custom_function.h>
#endif

namespace hybridrl::fused {

namespace detail {
inline std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("HYBRIDRL_FUSED_KERNELS");
    return v == nullptr || std::string_view(v) != "0";
  }()};
  return on;
}

inline std::optional<cuda::KernelDtype> kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return cuda::KernelDtype::f32;
    case at::kHalf: return cuda::KernelDtype::f16;
    case at::kBFloat16: return cuda::KernelDtype::bf16;
    default: return std::nullopt;
  }
}

inline void check_launch(int rc, std::string_view what) {
  HYBRIDRL_CHECK(rc == 0, fmt::format("fused {}: the CUDA kernel failed to launch (cudaError {})", what, rc),
                 "check the device and that hybridrl::cuda was built for its architecture, or set "
                 "HYBRIDRL_FUSED_KERNELS=0");
}

#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
inline void* stream() { return at::cuda::getCurrentCUDAStream().stream(); }
#endif
}  // namespace detail

/// Switches the fused kernels on or off for the process (on unless HYBRIDRL_FUSED_KERNELS=0).
inline void set_enabled(bool on) noexcept { detail::enabled_flag().store(on); }
/// Whether the fused kernels are switched on.
[[nodiscard]] inline bool enabled() noexcept { return detail::enabled_flag().load(); }

/// Launches hybridrl's kernels with programmatic dependent launch (cuda::set_programmatic_launch;
/// off unless HYBRIDRL_PDL=1). Without hybridrl::cuda there is nothing to launch: a no-op.
inline void set_programmatic_launch(bool on) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  cuda::set_programmatic_launch(on);
#else
  (void)on;
#endif
}
/// Whether hybridrl's kernels are launched with programmatic dependent launch.
[[nodiscard]] inline bool programmatic_launch() {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  return cuda::programmatic_launch();
#else
  return false;
#endif
}

/// Whether the kernels can run on `t`: CUDA, linked with hybridrl::cuda, no autograd recording,
/// switched on, a float / half / bfloat16 dtype.
[[nodiscard]] inline bool applies(const at::Tensor& t) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  return t.defined() && t.is_cuda() && !c10::GradMode::is_enabled() && enabled() &&
         detail::kernel_dtype(t.scalar_type()).has_value();
#else
  (void)t;
  return false;
#endif
}

/// RMSNorm of `x` [..., dim] with `weight` [dim] (the dtype of x): undefined where the kernel does
/// not apply.
inline at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (!applies(x) || weight.scalar_type() != x.scalar_type() || weight.device() != x.device() ||
      !x.is_contiguous() || !weight.is_contiguous() || weight.dim() != 1 || weight.size(0) != x.size(-1)) {
    return {};
  }
  auto out = at::empty_like(x);
  const auto dim = x.size(-1);
  detail::check_launch(cuda::launch_rms_norm(x.data_ptr(), nullptr, nullptr, weight.data_ptr(), out.data_ptr(),
                                             nullptr, x.numel() / dim, dim, static_cast<float>(eps),
                                             *detail::kernel_dtype(x.scalar_type()), detail::stream()),
                       "rms_norm");
  return out;
#else
  (void)x, (void)weight, (void)eps;
  return {};
#endif
}

/// {h, rms_norm(h)} with h = x + residual (a pre-norm layer's residual add and the next norm in
/// one pass): undefined tensors where the kernel does not apply.
inline std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                      const at::Tensor& weight, double eps) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (!applies(x) || residual.sizes() != x.sizes() || residual.scalar_type() != x.scalar_type() ||
      residual.device() != x.device() || !residual.is_contiguous() || weight.scalar_type() != x.scalar_type() ||
      weight.device() != x.device() || !x.is_contiguous() || !weight.is_contiguous() || weight.dim() != 1 ||
      weight.size(0) != x.size(-1)) {
    return {};
  }
  auto h = at::empty_like(x);
  auto out = at::empty_like(x);
  const auto dim = x.size(-1);
  detail::check_launch(cuda::launch_rms_norm(x.data_ptr(), residual.data_ptr(), h.data_ptr(), weight.data_ptr(),
                                             out.data_ptr(), nullptr, x.numel() / dim, dim, static_cast<float>(eps),
                                             *detail::kernel_dtype(x.scalar_type()), detail::stream()),
                       "add_rms_norm");
  return {h, out};
#else
  (void)x, (void)residual, (void)weight, (void)eps;
  return {};
#endif
}

/// Rotary embeddings applied in place to q [B, T, H, D] and k [B, T, Hkv, D] (contiguous) with
/// cos / sin [B, T, D]: true when done, false where the kernel does not apply (nothing changed).
inline bool rope_(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (!applies(q) || q.dim() != 4 || k.dim() != 4 || !q.is_contiguous() || !k.is_contiguous() ||
      !cos.is_contiguous() || !sin.is_contiguous() || k.scalar_type() != q.scalar_type() ||
      cos.scalar_type() != q.scalar_type() || sin.scalar_type() != q.scalar_type() || k.device() != q.device() ||
      cos.device() != q.device() || sin.device() != q.device()) {
    return false;
  }
  const auto B = q.size(0), T = q.size(1), D = q.size(3);
  if (k.size(0) != B || k.size(1) != T || k.size(3) != D || D % 2 != 0 || cos.dim() != 3 || cos.size(0) != B ||
      cos.size(1) != T || cos.size(2) != D || sin.sizes() != cos.sizes()) {
    return false;
  }
  const auto H = q.size(2), Hkv = k.size(2);
  detail::check_launch(cuda::launch_rope(q.data_ptr(), k.data_ptr(), nullptr, H * D, Hkv * D, 0, q.data_ptr(),
                                         k.data_ptr(), nullptr, H * D, Hkv * D, 0, cos.data_ptr(), sin.data_ptr(),
                                         B * T, H, Hkv, D,
                                         *detail::kernel_dtype(q.scalar_type()), detail::stream()),
                       "rope");
  return true;
#else
  (void)q, (void)k, (void)cos, (void)sin;
  return false;
#endif
}

/// A paged KV cache's rows for a step's new keys and values (write_kv_to_cache's arguments):
/// key_cache / value_cache [num_blocks, block_size, Hkv, D] (contiguous), slot_mapping int64
/// [tokens] (block · block_size + offset; −1: not stored).
struct CacheRows {
  at::Tensor key_cache, value_cache, slot_mapping;
};

/// The rotary-embedded q [B, T, H, D], k [B, T, Hkv, D] and v [B, T, Hkv, D] (each contiguous)
/// of one fused q|k|v projection `qkv` [B, T, (H + 2 Hkv) D] (contiguous) with cos / sin
/// [B, T, D]: one kernel splits, rotates and copies — and with `cache`, stores k and v at their
/// slots in the same pass (token b·T + t at slot_mapping[b·T + t]). Undefined tensors where it
/// does not apply (for `cache` also: caches not contiguous [blocks, block_size, Hkv, D] of qkv's
/// dtype and device, slot_mapping not int64 [B·T] there): nothing is written then.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_rope(const at::Tensor& qkv, int64_t heads, int64_t kv_heads,
                                                               int64_t head_dim, const at::Tensor& cos,
                                                               const at::Tensor& sin, const CacheRows* cache = nullptr) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  const auto row = (heads + 2 * kv_heads) * head_dim;
  if (!applies(qkv) || qkv.dim() != 3 || qkv.size(2) != row || !qkv.is_contiguous() || head_dim % 2 != 0 ||
      !cos.is_contiguous() || !sin.is_contiguous() || cos.scalar_type() != qkv.scalar_type() ||
      sin.scalar_type() != qkv.scalar_type() || cos.device() != qkv.device() || sin.device() != qkv.device() ||
      cos.dim() != 3 || cos.size(0) != qkv.size(0) || cos.size(1) != qkv.size(1) || cos.size(2) != head_dim ||
      sin.sizes() != cos.sizes()) {
    return {};
  }
  if (cache != nullptr) {
    const auto& kc = cache->key_cache;
    const auto& vc = cache->value_cache;
    const auto& sm = cache->slot_mapping;
    if (!kc.defined() || !vc.defined() || !sm.defined() || kc.dim() != 4 || vc.sizes() != kc.sizes() ||
        kc.size(2) != kv_heads || kc.size(3) != head_dim || kc.scalar_type() != qkv.scalar_type() ||
        vc.scalar_type() != qkv.scalar_type() || kc.device() != qkv.device() || vc.device() != qkv.device() ||
        !kc.is_contiguous() || !vc.is_contiguous() || sm.scalar_type() != at::kLong || sm.dim() != 1 ||
        sm.size(0) != qkv.size(0) * qkv.size(1) || sm.device() != qkv.device() || !sm.is_contiguous()) {
      return {};
    }
  }
  const auto B = qkv.size(0), T = qkv.size(1);
  auto q = at::empty({B, T, heads, head_dim}, qkv.options());
  auto k = at::empty({B, T, kv_heads, head_dim}, qkv.options());
  auto v = at::empty({B, T, kv_heads, head_dim}, qkv.options());
  const auto elem = static_cast<int64_t>(qkv.element_size());
  const auto* base = static_cast<const char*>(qkv.data_ptr());
  detail::check_launch(cuda::launch_rope(base, base + heads * head_dim * elem, base + (heads + kv_heads) * head_dim * elem,
                                         row, row, row, q.data_ptr(), k.data_ptr(), v.data_ptr(), heads * head_dim,
                                         kv_heads * head_dim, kv_heads * head_dim, cos.data_ptr(), sin.data_ptr(),
                                         B * T, heads, kv_heads, head_dim,
                                         *detail::kernel_dtype(qkv.scalar_type()), detail::stream(),
                                         cache != nullptr ? cache->key_cache.data_ptr() : nullptr,
                                         cache != nullptr ? cache->value_cache.data_ptr() : nullptr,
                                         cache != nullptr ? cache->slot_mapping.data_ptr<int64_t>() : nullptr,
                                         cache != nullptr ? cache->key_cache.size(0) * cache->key_cache.size(1) : 0),
                       "qkv_rope");
  return {q, k, v};
#else
  (void)qkv, (void)heads, (void)kv_heads, (void)head_dim, (void)cos, (void)sin, (void)cache;
  return {};
#endif
}

/// silu(gate) · up (one shape, contiguous): undefined where the kernel does not apply.
inline at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (!applies(gate) || up.sizes() != gate.sizes() || up.scalar_type() != gate.scalar_type() ||
      up.device() != gate.device() || !gate.is_contiguous() || !up.is_contiguous() || gate.dim() == 0) {
    return {};
  }
  auto out = at::empty_like(gate);
  const auto cols = gate.size(-1);
  detail::check_launch(cuda::launch_silu_mul(gate.data_ptr(), up.data_ptr(), cols, out.data_ptr(), gate.numel() / cols,
                                             cols, *detail::kernel_dtype(gate.scalar_type()), detail::stream()),
                       "silu_mul");
  return out;
#else
  (void)gate, (void)up;
  return {};
#endif
}

/// silu(gate) · up of one fused gate|up projection `gate_up` [..., 2 I] (contiguous): [..., I];
/// undefined where the kernel does not apply.
inline at::Tensor silu_mul_halves(const at::Tensor& gate_up) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (!applies(gate_up) || !gate_up.is_contiguous() || gate_up.dim() == 0 || gate_up.size(-1) % 2 != 0) return {};
  auto sizes = gate_up.sizes().vec();
  const auto in = sizes.back(), cols = in / 2;
  sizes.back() = cols;
  auto out = at::empty(sizes, gate_up.options());
  const auto* base = static_cast<const char*>(gate_up.data_ptr());
  detail::check_launch(cuda::launch_silu_mul(base, base + cols * static_cast<int64_t>(gate_up.element_size()), in,
                                             out.data_ptr(), gate_up.numel() / in, cols,
                                             *detail::kernel_dtype(gate_up.scalar_type()), detail::stream()),
                       "silu_mul_halves");
  return out;
#else
  (void)gate_up;
  return {};
#endif
}

#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
namespace detail {
// log p(label) and the entropy of logits [N, V] · inv as an autograd function (the kernels of
// launch_token_log_prob and its backward); saves the logits, the labels, lse and E_p[x].
struct TokenLogProb : torch::autograd::Function<TokenLogProb> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                                                const at::Tensor& labels, double inv, bool with_entropy) {
    const auto N = logits.size(0);
    const auto f = logits.options().dtype(at::kFloat);
    auto lp = at::empty({N}, f), lse = at::empty({N}, f), mean = at::empty({N}, f);
    auto ent = with_entropy ? at::empty({N}, f) : at::Tensor();
    check_launch(cuda::launch_token_log_prob(logits.data_ptr(), N, logits.size(1), logits.stride(0),
                                             labels.data_ptr<int64_t>(), static_cast<float>(inv), lp.data_ptr<float>(),
                                             with_entropy ? ent.data_ptr<float>() : nullptr, lse.data_ptr<float>(),
                                             mean.data_ptr<float>(), *kernel_dtype(logits.scalar_type()), stream()),
                 "token_log_prob");
    ctx->save_for_backward({logits, labels, lse, mean});
    ctx->saved_data["inv"] = inv;
    if (!with_entropy) return {lp};
    return {lp, ent};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& logits = saved[0];
    const auto N = logits.size(0), V = logits.size(1);
    auto g_lp = grads[0].defined() ? grads[0].to(at::kFloat).contiguous() : at::Tensor();
    auto g_h = grads.size() > 1 && grads[1].defined() ? grads[1].to(at::kFloat).contiguous() : at::Tensor();
    auto grad = at::empty({N, V}, logits.options());
    check_launch(cuda::launch_token_log_prob_backward(
                     logits.data_ptr(), N, V, logits.stride(0), saved[1].data_ptr<int64_t>(),
                     static_cast<float>(ctx->saved_data["inv"].toDouble()), saved[2].data_ptr<float>(),
                     saved[3].data_ptr<float>(), g_lp.defined() ? g_lp.data_ptr<float>() : nullptr,
                     g_h.defined() ? g_h.data_ptr<float>() : nullptr, grad.data_ptr(),
                     *kernel_dtype(logits.scalar_type()), stream()),
                 "token_log_prob_backward");
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
}  // namespace detail
#endif

#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
namespace detail {
// rotary embeddings of q [N, H, D] and k [N, Hkv, D] out of place as an autograd function: the
// rotation is linear, its backward the rotation by −θ (sin negated), through the same kernel
struct Rope : torch::autograd::Function<Rope> {
  static std::pair<at::Tensor, at::Tensor> rotate(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                                  const at::Tensor& sin) {
    auto qo = at::empty(q.sizes(), q.options()), ko = at::empty(k.sizes(), k.options());
    const auto N = q.size(0), H = q.size(1), Hkv = k.size(1), D = q.size(2);
    check_launch(cuda::launch_rope(q.data_ptr(), k.data_ptr(), nullptr, q.stride(0), k.stride(0), 0, qo.data_ptr(),
                                   ko.data_ptr(), nullptr, H * D, Hkv * D, 0, cos.data_ptr(), sin.data_ptr(), N, H,
                                   Hkv, D,
                                   *kernel_dtype(q.scalar_type()), stream()),
                 "rope (training)");
    return {qo, ko};
  }
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    auto [qo, ko] = rotate(q, k, cos, sin);
    return {qo, ko};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();  // an output unused downstream gets zeros (materialized)
    auto [dq, dk] = rotate(grads[0].contiguous(), grads[1].contiguous(), saved[0], -saved[1]);
    return {dq, dk, at::Tensor(), at::Tensor()};
  }
};
}  // namespace detail
#endif

#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
namespace detail {
// silu(gate) · up as an autograd function: the forward is the inference kernel (bit-identical to
// the eager ops), the backward one kernel for both gradients; saves gate and up (the eager
// product saves silu(gate) and up besides).
struct SiluMul : torch::autograd::Function<SiluMul> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate,
                                                const at::Tensor& up) {
    auto out = at::empty_like(gate);  // gate is contiguous
    const auto cols = gate.size(-1);
    check_launch(cuda::launch_silu_mul(gate.data_ptr(), up.data_ptr(), cols, out.data_ptr(), gate.numel() / cols, cols,
                                       *kernel_dtype(gate.scalar_type()), stream()),
                 "silu_mul (training)");
    ctx->save_for_backward({gate, up});
    return {out};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& gate = saved[0];
    const auto& up = saved[1];
    const auto go = grads[0].to(gate.scalar_type()).contiguous();
    auto dg = at::empty_like(gate), du = at::empty_like(up);  // both contiguous
    const auto cols = gate.size(-1);
    check_launch(cuda::launch_silu_mul_backward(gate.data_ptr(), up.data_ptr(), cols, go.data_ptr(), dg.data_ptr(),
                                                du.data_ptr(), cols, gate.numel() / cols, cols,
                                                *kernel_dtype(gate.scalar_type()), stream()),
                 "silu_mul_backward");
    return {dg, du};
  }
};

// silu(gate) · up of one fused gate|up projection [rows, 2 I] (contiguous) as an autograd
// function: the forward reads the two halves in place (the inference kernel), the backward writes
// both halves' gradients straight into one [rows, 2 I] tensor — the fused GEMM's gradient, no
// concatenation; saves gate|up
struct SiluMulHalves : torch::autograd::Function<SiluMulHalves> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate_up) {
    const auto in = gate_up.size(-1), cols = in / 2;
    auto sizes = gate_up.sizes().vec();
    sizes.back() = cols;
    auto out = at::empty(sizes, gate_up.options());
    const auto* base = static_cast<const char*>(gate_up.data_ptr());
    check_launch(cuda::launch_silu_mul(base, base + cols * static_cast<int64_t>(gate_up.element_size()), in,
                                       out.data_ptr(), gate_up.numel() / in, cols, *kernel_dtype(gate_up.scalar_type()),
                                       stream()),
                 "silu_mul_halves (training)");
    ctx->save_for_backward({gate_up});
    return {out};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto gate_up = ctx->get_saved_variables()[0];
    const auto in = gate_up.size(-1), cols = in / 2;
    const auto go = grads[0].to(gate_up.scalar_type()).contiguous();
    auto d = at::empty_like(gate_up);
    const auto elem = static_cast<int64_t>(gate_up.element_size());
    const auto* base = static_cast<const char*>(gate_up.data_ptr());
    auto* dbase = static_cast<char*>(d.data_ptr());
    check_launch(cuda::launch_silu_mul_backward(base, base + cols * elem, in, go.data_ptr(), dbase, dbase + cols * elem,
                                                in, gate_up.numel() / in, cols, *kernel_dtype(gate_up.scalar_type()),
                                                stream()),
                 "silu_mul_halves_backward");
    return {d};
  }
};

// q, k (rotated) and v of one fused q|k|v projection [N, (H + 2 Hkv) D] (contiguous) as an
// autograd function: the forward is the inference split-and-rotate kernel; the backward the same
// kernel in reverse — the gradients of q and k rotated by −θ and v's copied, written straight
// into one [N, (H + 2 Hkv) D] tensor, the fused GEMM's gradient (no concatenation); saves cos, sin
struct QkvRope : torch::autograd::Function<QkvRope> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv,
                                                const at::Tensor& cos, const at::Tensor& sin, int64_t heads,
                                                int64_t kv_heads) {
    const auto N = qkv.size(0), D = cos.size(1), row = qkv.size(1);
    auto q = at::empty({N, heads, D}, qkv.options());
    auto k = at::empty({N, kv_heads, D}, qkv.options());
    auto v = at::empty({N, kv_heads, D}, qkv.options());
    const auto elem = static_cast<int64_t>(qkv.element_size());
    const auto* base = static_cast<const char*>(qkv.data_ptr());
    check_launch(cuda::launch_rope(base, base + heads * D * elem, base + (heads + kv_heads) * D * elem, row, row, row,
                                   q.data_ptr(), k.data_ptr(), v.data_ptr(), heads * D, kv_heads * D, kv_heads * D,
                                   cos.data_ptr(), sin.data_ptr(), N, heads, kv_heads, D,
                                   *kernel_dtype(qkv.scalar_type()), stream()),
                 "qkv_rope (training)");
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["kv_heads"] = kv_heads;
    return {q, k, v};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();  // an output unused downstream gets zeros (materialized)
    const auto heads = ctx->saved_data["heads"].toInt(), kv_heads = ctx->saved_data["kv_heads"].toInt();
    const auto& cos = saved[0];
    const auto N = cos.size(0), D = cos.size(1), row = (heads + 2 * kv_heads) * D;
    const auto dq = grads[0].contiguous(), dk = grads[1].contiguous(), dv = grads[2].contiguous();
    auto d = at::empty({N, row}, dq.options());
    const auto elem = static_cast<int64_t>(d.element_size());
    auto* base = static_cast<char*>(d.data_ptr());
    const auto neg_sin = -saved[1];
    check_launch(cuda::launch_rope(dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), heads * D, kv_heads * D, kv_heads * D,
                                   base, base + heads * D * elem, base + (heads + kv_heads) * D * elem, row, row, row,
                                   cos.data_ptr(), neg_sin.data_ptr(), N, heads, kv_heads, D,
                                   *kernel_dtype(d.scalar_type()), stream()),
                 "qkv_rope_backward");
    return {d, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
}  // namespace detail
#endif

#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
namespace detail {
// RMSNorm, with or without the residual add before it, as autograd functions: the forward is
// the inference kernel writing each row's rstd too, the backward one kernel for the input's
// gradient — with the gradient the residual stream brings to h added in, so autograd has no sum
// to do there — and the weight's as partial sums over blocks of rows. Saves h (the add's output,
// which the layer keeps anyway, or the input), the weight and rstd. Two functions, because a C++
// autograd function takes no undefined tensor among its inputs.
struct RmsNormTrainImpl {
  /// {h, out} (h = x without a residual), saving what the backward needs.
  static std::pair<at::Tensor, at::Tensor> forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                   const at::Tensor& residual, const at::Tensor& weight, double eps) {
    const bool add = residual.defined();
    const auto dim = x.size(-1), rows = x.numel() / dim;
    auto h = add ? at::empty_like(x) : x;
    auto out = at::empty_like(x);
    auto rstd = at::empty({rows}, x.options().dtype(at::kFloat));
    check_launch(cuda::launch_rms_norm(x.data_ptr(), add ? residual.data_ptr() : nullptr, add ? h.data_ptr() : nullptr,
                                       weight.data_ptr(), out.data_ptr(), rstd.data_ptr<float>(), rows, dim,
                                       static_cast<float>(eps), *kernel_dtype(x.scalar_type()), stream()),
                 add ? "add_rms_norm (training)" : "rms_norm (training)");
    ctx->save_for_backward({h, weight, rstd});
    return {h, out};
  }
  /// {the gradient of h (x, and the residual), the weight's} from the output's (and h's, from
  /// the residual stream; undefined: none).
  static std::pair<at::Tensor, at::Tensor> backward(torch::autograd::AutogradContext* ctx, const at::Tensor& grad_out,
                                                    const at::Tensor& grad_h) {
    const auto saved = ctx->get_saved_variables();
    const auto& h = saved[0];
    const auto& weight = saved[1];
    const auto dim = h.size(-1), rows = h.numel() / dim;
    const auto dtype = *kernel_dtype(h.scalar_type());
    auto as_h = [&](const at::Tensor& g) { return g.defined() ? g.to(h.scalar_type()).contiguous() : at::Tensor(); };
    const auto g_out = as_h(grad_out);
    const auto g_res = as_h(grad_h);
    if (!g_out.defined()) return {g_res.defined() ? g_res : at::zeros_like(h), at::zeros_like(weight)};
    auto dx = at::empty_like(h);
    const auto blocks = cuda::rms_norm_backward_blocks(rows, dim, dtype);
    auto partial = at::empty({blocks, dim}, h.options().dtype(at::kFloat));
    check_launch(cuda::launch_rms_norm_backward(h.data_ptr(), g_out.data_ptr(), g_res.defined() ? g_res.data_ptr() : nullptr,
                                                weight.data_ptr(), saved[2].data_ptr<float>(), dx.data_ptr(),
                                                partial.data_ptr<float>(), rows, dim, blocks, dtype, stream()),
                 "rms_norm_backward");
    return {dx, partial.sum(0).to(weight.scalar_type())};
  }
};
struct RmsNormTrain : torch::autograd::Function<RmsNormTrain> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps) {
    return RmsNormTrainImpl::forward(ctx, x, at::Tensor(), weight, eps).second;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto [dx, dw] = RmsNormTrainImpl::backward(ctx, grads[0], at::Tensor());
    return {dx, dw, at::Tensor()};
  }
};
// {x, norm(x)}, x returned as an output (a view of it, by autograd) so the gradient the residual
// stream brings to x reaches this backward's kernel, which adds it in: the layer's input gets one
// gradient, not two for autograd to sum in an extra kernel
struct RmsNormKeepTrain : torch::autograd::Function<RmsNormKeepTrain> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const at::Tensor& weight, double eps) {
    auto [h, out] = RmsNormTrainImpl::forward(ctx, x, at::Tensor(), weight, eps);
    return {h, out};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto [dx, dw] = RmsNormTrainImpl::backward(ctx, grads[1], grads[0]);
    return {dx, dw, at::Tensor()};
  }
};
struct AddRmsNormTrain : torch::autograd::Function<AddRmsNormTrain> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const at::Tensor& residual, const at::Tensor& weight, double eps) {
    auto [h, out] = RmsNormTrainImpl::forward(ctx, x, residual, weight, eps);
    return {h, out};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto [dx, dw] = RmsNormTrainImpl::backward(ctx, grads[1], grads[0]);
    return {dx, dx, dw, at::Tensor()};
  }
};
}  // namespace detail
#endif

/// RMSNorm of `x` [..., dim] with `weight` [dim] as a differentiable op for training, and with
/// `residual` defined the pre-norm layer's residual add before it: {h = x + residual, norm(h)}
/// ({x, norm(x)} without). Forward: the inference kernel (within one unit in the last place of
/// the eager ops); backward: one kernel for the input's gradient (computed in float, rounded
/// once; the residual stream's gradient of h added in the same pass) and the weight's in partial
/// sums. Without a residual and with `keep`, h is x passed through the op (a view of it), so
/// what later uses of h send back is added in that kernel too, not summed by autograd apart.
/// Undefined tensors where the kernel does not apply (CPU, switched off, mixed dtypes or devices,
/// non-contiguous, a row not a multiple of 16 bytes or over 16 KB: bf16 rows up to 8192).
inline std::pair<at::Tensor, at::Tensor> rms_norm_train(const at::Tensor& x, const at::Tensor& residual,
                                                        const at::Tensor& weight, double eps, bool keep = false) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (!x.defined() || !x.is_cuda() || !enabled() || !detail::kernel_dtype(x.scalar_type()) || x.dim() == 0 ||
      x.numel() == 0 || !x.is_contiguous() || !weight.defined() || weight.scalar_type() != x.scalar_type() ||
      weight.device() != x.device() || !weight.is_contiguous() || weight.dim() != 1 || weight.size(0) != x.size(-1) ||
      cuda::rms_norm_backward_blocks(x.numel() / x.size(-1), x.size(-1), *detail::kernel_dtype(x.scalar_type())) == 0 ||
      reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0 || reinterpret_cast<uintptr_t>(weight.data_ptr()) % 16 != 0) {
    return {};
  }
  if (residual.defined() && (residual.sizes() != x.sizes() || residual.scalar_type() != x.scalar_type() ||
                             residual.device() != x.device() || !residual.is_contiguous() ||
                             reinterpret_cast<uintptr_t>(residual.data_ptr()) % 16 != 0)) {
    return {};
  }
  if (!residual.defined()) {
    if (!keep) return {x, detail::RmsNormTrain::apply(x, weight, eps)};
    auto out = detail::RmsNormKeepTrain::apply(x, weight, eps);
    return {out[0], out[1]};
  }
  auto out = detail::AddRmsNormTrain::apply(x, residual, weight, eps);
  return {out[0], out[1]};
#else
  (void)x, (void)residual, (void)weight, (void)eps, (void)keep;
  return {};
#endif
}

/// silu(gate) · up (one shape, dtype and device, contiguous) as a differentiable op for training:
/// the forward bit-identical to the eager `at::silu(gate) * up`, the backward one kernel whose
/// gradients are computed in float and rounded once (within one unit in the last place of the
/// exact ones; the eager backward rounds an intermediate product first). Undefined where the
/// kernel does not apply (CPU, switched off, another dtype or layout).
inline at::Tensor silu_mul_train(const at::Tensor& gate, const at::Tensor& up) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (!gate.defined() || !gate.is_cuda() || !enabled() || !detail::kernel_dtype(gate.scalar_type()) ||
      !up.defined() || up.sizes() != gate.sizes() || up.scalar_type() != gate.scalar_type() ||
      up.device() != gate.device() || !gate.is_contiguous() || !up.is_contiguous() || gate.dim() == 0 ||
      gate.numel() == 0) {
    return {};
  }
  return detail::SiluMul::apply(gate, up)[0];
#else
  (void)gate, (void)up;
  return {};
#endif
}

/// Rotary embeddings of q [N, H, D] and k [N, Hkv, D] (each token's heads contiguous) with cos /
/// sin [N, D] (contiguous), out of place and differentiable (the backward rotates the gradient
/// by −θ with the same kernel): bit-identical to apply_rope's eager ops forward and backward.
/// Undefined tensors where the kernel does not apply (CPU, switched off, mixed dtypes or layouts).
inline std::pair<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                              const at::Tensor& sin) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  auto rows_ok = [](const at::Tensor& t) {
    return t.dim() == 3 && t.stride(2) == 1 && t.stride(1) == t.size(2);
  };
  if (!q.defined() || !q.is_cuda() || !enabled() || !detail::kernel_dtype(q.scalar_type()) || !rows_ok(q) ||
      !rows_ok(k) || k.scalar_type() != q.scalar_type() || cos.scalar_type() != q.scalar_type() ||
      sin.scalar_type() != q.scalar_type() || k.device() != q.device() || cos.device() != q.device() ||
      sin.device() != q.device() || !cos.is_contiguous() || !sin.is_contiguous() || cos.dim() != 2 ||
      sin.sizes() != cos.sizes() || k.size(0) != q.size(0) || cos.size(0) != q.size(0) ||
      k.size(2) != q.size(2) || cos.size(1) != q.size(2) || q.size(2) % 2 != 0) {
    return {};
  }
  auto out = detail::Rope::apply(q, k, cos, sin);
  return {out[0], out[1]};
#else
  (void)q, (void)k, (void)cos, (void)sin;
  return {};
#endif
}

/// silu(gate) · up of one fused gate|up projection `gate_up` [..., 2 I] (contiguous; gate the
/// first half of each row) as a differentiable op for training: [..., I], the forward
/// bit-identical to the eager `at::silu(gate) * up`, the backward silu_mul_train's arithmetic
/// writing both halves' gradients into one tensor shaped as gate_up (the fused GEMM's gradient
/// without a concatenation). Undefined where the kernel does not apply (CPU, switched off,
/// another dtype or layout, an odd last dimension).
inline at::Tensor silu_mul_halves_train(const at::Tensor& gate_up) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (!gate_up.defined() || !gate_up.is_cuda() || !enabled() || !detail::kernel_dtype(gate_up.scalar_type()) ||
      !gate_up.is_contiguous() || gate_up.dim() == 0 || gate_up.numel() == 0 || gate_up.size(-1) % 2 != 0) {
    return {};
  }
  return detail::SiluMulHalves::apply(gate_up)[0];
#else
  (void)gate_up;
  return {};
#endif
}

/// q [N, H, D] and k [N, Hkv, D] rotated and v [N, Hkv, D] (each contiguous) of one fused q|k|v
/// projection `qkv` [N, (H + 2 Hkv) D] (contiguous) with cos / sin [N, D] (contiguous), as a
/// differentiable op for training: the forward is qkv_rope's kernel (bit-identical to slicing
/// and apply_rope_rows' eager ops), the backward rotates q's and k's gradients by −θ and copies
/// v's, straight into one gradient shaped as qkv (the fused GEMM's, without a concatenation).
/// Undefined tensors where the kernel does not apply (CPU, switched off, mixed dtypes or layouts).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_rope_train(const at::Tensor& qkv, int64_t heads,
                                                                     int64_t kv_heads, int64_t head_dim,
                                                                     const at::Tensor& cos, const at::Tensor& sin) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (!qkv.defined() || !qkv.is_cuda() || !enabled() || !detail::kernel_dtype(qkv.scalar_type()) || qkv.dim() != 2 ||
      !qkv.is_contiguous() || head_dim % 2 != 0 || qkv.size(1) != (heads + 2 * kv_heads) * head_dim ||
      !cos.defined() || !sin.defined() || cos.dim() != 2 || cos.size(0) != qkv.size(0) || cos.size(1) != head_dim ||
      sin.sizes() != cos.sizes() || !cos.is_contiguous() || !sin.is_contiguous() ||
      cos.scalar_type() != qkv.scalar_type() || sin.scalar_type() != qkv.scalar_type() ||
      cos.device() != qkv.device() || sin.device() != qkv.device()) {
    return {};
  }
  auto out = detail::QkvRope::apply(qkv, cos, sin, heads, kv_heads);
  return {out[0], out[1], out[2]};
#else
  (void)qkv, (void)heads, (void)kv_heads, (void)head_dim, (void)cos, (void)sin;
  return {};
#endif
}

/// {log_softmax(logits / temperature)[labels], its entropy (undefined unless `with_entropy`)},
/// float [N], of `logits` [N, V] (last dimension contiguous) and `labels` int64 [N] — one kernel
/// over each row, nothing [N, V] in fp32 in the forward, the gradient written once in the logits'
/// dtype in the backward (so it works with autograd recording, unlike the inference kernels).
/// Undefined tensors where the kernel does not apply (CPU, switched off, another dtype).
inline std::pair<at::Tensor, at::Tensor> token_log_prob(const at::Tensor& logits, const at::Tensor& labels,
                                                        double temperature, bool with_entropy) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (!logits.defined() || !logits.is_cuda() || !enabled() || !detail::kernel_dtype(logits.scalar_type()) ||
      logits.dim() != 2 || logits.stride(1) != 1 || logits.size(1) == 0 || !labels.defined() ||
      labels.scalar_type() != at::kLong || labels.dim() != 1 || labels.size(0) != logits.size(0) ||
      labels.device() != logits.device() || temperature <= 0.0) {
    return {};
  }
  // logits / T as ATen computes it on CUDA: a multiply by the float reciprocal of the float T
  const double inv = 1.0 / static_cast<double>(static_cast<float>(temperature));
  auto out = detail::TokenLogProb::apply(logits, labels.contiguous(), inv, with_entropy);
  return {out[0], with_entropy ? out[1] : at::Tensor()};
#else
  (void)logits, (void)labels, (void)temperature, (void)with_entropy;
  return {};
#endif
}

/// Whether adamw_step's kernel takes `param` with gradient `grad`: float32 on CUDA, contiguous,
/// one shape, hybridrl::cuda linked and the kernels switched on.
[[nodiscard]] inline bool adamw_applies(const at::Tensor& param, const at::Tensor& grad) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  return enabled() && param.defined() && grad.defined() && param.is_cuda() && param.scalar_type() == at::kFloat &&
         grad.scalar_type() == at::kFloat && grad.device() == param.device() && !grad.is_sparse() &&
         param.is_contiguous() && grad.is_contiguous() && grad.sizes() == param.sizes();
#else
  (void)param, (void)grad;
  return false;
#endif
}

/// Whether adamw_step can write `copy` beside `param`: bfloat16 or float16, contiguous, the
/// parameter's numel, on its device.
[[nodiscard]] inline bool adamw_copy_applies(const at::Tensor& param, const at::Tensor& copy) {
  return copy.defined() && (copy.scalar_type() == at::kBFloat16 || copy.scalar_type() == at::kHalf) &&
         copy.is_contiguous() && copy.numel() == param.numel() && copy.device() == param.device();
}

/// The flat float buffer `flat` [n] (contiguous, CUDA) filled in one kernel from `parts`: part i
/// (contiguous, float / half / bfloat16, all of one dtype; undefined = zeros) cast into
/// [offsets[i], offsets[i] + numels[i]), and [covered, n) zeroed. False, having done nothing,
/// where the kernel does not apply (then copy the parts one by one).
[[nodiscard]] inline bool pack_flat(at::Tensor& flat, const std::vector<at::Tensor>& parts,
                                    const std::vector<int64_t>& offsets, const std::vector<int64_t>& numels,
                                    int64_t covered) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (!enabled() || !flat.defined() || !flat.is_cuda() || flat.scalar_type() != at::kFloat || !flat.is_contiguous()) {
    return false;
  }
  std::optional<at::ScalarType> dtype;
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (i >= parts.size() || !parts[i].defined()) continue;
    const auto& t = parts[i];
    if (t.device() != flat.device() || !t.is_contiguous() || t.numel() != numels[i] ||
        !detail::kernel_dtype(t.scalar_type()) || (dtype && *dtype != t.scalar_type())) {
      return false;
    }
    dtype = t.scalar_type();
  }
  cuda::FlatPieces pieces;
  auto flush = [&] {
    detail::check_launch(cuda::launch_pack_flat(pieces, *detail::kernel_dtype(dtype.value_or(at::kFloat)),
                                                flat.data_ptr<float>(), detail::stream()),
                         "pack_flat");
    pieces.count = 0;
  };
  auto add = [&](const void* src, int64_t offset, int64_t n) {
    if (n <= 0) return;
    if (pieces.count == cuda::kMaxFlatPieces) flush();
    pieces.src[pieces.count] = src;
    pieces.offset[pieces.count] = offset;
    pieces.n[pieces.count] = n;
    ++pieces.count;
  };
  for (size_t i = 0; i < offsets.size(); ++i) {
    const bool has = i < parts.size() && parts[i].defined();
    add(has ? parts[i].data_ptr() : nullptr, offsets[i], numels[i]);
  }
  add(nullptr, covered, flat.numel() - covered);
  if (pieces.count > 0) flush();
  return true;
#else
  (void)flat, (void)parts, (void)offsets, (void)numels, (void)covered;
  return false;
#endif
}

/// One AdamW step of `param` (torch.optim.AdamW's formula, `step` ≥ 1 the count this step makes)
/// from `grad`, updating the moments `exp_avg` / `exp_avg_sq` (float32, param's shape, contiguous)
/// in place: one kernel reading each tensor once and writing param and the moments once. With
/// `inv_scale` (0-d float32 on param's device) each gradient is divided by it as it is read (the
/// clip factor's reciprocal; no host synchronisation). Where adamw_applies.
/// With `copy` (bfloat16 or float16, param's numel, contiguous, on param's device; where
/// adamw_copy_applies) the new parameter is also written there, rounded, in the same pass. The
/// parameter's version counter is bumped, as an in-place ATen op would.
inline void adamw_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                       double lr, double beta1, double beta2, double weight_decay, double eps, int64_t step,
                       const at::Tensor& inv_scale = {}, const at::Tensor& copy = {}) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  HYBRIDRL_CHECK(adamw_applies(param, grad) && adamw_applies(exp_avg, exp_avg_sq) && exp_avg.sizes() == param.sizes() &&
                     exp_avg.device() == param.device(),
                 "fused::adamw_step: parameter, gradient and moments must be contiguous float32 of one shape on one CUDA device",
                 "check fused::adamw_applies first (the optimizer does)");
  HYBRIDRL_CHECK(!copy.defined() || adamw_copy_applies(param, copy),
                 "fused::adamw_step: the copy must be a contiguous bfloat16 or float16 tensor of the parameter's size on its device",
                 "check fused::adamw_copy_applies first");
  detail::check_launch(cuda::launch_adamw(param.data_ptr<float>(), grad.data_ptr<float>(), exp_avg.data_ptr<float>(),
                                          exp_avg_sq.data_ptr<float>(), param.numel(), lr, beta1, beta2, weight_decay,
                                          eps, step, inv_scale.defined() ? inv_scale.data_ptr<float>() : nullptr,
                                          detail::stream(), copy.defined() ? copy.data_ptr() : nullptr,
                                          copy.defined() ? *detail::kernel_dtype(copy.scalar_type()) : cuda::KernelDtype::bf16),
                       "adamw");
  param.unsafeGetTensorImpl()->bump_version();
#else
  (void)param, (void)grad, (void)exp_avg, (void)exp_avg_sq, (void)lr, (void)beta1, (void)beta2, (void)weight_decay,
      (void)eps, (void)step, (void)inv_scale, (void)copy;
  HYBRIDRL_CHECK(false, "fused::adamw_step: not linked with hybridrl::cuda", "check fused::adamw_applies first");
#endif
}

/// One draw per row of `logits` [B, V] (rollout/sampler.hpp's rule without top-k / top-p / min-p /
/// banned tokens): {tokens int64 [B], log_probs float [B]}, or undefined tensors where the kernel
/// does not apply. `temperature` 0 = greedy. seeds / samples / positions: int64 [B] on the device.
inline std::pair<at::Tensor, at::Tensor> sample(const at::Tensor& logits, double temperature, const at::Tensor& seeds,
                                                const at::Tensor& samples, const at::Tensor& positions) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (!applies(logits) || logits.dim() != 2 || logits.stride(1) != 1) return {};
  const auto B = logits.size(0);
  for (const auto* t : {&seeds, &samples, &positions}) {
    if (!t->defined() || t->scalar_type() != at::kLong || t->dim() != 1 || t->size(0) != B ||
        t->device() != logits.device() || !t->is_contiguous()) {
      return {};
    }
  }
  auto tokens = at::empty({B}, logits.options().dtype(at::kLong));
  auto log_probs = at::empty({B}, logits.options().dtype(at::kFloat));
  const bool greedy = temperature == 0.0;
  // logits / T as ATen computes it on CUDA: a multiply by the float reciprocal of the float T
  const float inv = greedy ? 1.0f : 1.0f / static_cast<float>(temperature);
  detail::check_launch(cuda::launch_sample_tokens(logits.data_ptr(), B, logits.size(1), logits.stride(0), inv, greedy,
                                                  seeds.data_ptr<int64_t>(), samples.data_ptr<int64_t>(),
                                                  positions.data_ptr<int64_t>(), tokens.data_ptr<int64_t>(),
                                                  log_probs.data_ptr<float>(), *detail::kernel_dtype(logits.scalar_type()),
                                                  detail::stream()),
                       "sample");
  return {tokens, log_probs};
#else
  (void)logits, (void)temperature, (void)seeds, (void)samples, (void)positions;
  return {};
#endif
}

}  // namespace hybridrl::fused
