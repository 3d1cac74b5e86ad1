// How hybridrl's kernels are launched: with programmatic dependent launch (PDL) where it is on.
//
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled
// while the kernel before it on the stream is still finishing; it must then wait for that kernel
// (its completion and the visibility of its writes) before it reads anything that kernel wrote:
// `griddepcontrol.wait`. Every kernel launched through `launch()` calls wait_for_prior_grids()
// as its first statement, in every block, so a kernel never completes before the one it follows
// (the next kernel's wait then covers every earlier one too). Nothing is triggered early
// (no `griddepcontrol.launch_dependents`): what PDL buys here is the launch and the start of the
// next grid overlapping the last blocks of the one before — the gaps of a decode step's ~10
// launches a layer. Off (plain launches, the wait a no-op) unless HYBRIDRL_PDL=1 or
// set_programmatic_launch(true), and on devices before Hopper (sm_90). Inside a CUDA graph
// capture the attribute becomes a programmatic edge of the graph.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace hybridrl::cuda::detail {

/// The first statement of every kernel launched through launch(): waits until the grids it
/// follows have completed and their writes are visible (sm_90+; a no-op for a plain launch).
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

inline std::atomic<int>& programmatic_launch_flag() {
  static std::atomic<int> on{[] {
    const char* v = std::getenv("HYBRIDRL_PDL");
    return v != nullptr && std::strcmp(v, "1") == 0 ? 1 : 0;
  }()};
  return on;
}

/// Whether the current device takes programmatic launches (compute capability 9.0 or later),
/// asked of the driver once per device.
inline bool device_takes_programmatic_launch() {
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices] = {};  // 0 not asked yet, 1 no, 2 yes
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) return false;
  int v = known[device].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0;
    v = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9 ? 2 : 1;
    known[device].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

/// `kernel<<<grid, block, smem, stream>>>(args...)`, with the PDL attribute where it is on.
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = programmatic_launch_flag().load(std::memory_order_relaxed) != 0 &&
                            device_takes_programmatic_launch()
                        ? 1
                        : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Args&&>(args)...);
}

}  // namespace hybridrl::cuda::detail
