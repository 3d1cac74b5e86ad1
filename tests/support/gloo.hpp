#pragma once
// Test support: run a function on `world` ranks as threads of this process, each with a process
// group.
//
// TestGroup is c10d::ProcessGroupGloo over an in-process HashStore wherever LibTorch ships the
// gloo headers it was built with (Debian's LibTorch 1.13 does; CMake checks and sets
// HYBRIDRL_TEST_GLOO). The pip wheels of LibTorch 2.x ship none, so there
// TestGroup is ThreadGroup: an in-process group with the same allgather/allreduce calls, so the
// collective logic is still exercised (the real NCCL path is tested in core/collective_test.cpp
// on CUDA machines).
#include <hybridrl/detail/compat.hpp>  // first: defines USE_C10D_GLOO on LibTorch 2.x

#include <ATen/ATen.h>

#include <barrier>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(HYBRIDRL_TEST_GLOO) && HYBRIDRL_TEST_GLOO  // set by tests/CMakeLists.txt
#define HYBRIDRL_TEST_HAS_GLOO 1
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#else
#define HYBRIDRL_TEST_HAS_GLOO 0
#endif

namespace hybridrl::testing {

/// An in-process group of `world` threads with c10d's allgather/allreduce(SUM) call shapes.
class ThreadGroup {
 public:
  struct Shared {
    explicit Shared(int world) : world(world), barrier(world), slots(static_cast<size_t>(world)) {}
    int world;
    std::barrier<> barrier;
    std::vector<std::vector<at::Tensor>> slots;
  };
  /// Completed work: every call is synchronous, wait() returns at once.
  struct Done {
    bool wait() { return true; }
  };

  ThreadGroup(std::shared_ptr<Shared> shared, int rank) : shared_(std::move(shared)), rank_(rank) {}
  int getRank() const { return rank_; }
  int getSize() const { return shared_->world; }

  std::unique_ptr<Done> allgather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in) {
    publish(in);
    for (size_t i = 0; i < in.size(); ++i) {
      for (int r = 0; r < getSize(); ++r) out[i][static_cast<size_t>(r)].copy_(shared_->slots[static_cast<size_t>(r)][i]);
    }
    shared_->barrier.arrive_and_wait();
    return std::make_unique<Done>();
  }

  std::unique_ptr<Done> allreduce(std::vector<at::Tensor>& tensors) {
    publish(tensors);
    std::vector<at::Tensor> sums;
    for (size_t i = 0; i < tensors.size(); ++i) {
      auto s = at::zeros_like(tensors[i]);
      for (int r = 0; r < getSize(); ++r) s += shared_->slots[static_cast<size_t>(r)][i];
      sums.push_back(s);
    }
    shared_->barrier.arrive_and_wait();  // everyone has read the slots
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(sums[i]);
    return std::make_unique<Done>();
  }

 private:
  void publish(const std::vector<at::Tensor>& in) {
    std::vector<at::Tensor> mine;
    for (const auto& t : in) mine.push_back(t.clone());
    shared_->slots[static_cast<size_t>(rank_)] = std::move(mine);
    shared_->barrier.arrive_and_wait();  // everyone has published
  }

  std::shared_ptr<Shared> shared_;
  int rank_;
};

#if HYBRIDRL_TEST_HAS_GLOO
using TestGroup = c10d::ProcessGroupGloo;
#else
using TestGroup = ThreadGroup;
#endif

/// Calls fn(rank, group) on `world` threads; rethrows the first exception any rank threw.
inline void run_ranks(int world, const std::function<void(int, TestGroup&)>& fn) {
#if HYBRIDRL_TEST_HAS_GLOO
  auto store = c10::make_intrusive<c10d::HashStore>();
#else
  auto shared = std::make_shared<ThreadGroup::Shared>(world);
#endif
  std::exception_ptr error;
  std::mutex error_mutex;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
#if HYBRIDRL_TEST_HAS_GLOO
        auto opts = c10d::ProcessGroupGloo::Options::create();
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        c10d::ProcessGroupGloo group(store, rank, world, opts);
#else
        ThreadGroup group(shared, rank);
#endif
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
