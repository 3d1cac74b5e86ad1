#pragma once
// Test support: run a function on `world` ranks as threads of this process, each with a Gloo
// process group over an in-process HashStore (no network beyond loopback, no launcher).
#include <hybridrl/detail/compat.hpp>  // first: defines USE_C10D_GLOO on LibTorch 2.x

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hybridrl::testing {

/// Calls fn(rank, group) on `world` threads; rethrows the first exception any rank threw.
inline void run_ranks(int world, const std::function<void(int, c10d::ProcessGroupGloo&)>& fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::exception_ptr error;
  std::mutex error_mutex;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto opts = c10d::ProcessGroupGloo::Options::create();
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        c10d::ProcessGroupGloo group(store, rank, world, opts);
        fn(rank, group);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace hybridrl::testing
