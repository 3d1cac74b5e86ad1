#pragma once
// Where a GPU benchmark's time goes: records a piece of work under LibTorch's Kineto profiler (CUPTI
// kernel records, as torch.profiler gives them) and prints one JSON line per kernel class and per
// kernel (the `top` largest), with calls and GPU milliseconds per repetition, plus a summary line:
// the GPU's summed kernel time against the wall time (the busy fraction, without counters). The
// Chrome trace is saved when a path is given (open it in chrome://tracing or Perfetto).
//
// Kernel classes are read off the kernel names: GEMM (cuBLAS/cuBLASLt/CUTLASS), attention (flash),
// the optimizer (fused/multi-tensor Adam, foreach), reductions, copies and casts, elementwise, our
// fused kernels (hybridrl::fused), and the rest.

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace hybridrl::bench {

inline std::string kernel_class(const std::string& n) {
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("Memcpy") || has("Memset")) return "memcpy/memset";
  if (has("flash") || has("fmha") || has("attention")) return "attention";
  if (has("adam") || has("Adam") || has("multi_tensor") || has("foreach")) return "optimizer/foreach";
  if (has("gemm") || has("Gemm") || has("cutlass") || has("nvjet") || has("xmma") || has("cublas")) return "gemm";
  if (has("hybridrl") || has("rms_norm") || has("rope") || has("silu_mul") || has("sample_tokens")) return "hybridrl fused";
  if (has("reduce") || has("Reduce") || has("softmax") || has("norm")) return "reduction/softmax";
  if (has("copy") || has("Copy") || has("cast")) return "copy/cast";
  if (has("elementwise") || has("Elementwise") || has("vectorized")) return "elementwise";
  if (has("index") || has("Index") || has("gather") || has("scatter") || has("nonzero") || has("unique")) return "index/gather";
  return "other";
}

/// Starts recording CPU ops and CUDA kernels (Kineto); `stop` prints the tables.
inline void start_kernel_profile() {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  const ProfilerConfig cfg(ProfilerState::KINETO, /*report_input_shapes=*/true);  // shapes: trace_ops.py
  const std::set<ActivityType> acts{ActivityType::CPU, ActivityType::CUDA};
  prof::prepareProfiler(cfg, acts);
  prof::enableProfiler(cfg, acts);
}

/// Stops the recording `start_kernel_profile` began (the caller synchronised the device first) and
/// prints the kernel classes and the `top` largest kernels, per repetition of `reps` recorded
/// ones, against `wall_ms` (the recorded span's wall time), tagged with `what`; saves the Chrome
/// trace to `trace_path` when it is not empty.
inline void stop_kernel_profile(const std::string& what, int reps, double wall_ms, int top,
                                const std::string& trace_path) {
  auto result = torch::autograd::profiler::disableProfiler();
  struct Agg {
    double ms = 0;
    int64_t calls = 0;
  };
  std::map<std::string, Agg> by_name, by_class;
  double total_ms = 0;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    const double ms = static_cast<double>(e.durationNs()) / 1e6;
    const auto name = e.name();
    by_name[name].ms += ms;
    by_name[name].calls += 1;
    auto& c = by_class[kernel_class(name)];
    c.ms += ms;
    c.calls += 1;
    total_ms += ms;
  }
  auto print = [&](const char* kind, const std::map<std::string, Agg>& m, int limit) {
    std::vector<std::pair<std::string, Agg>> v(m.begin(), m.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    for (int i = 0; i < static_cast<int>(v.size()) && i < limit; ++i) {
      auto name = v[i].first.substr(0, 110);
      std::replace(name.begin(), name.end(), '"', '\'');
      std::replace(name.begin(), name.end(), '\\', '/');
      std::printf("{\"bench\": \"profile\", \"what\": \"%s\", \"%s\": \"%s\", \"calls_per_rep\": %.1f, "
                  "\"gpu_ms_per_rep\": %.3f, \"share\": %.4f}\n",
                  what.c_str(), kind, name.c_str(), static_cast<double>(v[i].second.calls) / reps, v[i].second.ms / reps,
                  total_ms > 0 ? v[i].second.ms / total_ms : 0.0);
    }
  };
  print("class", by_class, 100);
  print("kernel", by_name, top);
  std::printf("{\"bench\": \"profile_summary\", \"what\": \"%s\", \"reps\": %d, \"wall_ms_per_rep\": %.3f, "
              "\"gpu_kernel_ms_per_rep\": %.3f, \"gpu_busy_fraction\": %.4f, \"kernels\": %zu}\n",
              what.c_str(), reps, wall_ms / reps, total_ms / reps, wall_ms > 0 ? total_ms / wall_ms : 0.0, by_name.size());
  std::fflush(stdout);
  if (!trace_path.empty()) result->save(trace_path);
}

}  // namespace hybridrl::bench
