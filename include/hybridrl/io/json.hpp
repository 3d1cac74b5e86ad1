#pragma once
/// \file
/// Parsing untrusted JSON (checkpoint headers, config.json, dataset lines) with bounds: nesting
/// depth capped (deep nesting is an error, never a stack overflow in a later copy or dump), NUL
/// bytes rejected (nlohmann stops at a NUL and would accept `{..}\0garbage`), optional duplicate
/// key rejection, and every nlohmann exception (parse_error, out_of_range for 1e400, ...) turned
/// into one message. `brief` prints a bounded, non-recursive description for error messages.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "hybridrl/core/error.hpp"

namespace hybridrl::io {

/// Default nesting limit: HF configs and safetensors headers nest 3 levels, dataset lines a few.
inline constexpr int kMaxJsonDepth = 64;

/// How parse_json bounds its input.
struct JSONLimits {
  int max_depth = kMaxJsonDepth;  ///< deepest array/object nesting accepted
  bool unique_keys = false;       ///< reject an object that repeats a key (safetensors does)
};

/// The outcome of parse_json: the value, or why the text was rejected.
struct ParsedJson {
  nlohmann::json value;  ///< the parsed document (null on failure)
  std::string error;     ///< empty on success, else a one-line reason
  /// Whether the text parsed.
  explicit operator bool() const noexcept { return error.empty(); }
};

namespace detail {
/// Thrown by the parse callback to stop at the first violated limit.
struct JSONLimitExceeded {
  std::string why;
};
}  // namespace detail

/// Parses `text` as one JSON document within `limits`. Never throws for bad input.
[[nodiscard]] inline ParsedJson parse_json(std::string_view text, const JSONLimits& limits = {}) {
  ParsedJson out;
  if (const void* nul = std::memchr(text.data(), '\0', text.size()); nul != nullptr) {
    out.error = fmt::format("a NUL byte at offset {}",
                            static_cast<const char*>(nul) - text.data());
    return out;
  }
  std::vector<std::set<std::string>> keys;  // one set per open object (unique_keys only)
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start || event == E::array_start) {
      if (depth >= limits.max_depth) {
        throw detail::JSONLimitExceeded{
            fmt::format("nesting deeper than {} levels", limits.max_depth)};
      }
      if (limits.unique_keys && event == E::object_start) keys.emplace_back();
    } else if (limits.unique_keys && event == E::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (limits.unique_keys && event == E::key && !keys.empty()) {
      auto name = parsed.get<std::string>();
      if (!keys.back().insert(name).second) {
        if (name.size() > 64) name = name.substr(0, 64) + "...";
        throw detail::JSONLimitExceeded{fmt::format("the key \"{}\" appears twice in one object", name)};
      }
    }
    return true;
  };
  try {
    out.value = nlohmann::json::parse(text.begin(), text.end(), callback);
  } catch (const detail::JSONLimitExceeded& e) {
    out.value = nullptr;
    out.error = e.why;
  } catch (const nlohmann::json::exception& e) {
    out.value = nullptr;
    out.error = e.what();
  }
  return out;
}

/// Reads a whole file into a string; throws Error naming `what` when it cannot be read (missing,
/// a directory, a read error midway) or is larger than `max_bytes`.
[[nodiscard]] inline std::string read_text_file(const std::string& path, const std::string& what,
                                                size_t max_bytes = size_t{1} << 30) {
  std::ifstream in(path, std::ios::binary);
  HYBRIDRL_CHECK(in.is_open(), fmt::format("cannot open {} '{}': {}", what, path, std::strerror(errno)),
                 "check that the file exists and is readable");
  std::string text;
  char buf[1 << 16];
  try {
    while (in.read(buf, sizeof buf) || in.gcount() > 0) {
      text.append(buf, static_cast<size_t>(in.gcount()));
      HYBRIDRL_CHECK(text.size() <= max_bytes,
                     fmt::format("{} '{}' is larger than {} bytes", what, path, max_bytes),
                     "pass the right file (this one is far larger than any valid one)");
      if (in.eof()) break;
    }
  } catch (const std::ios_base::failure&) {
    in.setstate(std::ios::badbit);
  }
  HYBRIDRL_CHECK(!in.bad(), fmt::format("reading {} '{}' failed (a directory, or an I/O error)", what, path),
                 "pass a regular, readable file");
  return text;
}

/// The byte offset of the first ill-formed UTF-8 sequence of `s` (a stray or missing continuation
/// byte, an overlong form, a surrogate, a code point past U+10FFFF), or npos when `s` is UTF-8.
/// JSON text is UTF-8: a string that is not cannot be written back (nlohmann's dump() throws).
[[nodiscard]] inline size_t invalid_utf8_at(std::string_view s) noexcept {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n = 0;
    uint32_t cp = 0;
    if ((c >> 5) == 0x6) n = 2, cp = c & 0x1F;
    else if ((c >> 4) == 0xE) n = 3, cp = c & 0x0F;
    else if ((c >> 3) == 0x1E) n = 4, cp = c & 0x07;
    else return i;
    if (i + n > s.size()) return i;
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return i;
    }
    i += n;
  }
  return std::string_view::npos;
}

/// A short description of `v` for messages: scalars as written (strings cut at 40 bytes), arrays
/// and objects one level deep, at most 8 elements. Never recurses and never throws.
[[nodiscard]] inline std::string brief(const nlohmann::json& v) {
  auto scalar = [](const nlohmann::json& s) -> std::string {
    if (s.is_string()) {
      const auto& str = s.get_ref<const std::string&>();
      return str.size() > 40 ? fmt::format("\"{}...\"", str.substr(0, 40)) : fmt::format("\"{}\"", str);
    }
    if (s.is_number_unsigned()) return std::to_string(s.get<uint64_t>());
    if (s.is_number_integer()) return std::to_string(s.get<int64_t>());
    if (s.is_number_float()) return fmt::format("{}", s.get<double>());
    if (s.is_boolean()) return s.get<bool>() ? "true" : "false";
    if (s.is_null()) return "null";
    return s.is_array() ? "[...]" : "{...}";
  };
  if (!v.is_array() && !v.is_object()) return scalar(v);
  std::string out = v.is_array() ? "[" : "{";
  size_t n = 0;
  for (auto it = v.begin(); it != v.end(); ++it, ++n) {
    if (n == 8) {
      out += ", ...";
      break;
    }
    if (n > 0) out += ", ";
    if (v.is_object()) out += fmt::format("\"{}\": ", it.key().size() > 40 ? it.key().substr(0, 40) + "..." : it.key());
    out += scalar(*it);
  }
  return out + (v.is_array() ? "]" : "}");
}

/// Reads and parses a JSON file within `limits` (read_text_file's size cap, parse_json's depth cap
/// and NUL check). Throws Error "'<path>' is not valid JSON (<why>)" with `fix` for bad content.
[[nodiscard]] inline nlohmann::json read_json_file(const std::string& path, const std::string& what,
                                                   const std::string& fix, size_t max_bytes = size_t{1} << 30,
                                                   const JSONLimits& limits = {}) {
  auto parsed = parse_json(read_text_file(path, what, max_bytes), limits);
  HYBRIDRL_CHECK(static_cast<bool>(parsed), fmt::format("'{}' is not valid JSON ({})", path, parsed.error), fix);
  return std::move(parsed.value);
}

/// A token id field that may be one id or a list of them (`eos_token_id`); absent or null: none.
inline std::vector<int64_t> json_id_list(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return {};
  const auto& v = j[key];
  auto one = [&](const nlohmann::json& x) {
    HYBRIDRL_CHECK(x.is_number_integer() && !(x.is_number_unsigned() && x.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)),
                   fmt::format("{} = {} is not a token id or a list of them", key, io::brief(v)),
                   "write a whole number, or a list of whole numbers");
    return x.get<int64_t>();
  };
  std::vector<int64_t> out;
  if (v.is_array()) {
    for (const auto& x : v) out.push_back(one(x));
  } else {
    out.push_back(one(v));
  }
  return out;
}

}  // namespace hybridrl::io
