// all_gather of a TensorBatch over Gloo process groups on threads (2 and 3 ranks, uneven sizes).

#include "../support/gloo.hpp"

#include <hybridrl/core/collective.hpp>

#include <string>
#include <vector>
#include <doctest/doctest.h>  // last: c10 defines a CHECK macro of its own

using hybridrl::Column;
using hybridrl::Error;
using hybridrl::TensorBatch;

namespace {
// Rank r holds r+1 samples: x = 100*r + i (bfloat16 and bool too), id = "r<rank>-<i>".
TensorBatch rank_batch(int rank) {
  const int64_t n = rank + 1;
  auto x = at::arange(n, at::kLong) + 100 * rank;
  Column id;
  for (int64_t i = 0; i < n; ++i) id.push_back("r" + std::to_string(rank) + "-" + std::to_string(i));
  return TensorBatch({{"x", x}, {"h", x.to(at::kBFloat16).unsqueeze(1).repeat({1, 2})}, {"flag", x.remainder(2).to(at::kBool)}},
                     {{"id", id}}, {{"rank", rank}});
}
}  // namespace

TEST_SUITE("core/collective") {
  TEST_CASE("all_gather concatenates uneven batches in rank order on every rank") {
    constexpr int world = 3;
    std::vector<TensorBatch> results(world);
    hybridrl::testing::run_ranks(world, [&](int rank, hybridrl::testing::TestGroup& group) {
      results[static_cast<size_t>(rank)] = hybridrl::all_gather(rank_batch(rank), group);
    });
    const std::vector<int64_t> expected_x{0, 100, 101, 200, 201, 202};
    for (int r = 0; r < world; ++r) {
      const auto& b = results[static_cast<size_t>(r)];
      REQUIRE(b.size() == 6);
      auto x = b.tensor("x");
      CHECK((x.scalar_type() == at::kLong));
      CHECK(std::vector<int64_t>(x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + 6) == expected_x);
      CHECK((b.tensor("h").scalar_type() == at::kBFloat16));
      CHECK(b.tensor("h").select(1, 1).to(at::kLong).equal(x));
      CHECK((b.tensor("flag").scalar_type() == at::kBool));
      CHECK(b.tensor("flag").equal(x.remainder(2).to(at::kBool)));
      CHECK(b.column("id")[3].get<std::string>() == "r2-0");
      CHECK(b.meta()["rank"] == r);  // metadata stays local
    }
  }

  TEST_CASE("a rank with no samples still takes part") {
    std::vector<TensorBatch> results(2);
    hybridrl::testing::run_ranks(2, [&](int rank, hybridrl::testing::TestGroup& group) {
      auto b = rank_batch(1);
      if (rank == 0) b = b.slice(0, 0);
      results[static_cast<size_t>(rank)] = hybridrl::all_gather(b, group);
    });
    CHECK(results[0].size() == 2);
    CHECK(results[1].tensor("x").equal(at::tensor(std::vector<int64_t>{100, 101})));
  }

  TEST_CASE("mismatched schemas fail on every rank with the same error, without hanging") {
    std::vector<std::string> errors(2);
    hybridrl::testing::run_ranks(2, [&](int rank, hybridrl::testing::TestGroup& group) {
      auto b = rank_batch(rank);
      if (rank == 1) b.set("x", b.tensor("x").to(at::kFloat));
      try {
        (void)hybridrl::all_gather(b, group);
      } catch (const Error& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
    for (const auto& e : errors) {
      CHECK(e.find("rank 1's tensors") != std::string::npos);
      CHECK(e.find("Float") != std::string::npos);
    }
  }
}

#if defined(HYBRIDRL_WITH_NCCL) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>)
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/cuda.h>

#include <thread>

TEST_SUITE("core/collective") {
  TEST_CASE("all_gather over NCCL: one rank per CUDA device, tensors stay on the GPU") {
    const int world = static_cast<int>(torch::cuda::device_count());
    if (world == 0) {
      MESSAGE("CUDA build without a CUDA device: the NCCL all_gather runs on GPU machines");
      return;
    }
    auto store = c10::make_intrusive<c10d::HashStore>();
    std::vector<TensorBatch> results(static_cast<size_t>(world));
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world; ++rank) {
      threads.emplace_back([&, rank] {
        c10d::ProcessGroupNCCL group(store, rank, world);
        auto b = rank_batch(rank).to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(rank)));
        results[static_cast<size_t>(rank)] = hybridrl::all_gather(b, group);
      });
    }
    for (auto& t : threads) t.join();
    int64_t expected = 0;
    for (int r = 0; r < world; ++r) expected += r + 1;
    for (int r = 0; r < world; ++r) {
      const auto& b = results[static_cast<size_t>(r)];
      CHECK(b.size() == expected);
      CHECK(b.tensor("x").is_cuda());
      CHECK((b.tensor("h").scalar_type() == at::kBFloat16));
      CHECK(b.tensor("h").select(1, 0).to(at::kLong).equal(b.tensor("x")));
      CHECK(b.tensor("flag").cpu().equal(b.tensor("x").cpu().remainder(2).to(at::kBool)));
      CHECK(b.column("id")[0].get<std::string>() == "r0-0");
    }
  }
}
#endif
