// Paged KV cache writes: the new keys/values of a decode or prefill step go to their cache slots
// (slot = block * block_size + offset), one CUDA block per token, 16-byte vectors where the row
// allows. Host launcher declared in include/hybridrl/cuda/launchers.hpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "hybridrl/cuda/launchers.hpp"
#include "launch.cuh"

namespace hybridrl::cuda {
namespace {

template <class T>
__global__ void write_kv_to_cache_kernel(const T* __restrict__ key, const T* __restrict__ value,
                                         T* __restrict__ key_cache, T* __restrict__ value_cache,
                                         const int64_t* __restrict__ slot_mapping,
                                         int64_t row_elems, int64_t num_slots) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0 || slot >= num_slots) return;  // padding token, or out of range: nothing written
  const T* k = key + token * row_elems;
  const T* v = value + token * row_elems;
  T* kc = key_cache + slot * row_elems;
  T* vc = value_cache + slot * row_elems;
  constexpr int kVec = 16 / sizeof(T);
  if (row_elems % kVec == 0 && reinterpret_cast<uintptr_t>(k) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(v) % 16 == 0 && reinterpret_cast<uintptr_t>(kc) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(vc) % 16 == 0) {
    const int64_t n = row_elems / kVec;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      reinterpret_cast<uint4*>(kc)[i] = reinterpret_cast<const uint4*>(k)[i];
      reinterpret_cast<uint4*>(vc)[i] = reinterpret_cast<const uint4*>(v)[i];
    }
  } else {
    for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) {
      kc[i] = k[i];
      vc[i] = v[i];
    }
  }
}

template <class T>
int launch(const void* key, const void* value, void* key_cache, void* value_cache,
           const int64_t* slots, int64_t num_tokens, int64_t row_elems, int64_t num_slots,
           cudaStream_t stream) {
  if (num_tokens == 0) return 0;
  const int threads = row_elems >= 1024 ? 256 : 128;
  detail::launch(write_kv_to_cache_kernel<T>, static_cast<unsigned>(num_tokens), threads, 0, stream,
      static_cast<const T*>(key), static_cast<const T*>(value), static_cast<T*>(key_cache),
      static_cast<T*>(value_cache), slots, row_elems, num_slots);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_write_kv_to_cache(const void* key, const void* value, void* key_cache,
                             void* value_cache, const int64_t* slot_mapping, int64_t num_tokens,
                             int64_t row_elems, int64_t num_slots, KernelDtype dtype,
                             void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case KernelDtype::f32:
      return launch<float>(key, value, key_cache, value_cache, slot_mapping, num_tokens, row_elems, num_slots, s);
    case KernelDtype::f16:
      return launch<__half>(key, value, key_cache, value_cache, slot_mapping, num_tokens, row_elems, num_slots, s);
    case KernelDtype::bf16:
      return launch<__nv_bfloat16>(key, value, key_cache, value_cache, slot_mapping, num_tokens, row_elems, num_slots, s);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace hybridrl::cuda
