// all_gather / broadcast of a TensorBatch through a Communicator: threads and Gloo (2 and 3
// ranks, uneven sizes, bool and bf16 tensors, columns), and every rank throwing together on bad
// input (audit B.6: invalid UTF-8 in a column, differing column names, differing schemas).

#include "../support/gloo.hpp"

#include <hybridrl/distributed/batch_collectives.hpp>
#include <fmt/format.h>

#include <string>
#include <vector>
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using hybridrl::Column;
using hybridrl::Communicator;
using hybridrl::Error;
using hybridrl::TensorBatch;

namespace {
// Rank r holds r+1 samples: x = 100*r + i (bfloat16 and bool too), id = "r<rank>-<i>".
TensorBatch rank_batch(int rank) {
  const int64_t n = rank + 1;
  auto x = at::arange(n, at::kLong) + 100 * rank;
  Column id;
  for (int64_t i = 0; i < n; ++i) id.push_back(fmt::format("r{}-{}", rank, i));
  return TensorBatch({{"x", x}, {"h", x.to(at::kBFloat16).unsqueeze(1).repeat({1, 2})}, {"flag", x.remainder(2).to(at::kBool)}},
                     {{"id", id}}, {{"rank", rank}});
}

// Runs fn on every rank and returns each rank's Error problem ("" if none was thrown).
std::vector<std::string> errors_of(const std::string& backend, int world,
                                   const std::function<void(Communicator&)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  hybridrl::testing::run_on(backend, world, [&](Communicator& comm) {
    try {
      fn(comm);
    } catch (const Error& e) {
      errors[static_cast<size_t>(comm.rank())] = e.problem();
    }
  });
  return errors;
}
}  // namespace

TEST_SUITE("distributed/batch_collectives") {
  TEST_CASE("all_gather concatenates uneven batches in rank order on every rank") {
    for (const auto& backend : hybridrl::testing::backends()) {
      CAPTURE(backend);
      constexpr int world = 3;
      std::vector<TensorBatch> results(world);
      hybridrl::testing::run_on(backend, world, [&](Communicator& comm) {
        results[static_cast<size_t>(comm.rank())] = hybridrl::all_gather(rank_batch(comm.rank()), comm);
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
  }

  TEST_CASE("a rank with no samples still takes part") {
    for (const auto& backend : hybridrl::testing::backends()) {
      CAPTURE(backend);
      std::vector<TensorBatch> results(2);
      hybridrl::testing::run_on(backend, 2, [&](Communicator& comm) {
        auto b = rank_batch(1);
        if (comm.rank() == 0) b = b.slice(0, 0);
        results[static_cast<size_t>(comm.rank())] = hybridrl::all_gather(b, comm);
      });
      CHECK(results[0].size() == 2);
      CHECK(results[1].tensor("x").equal(at::tensor(std::vector<int64_t>{100, 101})));
    }
  }

  TEST_CASE("mismatched schemas fail on every rank with the same error, without hanging") {
    for (const auto& backend : hybridrl::testing::backends()) {
      CAPTURE(backend);
      auto errors = errors_of(backend, 2, [](Communicator& comm) {
        auto b = rank_batch(comm.rank());
        if (comm.rank() == 1) b.set("x", b.tensor("x").to(at::kFloat));
        (void)hybridrl::all_gather(b, comm);
      });
      for (const auto& e : errors) {
        CHECK(e.find("rank 1's tensors") != std::string::npos);
        CHECK(e.find("Float") != std::string::npos);
      }
    }
  }

  TEST_CASE("a column of invalid UTF-8 on one rank makes every rank throw (no hang)") {
    for (const auto& backend : hybridrl::testing::backends()) {
      CAPTURE(backend);
      auto errors = errors_of(backend, 3, [](Communicator& comm) {
        auto b = rank_batch(comm.rank());
        if (comm.rank() == 2) {
          Column bad(3, "ok");
          bad[1] = std::string("cut mid-character \xE2\x82");  // first 2 bytes of the euro sign
          b.set_column("id", bad);
        }
        (void)hybridrl::all_gather(b, comm);
      });
      for (const auto& e : errors) {
        CHECK(e.find("all_gather: the non-tensor columns of rank(s) 2 cannot be serialized") == 0);
      }
      CHECK(errors[2].find("UTF-8 string") != std::string::npos);  // the failing rank says why (nlohmann)
    }
  }

  TEST_CASE("a NaN in a column on one rank makes every rank throw (JSON would deliver null)") {
    for (const auto& backend : hybridrl::testing::backends()) {
      CAPTURE(backend);
      auto errors = errors_of(backend, 2, [](Communicator& comm) {
        auto b = rank_batch(comm.rank());
        if (comm.rank() == 1) {
          Column scores(2, 1.5);  // rank 1 holds 2 rows
          scores[1] = nlohmann::json::array({1.0, std::nan("")});  // nested, too
          b.set_column("id", scores);
        }
        (void)hybridrl::all_gather(b, comm);
      });
      for (const auto& e : errors) CHECK(e.find("all_gather: the non-tensor columns of rank(s) 1 cannot be serialized") == 0);
      CHECK(errors[1].find("column 'id' row 1 holds a NaN or infinite number") != std::string::npos);
    }
  }

  TEST_CASE("the same number of columns under different names is a clear error on every rank") {
    for (const auto& backend : hybridrl::testing::backends()) {
      CAPTURE(backend);
      auto errors = errors_of(backend, 2, [](Communicator& comm) {
        auto b = rank_batch(comm.rank());
        if (comm.rank() == 1) {
          b.set_column("uid", b.column("id"));
          b = b.select({"x", "h", "flag"}, {"uid"});
        }
        (void)hybridrl::all_gather(b, comm);
      });
      for (const auto& e : errors) {
        CHECK(e == "all_gather: rank 1's non-tensor columns [uid] differ from rank 0's [id]");
      }
    }
  }

  TEST_CASE("broadcast gives every rank the root's batch") {
    for (const auto& backend : hybridrl::testing::backends()) {
      CAPTURE(backend);
      std::vector<TensorBatch> results(3);
      hybridrl::testing::run_on(backend, 3, [&](Communicator& comm) {
        auto b = comm.rank() == 2 ? rank_batch(2) : TensorBatch();
        results[static_cast<size_t>(comm.rank())] = hybridrl::broadcast(b, comm, 2);
      });
      for (const auto& b : results) {
        REQUIRE(b.size() == 3);
        CHECK(b.tensor("x").equal(at::tensor(std::vector<int64_t>{200, 201, 202})));
        CHECK((b.tensor("h").scalar_type() == at::kBFloat16));
        CHECK(b.tensor("h").select(1, 0).to(at::kLong).equal(b.tensor("x")));
        CHECK(b.tensor("flag").equal(at::tensor(std::vector<int64_t>{0, 1, 0}).to(at::kBool)));
        CHECK(b.column("id")[2].get<std::string>() == "r2-2");
      }
    }
  }
}

#if defined(HYBRIDRL_WITH_NCCL) && HYBRIDRL_HAS_NCCL
#include <torch/cuda.h>

#include <thread>

TEST_SUITE("distributed/batch_collectives") {
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
        hybridrl::C10dCommunicator comm(store, rank, world, hybridrl::C10dOptions().backend("nccl"));
        auto b = rank_batch(rank).to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(rank)));
        results[static_cast<size_t>(rank)] = hybridrl::all_gather(b, comm);
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
