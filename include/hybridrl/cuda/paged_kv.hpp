#pragma once
/// \file
/// Writing a step's new keys and values into a paged KV cache (the cache of Rollout<Paged>):
/// token i goes to slot `slot_mapping[i]` = block * block_size + offset, −1 = a padding token that
/// is not written. On CUDA, in a target linked with hybridrl::cuda, one kernel does it
/// (src/cuda/paged_kv_cache.cu); elsewhere the same result comes from index_copy_.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "hybridrl/core/error.hpp"
#include "hybridrl/cuda/launchers.hpp"

#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
#include <ATen/cuda/CUDAContext.h>
#endif

namespace hybridrl {

/// Writes key/value [N, H, D] into key_cache/value_cache [num_blocks, block_size, H, D] at the
/// flat slots `slot_mapping` [N] (int64; −1 skips the token). On the CPU a slot outside
/// [−1, num_blocks·block_size) is an Error; the CUDA kernel cannot check without a device sync
/// and skips such tokens.
inline void write_kv_to_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                              at::Tensor& value_cache, const at::Tensor& slot_mapping) {
  constexpr const char* fn = "write_kv_to_cache";
  HYBRIDRL_CHECK(key.dim() == 3 && value.sizes() == key.sizes(),
                 fmt::format("{}: key and value must be [N, heads, head_dim] of one shape, got {} and {}",
                             fn, key.dim(), value.dim()),
                 "pass the step's new keys and values, one row per token");
  HYBRIDRL_CHECK(key_cache.dim() == 4 && value_cache.sizes() == key_cache.sizes() &&
                     key_cache.size(2) == key.size(1) && key_cache.size(3) == key.size(2),
                 fmt::format("{}: caches must be [num_blocks, block_size, {}, {}] of one shape", fn,
                             key.size(1), key.size(2)),
                 "allocate both caches with the key's head count and head size");
  HYBRIDRL_CHECK(key.scalar_type() == key_cache.scalar_type() &&
                     value.scalar_type() == key.scalar_type() &&
                     value_cache.scalar_type() == key.scalar_type(),
                 fmt::format("{}: key, value and caches must share one dtype", fn),
                 "convert the new keys/values to the cache dtype first");
  HYBRIDRL_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(),
                 fmt::format("{}: the caches must be contiguous", fn),
                 "allocate the caches with at::empty and write into them in place");
  HYBRIDRL_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == key.size(0) &&
                     slot_mapping.scalar_type() == at::kLong,
                 fmt::format("{}: slot_mapping must be int64 [{}]", fn, key.size(0)),
                 "pass one flat slot index (block * block_size + offset, or -1) per token");
  HYBRIDRL_CHECK(key.device() == key_cache.device() && slot_mapping.device() == key.device(),
                 fmt::format("{}: all tensors must be on one device", fn),
                 "move slot_mapping and the new keys/values to the cache's device");
  const int64_t row = key.size(1) * key.size(2);
  const int64_t num_slots = key_cache.size(0) * key_cache.size(1);
  const int64_t n = key.size(0);
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (key.is_cuda()) {
    cuda::KernelDtype dt;
    switch (key.scalar_type()) {
      case at::kFloat: dt = cuda::KernelDtype::f32; break;
      case at::kHalf: dt = cuda::KernelDtype::f16; break;
      case at::kBFloat16: dt = cuda::KernelDtype::bf16; break;
      default:
        throw Error(fmt::format("{}: dtype {} has no CUDA kernel", fn,
                                std::string(c10::toString(key.scalar_type()))),
                    "use a float32, float16 or bfloat16 cache");
    }
    const auto k = key.contiguous();
    const auto v = value.contiguous();
    const auto s = slot_mapping.contiguous();
    const int rc = cuda::launch_write_kv_to_cache(
        k.data_ptr(), v.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
        s.data_ptr<int64_t>(), n, row, num_slots, dt, at::cuda::getCurrentCUDAStream().stream());
    HYBRIDRL_CHECK(rc == 0, fmt::format("{}: the CUDA kernel failed to launch (cudaError {})", fn, rc),
                   "check the device and that hybridrl::cuda was built for its architecture");
    return;
  }
#endif
  if (key.device().is_cpu() && n > 0) {
    const auto mn = slot_mapping.min().item<int64_t>();
    const auto mx = slot_mapping.max().item<int64_t>();
    HYBRIDRL_CHECK(mn >= -1 && mx < num_slots,
                   fmt::format("{}: slot_mapping holds slots in [{}, {}], outside [-1, {})", fn, mn,
                               mx, num_slots),
                   "map each token to block * block_size + offset of a block it owns, or -1");
  }
  const auto keep = slot_mapping.ge(0).logical_and(slot_mapping.lt(num_slots));
  const auto idx = slot_mapping.masked_select(keep);
  auto kc = key_cache.view({num_slots, row});
  auto vc = value_cache.view({num_slots, row});
  kc.index_copy_(0, idx, key.reshape({n, row}).index({keep}));
  vc.index_copy_(0, idx, value.reshape({n, row}).index({keep}));
}

}  // namespace hybridrl
