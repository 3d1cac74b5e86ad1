#pragma once
/// \file
/// Rewards: plain callables from a scored sample (its dataset row, the response text and token
/// ids) to a score, and the built-in rule-based ones: exact match, GSM8K's `#### <number>` answers
/// (strict and flexible extraction, as verl's gsm8k reward), and `\boxed{...}` math answers with a
/// light LaTeX normalisation. A reward that wants the whole batch at once is a BatchRewardFn;
/// `batched(fn)` lifts a per-sample one.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <regex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hybridrl/core/error.hpp"

namespace hybridrl {

/// What a reward function sees of one sample.
struct RewardInput {
  const nlohmann::json* sample = nullptr;  ///< the dataset row (e.g. "answer", "data_source"); may be null
  std::string_view prompt;                 ///< prompt text ("" without a tokenizer)
  std::string_view response;               ///< response text ("" without a tokenizer)
  std::span<const int64_t> response_ids;   ///< the response tokens (EOS included when drawn)
  std::span<const int64_t> prompt_ids;     ///< the prompt tokens (padding removed; empty when unknown)

  /// The row's field `key` as a string (numbers printed), or nullopt when absent.
  [[nodiscard]] std::optional<std::string> field(std::string_view key) const {
    if (sample == nullptr || !sample->is_object()) return std::nullopt;
    auto it = sample->find(std::string(key));
    if (it == sample->end() || it->is_null()) return std::nullopt;
    return it->is_string() ? it->get<std::string>() : it->dump();
  }
};

/// A per-sample reward.
using RewardFn = std::function<double(const RewardInput&)>;
/// A batched reward: one score per input, in order.
using BatchRewardFn = std::function<std::vector<double>(std::span<const RewardInput>)>;

/// `fn` applied to each input.
inline BatchRewardFn batched(RewardFn fn) {
  return [fn = std::move(fn)](std::span<const RewardInput> in) {
    std::vector<double> out;
    out.reserve(in.size());
    for (const auto& x : in) out.push_back(fn(x));
    return out;
  };
}

namespace detail {
inline std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}
inline std::string remove_all(std::string s, std::string_view what) {
  for (auto pos = s.find(what); pos != std::string::npos; pos = s.find(what, pos)) s.erase(pos, what.size());
  return s;
}
inline std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (auto pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size())) s.replace(pos, from.size(), to);
  return s;
}
// the row's ground truth: "answer", or "ground_truth", or reward_model.ground_truth (verl's layout)
inline std::optional<std::string> ground_truth(const RewardInput& x) {
  if (auto a = x.field("answer")) return a;
  if (auto g = x.field("ground_truth")) return g;
  if (x.sample != nullptr && x.sample->contains("reward_model") && (*x.sample)["reward_model"].is_object()) {
    const auto& rm = (*x.sample)["reward_model"];
    if (rm.contains("ground_truth")) return rm["ground_truth"].is_string() ? rm["ground_truth"].get<std::string>() : rm["ground_truth"].dump();
  }
  return std::nullopt;
}
}  // namespace detail

/// 1 when the response equals `answer` after trimming whitespace, else 0.
inline double exact_match(std::string_view response, std::string_view answer) {
  return detail::trim(response) == detail::trim(answer) ? 1.0 : 0.0;
}

/// How gsm8k_answer finds the answer.
enum class GSM8KExtraction {
  strict,   ///< the number after the first "#### " (commas and dollar signs dropped)
  flexible  ///< the last number anywhere in the text (a sentence's final period dropped)
};

/// The final answer of a GSM8K-style solution, or nullopt when there is none. Only the last 300
/// characters are searched (a long response's answer is at its end; verl does the same).
inline std::optional<std::string> gsm8k_answer(std::string_view text, GSM8KExtraction how = GSM8KExtraction::strict) {
  if (text.size() > 300) text = text.substr(text.size() - 300);
  const std::string s(text);
  if (how == GSM8KExtraction::strict) {
    static const std::regex re(R"(#### (\-?[0-9\.\,]+))");
    std::smatch m;
    if (!std::regex_search(s, m, re)) return std::nullopt;
    return detail::remove_all(detail::remove_all(m[1].str(), ","), "$");
  }
  static const std::regex num(R"((\-?[0-9\.\,]+))");
  std::optional<std::string> last;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), num); it != std::sregex_iterator(); ++it) {
    auto v = (*it)[1].str();
    v = detail::remove_all(v, ",");
    while (!v.empty() && v.back() == '.') v.pop_back();  // "... is 5." answers 5 (verl keeps the dot)
    if (!v.empty() && v != "-") last = v;
  }
  return last;
}

/// GSM8K's reward: `score` when the extracted answer equals the ground truth (its own "#### "
/// answer when it has one, commas dropped), `format_score` when an answer was found but is wrong,
/// 0 when none was found.
inline double gsm8k_score(std::string_view response, std::string_view ground_truth,
                          GSM8KExtraction how = GSM8KExtraction::strict, double format_score = 0.0, double score = 1.0) {
  const auto got = gsm8k_answer(response, how);
  if (!got) return 0.0;
  std::string truth(detail::trim(ground_truth));
  if (auto t = gsm8k_answer(truth, GSM8KExtraction::strict)) truth = *t;
  truth = detail::remove_all(truth, ",");
  return *got == truth ? score : format_score;
}

/// The content of the last `\boxed{...}` (or `\fbox{...}`) of `text`, braces balanced, or nullopt.
inline std::optional<std::string> last_boxed(std::string_view text) {
  auto at = text.rfind("\\boxed");
  const auto fbox = text.rfind("\\fbox");
  if (at == std::string_view::npos || (fbox != std::string_view::npos && fbox > at)) at = fbox;
  if (at == std::string_view::npos) return std::nullopt;
  auto open = text.find('{', at);
  if (open == std::string_view::npos) return std::nullopt;
  int depth = 0;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '{') ++depth;
    if (text[i] == '}' && --depth == 0) return std::string(text.substr(open + 1, i - open - 1));
  }
  return std::nullopt;  // unbalanced
}

/// A math answer in a canonical spelling: no spaces, `\left` / `\right` / `\!` / `$` / `\%` / a
/// trailing period removed, `\dfrac` and `\tfrac` as `\frac`, degrees dropped, `0.5` for `.5`,
/// and a number without trailing zeros (`2.50` → `2.5`, `3.0` → `3`).
inline std::string normalize_math_answer(std::string_view answer) {
  std::string s(detail::trim(answer));
  for (std::string_view w : {"\\left", "\\right", "\\!", "$", "\\%", "%", "^{\\circ}", "^\\circ", "\\,", "\\;", " "}) {
    s = detail::remove_all(std::move(s), w);
  }
  s = detail::replace_all(std::move(s), "\\dfrac", "\\frac");
  s = detail::replace_all(std::move(s), "\\tfrac", "\\frac");
  while (!s.empty() && s.back() == '.') s.pop_back();
  if (!s.empty() && s.front() == '.') s.insert(s.begin(), '0');
  // a plain decimal number: drop trailing zeros after the point
  double v = 0;
  const auto* first = s.data();
  const auto* last = s.data() + s.size();
  if (!s.empty() && std::from_chars(first, last, v).ptr == last && s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s;
}

/// 1 when the response's last `\boxed{}` answer equals the ground truth after
/// normalize_math_answer (the ground truth may itself be boxed), else 0.
inline double boxed_math_score(std::string_view response, std::string_view ground_truth) {
  const auto got = last_boxed(response);
  if (!got) return 0.0;
  std::string truth(ground_truth);
  if (auto t = last_boxed(truth)) truth = *t;
  return normalize_math_answer(*got) == normalize_math_answer(truth) ? 1.0 : 0.0;
}

/// The built-in reward `name` as a RewardFn over a row's ground truth ("answer", "ground_truth"
/// or reward_model.ground_truth): exact_match, gsm8k (strict), gsm8k_flexible, boxed_math.
inline RewardFn builtin_reward(std::string_view name) {
  auto need_truth = [](const RewardInput& x, std::string_view reward) {
    auto t = detail::ground_truth(x);
    HYBRIDRL_CHECK(t.has_value(),
                   fmt::format("reward {}: the sample has no \"answer\" (or \"ground_truth\") field", reward),
                   "give every dataset row its answer, e.g. {\"prompt\": ..., \"answer\": \"42\"}");
    return *t;
  };
  if (name == "exact_match") return [need_truth](const RewardInput& x) { return exact_match(x.response, need_truth(x, "exact_match")); };
  if (name == "gsm8k") return [need_truth](const RewardInput& x) { return gsm8k_score(x.response, need_truth(x, "gsm8k")); };
  if (name == "gsm8k_flexible") {
    return [need_truth](const RewardInput& x) {
      return gsm8k_score(x.response, need_truth(x, "gsm8k_flexible"), GSM8KExtraction::flexible);
    };
  }
  if (name == "boxed_math") return [need_truth](const RewardInput& x) { return boxed_math_score(x.response, need_truth(x, "boxed_math")); };
  throw Error(fmt::format("reward \"{}\" is not a built-in reward", name),
              "use exact_match, gsm8k, gsm8k_flexible or boxed_math, or pass your own RewardFn");
}

}  // namespace hybridrl
