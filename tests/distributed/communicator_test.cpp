// Every Communicator collective on ThreadCommunicator and (where the gloo headers ship) on c10d
// Gloo, worlds 1-4: the same expected values, computed here with scalar loops. Then split,
// DeviceMesh coordinates by hand, and the failure modes of the thread communicator.

#include "../support/gloo.hpp"

#include <hybridrl/distributed/device_mesh.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using hybridrl::Communicator;
using hybridrl::DeviceMesh;
using hybridrl::Error;
using hybridrl::MeshAxis;
using hybridrl::MeshShape;
using hybridrl::ReduceOp;

namespace {
std::vector<double> values(const at::Tensor& t) {
  auto c = t.to(at::kDouble).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}
at::Tensor doubles(std::vector<double> v) { return at::tensor(v, at::kDouble); }
}  // namespace

TEST_SUITE("distributed/communicator") {
  TEST_CASE("all_reduce sum / avg / max / min, in every dtype, on every backend and world") {
    for (const auto& backend : hybridrl::testing::backends()) {
      for (int world = 1; world <= 4; ++world) {
        CAPTURE(backend);
        CAPTURE(world);
        double sum = 0;  // of r + 1
        for (int r = 0; r < world; ++r) sum += r + 1;
        std::vector<std::vector<std::vector<double>>> got(static_cast<size_t>(world));
        hybridrl::testing::run_on(backend, world, [&](Communicator& comm) {
          const double v = comm.rank() + 1;
          auto& out = got[static_cast<size_t>(comm.rank())];
          for (auto op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
            auto t = doubles({v, -v});
            comm.all_reduce(t, op);
            out.push_back(values(t));
          }
          auto i = at::tensor(std::vector<int64_t>{static_cast<int64_t>(v) * 1000000007LL});
          comm.all_reduce(i);
          out.push_back(values(i));
          auto h = doubles({v, 0.5}).to(at::kBFloat16);  // small integers and halves: exact
          comm.all_reduce(h);
          CHECK((h.scalar_type() == at::kBFloat16));
          out.push_back(values(h));
          auto b = at::tensor(std::vector<int64_t>{comm.rank() == 0, 0}).to(at::kBool);
          comm.all_reduce(b, ReduceOp::max);
          CHECK((b.scalar_type() == at::kBool));
          out.push_back(values(b));
        });
        for (const auto& o : got) {
          CHECK(o[0] == std::vector<double>{sum, -sum});
          CHECK(o[1] == std::vector<double>{sum / world, -sum / world});
          CHECK(o[2] == std::vector<double>{double(world), -1.0});
          CHECK(o[3] == std::vector<double>{1.0, -double(world)});
          CHECK(o[4] == std::vector<double>{sum * 1000000007.0});
          CHECK(o[5] == std::vector<double>{sum, 0.5 * world});
          CHECK(o[6] == std::vector<double>{1.0, 0.0});
        }
      }
    }
  }

  TEST_CASE("all_gather_into, reduce_scatter and broadcast on every backend and world") {
    for (const auto& backend : hybridrl::testing::backends()) {
      for (int world = 1; world <= 4; ++world) {
        CAPTURE(backend);
        CAPTURE(world);
        std::vector<std::vector<double>> gathered(static_cast<size_t>(world)),
            scattered(static_cast<size_t>(world)), broadcast(static_cast<size_t>(world)),
            flags(static_cast<size_t>(world));
        hybridrl::testing::run_on(backend, world, [&](Communicator& comm) {
          const int r = comm.rank();
          const auto idx = static_cast<size_t>(r);
          // rank r: rows [100r, 100r + 1], each row (x, x + 0.5)
          auto in = doubles({100.0 * r, 100.0 * r + 0.5, 100.0 * r + 1, 100.0 * r + 1.5}).reshape({2, 2});
          auto out = at::empty({2 * world, 2}, at::kDouble);
          comm.all_gather_into(out, in);
          gathered[idx] = values(out);
          // bool travels too
          auto flag = at::tensor(std::vector<int64_t>{r % 2}).to(at::kBool);
          auto all_flags = at::empty({world}, at::kBool);
          comm.all_gather_into(all_flags, flag);
          flags[idx] = values(all_flags);
          // reduce_scatter: rank q contributes row i = 1000q + i, rows 0 .. 2*world - 1
          auto rs_in = (at::arange(2 * world, at::kDouble) + 1000.0 * r).reshape({2 * world, 1});
          auto rs_out = at::empty({2, 1}, at::kDouble);
          comm.reduce_scatter(rs_out, rs_in);
          scattered[idx] = values(rs_out);
          auto b = doubles({double(r), 7.0 * r});
          comm.broadcast(b, world - 1);
          broadcast[idx] = values(b);
        });
        std::vector<double> want_gather, want_flags;
        for (int q = 0; q < world; ++q) {
          for (double x : {100.0 * q, 100.0 * q + 1}) {
            want_gather.push_back(x);
            want_gather.push_back(x + 0.5);
          }
          want_flags.push_back(q % 2);
        }
        for (int r = 0; r < world; ++r) {
          std::vector<double> want_rs(2, 0.0);
          for (int j = 0; j < 2; ++j) {
            for (int q = 0; q < world; ++q) want_rs[static_cast<size_t>(j)] += 1000.0 * q + (2 * r + j);
          }
          CHECK(gathered[static_cast<size_t>(r)] == want_gather);
          CHECK(flags[static_cast<size_t>(r)] == want_flags);
          CHECK(scattered[static_cast<size_t>(r)] == want_rs);
          CHECK(broadcast[static_cast<size_t>(r)] == std::vector<double>{world - 1.0, 7.0 * (world - 1)});
        }
      }
    }
  }

  TEST_CASE("barrier waits for every rank; send/recv pass a ring") {
    for (const auto& backend : hybridrl::testing::backends()) {
      for (int world = 1; world <= 4; ++world) {
        CAPTURE(backend);
        CAPTURE(world);
        std::atomic<int> arrived{0};
        std::vector<int> seen_after_barrier(static_cast<size_t>(world));
        std::vector<std::vector<double>> received(static_cast<size_t>(world));
        hybridrl::testing::run_on(backend, world, [&](Communicator& comm) {
          const int r = comm.rank();
          if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // arrives last
          ++arrived;
          comm.barrier();
          seen_after_barrier[static_cast<size_t>(r)] = arrived.load();
          if (world == 1) return;
          const int next = (r + 1) % world, prev = (r + world - 1) % world;
          auto mine = doubles({double(r), r + 0.25});
          auto got = at::empty({2}, at::kDouble);
          if (r % 2 == 0) {  // even ranks send first, odd ranks receive first: no cycle of sends
            comm.send(mine, next, 3);
            comm.recv(got, prev, 3);
          } else {
            comm.recv(got, prev, 3);
            comm.send(mine, next, 3);
          }
          received[static_cast<size_t>(r)] = values(got);
        });
        for (int r = 0; r < world; ++r) {
          CHECK(seen_after_barrier[static_cast<size_t>(r)] == world);
          if (world > 1) {
            const int prev = (r + world - 1) % world;
            CHECK(received[static_cast<size_t>(r)] == std::vector<double>{double(prev), prev + 0.25});
          }
        }
      }
    }
  }

  TEST_CASE("split: members get a group of their own with renumbered ranks, others nullptr") {
    for (const auto& backend : hybridrl::testing::backends()) {
      CAPTURE(backend);
      constexpr int world = 4;
      std::vector<int> sub_rank(world, -2), sub_size(world, -2);
      std::vector<double> sub_sum(world, -1), nested_sum(world, -1);
      hybridrl::testing::run_on(backend, world, [&](Communicator& comm) {
        const auto idx = static_cast<size_t>(comm.rank());
        auto odd = comm.split({1, 3});
        auto first3 = comm.split({0, 1, 2});
        if (odd) {
          sub_rank[idx] = odd->rank();
          sub_size[idx] = odd->size();
          auto t = doubles({double(comm.rank())});
          odd->all_reduce(t);
          sub_sum[idx] = values(t)[0];
        } else {
          sub_rank[idx] = -1;
        }
        if (first3) {
          auto pair = first3->split({1, 2});  // world ranks 1 and 2
          if (pair) {
            auto t = doubles({10.0 * comm.rank()});
            pair->all_reduce(t);
            nested_sum[idx] = values(t)[0];
          }
        }
      });
      CHECK(sub_rank == std::vector<int>{-1, 0, -1, 1});
      CHECK(sub_size[1] == 2);
      CHECK(sub_size[3] == 2);
      CHECK(sub_sum[1] == 4.0);  // 1 + 3
      CHECK(sub_sum[3] == 4.0);
      CHECK(nested_sum == std::vector<double>{-1, 30, 30, -1});  // 10 + 20 on world ranks 1, 2
    }
  }

  TEST_CASE("all_reduce_mean: mean over ranks, a copy with no communicator") {
    auto t = doubles({3.0});
    auto alone = hybridrl::all_reduce_mean(nullptr, t);
    CHECK(values(alone) == std::vector<double>{3.0});
    alone.add_(1.0);
    CHECK(values(t) == std::vector<double>{3.0});  // a copy, not an alias
    for (const auto& backend : hybridrl::testing::backends()) {
      std::vector<double> means(3);
      hybridrl::testing::run_on(backend, 3, [&](Communicator& comm) {
        auto mine = doubles({comm.rank() * 1.5}).reshape({});  // 0, 1.5, 3 -> 1.5
        means[static_cast<size_t>(comm.rank())] = hybridrl::all_reduce_mean(&comm, mine).item<double>();
      });
      CHECK(means == std::vector<double>{1.5, 1.5, 1.5});
    }
  }
}

TEST_SUITE("distributed/thread_communicator") {
  TEST_CASE("ranks that disagree on a shape all throw the same error") {
    std::vector<std::string> errors(2);
    hybridrl::run_ranks(2, [&](Communicator& comm) {
      auto t = at::zeros({comm.rank() + 1}, at::kDouble);
      try {
        comm.all_reduce(t);
      } catch (const Error& e) {
        errors[static_cast<size_t>(comm.rank())] = e.problem();
      }
      comm.barrier();  // still in step afterwards
    });
    CHECK(errors[0] == "all_reduce: rank 1 gave Double 2, rank 0 gave Double 1");
    CHECK(errors[1] == errors[0]);
  }

  TEST_CASE("run_ranks rethrows the first rank's exception and wakes the waiting ranks") {
    std::vector<std::string> others(3);
    CHECK_THROWS_WITH(hybridrl::run_ranks(3, [&](Communicator& comm) {
                        if (comm.rank() == 1) throw std::runtime_error("boom on rank 1");
                        auto t = at::zeros({1});
                        try {
                          comm.all_reduce(t);
                        } catch (const Error& e) {
                          others[static_cast<size_t>(comm.rank())] = e.problem();
                          throw;
                        }
                      }),
                      "boom on rank 1");
    CHECK(others[0] == "all_reduce on rank 0: another rank failed");
    CHECK(others[2] == "all_reduce on rank 2: another rank failed");
  }

  TEST_CASE("a rank that skips a collective makes the others time out with an Error") {
    std::string error;
    hybridrl::run_ranks(
        2,
        [&](Communicator& comm) {
          if (comm.rank() == 1) return;
          try {
            comm.barrier();
          } catch (const Error& e) {
            error = e.problem();
          }
        },
        std::chrono::milliseconds(100));
    CHECK(error == "barrier on rank 0: the other ranks did not join within 100 ms");
  }

  TEST_CASE("split lists must agree and be ascending ranks of the group") {
    CHECK_THROWS_WITH(hybridrl::run_ranks(2, [](Communicator& comm) { (void)comm.split({1, 0}); }),
                      doctest::Contains("split: ranks [1, 0] must be a non-empty ascending list"));
    CHECK_THROWS_WITH(hybridrl::run_ranks(2, [](Communicator& comm) {
                        (void)comm.split(comm.rank() == 0 ? std::vector<int>{0} : std::vector<int>{1});
                      }),
                      doctest::Contains("split: the ranks gave different lists"));
  }
}

TEST_SUITE("distributed/device_mesh") {
  TEST_CASE("coordinates and groups of a 2 x 2 x 2 mesh, by hand") {
    const MeshShape shape{2, 2, 2};  // rank = (pipeline * 2 + data) * 2 + tensor
    CHECK(DeviceMesh::coordinates(shape, 0) == hybridrl::MeshCoordinates{0, 0, 0});
    CHECK(DeviceMesh::coordinates(shape, 1) == hybridrl::MeshCoordinates{0, 1, 0});
    CHECK(DeviceMesh::coordinates(shape, 2) == hybridrl::MeshCoordinates{1, 0, 0});
    CHECK(DeviceMesh::coordinates(shape, 5) == hybridrl::MeshCoordinates{0, 1, 1});
    CHECK(DeviceMesh::coordinates(shape, 7) == hybridrl::MeshCoordinates{1, 1, 1});
    for (int r = 0; r < 8; ++r) CHECK(DeviceMesh::rank_of(shape, DeviceMesh::coordinates(shape, r)) == r);
    CHECK(DeviceMesh::group_ranks(shape, MeshAxis::tensor, 5) == std::vector<int>{4, 5});
    CHECK(DeviceMesh::group_ranks(shape, MeshAxis::data, 5) == std::vector<int>{5, 7});
    CHECK(DeviceMesh::group_ranks(shape, MeshAxis::pipeline, 5) == std::vector<int>{1, 5});
    CHECK(DeviceMesh::all_groups(shape, MeshAxis::data) ==
          std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  }

  TEST_CASE("sizes that do not multiply to the world are an Error") {
    const MeshShape six{3, 2, 1}, odd{-1, 3, 1};
    CHECK_THROWS_WITH((void)six.resolved(8),
                      doctest::Contains("mesh data = 3 x tensor = 2 x pipeline = 1 = 6 ranks, but the world has 8"));
    CHECK_THROWS_WITH((void)odd.resolved(8),
                      doctest::Contains("the world of 8 ranks does not divide into tensor = 3"));
    CHECK(MeshShape{-1, 2, 2}.resolved(8).data == 2);
  }

  TEST_CASE("sub-communicators of a data 2 x tensor 2 mesh reduce over the right ranks") {
    for (const auto& backend : hybridrl::testing::backends()) {
      CAPTURE(backend);
      std::vector<double> data_sum(4), tensor_sum(4);
      std::vector<int> pipeline_size(4), tensor_rank(4);
      hybridrl::testing::run_on(backend, 4, [&](Communicator& comm) {
        // a non-owning pointer: the mesh must not outlive comm (it does not here)
        DeviceMesh mesh(std::shared_ptr<Communicator>(&comm, [](Communicator*) {}), MeshShape{-1, 2, 1});
        const auto idx = static_cast<size_t>(comm.rank());
        auto t = doubles({double(comm.rank())});
        mesh.data().all_reduce(t);
        data_sum[idx] = values(t)[0];
        auto u = doubles({double(comm.rank())});
        mesh.tensor().all_reduce(u);
        tensor_sum[idx] = values(u)[0];
        pipeline_size[idx] = mesh.pipeline().size();
        tensor_rank[idx] = mesh.tensor().rank();
      });
      CHECK(data_sum == std::vector<double>{2, 4, 2, 4});      // groups {0, 2}, {1, 3}
      CHECK(tensor_sum == std::vector<double>{1, 1, 5, 5});    // groups {0, 1}, {2, 3}
      CHECK(pipeline_size == std::vector<int>{1, 1, 1, 1});
      CHECK(tensor_rank == std::vector<int>{0, 1, 0, 1});
    }
  }
}

#if HYBRIDRL_TEST_HAS_GLOO
TEST_SUITE("distributed/communicator") {
  TEST_CASE("Gloo: a rank that stalls or dies is named by every rank that waited for it, within the timeout") {
    // 3 ranks, timeout 1 s: rank 2 stalls (sleeps past the timeout) before its second collective;
    // ranks 0 and 1 wait in it, fail, report, and name rank 2 (not each other)
    auto store = c10::make_intrusive<c10d::HashStore>();
    std::vector<std::string> errors(3);
    std::vector<double> seconds(3, 0.0);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 3; ++rank) {
      threads.emplace_back([&, rank] {
        hybridrl::C10dCommunicator comm(store, rank, 3,
                                        hybridrl::C10dOptions().backend("gloo").gloo_hostname("127.0.0.1").timeout_s(1));
        auto t = at::ones({4});
        comm.all_reduce(t);  // collective #1: every rank
        if (rank == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));
          return;
        }
        const auto start = std::chrono::steady_clock::now();
        try {
          comm.all_reduce(t);  // #2: rank 2 never comes
        } catch (const Error& e) {
          errors[static_cast<size_t>(rank)] = e.problem();
        }
        seconds[static_cast<size_t>(rank)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      });
    }
    for (auto& t : threads) t.join();
    for (int rank : {0, 1}) {
      CAPTURE(rank);
      const auto& e = errors[static_cast<size_t>(rank)];
      CHECK(e.find("all_reduce over gloo failed: ") == 0);
      CHECK(e.find("rank 2 sent no report within 0.2 s of this failure: stalled or died before collective #2 "
                   "(all_reduce), which this rank was waiting in") != std::string::npos);
      CHECK(e.find("rank " + std::to_string(1 - rank) + " ") == std::string::npos);  // the other waiter is not named
      CHECK(seconds[static_cast<size_t>(rank)] < 1.0 + 0.2 + 1.0);  // the timeout, the grace, slack
    }
  }
}
#endif
