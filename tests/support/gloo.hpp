#pragma once
// Test support: run a function on `world` ranks as threads of this process, over either backend a
// Communicator test must agree on — hybridrl's ThreadCommunicator (run_ranks) and c10d Gloo
// (C10dCommunicator over an in-process HashStore, where LibTorch ships the gloo headers it was
// built with: CMake checks and sets HYBRIDRL_TEST_GLOO; Debian's 1.13 does, the pip wheels of 2.x
// do not).
#include <hybridrl/distributed/c10d_communicator.hpp>
#include <hybridrl/distributed/thread_communicator.hpp>

#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(HYBRIDRL_TEST_GLOO) && HYBRIDRL_TEST_GLOO && HYBRIDRL_HAS_GLOO  // set by tests/CMakeLists.txt
#define HYBRIDRL_TEST_HAS_GLOO 1
#else
#define HYBRIDRL_TEST_HAS_GLOO 0
#endif

namespace hybridrl::testing {

/// Calls fn(comm) on `world` threads, each a C10dCommunicator (Gloo on 127.0.0.1) of one group
/// over a HashStore; rethrows the first exception. A rank that throws leaves the others waiting
/// until the 30 s collective timeout.
inline void run_gloo_ranks(int world, const std::function<void(Communicator&)>& fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::exception_ptr error;
  std::mutex error_mutex;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        C10dCommunicator comm(store, rank, world,
                              C10dOptions().backend("gloo").gloo_hostname("127.0.0.1").timeout_s(30));
        fn(comm);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

/// The backends every Communicator test runs on: "thread" always, "gloo" where available.
inline std::vector<std::string> backends() {
#if HYBRIDRL_TEST_HAS_GLOO
  return {"thread", "gloo"};
#else
  return {"thread"};
#endif
}

/// run_ranks over `backend` ("thread" or "gloo").
inline void run_on(const std::string& backend, int world, const std::function<void(Communicator&)>& fn) {
  if (backend == "gloo") {
    run_gloo_ranks(world, fn);
  } else {
    run_ranks(world, fn);
  }
}

}  // namespace hybridrl::testing
