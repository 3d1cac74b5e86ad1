#pragma once
// Test support for the model's tensor-parallel tests: a small in-process Communicator (ranks as
// threads; all_reduce sum/avg/max/min, all_gather, reduce_scatter, broadcast, barrier) and
// run_model_ranks() to run a function on every rank. Every rank combines the slots in rank order,
// so all ranks get bit-identical results. A collective that some rank never joins times out with
// an exception instead of hanging the test. Stand-in until the library's ThreadCommunicator lands.
#include <hybridrl/distributed/communicator.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace hybridrl::testing {

/// One rank of an in-process group of `size` threads.
class ModelTestCommunicator : public Communicator {
 public:
  /// State shared by the ranks of one group.
  struct Shared {
    explicit Shared(int world) : world(world), slots(static_cast<size_t>(world)) {}
    int world;
    std::mutex mu;
    std::condition_variable cv;
    int arrived = 0;
    long generation = 0;
    std::vector<at::Tensor> slots;
  };

  ModelTestCommunicator(std::shared_ptr<Shared> shared, int rank) : s_(std::move(shared)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return s_->world; }
  std::string backend() const override { return "model-test-thread"; }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    deposit(t);
    auto r = s_->slots[0].clone();
    for (int i = 1; i < s_->world; ++i) {
      const auto& x = s_->slots[static_cast<size_t>(i)];
      if (op == ReduceOp::max) r = at::maximum(r, x);
      else if (op == ReduceOp::min) r = at::minimum(r, x);
      else r = r + x;
    }
    if (op == ReduceOp::avg) r = r / s_->world;
    sync();
    t.copy_(r);
  }
  void all_gather_into(at::Tensor& out, const at::Tensor& in) override {
    deposit(in);
    auto r = at::cat(s_->slots, 0);
    sync();
    out.copy_(r);
  }
  void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    auto full = in.clone();
    all_reduce(full, op);
    out.copy_(full.narrow(0, rank_ * out.size(0), out.size(0)));
  }
  void broadcast(at::Tensor& t, int root) override {
    deposit(t);
    auto r = s_->slots[static_cast<size_t>(root)].clone();
    sync();
    t.copy_(r);
  }
  void barrier() override { sync(); }
  void send(const at::Tensor&, int, int) override { throw std::logic_error("ModelTestCommunicator: no send"); }
  void recv(at::Tensor&, int, int) override { throw std::logic_error("ModelTestCommunicator: no recv"); }
  std::shared_ptr<Communicator> split(const std::vector<int>&) override {
    throw std::logic_error("ModelTestCommunicator: no split");
  }

 private:
  void deposit(const at::Tensor& t) {
    s_->slots[static_cast<size_t>(rank_)] = t.detach().clone();
    sync();
  }
  void sync() {
    std::unique_lock<std::mutex> lock(s_->mu);
    const auto gen = s_->generation;
    if (++s_->arrived == s_->world) {
      s_->arrived = 0;
      ++s_->generation;
      s_->cv.notify_all();
      return;
    }
    if (!s_->cv.wait_for(lock, std::chrono::seconds(60), [&] { return s_->generation != gen; })) {
      throw std::runtime_error("ModelTestCommunicator: a collective timed out (ranks called different collectives)");
    }
  }

  std::shared_ptr<Shared> s_;
  int rank_;
};

/// Runs `fn(rank, comm)` on `world` threads, one communicator each; rethrows the first exception.
inline void run_model_ranks(int world, const std::function<void(int, Communicator&)>& fn) {
  auto shared = std::make_shared<ModelTestCommunicator::Shared>(world);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        ModelTestCommunicator comm(shared, r);
        fn(r, comm);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace hybridrl::testing
