#pragma once
/// \file
/// The ONE place where LibTorch 1.13 and 2.x differ for hybridrl. Everything version-dependent
/// goes through the macros and functions here; no other header tests TORCH_VERSION_*.
///
/// - HYBRIDRL_TORCH_MAJOR / HYBRIDRL_TORCH_MINOR: the LibTorch version the code is compiled against.
/// - HYBRIDRL_HAS_SDPA: at::scaled_dot_product_attention (fused flash / memory-efficient kernels)
///   exists (LibTorch >= 2.0). Without it, attention is computed with plain matmul + softmax.
/// - c10d (ProcessGroup on 1.13, Backend on 2.x; USE_C10D_GLOO / USE_C10D_NCCL) is handled in
///   distributed/c10d_communicator.hpp, the one header that includes c10d.
/// - compat::cuda_memory(device): allocated / reserved / peak bytes of the caching allocator,
///   whose stats types moved namespaces between versions.
/// - compat::AutocastGuard(device_type, dtype): RAII autocast on CUDA; the autocast calls became
///   per-device-type in LibTorch 2.4.

#include <ATen/ATen.h>
#include <torch/version.h>

#include <cstdint>
#include <limits>

#define HYBRIDRL_TORCH_MAJOR TORCH_VERSION_MAJOR
#define HYBRIDRL_TORCH_MINOR TORCH_VERSION_MINOR

#if HYBRIDRL_TORCH_MAJOR >= 2
#define HYBRIDRL_HAS_SDPA 1
#else
#define HYBRIDRL_HAS_SDPA 0
#endif

#if defined(HYBRIDRL_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace hybridrl::detail::compat {

/// Caching-allocator byte counts for one CUDA device.
struct CudaMemory {
  int64_t allocated = 0;       ///< bytes in live tensors
  int64_t reserved = 0;        ///< bytes held by the caching allocator
  int64_t peak_allocated = 0;  ///< high-water mark of `allocated` since start or last reset
};

/// Byte counts of the caching allocator on CUDA device `index` (zeros in a CPU-only build).
inline CudaMemory cuda_memory([[maybe_unused]] int index) {
#if defined(HYBRIDRL_WITH_CUDA)
  // DeviceStats lives in c10::cuda::CUDACachingAllocator (1.13) or c10::CachingDeviceAllocator
  // (2.x); `auto` spans both. Index 0 is StatType::AGGREGATE in every version.
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  return {stats.allocated_bytes[0].current, stats.reserved_bytes[0].current,
          stats.allocated_bytes[0].peak};
#else
  return {};
#endif
}

/// Scaled dot-product attention: the fused kernels of LibTorch >= 2, plain math on 1.13.
/// q, k, v: [batch, heads, seq, head_dim]; `mask` is a boolean "may attend" mask broadcastable to
/// [batch, heads, q_len, k_len], or undefined for none; `causal` adds the causal mask.
inline at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const at::Tensor& mask,
                                               bool causal, double scale) {
#if HYBRIDRL_HAS_SDPA
  if (!mask.defined()) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, causal, scale);
  }
  at::Tensor m = mask;
  if (causal) {
    const auto ql = q.size(-2), kl = k.size(-2);
    m = m.logical_and(at::ones({ql, kl}, q.options().dtype(at::kBool)).tril(kl - ql));
  }
  return at::scaled_dot_product_attention(q, k, v, m, 0.0, false, scale);
#else
  auto scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  at::Tensor m = mask;
  if (causal) {
    const auto ql = q.size(-2), kl = k.size(-2);
    auto c = at::ones({ql, kl}, q.options().dtype(at::kBool)).tril(kl - ql);
    m = m.defined() ? m.logical_and(c) : c;
  }
  if (m.defined()) scores = scores.masked_fill(m.logical_not(), -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(scores, -1, at::kFloat).to(q.scalar_type()), v);
#endif
}

}  // namespace hybridrl::detail::compat

// ---- autocast (mixed precision) ------------------------------------------------------------------
#include <ATen/autocast_mode.h>

namespace hybridrl::detail::compat {

/// RAII: enables autocast to `dtype` on CUDA for its lifetime and restores the previous state.
/// A no-op for other device types. LibTorch >= 2.4 has per-device-type calls; older versions have
/// CUDA-only ones.
class AutocastGuard {
 public:
  AutocastGuard(at::DeviceType device, at::ScalarType dtype) : active_(device == at::kCUDA) {
    if (!active_) return;
#if HYBRIDRL_TORCH_MAJOR > 2 || (HYBRIDRL_TORCH_MAJOR == 2 && HYBRIDRL_TORCH_MINOR >= 4)
    prev_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
    prev_dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, dtype);
#else
    prev_enabled_ = at::autocast::is_enabled();
    prev_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(dtype);
#endif
    at::autocast::increment_nesting();
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
  ~AutocastGuard() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if HYBRIDRL_TORCH_MAJOR > 2 || (HYBRIDRL_TORCH_MAJOR == 2 && HYBRIDRL_TORCH_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCUDA, prev_enabled_);
    at::autocast::set_autocast_dtype(at::kCUDA, prev_dtype_);
#else
    at::autocast::set_enabled(prev_enabled_);
    at::autocast::set_autocast_gpu_dtype(prev_dtype_);
#endif
  }

 private:
  bool active_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

}  // namespace hybridrl::detail::compat
