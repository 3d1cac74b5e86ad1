#pragma once
/// \file
/// What this process can use (like verl's get_device_info) and where its memory goes (like verl's
/// log_gpu_memory_usage): `device_info()` and `log_memory(tag)`.

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>
#include <torch/version.h>

#include <cstdint>
#include <fstream>
#include <iostream>
#include <optional>
#include <tuple>
#include <utility>
#include <string>
#include <vector>

#include "hybridrl/detail/compat.hpp"
#include "hybridrl/version.hpp"

#if defined(HYBRIDRL_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif
#if defined(HYBRIDRL_WITH_NCCL)
#include <nccl.h>
#endif

namespace hybridrl {

/// One CUDA device as the runtime reports it.
struct CUDADevice {
  int index = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  int64_t total_memory = 0;  ///< bytes
};

/// The accelerators, libraries and versions available to this process.
struct DeviceInfo {
  int cuda_device_count = 0;
  std::string cuda_runtime_version;  ///< "13.0", or "" without CUDA
  std::string cuda_driver_version;   ///< highest CUDA version the driver supports, or ""
  bool nccl_available = false;
  std::string nccl_version;          ///< "2.27.3", or ""
  bool fused_attention_available = false;  ///< LibTorch >= 2 SDPA kernels on a CUDA device
  bool flash_attention_available = false;  ///< ... and a device of compute capability >= 8.0
  std::string torch_version;
  std::string hybridrl_version;
  std::vector<CUDADevice> devices;

  /// Multi-line human-readable report.
  [[nodiscard]] std::string to_string() const {
    std::string s = fmt::format(
        "hybridrl {} | LibTorch {} | CUDA devices: {} | CUDA runtime: {} | driver: {} | NCCL: {} | "
        "fused attention: {} | flash attention: {}",
        hybridrl_version, torch_version, cuda_device_count,
        cuda_runtime_version.empty() ? "none" : cuda_runtime_version,
        cuda_driver_version.empty() ? "none" : cuda_driver_version,
        nccl_available ? nccl_version : std::string("none"), fused_attention_available ? "yes" : "no",
        flash_attention_available ? "yes" : "no");
    for (const auto& d : devices) {
      s += fmt::format("\n  cuda:{} {} (sm_{}{}, {:.1f} GiB)", d.index, d.name, d.compute_major,
                       d.compute_minor, static_cast<double>(d.total_memory) / (1 << 30));
    }
    return s;
  }

  /// The same report as JSON (for metrics files and bug reports).
  [[nodiscard]] nlohmann::json to_json() const {
    nlohmann::json devs = nlohmann::json::array();
    for (const auto& d : devices) {
      devs.push_back({{"index", d.index}, {"name", d.name},
                      {"compute_capability", fmt::format("{}.{}", d.compute_major, d.compute_minor)},
                      {"total_memory", d.total_memory}});
    }
    return {{"hybridrl_version", hybridrl_version}, {"torch_version", torch_version},
            {"cuda_device_count", cuda_device_count}, {"cuda_runtime_version", cuda_runtime_version},
            {"cuda_driver_version", cuda_driver_version}, {"nccl_available", nccl_available},
            {"nccl_version", nccl_version}, {"fused_attention_available", fused_attention_available},
            {"flash_attention_available", flash_attention_available}, {"devices", devs}};
  }
};

namespace detail {
inline std::string cuda_version_string(int v) {
  return v > 0 ? fmt::format("{}.{}", v / 1000, (v % 1000) / 10) : std::string();
}
}  // namespace detail

/// Probes the process: CUDA devices and versions, NCCL, fused attention, library versions.
inline DeviceInfo device_info() {
  DeviceInfo info;
  info.torch_version = TORCH_VERSION;
  info.hybridrl_version = version();
  info.cuda_device_count = static_cast<int>(torch::cuda::device_count());
#if defined(HYBRIDRL_WITH_CUDA)
  int rt = 0, drv = 0;
  if (cudaRuntimeGetVersion(&rt) == cudaSuccess) info.cuda_runtime_version = detail::cuda_version_string(rt);
  if (cudaDriverGetVersion(&drv) == cudaSuccess) info.cuda_driver_version = detail::cuda_version_string(drv);
  for (int i = 0; i < info.cuda_device_count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    info.devices.push_back({i, p.name, p.major, p.minor, static_cast<int64_t>(p.totalGlobalMem)});
  }
#endif
#if defined(HYBRIDRL_WITH_NCCL)
  int nv = 0;
  if (ncclGetVersion(&nv) == ncclSuccess && nv > 0) {
    info.nccl_available = true;
    // Since NCCL 2.9 the code is major*10000 + minor*100 + patch.
    info.nccl_version = fmt::format("{}.{}.{}", nv / 10000, (nv % 10000) / 100, nv % 100);
  }
#endif
  info.fused_attention_available = HYBRIDRL_HAS_SDPA && info.cuda_device_count > 0;
  for (const auto& d : info.devices) {
    if (info.fused_attention_available && d.compute_major >= 8) info.flash_attention_available = true;
  }
  return info;
}

/// Memory of this process at one point, in bytes. CUDA fields are 0 on a CPU-only run.
struct MemoryReport {
  std::string tag;
  std::string device;          ///< "cuda:0" or "cpu"
  int64_t allocated = 0;       ///< CUDA: bytes in live tensors
  int64_t reserved = 0;        ///< CUDA: bytes held by the caching allocator
  int64_t peak_allocated = 0;  ///< CUDA: high-water mark of allocated
  int64_t rss = 0;             ///< resident set size of the process
  int64_t peak_rss = 0;        ///< high-water mark of rss

  [[nodiscard]] std::string to_string() const {
    constexpr double gib = 1 << 30;
    if (device == "cpu") {
      return fmt::format("[memory] {} | cpu rss {:.3f} GiB, peak {:.3f} GiB", tag, rss / gib,
                         peak_rss / gib);
    }
    return fmt::format("[memory] {} | {} allocated {:.3f} GiB, reserved {:.3f} GiB, peak {:.3f} GiB | "
                       "rss {:.3f} GiB",
                       tag, device, allocated / gib, reserved / gib, peak_allocated / gib, rss / gib);
  }
};

namespace detail {
/// Reads "VmRSS:" and "VmHWM:" (kB) from /proc/self/status; zeros where that file does not exist.
inline std::pair<int64_t, int64_t> process_rss() {
  std::ifstream f("/proc/self/status");
  std::string key;
  int64_t rss = 0, hwm = 0;
  while (f >> key) {
    int64_t kb = 0;
    if (key == "VmRSS:" && f >> kb) rss = kb * 1024;
    else if (key == "VmHWM:" && f >> kb) hwm = kb * 1024;
  }
  return {rss, hwm};
}
}  // namespace detail

/// Bytes that can still be allocated on `device`: MemAvailable from /proc/meminfo for the CPU,
/// cudaMemGetInfo's free memory for a CUDA device (in a CUDA build). nullopt where it cannot be
/// told (no /proc, a CPU-only build asked about CUDA, another device type): callers then skip
/// their check rather than refuse.
inline std::optional<int64_t> available_memory(const at::Device& device) {
  if (device.is_cpu()) {
    std::ifstream f("/proc/meminfo");
    std::string key;
    int64_t kb = 0;
    while (f >> key >> kb) {
      if (key == "MemAvailable:") return kb * 1024;
      f.ignore(64, '\n');
    }
    return std::nullopt;
  }
#if defined(HYBRIDRL_WITH_CUDA)
  if (device.is_cuda()) {
    int before = 0;
    if (cudaGetDevice(&before) != cudaSuccess) return std::nullopt;
    const int index = device.has_index() ? device.index() : before;
    if (index != before && cudaSetDevice(index) != cudaSuccess) return std::nullopt;
    std::size_t free_bytes = 0, total = 0;
    const bool ok = cudaMemGetInfo(&free_bytes, &total) == cudaSuccess;
    if (index != before) cudaSetDevice(before);
    if (ok) return static_cast<int64_t>(free_bytes);
  }
#endif
  return std::nullopt;
}

/// Measures memory now (CUDA device `cuda_index` when CUDA devices exist, else the process RSS),
/// writes one line to `out` (std::clog by default; nullptr for none) and returns the numbers.
inline MemoryReport log_memory(const std::string& tag, std::ostream* out = &std::clog,
                               int cuda_index = 0) {
  MemoryReport r;
  r.tag = tag;
  std::tie(r.rss, r.peak_rss) = detail::process_rss();
  if (static_cast<int64_t>(torch::cuda::device_count()) > static_cast<int64_t>(cuda_index)) {
    r.device = fmt::format("cuda:{}", cuda_index);
    const auto m = detail::compat::cuda_memory(cuda_index);
    r.allocated = m.allocated;
    r.reserved = m.reserved;
    r.peak_allocated = m.peak_allocated;
  } else {
    r.device = "cpu";
  }
  if (out != nullptr) *out << r.to_string() << '\n';
  return r;
}

}  // namespace hybridrl
