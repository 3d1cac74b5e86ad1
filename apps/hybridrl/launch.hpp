#pragma once
// `hybridrl launch`: torchrun's --no-python launch on one machine, without Python.
//   hybridrl launch --nproc-per-node 2 [--master-port 29500] -- train key=value ...
// Starts N copies of this program with the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT: a free port unless given), waits for
// them, and when one fails stops the others (SIGTERM, then SIGKILL after a grace period) and
// exits with the failed rank's code. For several machines use torchrun or srun (docs/distributed.md).

#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <hybridrl/core/error.hpp>

namespace hybridrl::app {

/// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick).
inline int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  HYBRIDRL_CHECK(fd >= 0, "launch: cannot open a socket to find a free port", "pass --master-port");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  HYBRIDRL_CHECK(ok, "launch: cannot find a free port on 127.0.0.1", "pass --master-port");
  return ntohs(a.sin_port);
}

/// Runs `args` (a subcommand and its arguments) as `nproc` ranks of one machine; returns the exit
/// code: 0 when every rank exits 0, else the first failed rank's (128 + signal when killed).
inline int run_launch(int nproc, int master_port, const std::vector<std::string>& args, double grace_s = 10.0) {
  HYBRIDRL_CHECK(nproc >= 1, fmt::format("launch: --nproc-per-node = {} is below 1", nproc), "give the number of ranks, e.g. 2");
  HYBRIDRL_CHECK(!args.empty(), "launch: no subcommand to run", "e.g. hybridrl launch --nproc-per-node 2 -- train task.name=reverse");
  const int port = master_port > 0 ? master_port : free_local_port();
  char self[4096];
  const auto n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  HYBRIDRL_CHECK(n > 0, "launch: cannot find this program's path (/proc/self/exe)", "run hybridrl from a Linux system");
  self[n] = '\0';
  std::fprintf(stderr, "hybridrl launch: %d ranks on 127.0.0.1:%d: %s\n", nproc, port, args.front().c_str());
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = ::fork();
    HYBRIDRL_CHECK(pid >= 0, fmt::format("launch: fork failed for rank {}", r), "free some memory or processes and retry");
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<char*> argv;
      argv.push_back(self);
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(self, argv.data());
      std::fprintf(stderr, "hybridrl launch: rank %d: cannot run %s\n", r, self);
      std::_Exit(127);
    }
    pids.push_back(pid);
  }
  int result = 0, left = nproc;
  auto rank_of = [&](pid_t p) {
    for (int r = 0; r < nproc; ++r) {
      if (pids[static_cast<size_t>(r)] == p) return r;
    }
    return -1;
  };
  auto stop_others = [&] {
    for (auto p : pids) {
      if (p > 0) ::kill(p, SIGTERM);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
    while (left > 0 && std::chrono::steady_clock::now() < until) {
      int st = 0;
      const pid_t p = ::waitpid(-1, &st, WNOHANG);
      if (p > 0) {
        const int r = rank_of(p);
        if (r >= 0) pids[static_cast<size_t>(r)] = -1;
        --left;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    for (auto p : pids) {
      if (p > 0) ::kill(p, SIGKILL);
    }
  };
  while (left > 0) {
    int st = 0;
    const pid_t p = ::waitpid(-1, &st, 0);
    if (p < 0) break;
    const int r = rank_of(p);
    if (r < 0) continue;
    pids[static_cast<size_t>(r)] = -1;
    --left;
    const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    if (code != 0 && result == 0) {
      result = code;
      std::fprintf(stderr, "hybridrl launch: rank %d exited with code %d; stopping the other ranks\n", r, code);
      stop_others();
      break;
    }
  }
  while (::waitpid(-1, nullptr, 0) > 0) {
  }
  return result;
}

}  // namespace hybridrl::app
