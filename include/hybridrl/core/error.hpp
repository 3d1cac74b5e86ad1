#pragma once
/// \file
/// The one exception type of hybridrl: every message names the problem and the fix.

#include <stdexcept>
#include <string>
#include <utility>

namespace hybridrl {

/// Thrown for every user-facing failure (bad config, bad data, impossible geometry, bad checkpoint).
/// `what()` reads "hybridrl: <problem>\n  fix: <fix>"; `problem()` and `fix()` give the two halves.
class Error : public std::runtime_error {
 public:
  Error(std::string problem, std::string fix)
      : std::runtime_error("hybridrl: " + problem + "\n  fix: " + fix),
        problem_(std::move(problem)),
        fix_(std::move(fix)) {}

  /// What went wrong, with the offending values.
  [[nodiscard]] const std::string& problem() const noexcept { return problem_; }
  /// What the user should do about it.
  [[nodiscard]] const std::string& fix() const noexcept { return fix_; }

 private:
  std::string problem_;
  std::string fix_;
};

}  // namespace hybridrl

/// Throws hybridrl::Error(problem, fix) when `cond` is false. `problem` and `fix` are evaluated only
/// on failure, so they may format expensively (e.g. with fmt::format).
#define HYBRIDRL_CHECK(cond, problem, fix)             \
  do {                                                 \
    if (!(cond)) [[unlikely]] {                        \
      throw ::hybridrl::Error((problem), (fix));       \
    }                                                  \
  } while (false)
