// core/device.hpp: device_info, version, log_memory.

#include <ATen/ATen.h>
#include <hybridrl/core/device.hpp>
#include <hybridrl/version.hpp>

#include <sstream>
#include <string>
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using namespace hybridrl::testing;

namespace {
}  // namespace

TEST_SUITE("core/device") {
  TEST_CASE("device_info reports versions and agrees with LibTorch") {
    auto info = device_info();
    CHECK(info.hybridrl_version == std::string(HYBRIDRL_VERSION_STRING));
    CHECK(info.torch_version == std::string(TORCH_VERSION));
    CHECK(info.cuda_device_count == static_cast<int>(torch::cuda::device_count()));
    CHECK(static_cast<int>(info.devices.size()) <= info.cuda_device_count);
    if (info.cuda_device_count == 0) {
      CHECK_FALSE(info.fused_attention_available);
      CHECK_FALSE(info.flash_attention_available);
    }
#if !defined(HYBRIDRL_WITH_NCCL)
    CHECK_FALSE(info.nccl_available);
#endif
    CHECK(info.to_json()["torch_version"] == info.torch_version);
    CHECK(contains(info.to_string(), "LibTorch " + info.torch_version));
  }

  TEST_CASE("version matches CMake's project version") {
    CHECK(std::string(version()) == HYBRIDRL_CMAKE_PROJECT_VERSION);
  }

  TEST_CASE("log_memory sees an allocation grow the resident set") {
    std::ostringstream line;
    auto before = log_memory("before", &line);
    CHECK(contains(line.str(), "[memory] before |"));
    // 256 MiB touched page by page must show up in RSS (CPU) or allocated bytes (CUDA).
    const bool cuda = before.device != "cpu";
    auto big = at::ones({64 * 1024 * 1024}, at::TensorOptions(at::kFloat).device(cuda ? at::kCUDA : at::kCPU));
    auto after = log_memory("after", nullptr);
    if (cuda) {
      CHECK(after.allocated - before.allocated >= 256LL * 1024 * 1024);
      CHECK(after.peak_allocated >= after.allocated);
    } else {
      CHECK(before.rss > 0);
      CHECK(after.rss - before.rss >= 200LL * 1024 * 1024);
      CHECK(after.peak_rss >= after.rss);
    }
    CHECK(big.sum().item<double>() == doctest::Approx(64.0 * 1024 * 1024));
  }
}
