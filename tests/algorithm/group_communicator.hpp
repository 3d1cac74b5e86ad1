#pragma once
// Test support for the algorithm tests: hybridrl::Communicator over the test process group of
// tests/support/gloo.hpp (Gloo where LibTorch ships it, else the in-process thread group).
// Implements the collectives the algorithm code calls (all_reduce: sum, avg, max, min); the
// others throw, so a test that reaches them fails loudly.
#include <hybridrl/core/error.hpp>
#include <hybridrl/distributed/communicator.hpp>

#include "../support/gloo.hpp"

#include <memory>
#include <string>
#include <vector>

namespace hybridrl::testing {

class GroupCommunicator final : public Communicator {
 public:
  explicit GroupCommunicator(TestGroup& group) : group_(group) {}
  [[nodiscard]] int rank() const override { return group_.getRank(); }
  [[nodiscard]] int size() const override { return group_.getSize(); }
  [[nodiscard]] std::string backend() const override { return "test-group"; }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    auto flat = t.contiguous().reshape({-1});
    if (op == ReduceOp::sum || op == ReduceOp::avg) {
      std::vector<at::Tensor> v{flat};
      group_.allreduce(v)->wait();
      if (op == ReduceOp::avg) flat.div_(size());
    } else {  // max / min through an all-gather (the thread group only sums)
      std::vector<at::Tensor> in{flat};
      std::vector<std::vector<at::Tensor>> out(1);
      for (int r = 0; r < size(); ++r) out[0].push_back(at::empty_like(flat));
      group_.allgather(out, in)->wait();
      auto all = at::stack(out[0]);
      flat.copy_(op == ReduceOp::max ? std::get<0>(all.max(0)) : std::get<0>(all.min(0)));
    }
    t.copy_(flat.reshape(t.sizes()));
  }
  void all_gather_into(at::Tensor&, const at::Tensor&) override { unused("all_gather_into"); }
  void reduce_scatter(at::Tensor&, const at::Tensor&, ReduceOp) override { unused("reduce_scatter"); }
  void broadcast(at::Tensor&, int) override { unused("broadcast"); }
  void barrier() override { unused("barrier"); }
  void send(const at::Tensor&, int, int) override { unused("send"); }
  void recv(at::Tensor&, int, int) override { unused("recv"); }
  std::shared_ptr<Communicator> split(const std::vector<int>&) override {
    unused("split");
    return nullptr;
  }

 private:
  [[noreturn]] static void unused(const char* what) {
    throw Error(std::string("GroupCommunicator::") + what + " is not implemented",
                "use the library's ThreadCommunicator for tests that need it");
  }
  TestGroup& group_;
};

}  // namespace hybridrl::testing
