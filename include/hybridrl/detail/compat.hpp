#pragma once
/// \file
/// The ONE place where LibTorch 1.13 and 2.x differ for hybridrl. Everything version-dependent
/// goes through the macros and functions here; no other header tests TORCH_VERSION_*.
///
/// - HYBRIDRL_TORCH_MAJOR / HYBRIDRL_TORCH_MINOR: the LibTorch version the code is compiled against.
/// - HYBRIDRL_HAS_SDPA: at::scaled_dot_product_attention (fused flash / memory-efficient kernels)
///   exists (LibTorch >= 2.0). Without it model/attention.hpp computes plain matmul + softmax.
/// - c10d (ProcessGroup on 1.13, Backend on 2.x; USE_C10D_GLOO / USE_C10D_NCCL) is handled in
///   distributed/c10d_communicator.hpp, the one header that includes c10d.
/// - compat::cuda_memory(device): allocated / reserved / peak bytes of the caching allocator,
///   whose stats types moved namespaces between versions.
/// - compat::AutocastGuard(device_type, dtype): RAII autocast on CUDA or CPU; the autocast calls
///   became per-device-type in LibTorch 2.4.
/// - HYBRIDRL_HAS_VARLEN_FLASH / compat::varlen_flash_attention: FlashAttention-2's packed varlen
///   forward (at::_flash_attention_forward with cum_seq_q/k and a sliding window; LibTorch >= 2.6);
///   compat::dense_cudnn_attention beside it: cuDNN's dense causal attention for rows of one length
///   (at most 64 distinct shapes a process, compat::cudnn_shape_budget: a plan is built per shape).
/// - HYBRIDRL_HAS_FUSED_ADAMW / compat::fused_adamw: the multi-tensor AdamW kernel and foreach ops
///   with tensor scalars (LibTorch >= 2.1), used on CUDA.
/// - HYBRIDRL_HAS_FUSED_RMS_NORM / compat::fused_rms_norm: at::_fused_rms_norm with its backward
///   (LibTorch >= 2.10), used by training forwards on CUDA.

#include <ATen/ATen.h>
#include <torch/version.h>

#include <cstdint>

#define HYBRIDRL_TORCH_MAJOR TORCH_VERSION_MAJOR
#define HYBRIDRL_TORCH_MINOR TORCH_VERSION_MINOR

#if HYBRIDRL_TORCH_MAJOR >= 2
#define HYBRIDRL_HAS_SDPA 1
#else
#define HYBRIDRL_HAS_SDPA 0
#endif
// scaled_dot_product_attention(..., enable_gqa) reads K/V with fewer heads than Q (2.5 and later)
#if HYBRIDRL_TORCH_MAJOR > 2 || (HYBRIDRL_TORCH_MAJOR == 2 && HYBRIDRL_TORCH_MINOR >= 5)
#define HYBRIDRL_HAS_SDPA_GQA 1
#else
#define HYBRIDRL_HAS_SDPA_GQA 0
#endif

#if defined(HYBRIDRL_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace hybridrl::detail::compat {

/// Caching-allocator byte counts for one CUDA device.
struct CUDAMemory {
  int64_t allocated = 0;       ///< bytes in live tensors
  int64_t reserved = 0;        ///< bytes held by the caching allocator
  int64_t peak_allocated = 0;  ///< high-water mark of `allocated` since start or last reset
};

/// Byte counts of the caching allocator on CUDA device `index` (zeros in a CPU-only build).
inline CUDAMemory cuda_memory([[maybe_unused]] int index) {
#if defined(HYBRIDRL_WITH_CUDA)
  // DeviceStats lives in c10::cuda::CUDACachingAllocator (1.13) or c10::CachingDeviceAllocator
  // (2.x); `auto` spans both. Index 0 is StatType::AGGREGATE in every version.
  // LibTorch 2.x initialises the allocator lazily, at a process's first CUDA allocation; before it
  // getDeviceStats throws "Invalid device argument". Nothing allocated yet: every count is 0.
  try {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    return {stats.allocated_bytes[0].current, stats.reserved_bytes[0].current,
            stats.allocated_bytes[0].peak};
  } catch (const c10::Error&) {
    return {};
  }
#else
  return {};
#endif
}

/// Starts a new high-water mark of allocated bytes on CUDA device `index` (a no-op in a CPU-only build).
inline void reset_cuda_peak([[maybe_unused]] int index) {
#if defined(HYBRIDRL_WITH_CUDA)
  try {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<decltype(c10::DeviceIndex{})>(index));
  } catch (const c10::Error&) {  // the allocator not initialised yet: nothing to reset
  }
#endif
}

}  // namespace hybridrl::detail::compat

// ---- autocast (mixed precision) ------------------------------------------------------------------
#include <ATen/autocast_mode.h>

namespace hybridrl::detail::compat {

/// RAII: enables autocast to `dtype` on CUDA or CPU for its lifetime and restores the previous
/// state. A no-op for other device types. LibTorch >= 2.4 has per-device-type calls; older versions
/// have separate CUDA ("gpu") and CPU ones.
class AutocastGuard {
 public:
  AutocastGuard(at::DeviceType device, at::ScalarType dtype)
      : device_(device), active_(device == at::kCUDA || device == at::kCPU) {
    if (!active_) return;
    prev_enabled_ = enabled(device_);
    prev_dtype_ = get_dtype(device_);
    set(device_, true, dtype);
    at::autocast::increment_nesting();
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
  ~AutocastGuard() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set(device_, prev_enabled_, prev_dtype_);
  }

  /// Whether autocast is on for `device` (kCUDA or kCPU).
  static bool enabled(at::DeviceType device) {
#if HYBRIDRL_TORCH_MAJOR > 2 || (HYBRIDRL_TORCH_MAJOR == 2 && HYBRIDRL_TORCH_MINOR >= 4)
    return at::autocast::is_autocast_enabled(device);
#else
    return device == at::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
  }

  /// The dtype autocast casts to on `device` (kCUDA or kCPU).
  static at::ScalarType get_dtype(at::DeviceType device) {
#if HYBRIDRL_TORCH_MAJOR > 2 || (HYBRIDRL_TORCH_MAJOR == 2 && HYBRIDRL_TORCH_MINOR >= 4)
    return at::autocast::get_autocast_dtype(device);
#else
    return device == at::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
#endif
  }

 private:
  static void set(at::DeviceType device, bool on, at::ScalarType dtype) {
#if HYBRIDRL_TORCH_MAJOR > 2 || (HYBRIDRL_TORCH_MAJOR == 2 && HYBRIDRL_TORCH_MINOR >= 4)
    at::autocast::set_autocast_enabled(device, on);
    at::autocast::set_autocast_dtype(device, dtype);
#else
    if (device == at::kCUDA) {
      at::autocast::set_enabled(on);
      at::autocast::set_autocast_gpu_dtype(dtype);
    } else {
      at::autocast::set_cpu_enabled(on);
      at::autocast::set_autocast_cpu_dtype(dtype);
    }
#endif
  }

  at::DeviceType device_;
  bool active_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

}  // namespace hybridrl::detail::compat

// ---- torch::optim state keys ---------------------------------------------------------------------
#include <sstream>
#include <string>
#include <type_traits>

namespace hybridrl::detail::compat {

/// The key of parameter `p` in a torch::optim optimizer's state map `Map`: LibTorch 1.13 keys it
/// by the printed address of the parameter's TensorImpl (a string), later versions may key it by
/// the address itself; the map's key_type decides.
template <class Map>
typename Map::key_type optimizer_state_key(const at::Tensor& p) {
  using K = typename Map::key_type;
  if constexpr (std::is_same_v<K, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return reinterpret_cast<K>(p.unsafeGetTensorImpl());
  }
}

}  // namespace hybridrl::detail::compat

// ---- varlen flash attention ----------------------------------------------------------------------
// at::_flash_attention_forward with cum_seq_q/k, window sizes and seqused_k (the schema since 2.6)
#if HYBRIDRL_TORCH_MAJOR > 2 || (HYBRIDRL_TORCH_MAJOR == 2 && HYBRIDRL_TORCH_MINOR >= 6)
#define HYBRIDRL_HAS_VARLEN_FLASH 1
#else
#define HYBRIDRL_HAS_VARLEN_FLASH 0
#endif

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>

namespace hybridrl::detail::compat {

/// The distinct attention shapes dense_cudnn_attention may send to cuDNN, at most `limit`: cuDNN
/// builds an execution plan at each new shape (a GRPO run of 160m paid ~0.9 s over its first two
/// steps, 2026-12-07), so a workload whose rows of one length keep taking new lengths (bucketed
/// batches without padding) would pay it again and again. Past the limit a new shape takes
/// FlashAttention-2; the admitted ones keep cuDNN. Thread-safe.
class ShapeBudget {
 public:
  using Shape = std::array<int64_t, 8>;
  explicit ShapeBudget(std::size_t limit) : limit_(limit) {}
  /// Whether `shape` may go to cuDNN: admitted before, or new while fewer than `limit` are.
  [[nodiscard]] bool admit(const Shape& shape) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (admitted_.count(shape) != 0) return true;
    if (admitted_.size() >= limit_) return false;
    admitted_.insert(shape);
    return true;
  }
  [[nodiscard]] std::size_t admitted() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return admitted_.size();
  }
  [[nodiscard]] std::size_t limit() const noexcept { return limit_; }

 private:
  std::size_t limit_;
  mutable std::mutex mutex_;
  std::set<Shape> admitted_;
};
/// The process's budget of cuDNN attention shapes (64).
inline ShapeBudget& cudnn_shape_budget() {
  static ShapeBudget budget(64);
  return budget;
}

#if HYBRIDRL_HAS_VARLEN_FLASH
/// Causal attention of packed queries `q` [Tq, H, D] over packed keys/values [Tk, Hkv, D] (CUDA,
/// bf16 or fp16, H a multiple of Hkv): sequence s holds query rows [cu_q[s], cu_q[s+1]) and key
/// rows [cu_k[s], cu_k[s+1]) (int32 prefix sums). FlashAttention-2 aligns the causal mask to the
/// bottom right, so a chunk of queries after cached keys sees them all; `window` keeps the keys
/// fewer than that many positions back. → [Tq, H, D].
inline at::Tensor varlen_flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& cu_q, const at::Tensor& cu_k, int64_t max_q, int64_t max_k,
                                         double scale, std::optional<int64_t> window) {
  std::optional<int64_t> left, right;
  if (window) {
    left = *window - 1;
    right = 0;
  }
  auto res = at::_flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, /*dropout_p=*/0.0, /*is_causal=*/true,
                                          /*return_debug_mask=*/false, scale, left, right);
  return std::get<0>(res);
}

/// Whether dense_cudnn_attention is tried: on unless the environment says HYBRIDRL_CUDNN_ATTENTION=0
/// or set_cudnn_attention(false) was called; off for the rest of the process once cuDNN refuses a
/// call. On by default since its CUDA test and the update benchmark ran on an H100 (2026-12-07:
/// the update 4–5 % faster than through FlashAttention-2; docs/benchmarks.md).
inline std::atomic<bool>& cudnn_attention_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("HYBRIDRL_CUDNN_ATTENTION");
    return v == nullptr || std::string_view(v) != "0";
  }()};
  return on;
}
inline void set_cudnn_attention(bool on) noexcept { cudnn_attention_flag().store(on); }
[[nodiscard]] inline bool cudnn_attention_enabled() noexcept { return cudnn_attention_flag().load(); }

/// Causal attention of `rows` sequences of one length packed in `q` [N, H, D], `k`, `v` [N, Hkv,
/// D] (CUDA, bf16 / fp16; N = rows × length) through cuDNN's fused dense attention
/// (at::_scaled_dot_product_cudnn_attention on [rows, heads, length, D] views: no copy in, its
/// backward differentiable as SDPA's) → [N, H, D]; undefined where it does not apply or cuDNN
/// refuses the shapes (the caller runs FlashAttention-2's varlen kernel). Faster than
/// FlashAttention-2 at the update's shapes on Hopper (head size 64, 16 × 1024 tokens, MHA and GQA).
inline at::Tensor dense_cudnn_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t rows,
                                        double scale) {
  if (!cudnn_attention_enabled() || !q.is_cuda() || rows <= 0 || q.size(0) % rows != 0 ||
      (q.scalar_type() != at::kBFloat16 && q.scalar_type() != at::kHalf)) {
    return {};
  }
  const auto N = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1), L = N / rows;
  const bool grad = q.requires_grad() || k.requires_grad() || v.requires_grad();
  if (!cudnn_shape_budget().admit({rows, L, H, Hkv, D, static_cast<int64_t>(q.scalar_type()), grad ? 1 : 0,
                                   static_cast<int64_t>(q.device().index())})) {
    return {};  // a shape past the budget: no new plan (FlashAttention-2 serves it)
  }
  auto qd = q.view({rows, L, H, D}).transpose(1, 2);
  auto kd = k.view({rows, L, Hkv, D}).transpose(1, 2);
  auto vd = v.view({rows, L, Hkv, D}).transpose(1, 2);
  try {
    auto res = at::_scaled_dot_product_cudnn_attention(qd, kd, vd, /*attn_bias=*/std::nullopt,
                                                       /*compute_log_sumexp=*/grad,
                                                       /*dropout_p=*/0.0, /*is_causal=*/true,
                                                       /*return_debug_mask=*/false, scale);
    return std::get<0>(res).transpose(1, 2).reshape({N, H, D});
  } catch (const c10::Error&) {
    set_cudnn_attention(false);  // this LibTorch / cuDNN does not take these shapes: FlashAttention-2 from now on
    return {};
  }
}
#endif

}  // namespace hybridrl::detail::compat

// ---- fused RMSNorm with its backward ----------------------------------------------------------
// at::_fused_rms_norm (one CUDA kernel forward, one backward; torch.nn.functional.rms_norm's CUDA
// path) from LibTorch 2.10; model/layers.hpp uses it where a norm records autograd on CUDA.
#if HYBRIDRL_TORCH_MAJOR > 2 || (HYBRIDRL_TORCH_MAJOR == 2 && HYBRIDRL_TORCH_MINOR >= 10)
#define HYBRIDRL_HAS_FUSED_RMS_NORM 1
#else
#define HYBRIDRL_HAS_FUSED_RMS_NORM 0
#endif

namespace hybridrl::detail::compat {

/// `weight * x / sqrt(mean(x²) + eps)` over the last dimension in one kernel (fp32 inside, one
/// rounding to x's dtype), differentiable; undefined where LibTorch has no fused kernel (before
/// 2.10) — the caller computes it eagerly.
inline at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
#if HYBRIDRL_HAS_FUSED_RMS_NORM
  return std::get<0>(at::_fused_rms_norm(x, {x.size(-1)}, weight, eps));
#else
  (void)x, (void)weight, (void)eps;
  return {};
#endif
}

}  // namespace hybridrl::detail::compat

// ---- multi-tensor AdamW and foreach ops ----------------------------------------------------------
// at::_fused_adamw_ (one multi-tensor kernel for a list of parameters: torch.optim.AdamW(fused=True))
// and _foreach_mul_ by a 0-d tensor exist from LibTorch 2.1; sharding/optimizer.hpp uses them on CUDA.
#if HYBRIDRL_TORCH_MAJOR > 2 || (HYBRIDRL_TORCH_MAJOR == 2 && HYBRIDRL_TORCH_MINOR >= 1)
#define HYBRIDRL_HAS_FUSED_ADAMW 1
#else
#define HYBRIDRL_HAS_FUSED_ADAMW 0
#endif

namespace hybridrl::detail::compat {

#if HYBRIDRL_HAS_FUSED_ADAMW
/// One AdamW step (decoupled weight decay, bias-corrected, no amsgrad) of `params` from `grads`,
/// updating `exp_avgs`/`exp_avg_sqs` in place: every tensor on one CUDA device, params, grads and
/// moments of one dtype, `steps` the 0-d float32 step counts on that device, already incremented
/// for this step (torch.optim's fused path). With `grad_scale` (0-d float32 on that device) the
/// kernel divides each gradient by it as it reads it and stores the quotient back (AMP's unscale;
/// the optimizer's clipping by 1 / coefficient).
inline void fused_adamw(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                        at::TensorList exp_avg_sqs, at::TensorList steps, double lr, double beta1, double beta2,
                        double weight_decay, double eps, const std::optional<at::Tensor>& grad_scale = std::nullopt) {
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2, weight_decay,
                    eps, /*amsgrad=*/false, /*maximize=*/false, grad_scale, std::nullopt);
}
#endif

}  // namespace hybridrl::detail::compat
