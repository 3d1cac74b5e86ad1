#pragma once
/// \file
/// Where this process sits in a launch: rank, world size, local rank and the rendezvous address,
/// read from the variables torchrun or Slurm set. Pure parsing over a lookup function, so tests
/// give a fake environment; init_from_environment (distributed/c10d_communicator.hpp) uses the
/// process environment.
///
/// - torchrun (chosen when RANK is set): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
/// - Slurm (chosen when SLURM_PROCID is set and RANK is not): SLURM_PROCID, SLURM_NTASKS,
///   SLURM_LOCALID; the address is MASTER_ADDR if set, else the first host of SLURM_NODELIST
///   (SLURM_JOB_NODELIST); the port is MASTER_PORT if set, else `default_port`.

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "hybridrl/core/error.hpp"

namespace hybridrl {

/// Looks up an environment variable: its value, or nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

/// The process environment (std::getenv).
inline EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

/// A fixed environment (for tests and for callers that assemble the variables themselves).
inline EnvLookup environment_from(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

/// This process's place in the launch, and where the rendezvous store listens.
struct LaunchEnvironment {
  int rank = 0;                ///< global rank, in [0, world_size)
  int world_size = 1;          ///< number of processes
  int local_rank = 0;          ///< rank on this node (the CUDA device to use)
  std::string master_addr;     ///< host of rank 0's TCPStore
  int master_port = 29500;     ///< port of rank 0's TCPStore
  std::string launcher;        ///< "torchrun" or "slurm"
};

namespace detail {

/// The value of `name`; an Error naming it when unset or empty.
inline std::string require_env(const EnvLookup& env, const std::string& name, const char* launcher,
                               const char* fix) {
  auto v = env(name);
  HYBRIDRL_CHECK(v.has_value() && !v->empty(),
                 fmt::format("{} is not set, but the {} launch needs it", name, launcher), fix);
  return *v;
}

/// `text` (the value of `name`) as an integer in [low, high]; an Error naming it otherwise.
inline int env_int(const std::string& name, const std::string& text, int low, int high,
                   const std::string& range) {
  int value = 0;
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  HYBRIDRL_CHECK(ec == std::errc() && ptr == end,
                 fmt::format("{} = '{}' is not an integer", name, text),
                 fmt::format("set {} to a decimal integer {}", name, range));
  HYBRIDRL_CHECK(value >= low && value <= high,
                 fmt::format("{} = {} must lie in {}", name, value, range),
                 fmt::format("set {} to a value in {}", name, range));
  return value;
}

}  // namespace detail

/// The first host of a Slurm node list: "node[003-005,9],gpu1" -> "node003", "a1,a2" -> "a1",
/// "n[1-2]-ib" -> "n1-ib". Throws naming SLURM_NODELIST when the list is malformed.
inline std::string first_slurm_host(std::string_view nodelist) {
  const auto bad = [&](const char* why) {
    return Error(fmt::format("SLURM_NODELIST = '{}' is malformed: {}", nodelist, why),
                 "set MASTER_ADDR to rank 0's host name, or run inside an srun/sbatch allocation");
  };
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] == ']') throw bad("']' without '['");
    if (nodelist[i] != '[') {
      host += nodelist[i++];
      continue;
    }
    const auto close = nodelist.find(']', i);
    if (close == std::string_view::npos) throw bad("'[' without ']'");
    const auto inside = nodelist.substr(i + 1, close - i - 1);
    const auto first = inside.substr(0, inside.find_first_of(",-"));
    if (first.empty() || first.find_first_not_of("0123456789") != std::string_view::npos) {
      throw bad("a bracket range must start with a number");
    }
    host += first;
    i = close + 1;
  }
  if (host.empty()) throw bad("no host name before the first ','");
  return host;
}

/// Reads the launch from `env`: torchrun's variables when RANK is set, else Slurm's when
/// SLURM_PROCID is set. Throws an Error naming the first missing or malformed variable.
inline LaunchEnvironment parse_launch_environment(const EnvLookup& env, int default_port = 29500) {
  LaunchEnvironment out;
  const char* torchrun_fix =
      "launch with `torchrun --no-python ...`, which sets RANK, WORLD_SIZE, LOCAL_RANK, "
      "MASTER_ADDR and MASTER_PORT, or set all five";
  const char* slurm_fix =
      "launch with srun inside an allocation, which sets SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID "
      "and SLURM_NODELIST";
  if (env("RANK")) {
    out.launcher = "torchrun";
    const auto world_text = detail::require_env(env, "WORLD_SIZE", "torchrun", torchrun_fix);
    out.world_size = detail::env_int("WORLD_SIZE", world_text, 1, 1 << 24, "[1, 2^24]");
    out.rank = detail::env_int("RANK", *env("RANK"), 0, out.world_size - 1,
                               fmt::format("[0, WORLD_SIZE - 1 = {}]", out.world_size - 1));
    out.local_rank = detail::env_int("LOCAL_RANK",
                                     detail::require_env(env, "LOCAL_RANK", "torchrun", torchrun_fix),
                                     0, out.world_size - 1,
                                     fmt::format("[0, WORLD_SIZE - 1 = {}]", out.world_size - 1));
    out.master_addr = detail::require_env(env, "MASTER_ADDR", "torchrun", torchrun_fix);
    out.master_port = detail::env_int(
        "MASTER_PORT", detail::require_env(env, "MASTER_PORT", "torchrun", torchrun_fix), 1, 65535,
        "[1, 65535]");
    return out;
  }
  if (env("SLURM_PROCID")) {
    out.launcher = "slurm";
    const auto world_text = detail::require_env(env, "SLURM_NTASKS", "Slurm", slurm_fix);
    out.world_size = detail::env_int("SLURM_NTASKS", world_text, 1, 1 << 24, "[1, 2^24]");
    out.rank = detail::env_int("SLURM_PROCID", *env("SLURM_PROCID"), 0, out.world_size - 1,
                               fmt::format("[0, SLURM_NTASKS - 1 = {}]", out.world_size - 1));
    out.local_rank = detail::env_int(
        "SLURM_LOCALID", detail::require_env(env, "SLURM_LOCALID", "Slurm", slurm_fix), 0,
        out.world_size - 1, fmt::format("[0, SLURM_NTASKS - 1 = {}]", out.world_size - 1));
    if (auto addr = env("MASTER_ADDR"); addr && !addr->empty()) {
      out.master_addr = *addr;
    } else {
      auto list = env("SLURM_NODELIST");
      if (!list || list->empty()) list = env("SLURM_JOB_NODELIST");
      HYBRIDRL_CHECK(list && !list->empty(),
                     "SLURM_NODELIST is not set (nor SLURM_JOB_NODELIST, nor MASTER_ADDR), so rank "
                     "0's host is unknown",
                     "run inside an srun/sbatch allocation, or set MASTER_ADDR to rank 0's host");
      out.master_addr = first_slurm_host(*list);
    }
    if (auto port = env("MASTER_PORT"); port && !port->empty()) {
      out.master_port = detail::env_int("MASTER_PORT", *port, 1, 65535, "[1, 65535]");
    } else {
      out.master_port = default_port;
    }
    return out;
  }
  throw Error("neither RANK (torchrun) nor SLURM_PROCID (Slurm) is set: this process was not "
              "started by a distributed launcher",
              "launch with `torchrun --no-python <program>` or `srun <program>`; for one process, "
              "skip init_from_environment and pass no communicator (or use run_ranks in tests)");
}

}  // namespace hybridrl
