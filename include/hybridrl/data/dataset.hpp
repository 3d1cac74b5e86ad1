#pragma once
/// \file
/// Datasets read from JSONL (one JSON object per line) and tokenised once, ahead of training:
/// - PromptDataset: `prompt` (string) — or `messages` (a conversation, [{"role", "content"}],
///   rendered by the tokenizer's chat format when it has one: `render_chat`) —, optional `answer`
///   (string or number), optional `data_source` (string); every other field is kept in the
///   "extra" column.
/// - PreferenceDataset (DPO): `prompt`, `chosen`, `rejected` (strings).
/// - LabelledDataset (KTO): `prompt`, `completion` (strings), `label` (true = desirable).
/// A malformed line (bad JSON or nesting deeper than 64, missing field, wrong type, empty text,
/// too long, text the tokenizer rejects) throws
/// hybridrl::Error naming the file and line, or with `OnError::skip` is skipped and counted in
/// DataStatistics. Nothing is truncated: a read error midway is an Error.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <istream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/policy.hpp"
#include "hybridrl/data/concepts.hpp"
#include "hybridrl/io/json.hpp"
#include "hybridrl/tokenizer/tokenizer.hpp"

namespace hybridrl {

/// What a dataset does with a malformed line.
enum class OnError {
  raise,  ///< throw hybridrl::Error naming file and line (default)
  skip,   ///< drop the line and count it in DataStatistics
};
HYBRIDRL_ENUM_NAMES(OnError, raise, skip);

/// Why a line was rejected; also the index into DataStatistics::skipped.
enum class LineError { bad_json, missing_field, wrong_type, empty_text, too_long, bad_text };

/// Number of LineError values.
inline constexpr int kLineErrorCount = 6;

/// Deepest JSON nesting a dataset line may have (deeper is `bad_json`, not a stack overflow when
/// the extra fields are copied into batches).
inline constexpr int kMaxLineDepth = 64;

/// Short name of a LineError, as used in statistics and messages ("bad_json", ...).
[[nodiscard]] inline std::string_view to_string(LineError e) noexcept {
  switch (e) {
    case LineError::bad_json: return "bad_json";
    case LineError::missing_field: return "missing_field";
    case LineError::wrong_type: return "wrong_type";
    case LineError::empty_text: return "empty_text";
    case LineError::too_long: return "too_long";
    case LineError::bad_text: return "bad_text";
  }
  return "unknown";
}

/// Counts gathered while reading a dataset; the loader reports them with its own statistics.
struct DataStatistics {
  int64_t lines = 0;        ///< lines read, blank ones included
  int64_t blank_lines = 0;  ///< whitespace-only lines (ignored, not an error)
  int64_t samples = 0;      ///< samples kept
  int64_t tokens = 0;       ///< tokens over all kept samples' sequences
  /// Lines skipped (OnError::skip), by LineError.
  std::array<int64_t, kLineErrorCount> skipped{};
  /// The first few skip messages ("file:line: reason"), for the log.
  std::vector<std::string> first_skips;

  /// Lines skipped for any reason.
  [[nodiscard]] int64_t skipped_total() const noexcept {
    int64_t s = 0;
    for (auto v : skipped) s += v;
    return s;
  }
  /// Lines skipped for `reason`.
  [[nodiscard]] int64_t skipped_for(LineError reason) const noexcept {
    return skipped[static_cast<size_t>(reason)];
  }
  /// The counts as a JSON object (for metrics logs).
  [[nodiscard]] nlohmann::json to_json() const {
    nlohmann::json j{{"lines", lines}, {"blank_lines", blank_lines}, {"samples", samples},
                     {"tokens", tokens}, {"skipped", skipped_total()}};
    for (int i = 0; i < kLineErrorCount; ++i) {
      j[fmt::format("skipped_{}", to_string(static_cast<LineError>(i)))] = skipped[static_cast<size_t>(i)];
    }
    return j;
  }
};

/// Options shared by every JSONL dataset.
struct DatasetOptions {
  /// Longest prompt in tokens (BOS included); longer lines are errors. 0 = no limit.
  HYBRIDRL_ARG(int64_t, max_prompt_length) = 0;
  /// Longest full sequence (prompt + completion) in tokens; longer lines are errors. 0 = no limit.
  HYBRIDRL_ARG(int64_t, max_length) = 0;
  /// Raise on a malformed line, or skip and count it.
  HYBRIDRL_ARG(OnError, on_error) = OnError::raise;
  /// Prepend the tokenizer's BOS to prompts.
  HYBRIDRL_ARG(bool, add_bos) = true;
  /// Append the tokenizer's EOS to completions (chosen, rejected, completion).
  HYBRIDRL_ARG(bool, add_eos) = true;
  /// `data_source` for lines without one; empty = the file's stem.
  HYBRIDRL_ARG(std::string, default_data_source) = "";
  /// PromptDataset: the field that holds the prompt, a string or a conversation ([{"role",
  /// "content"}], rendered in the tokenizer's chat format), e.g. `question` for GSM8K's JSONL.
  /// (With the default, a `messages` field is read as the conversation.)
  HYBRIDRL_ARG(std::string, prompt_key) = "prompt";
  /// PromptDataset: a string prompt becomes this text with `{prompt}` replaced by it, e.g.
  /// `{prompt} Let's think step by step and output the final answer after "####".`; empty = as is.
  HYBRIDRL_ARG(std::string, prompt_template) = "";
  /// PromptDataset: a string prompt is sent as one user message in the chat format (what an
  /// instruct model expects); a conversation always is.
  HYBRIDRL_ARG(bool, as_chat) = false;
  /// Longest line in bytes; a longer one is a too_long line (honours on_error) and is never held in
  /// memory whole (a JSON array or a file without newlines is not read into one string).
  HYBRIDRL_ARG(int64_t, max_line_bytes) = int64_t{1} << 30;
  /// Its fields sit at the level of the options that hold it (`data.max_prompt_length`).
  static constexpr bool inline_fields = true;
  HYBRIDRL_FIELDS(max_prompt_length, max_length, on_error, add_bos, add_eos, default_data_source, prompt_key,
                  prompt_template, as_chat, max_line_bytes)

  /// Throws hybridrl::Error for an impossible value.
  void validate() const {
    HYBRIDRL_CHECK(max_prompt_length_ >= 0, fmt::format("max_prompt_length = {} is negative", max_prompt_length_),
                   "use 0 (no limit) or a positive token count");
    HYBRIDRL_CHECK(max_length_ >= 0, fmt::format("max_length = {} is negative", max_length_),
                   "use 0 (no limit) or a positive token count");
    HYBRIDRL_CHECK(max_length_ == 0 || max_prompt_length_ == 0 || max_prompt_length_ <= max_length_,
                   fmt::format("max_prompt_length = {} exceeds max_length = {}", max_prompt_length_, max_length_),
                   "make max_length at least max_prompt_length");
    HYBRIDRL_CHECK(max_line_bytes_ > 0, fmt::format("max_line_bytes = {} is not positive", max_line_bytes_),
                   "use a positive byte count (default 1 GiB)");
    HYBRIDRL_CHECK(!prompt_key_.empty(), "prompt_key is empty", "name the field that holds the prompt, e.g. prompt");
    HYBRIDRL_CHECK(prompt_template_.empty() || prompt_template_.find("{prompt}") != std::string::npos,
                   fmt::format("prompt_template = \"{}\" has no {{prompt}}", prompt_template_),
                   "write {prompt} where the prompt goes, e.g. \"{prompt} Answer after ####.\"");
  }

  /// A string prompt after prompt_template.
  [[nodiscard]] std::string templated(const std::string& prompt) const {
    if (prompt_template_.empty()) return prompt;
    std::string out;
    size_t at = 0;
    for (size_t i; (i = prompt_template_.find("{prompt}", at)) != std::string::npos; at = i + 8) {
      out.append(prompt_template_, at, i - at).append(prompt);
    }
    return out.append(prompt_template_, at, std::string::npos);
  }
};

/// A prompt for online algorithms (PPO, GRPO).
struct PromptSample {
  std::vector<int64_t> prompt_ids;  ///< tokenised prompt
  nlohmann::json record;            ///< the line's JSON object, as read
  std::string uid;                  ///< "uid"/"id" field, or "<source>:<line>"
  std::string data_source;          ///< `data_source`, or the default
};

/// A DPO preference pair.
struct PreferenceSample {
  std::vector<int64_t> chosen_ids;    ///< prompt + chosen (+ EOS)
  std::vector<int64_t> rejected_ids;  ///< prompt + rejected (+ EOS)
  int64_t prompt_length = 0;          ///< shared prompt tokens at the start of both
  nlohmann::json record;
  std::string uid;
  std::string data_source;
};

/// A KTO labelled completion.
struct LabelledSample {
  std::vector<int64_t> prompt_ids;      ///< tokenised prompt
  std::vector<int64_t> completion_ids;  ///< tokenised completion (+ EOS), no prompt
  std::vector<int64_t> ids;             ///< prompt + completion
  bool label = false;                   ///< true = desirable
  nlohmann::json record;
  std::string uid;
  std::string data_source;
};

/// An SFT (prompt, completion) pair.
struct CompletionSample {
  std::vector<int64_t> prompt_ids;      ///< tokenised prompt
  std::vector<int64_t> completion_ids;  ///< tokenised completion (+ EOS), no prompt
  std::vector<int64_t> ids;             ///< prompt + completion
  nlohmann::json record;
  std::string uid;
  std::string data_source;
};

namespace detail {

/// Reads JSONL lines and turns them into samples; `Parse(json, source, line, SampleSink)` either
/// returns a sample or throws LineFailure.
struct LineFailure {
  LineError reason;
  std::string message;
};

inline std::string stem_of(const std::string& source) {
  return std::filesystem::path(source).stem().string();
}

/// Requires `key` in `obj` as a string; empty (or whitespace-only) strings are `empty_text`.
inline const std::string& require_text(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    throw LineFailure{LineError::missing_field, fmt::format("missing field \"{}\"", key)};
  }
  if (!it->is_string()) {
    throw LineFailure{LineError::wrong_type,
                      fmt::format("field \"{}\" is {}, expected a string", key, it->type_name())};
  }
  const auto& s = it->get_ref<const std::string&>();
  if (std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c) != 0; })) {
    throw LineFailure{LineError::empty_text, fmt::format("field \"{}\" is empty", key)};
  }
  return s;
}

inline std::string optional_string(const nlohmann::json& obj, const char* key,
                                   const std::string& fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) {
    throw LineFailure{LineError::wrong_type,
                      fmt::format("field \"{}\" is {}, expected a string", key, it->type_name())};
  }
  return it->get<std::string>();
}

inline std::string uid_of(const nlohmann::json& obj, const std::string& source, int64_t line) {
  for (const char* key : {"uid", "id"}) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) continue;
    if (it->is_string()) return it->get<std::string>();
    // unsigned first: 2^63 and above would wrap to a negative id through int64_t
    if (it->is_number_unsigned()) return std::to_string(it->get<uint64_t>());
    if (it->is_number_integer()) return std::to_string(it->get<int64_t>());
    throw LineFailure{LineError::wrong_type,
                      fmt::format("field \"{}\" is {}, expected a string or integer", key,
                                  it->type_name())};
  }
  return fmt::format("{}:{}", stem_of(source), line);
}

inline void check_length(int64_t n, int64_t limit, const char* what, const char* option) {
  if (limit > 0 && n > limit) {
    throw LineFailure{LineError::too_long,
                      fmt::format("{} is {} tokens, longer than {} = {}", what, n, option, limit)};
  }
}

/// std::getline with a bound: reads the next line (without '\n') into `out`, keeping at most
/// `max_bytes` of it; `*too_long` tells whether more was there (and was consumed, in 64 KiB pieces,
/// never held). False at the end of the stream or on a read error (the caller checks bad()).
inline bool read_line(std::istream& in, std::string& out, size_t max_bytes, bool* too_long) {
  out.clear();
  *too_long = false;
  bool any = false;
  char buf[1 << 16];
  for (;;) {
    in.getline(buf, sizeof buf);
    const auto n = static_cast<size_t>(in.gcount());
    const bool full = in.fail() && !in.eof() && !in.bad() && n == sizeof buf - 1;  // no '\n' yet
    if (in.bad()) return false;
    if (in.fail() && !full) return any;  // EOF with nothing more
    any = true;
    const size_t stored = full || in.eof() ? n : n - 1;  // gcount counts the extracted '\n'
    if (!*too_long) {
      if (out.size() + stored > max_bytes) {
        *too_long = true;
        out.clear();
        out.shrink_to_fit();
      } else {
        out.append(buf, stored);
      }
    }
    if (!full) return true;
    in.clear(in.rdstate() & ~std::ios::failbit);
  }
}

/// Drives the per-line parser over a stream with the raise/skip policy and statistics.
template <class Sample, class Parse>
std::vector<Sample> read_jsonl(std::istream& in, const std::string& source,
                               const DatasetOptions& options, DataStatistics& stats, Parse&& parse) {
  options.validate();
  std::vector<Sample> out;
  std::string text;
  int64_t line = 0;
  bool overlong = false;
  while (read_line(in, text, static_cast<size_t>(options.max_line_bytes()), &overlong)) {
    ++line;
    ++stats.lines;
    if (!overlong && !text.empty() && text.back() == '\r') text.pop_back();
    if (!overlong && std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c) != 0; })) {
      ++stats.blank_lines;
      continue;
    }
    try {
      if (overlong) {
        throw LineFailure{LineError::too_long,
                          fmt::format("the line is longer than max_line_bytes = {} bytes (JSONL holds one JSON "
                                      "object per line: is this a JSON array, or a file without newlines?)",
                                      options.max_line_bytes())};
      }
      // Depth-capped and NUL-rejecting; every nlohmann exception (1e400's out_of_range too) is a
      // bad_json line, not an escaping exception.
      auto parsed = io::parse_json(text, io::JSONLimits{.max_depth = kMaxLineDepth});
      if (!parsed) throw LineFailure{LineError::bad_json, fmt::format("bad JSON ({})", parsed.error)};
      nlohmann::json obj = std::move(parsed.value);
      if (!obj.is_object()) {
        throw LineFailure{LineError::wrong_type,
                          fmt::format("the line is a JSON {}, expected an object", obj.type_name())};
      }
      try {
        out.push_back(parse(std::move(obj), line));
      } catch (const Error& e) {  // the tokenizer's: gets file:line and honours skip like the rest
        throw LineFailure{LineError::bad_text, fmt::format("the tokenizer rejected the text: {}", e.problem())};
      }
      ++stats.samples;
    } catch (const LineFailure& f) {
      const auto where = fmt::format("{}:{}: {} ({})", source, line, f.message, to_string(f.reason));
      if (options.on_error() == OnError::raise) {
        throw Error(where, f.reason == LineError::too_long
                               ? "raise data.max_length / data.max_prompt_length (data.max_line_bytes for bytes), drop the line, or "
                                 "set data.on_error=skip (DatasetOptions::on_error(OnError::skip)) to "
                                 "skip and count such lines"
                               : "fix or delete the line, or set data.on_error=skip "
                                 "(DatasetOptions::on_error(OnError::skip)) to skip and count malformed lines");
      }
      ++stats.skipped[static_cast<size_t>(f.reason)];
      if (stats.first_skips.size() < 16) stats.first_skips.push_back(where);
    }
  }
  // getline stops at EOF and at a read error alike: tell them apart, never truncate silently.
  HYBRIDRL_CHECK(!in.bad(),
                 fmt::format("{}: reading failed after line {} (an I/O error, or not a regular file)",
                             source, line),
                 "check the file and the file system; nothing was loaded");
  return out;
}

inline std::ifstream open_jsonl(const std::string& path) {
  std::ifstream in(path);
  HYBRIDRL_CHECK(in.good(), fmt::format("cannot open dataset file '{}'", path),
                 "check the path (relative paths are taken from the working directory)");
  return in;
}

inline std::vector<int64_t> completion_tokens(const auto& tok, const std::string& text,
                                              const DatasetOptions& o) {
  auto ids = tok.encode(text, false);
  if (o.add_eos() && tok.eos_id() >= 0) ids.push_back(tok.eos_id());
  return ids;
}

/// What the three datasets share: the samples, the statistics of reading them, the pad id and
/// the accessors a loader uses. `Derived` provides `unit_length(i)`.
template <class Derived, class Sample>
class DatasetStorage {
 public:
  using sample_type = Sample;

  /// Number of units (prompts, pairs or completions).
  [[nodiscard]] int64_t size() const noexcept { return static_cast<int64_t>(samples_.size()); }
  /// Unit `i` (bounds-checked).
  [[nodiscard]] const Sample& operator[](int64_t i) const { return samples_.at(static_cast<size_t>(i)); }
  /// Longest sequence any batch can contain (the longest unit_length).
  [[nodiscard]] int64_t longest_sequence() const {
    int64_t m = 0;
    for (int64_t i = 0; i < size(); ++i) m = std::max(m, static_cast<const Derived&>(*this).unit_length(i));
    return m;
  }
  /// The token id used for padding (the tokenizer's PAD, else EOS).
  [[nodiscard]] int64_t pad_id() const noexcept { return pad_id_; }
  /// Counts gathered while reading (skipped lines by reason, tokens, ...).
  [[nodiscard]] const DataStatistics& statistics() const noexcept { return stats_; }

 protected:
  std::vector<Sample> samples_;
  DataStatistics stats_;
  int64_t pad_id_ = 0;
};

}  // namespace detail

/// Prompts for online algorithms (PPO, GRPO). One unit = one prompt.
class PromptDataset : public detail::DatasetStorage<PromptDataset, PromptSample> {
 public:
  /// What an Algorithm trains on with this dataset.
  static constexpr DataKind data_kind = DataKind::prompts;

  /// Reads `path` (JSONL) and tokenises every prompt once.
  template <tokenizer Tok>
  [[nodiscard]] static PromptDataset from_jsonl(const std::string& path, const Tok& tok,
                                                const DatasetOptions& options = {}) {
    auto in = detail::open_jsonl(path);
    return from_stream(in, path, tok, options);
  }

  /// Reads JSONL from `in`; `source` names it in messages (a path, or "<memory>").
  template <tokenizer Tok>
  [[nodiscard]] static PromptDataset from_stream(std::istream& in, const std::string& source,
                                                 const Tok& tok, const DatasetOptions& options = {}) {
    PromptDataset d;
    d.pad_id_ = tok.pad_id() >= 0 ? tok.pad_id() : tok.eos_id();
    const auto fallback_source =
        options.default_data_source().empty() ? detail::stem_of(source) : options.default_data_source();
    d.samples_ = detail::read_jsonl<PromptSample>(
        in, source, options, d.stats_, [&](nlohmann::json obj, int64_t line) {
          PromptSample s;
          // a conversation: the chat format's text (its own special tokens: no BOS added)
          auto chat_ids = [&](const nlohmann::json& messages, std::string_view field) {
            if constexpr (requires(const nlohmann::json& m) { { tok.render_chat(m) } -> std::convertible_to<std::string>; }) {
              std::string text;
              try {
                text = tok.render_chat(messages);
              } catch (const Error& e) {
                throw detail::LineFailure{LineError::wrong_type, e.what()};
              }
              return tok.encode(text, false);
            } else {
              throw detail::LineFailure{
                  LineError::wrong_type,
                  fmt::format("the line's \"{}\" is a conversation but the tokenizer has no chat format (render_chat)",
                              field)};
              return std::vector<int64_t>{};
            }
          };
          const auto& key = options.prompt_key();
          if (key == "prompt" && obj.contains("messages")) {
            if (obj.contains("prompt")) {
              throw detail::LineFailure{LineError::wrong_type, "both \"prompt\" and \"messages\" are set: give one"};
            }
            s.prompt_ids = chat_ids(obj["messages"], "messages");
          } else if (auto it = obj.find(key); it != obj.end() && it->is_array()) {
            s.prompt_ids = chat_ids(*it, key);
          } else {
            const auto text = options.templated(detail::require_text(obj, key.c_str()));
            s.prompt_ids = options.as_chat() ? chat_ids(nlohmann::json::array({{{"role", "user"}, {"content", text}}}), key)
                                             : tok.encode(text, options.add_bos());
          }
          if (auto it = obj.find("answer"); it != obj.end() && !it->is_null() && !it->is_string() &&
                                            !it->is_number()) {
            throw detail::LineFailure{
                LineError::wrong_type,
                fmt::format("field \"answer\" is {}, expected a string or number", it->type_name())};
          }
          s.data_source = detail::optional_string(obj, "data_source", fallback_source);
          s.uid = detail::uid_of(obj, source, line);
          detail::check_length(static_cast<int64_t>(s.prompt_ids.size()), options.max_prompt_length(),
                               "the prompt", "max_prompt_length");
          detail::check_length(static_cast<int64_t>(s.prompt_ids.size()), options.max_length(),
                               "the prompt", "max_length");
          s.record = std::move(obj);
          return s;
        });
    for (const auto& s : d.samples_) d.stats_.tokens += static_cast<int64_t>(s.prompt_ids.size());
    return d;
  }

  /// Sequences per unit (1: the prompt).
  static constexpr int64_t sequences_per_unit = 1;
  /// Longest sequence of unit `i` in tokens (what padding is sized by).
  [[nodiscard]] int64_t unit_length(int64_t i) const {
    return static_cast<int64_t>((*this)[i].prompt_ids.size());
  }
};

/// DPO preference pairs. One unit = one pair (chosen and rejected always travel together).
class PreferenceDataset : public detail::DatasetStorage<PreferenceDataset, PreferenceSample> {
 public:
  static constexpr DataKind data_kind = DataKind::preference_pairs;
  static constexpr int64_t sequences_per_unit = 2;

  /// Reads `path` (JSONL with prompt, chosen, rejected) and tokenises once.
  template <tokenizer Tok>
  [[nodiscard]] static PreferenceDataset from_jsonl(const std::string& path, const Tok& tok,
                                                    const DatasetOptions& options = {}) {
    auto in = detail::open_jsonl(path);
    return from_stream(in, path, tok, options);
  }

  /// Reads JSONL from `in`; `source` names it in messages.
  template <tokenizer Tok>
  [[nodiscard]] static PreferenceDataset from_stream(std::istream& in, const std::string& source,
                                                     const Tok& tok,
                                                     const DatasetOptions& options = {}) {
    PreferenceDataset d;
    d.pad_id_ = tok.pad_id() >= 0 ? tok.pad_id() : tok.eos_id();
    const auto fallback_source =
        options.default_data_source().empty() ? detail::stem_of(source) : options.default_data_source();
    d.samples_ = detail::read_jsonl<PreferenceSample>(
        in, source, options, d.stats_, [&](nlohmann::json obj, int64_t line) {
          PreferenceSample s;
          const auto& prompt = detail::require_text(obj, "prompt");
          const auto& chosen = detail::require_text(obj, "chosen");
          const auto& rejected = detail::require_text(obj, "rejected");
          s.data_source = detail::optional_string(obj, "data_source", fallback_source);
          s.uid = detail::uid_of(obj, source, line);
          auto p = tok.encode(prompt, options.add_bos());
          s.prompt_length = static_cast<int64_t>(p.size());
          detail::check_length(s.prompt_length, options.max_prompt_length(), "the prompt",
                               "max_prompt_length");
          s.chosen_ids = p;
          auto c = detail::completion_tokens(tok, chosen, options);
          s.chosen_ids.insert(s.chosen_ids.end(), c.begin(), c.end());
          s.rejected_ids = std::move(p);
          auto r = detail::completion_tokens(tok, rejected, options);
          s.rejected_ids.insert(s.rejected_ids.end(), r.begin(), r.end());
          detail::check_length(static_cast<int64_t>(s.chosen_ids.size()), options.max_length(),
                               "prompt + chosen", "max_length");
          detail::check_length(static_cast<int64_t>(s.rejected_ids.size()), options.max_length(),
                               "prompt + rejected", "max_length");
          s.record = std::move(obj);
          return s;
        });
    for (const auto& s : d.samples_) {
      d.stats_.tokens += static_cast<int64_t>(s.chosen_ids.size() + s.rejected_ids.size());
    }
    return d;
  }

  /// Longest of the pair's two sequences.
  [[nodiscard]] int64_t unit_length(int64_t i) const {
    const auto& s = (*this)[i];
    return static_cast<int64_t>(std::max(s.chosen_ids.size(), s.rejected_ids.size()));
  }
};

/// KTO labelled completions. One unit = one completion; the loader adds, inside the same batch,
/// the mismatched pair (prompt i, completion of the next sample) KTO uses for its KL estimate.
class LabelledDataset : public detail::DatasetStorage<LabelledDataset, LabelledSample> {
 public:
  static constexpr DataKind data_kind = DataKind::labelled_completions;
  /// The matched sequence and its mismatched (KL) partner.
  static constexpr int64_t sequences_per_unit = 2;

  /// Reads `path` (JSONL with prompt, completion, label) and tokenises once.
  template <tokenizer Tok>
  [[nodiscard]] static LabelledDataset from_jsonl(const std::string& path, const Tok& tok,
                                                  const DatasetOptions& options = {}) {
    auto in = detail::open_jsonl(path);
    return from_stream(in, path, tok, options);
  }

  /// Reads JSONL from `in`; `source` names it in messages.
  template <tokenizer Tok>
  [[nodiscard]] static LabelledDataset from_stream(std::istream& in, const std::string& source,
                                                   const Tok& tok,
                                                   const DatasetOptions& options = {}) {
    LabelledDataset d;
    d.pad_id_ = tok.pad_id() >= 0 ? tok.pad_id() : tok.eos_id();
    const auto fallback_source =
        options.default_data_source().empty() ? detail::stem_of(source) : options.default_data_source();
    d.samples_ = detail::read_jsonl<LabelledSample>(
        in, source, options, d.stats_, [&](nlohmann::json obj, int64_t line) {
          LabelledSample s;
          const auto& prompt = detail::require_text(obj, "prompt");
          const auto& completion = detail::require_text(obj, "completion");
          auto it = obj.find("label");
          if (it == obj.end()) {
            throw detail::LineFailure{LineError::missing_field, "missing field \"label\""};
          }
          if (!it->is_boolean()) {
            throw detail::LineFailure{
                LineError::wrong_type,
                fmt::format("field \"label\" is {}, expected true or false", it->type_name())};
          }
          s.label = it->get<bool>();
          s.data_source = detail::optional_string(obj, "data_source", fallback_source);
          s.uid = detail::uid_of(obj, source, line);
          s.prompt_ids = tok.encode(prompt, options.add_bos());
          detail::check_length(static_cast<int64_t>(s.prompt_ids.size()),
                               options.max_prompt_length(), "the prompt", "max_prompt_length");
          s.completion_ids = detail::completion_tokens(tok, completion, options);
          s.ids = s.prompt_ids;
          s.ids.insert(s.ids.end(), s.completion_ids.begin(), s.completion_ids.end());
          detail::check_length(static_cast<int64_t>(s.ids.size()), options.max_length(),
                               "prompt + completion", "max_length");
          s.record = std::move(obj);
          return s;
        });
    for (const auto& s : d.samples_) d.stats_.tokens += static_cast<int64_t>(s.ids.size());
    return d;
  }

  /// Length of the matched sequence (prompt + completion).
  [[nodiscard]] int64_t unit_length(int64_t i) const {
    return static_cast<int64_t>((*this)[i].ids.size());
  }
  /// Longest sequence any batch can contain: a mismatched (KL) pair may join the longest prompt
  /// with the longest completion, so this is their sum.
  [[nodiscard]] int64_t longest_sequence() const {
    int64_t p = 0, c = 0;
    for (const auto& s : samples_) {
      p = std::max(p, static_cast<int64_t>(s.prompt_ids.size()));
      c = std::max(c, static_cast<int64_t>(s.completion_ids.size()));
    }
    return p + c;
  }
};

/// (prompt, completion) pairs for supervised fine-tuning. One unit = one sequence.
class CompletionDataset : public detail::DatasetStorage<CompletionDataset, CompletionSample> {
 public:
  static constexpr DataKind data_kind = DataKind::completions;
  static constexpr int64_t sequences_per_unit = 1;

  /// Reads `path` (JSONL with prompt and completion) and tokenises once.
  template <tokenizer Tok>
  [[nodiscard]] static CompletionDataset from_jsonl(const std::string& path, const Tok& tok,
                                                    const DatasetOptions& options = {}) {
    auto in = detail::open_jsonl(path);
    return from_stream(in, path, tok, options);
  }

  /// Reads JSONL from `in`; `source` names it in messages.
  template <tokenizer Tok>
  [[nodiscard]] static CompletionDataset from_stream(std::istream& in, const std::string& source, const Tok& tok,
                                                     const DatasetOptions& options = {}) {
    CompletionDataset d;
    d.pad_id_ = tok.pad_id() >= 0 ? tok.pad_id() : tok.eos_id();
    const auto fallback_source =
        options.default_data_source().empty() ? detail::stem_of(source) : options.default_data_source();
    d.samples_ = detail::read_jsonl<CompletionSample>(
        in, source, options, d.stats_, [&](nlohmann::json obj, int64_t line) {
          CompletionSample s;
          const auto& prompt = detail::require_text(obj, "prompt");
          const auto& completion = detail::require_text(obj, "completion");
          s.data_source = detail::optional_string(obj, "data_source", fallback_source);
          s.uid = detail::uid_of(obj, source, line);
          s.prompt_ids = tok.encode(prompt, options.add_bos());
          detail::check_length(static_cast<int64_t>(s.prompt_ids.size()), options.max_prompt_length(), "the prompt",
                               "max_prompt_length");
          s.completion_ids = detail::completion_tokens(tok, completion, options);
          s.ids = s.prompt_ids;
          s.ids.insert(s.ids.end(), s.completion_ids.begin(), s.completion_ids.end());
          detail::check_length(static_cast<int64_t>(s.ids.size()), options.max_length(), "prompt + completion",
                               "max_length");
          s.record = std::move(obj);
          return s;
        });
    for (const auto& s : d.samples_) d.stats_.tokens += static_cast<int64_t>(s.ids.size());
    return d;
  }

  /// Length of the sequence (prompt + completion).
  [[nodiscard]] int64_t unit_length(int64_t i) const { return static_cast<int64_t>((*this)[i].ids.size()); }
};

static_assert(dataset<PromptDataset>, "hybridrl: PromptDataset must model the dataset concept (data/concepts.hpp)");
static_assert(dataset<PreferenceDataset>, "hybridrl: PreferenceDataset must model the dataset concept (data/concepts.hpp)");
static_assert(dataset<LabelledDataset>, "hybridrl: LabelledDataset must model the dataset concept (data/concepts.hpp)");
static_assert(dataset<CompletionDataset>, "hybridrl: CompletionDataset must model the dataset concept (data/concepts.hpp)");

}  // namespace hybridrl
