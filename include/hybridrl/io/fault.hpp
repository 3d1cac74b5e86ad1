#pragma once
/// \file
/// Fault injection for the fault tests (tests/apps/faults.cmake; docs/reliability.md). The
/// environment variable
///
///     HYBRIDRL_FAULT=<action>:<path part>[:<n>]
///
/// makes the n-th file (1 when not given) whose target path contains `<path part>` fail while
/// its bytes are written through io::AtomicFile — the writer of checkpoints, configurations and
/// saved models — after half of its first write has reached the temporary file:
/// - `kill`: the process sends itself SIGKILL (a crash, an OOM kill or a preemption mid-write);
/// - `enospc`: the write fails with ENOSPC, as on a full disk.
/// Unset (every normal run) the check is one test of a flag read once. A value that does not
/// parse is an Error at the first write, so a mistyped test cannot pass by injecting nothing.

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "hybridrl/core/error.hpp"

namespace hybridrl::io::fault {

/// What an injected fault does.
enum class Action { kill, enospc };

/// A parsed HYBRIDRL_FAULT.
struct Spec {
  Action action = Action::kill;
  std::string path_part;
  int64_t nth = 1;
};

/// Parses a HYBRIDRL_FAULT value; throws Error naming what is wrong.
inline Spec parse(std::string_view text) {
  const std::string fix = "set HYBRIDRL_FAULT=<kill|enospc>:<part of the target path>[:<n>], e.g. kill:trainer_state.json:2";
  Spec s;
  const auto c1 = text.find(':');
  HYBRIDRL_CHECK(c1 != std::string_view::npos, fmt::format("HYBRIDRL_FAULT='{}' has no ':'", text), fix);
  const auto action = text.substr(0, c1);
  if (action == "kill") {
    s.action = Action::kill;
  } else if (action == "enospc") {
    s.action = Action::enospc;
  } else {
    throw Error(fmt::format("HYBRIDRL_FAULT='{}': '{}' is not an action", text, action), fix);
  }
  auto rest = text.substr(c1 + 1);
  const auto c2 = rest.rfind(':');
  if (c2 != std::string_view::npos) {
    const auto n = rest.substr(c2 + 1);
    int64_t v = 0;
    bool ok = !n.empty() && n.size() <= 9;
    for (const char ch : n) {
      ok = ok && ch >= '0' && ch <= '9';
      v = v * 10 + (ch - '0');
    }
    HYBRIDRL_CHECK(ok && v >= 1, fmt::format("HYBRIDRL_FAULT='{}': '{}' is not a count >= 1", text, n), fix);
    s.nth = v;
    rest = rest.substr(0, c2);
  }
  HYBRIDRL_CHECK(!rest.empty(), fmt::format("HYBRIDRL_FAULT='{}' names no path part", text), fix);
  s.path_part = std::string(rest);
  return s;
}

namespace detail {
struct State {
  State() {
    if (const char* v = std::getenv("HYBRIDRL_FAULT"); v != nullptr && *v != '\0') {
      try {
        spec = parse(v);
      } catch (const Error& e) {
        error = e.problem();
        error_fix = e.fix();
      }
    }
  }
  std::optional<Spec> spec;
  std::string error, error_fix;  ///< a value that did not parse: raised at the first write
  std::atomic<int64_t> seen{0};
};
inline State& state() {
  static State s;
  return s;
}
}  // namespace detail

/// The fault to inject into the file written to `path`, or nullopt (the normal case). Counts the
/// files that match; throws Error when HYBRIDRL_FAULT is set but does not parse.
inline std::optional<Action> for_file(std::string_view path) {
  auto& s = detail::state();
  if (!s.error.empty()) throw Error(s.error, s.error_fix);
  if (!s.spec || path.find(s.spec->path_part) == std::string_view::npos) return std::nullopt;
  if (s.seen.fetch_add(1) + 1 != s.spec->nth) return std::nullopt;
  return s.spec->action;
}

}  // namespace hybridrl::io::fault
