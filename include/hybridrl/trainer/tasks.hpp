#pragma once
/// \file
/// Built-in tasks: small problems with exactly checkable answers, for smoke runs, tests and the
/// demo — `reverse` ("reverse 472 =" → "274"), `sort` ("sort 472 =" → "247") and `add`
/// ("add 41+35 =" → "76"). One seeded generator gives every data kind: prompts with answers
/// (online algorithms), preference pairs (the answer against a corrupted one), labelled completions
/// (answers desirable, corruptions undesirable), completions (SFT) — as JSONL text the datasets read
/// (`PromptDataset::from_stream`) — and the task's reward.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <utility>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/policy.hpp"
#include "hybridrl/trainer/rewards.hpp"

namespace hybridrl {

/// `task.*`: a built-in task (name empty: the run reads data.train_files instead).
struct TaskOptions {
  /// reverse, sort or add; empty: no built-in task.
  HYBRIDRL_ARG(std::string, name) = "";
  /// Digits per number.
  HYBRIDRL_ARG(int64_t, digits) = 3;
  /// Examples generated.
  HYBRIDRL_ARG(int64_t, examples) = 512;
  /// Seed of the generator (the same seed, the same examples).
  HYBRIDRL_ARG(uint64_t, seed) = 0;
  HYBRIDRL_FIELDS(name, digits, examples, seed)

  void validate() const {
    HYBRIDRL_CHECK(name_.empty() || name_ == "reverse" || name_ == "sort" || name_ == "add",
                   fmt::format("name = \"{}\" is not a built-in task", name_), "use reverse, sort or add");
    HYBRIDRL_CHECK(digits_ >= 1 && digits_ <= 9, fmt::format("digits = {} is outside [1, 9]", digits_),
                   "use 1 to 9 digits per number");
    HYBRIDRL_CHECK(examples_ >= 1, fmt::format("examples = {} is below 1", examples_), "generate at least one example");
  }
};

/// One generated example.
struct TaskExample {
  std::string prompt, answer, wrong;  ///< `wrong`: a corrupted answer of the same length
};

/// Example `i` of the task (a function of (seed, i) only).
inline TaskExample task_example(const TaskOptions& o, int64_t i) {
  o.validate();
  std::mt19937_64 rng(o.seed() * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i));
  std::uniform_int_distribution<int> digit(0, 9);
  auto number = [&] {
    std::string s;
    for (int64_t k = 0; k < o.digits(); ++k) s.push_back(static_cast<char>('0' + digit(rng)));
    return s;
  };
  TaskExample e;
  if (o.name() == "add") {
    const auto a = number(), b = number();
    e.prompt = fmt::format("add {}+{} =", a, b);
    e.answer = std::to_string(std::stoll(a) + std::stoll(b));
  } else {
    const auto a = number();
    e.prompt = fmt::format("{} {} =", o.name(), a);
    e.answer = a;
    if (o.name() == "reverse") {
      std::reverse(e.answer.begin(), e.answer.end());
    } else {
      std::sort(e.answer.begin(), e.answer.end());
    }
  }
  // corrupt one position (always a different digit)
  e.wrong = e.answer;
  const auto pos = static_cast<size_t>(rng() % e.wrong.size());
  e.wrong[pos] = static_cast<char>('0' + (e.wrong[pos] - '0' + 1 + static_cast<int>(rng() % 9)) % 10);
  return e;
}

/// The task's examples as JSONL text of `kind`: prompts {prompt, answer}; pairs {prompt, chosen,
/// rejected}; labelled {prompt, completion, label} (each example once, the answer or, every second
/// one, the corruption); completions {prompt, completion}. Completions start with a space: "reverse 472 =" + " 274".
inline std::string task_jsonl(const TaskOptions& o, DataKind kind) {
  std::ostringstream out;
  for (int64_t i = 0; i < o.examples(); ++i) {
    const auto e = task_example(o, i);
    nlohmann::json j{{"prompt", e.prompt}, {"data_source", o.name()}};
    switch (kind) {
      case DataKind::prompts: j["answer"] = e.answer; break;
      case DataKind::preference_pairs:
        j["chosen"] = " " + e.answer;
        j["rejected"] = " " + e.wrong;
        break;
      case DataKind::labelled_completions:
        j["completion"] = " " + (i % 2 == 0 ? e.answer : e.wrong);
        j["label"] = i % 2 == 0;
        break;
      case DataKind::completions: j["completion"] = " " + e.answer; break;
    }
    out << j.dump() << '\n';
  }
  return out.str();
}

/// The built-in tasks' reward: the fraction of the answer's characters the response has at their
/// places (leading spaces skipped; 1 exactly when the response starts with the answer), so
/// partial answers earn partial credit. Reads the row's `answer`.
inline double task_score(const RewardInput& x) {
  const auto truth = x.field("answer");
  if (!truth || truth->empty()) return 0.0;
  auto r = x.response;
  while (!r.empty() && r.front() == ' ') r.remove_prefix(1);
  double hits = 0;
  for (size_t i = 0; i < truth->size(); ++i) hits += (i < r.size() && r[i] == (*truth)[i]) ? 1.0 : 0.0;
  return hits / static_cast<double>(truth->size());
}

/// task_score as a RewardFn.
inline RewardFn task_reward() { return task_score; }

}  // namespace hybridrl
