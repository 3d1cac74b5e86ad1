// Launch environment parsing (torchrun, Slurm, missing and malformed variables) with fake
// environments, and a real two-process Gloo run through init_from_environment: fork, TCPStore on
// 127.0.0.1 and a free port.

#include "../support/gloo.hpp"

#include <hybridrl/distributed/batch_collectives.hpp>
#include <hybridrl/distributed/environment.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using hybridrl::environment_from;
using hybridrl::Error;
using hybridrl::parse_launch_environment;

namespace {
std::string problem_of(const std::map<std::string, std::string>& vars) {
  try {
    (void)parse_launch_environment(environment_from(vars));
  } catch (const Error& e) {
    return e.problem();
  }
  return "";
}
}  // namespace

TEST_SUITE("distributed/environment") {
  TEST_CASE("torchrun's variables") {
    auto env = parse_launch_environment(environment_from({{"RANK", "5"}, {"WORLD_SIZE", "8"},
        {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29400"},
        {"SLURM_PROCID", "0"}}));  // torchrun wins over an enclosing Slurm job
    CHECK(env.launcher == "torchrun");
    CHECK(env.rank == 5);
    CHECK(env.world_size == 8);
    CHECK(env.local_rank == 1);
    CHECK(env.master_addr == "node7");
    CHECK(env.master_port == 29400);
  }

  TEST_CASE("Slurm's variables: address from the node list, port from MASTER_PORT or the default") {
    auto env = parse_launch_environment(environment_from({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"},
        {"SLURM_LOCALID", "1"}, {"SLURM_NODELIST", "gpu[007-008,012],cpu1"}}), 29511);
    CHECK(env.launcher == "slurm");
    CHECK(env.rank == 3);
    CHECK(env.world_size == 4);
    CHECK(env.local_rank == 1);
    CHECK(env.master_addr == "gpu007");
    CHECK(env.master_port == 29511);
    auto with_port = parse_launch_environment(environment_from({{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}, {"SLURM_JOB_NODELIST", "a1,a2"},
        {"MASTER_PORT", "1234"}}));
    CHECK(with_port.master_addr == "a1");
    CHECK(with_port.master_port == 1234);
    auto with_addr = parse_launch_environment(environment_from({{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}, {"MASTER_ADDR", "head"}}));
    CHECK(with_addr.master_addr == "head");
  }

  TEST_CASE("first host of a Slurm node list") {
    CHECK(hybridrl::first_slurm_host("node1") == "node1");
    CHECK(hybridrl::first_slurm_host("n[3-5]-ib,m2") == "n3-ib");
    CHECK(hybridrl::first_slurm_host("rack[2,4]-n[010-011]") == "rack2-n010");
    CHECK_THROWS_WITH(hybridrl::first_slurm_host("gpu[1-2"),
                      doctest::Contains("SLURM_NODELIST = 'gpu[1-2' is malformed: '[' without ']'"));
    CHECK_THROWS_WITH(hybridrl::first_slurm_host("gpu[a-b]"), doctest::Contains("must start with a number"));
  }

  TEST_CASE("a missing or malformed variable is an Error naming it") {
    CHECK(problem_of({{"RANK", "0"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}) ==
          "WORLD_SIZE is not set, but the torchrun launch needs it");
    CHECK(problem_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_PORT", "1"}}) ==
          "MASTER_ADDR is not set, but the torchrun launch needs it");
    CHECK(problem_of({{"RANK", "two"}, {"WORLD_SIZE", "2"}}) == "RANK = 'two' is not an integer");
    CHECK(problem_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}) == "RANK = 2 must lie in [0, WORLD_SIZE - 1 = 1]");
    CHECK(problem_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "h"},
                      {"MASTER_PORT", "70000"}}) == "MASTER_PORT = 70000 must lie in [1, 65535]");
    CHECK(problem_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}) ==
          "SLURM_LOCALID is not set, but the Slurm launch needs it");
    CHECK(problem_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}})
              .find("SLURM_NODELIST is not set") == 0);
    CHECK(problem_of({}).find("neither RANK (torchrun) nor SLURM_PROCID (Slurm) is set") == 0);
  }

  TEST_CASE("C10dOptions validation names the field") {
    CHECK_THROWS_WITH(hybridrl::C10dOptions().timeout_s(0).validate(),
                      doctest::Contains("timeout_s = 0 must be > 0"));
    CHECK_THROWS_WITH(hybridrl::C10dOptions().backend("mpi").validate(),
                      doctest::Contains("backend = 'mpi' is not a c10d backend"));
  }
}

#if HYBRIDRL_TEST_HAS_GLOO
namespace {
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

// One rank's part: all_reduce and a TensorBatch all_gather; true when both give the values
// computed by hand (ranks 0 and 1 contribute 1 and 2; rank r holds r + 1 rows of 10r + i).
bool two_process_rank(hybridrl::Communicator& comm) {
  auto t = at::full({1}, comm.rank() + 1.0, at::kDouble);
  comm.all_reduce(t);
  auto x = at::arange(comm.rank() + 1, at::kLong) + 10 * comm.rank();
  auto all = hybridrl::all_gather(hybridrl::TensorBatch({{"x", x}}), comm);
  return comm.size() == 2 && t.item<double>() == 3.0 &&
         all.tensor("x").equal(at::tensor(std::vector<int64_t>{0, 10, 11}));
}
}  // namespace

TEST_SUITE("distributed/environment") {
  TEST_CASE("two processes meet through torchrun-style variables and a TCPStore (Gloo)") {
    const auto port = std::to_string(free_port());
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // rank 1, from its real process environment
      int code = 1;
      try {
        ::setenv("RANK", "1", 1);
        ::setenv("WORLD_SIZE", "2", 1);
        ::setenv("LOCAL_RANK", "1", 1);
        ::setenv("MASTER_ADDR", "127.0.0.1", 1);
        ::setenv("MASTER_PORT", port.c_str(), 1);
        auto comm = hybridrl::init_from_environment(
            hybridrl::C10dOptions().backend("gloo").timeout_s(30).store_timeout_s(30));
        code = two_process_rank(*comm) ? 0 : 3;
      } catch (...) {
        code = 2;
      }
      ::_exit(code);
    }
    bool ok = false;
    std::string error;
    try {
      auto comm = hybridrl::init_from_environment(
          hybridrl::C10dOptions().backend("gloo").timeout_s(30).store_timeout_s(30),
          environment_from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                            {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}}));
      CHECK(comm->backend() == "gloo");
      ok = two_process_rank(*comm);
    } catch (const std::exception& e) {
      error = e.what();
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(error == "");
    CHECK(ok);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);  // 2: the child threw, 3: its values were wrong
  }

  TEST_CASE("an unreachable rendezvous is an Error naming MASTER_ADDR:MASTER_PORT") {
    const auto port = std::to_string(free_port());  // nobody serves it
    const auto where = "MASTER_ADDR:MASTER_PORT = 127.0.0.1:" + port;
    CHECK_THROWS_WITH(hybridrl::init_from_environment(
                          hybridrl::C10dOptions().backend("gloo").store_timeout_s(0.5),
                          environment_from({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                                            {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}})),
                      doctest::Contains(where.c_str()));
  }
}
#endif
