#pragma once
/// \file
/// Host launchers of hybridrl's CUDA kernels. The kernels ship as source (src/cuda/*.cu) and are
/// compiled in the consumer's own build by `hybridrl_add_cuda_kernels()` (cmake/hybridrlCuda.cmake)
/// into the target hybridrl::cuda, for the consumer's CUDA architectures; nothing prebuilt ships.
/// These declarations need no CUDA header: pointers are untyped and the stream is a cudaStream_t
/// passed as void*. Use the LibTorch-facing functions (cuda/paged_kv.hpp) instead of these.

#include <cstdint>

namespace hybridrl::cuda {

/// Element type of a kernel's tensors.
enum class KernelDtype : int { f32 = 0, f16 = 1, bf16 = 2 };

/// Writes `num_tokens` rows of `row_elems` elements from `key`/`value` (contiguous [N, row]) into
/// the paged caches (contiguous [slots, row]) at `slot_mapping[i]` (int64; −1 = skip the token).
/// Returns the cudaError_t of the launch as int (0 = success).
int launch_write_kv_to_cache(const void* key, const void* value, void* key_cache,
                             void* value_cache, const int64_t* slot_mapping, int64_t num_tokens,
                             int64_t row_elems, int64_t num_slots, KernelDtype dtype,
                             void* stream);

}  // namespace hybridrl::cuda
