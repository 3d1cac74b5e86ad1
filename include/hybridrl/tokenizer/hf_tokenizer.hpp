#pragma once
/// \file
/// HFTokenizer: a Hugging Face `tokenizer.json` without Python — the BPE model (byte-level, as
/// Qwen2/2.5/3 and Llama-3 ship it, or with byte fallback, as Llama-2-style fast tokenizers do),
/// with the normalizers, pre-tokenizers, post-processor and decoders those files use, giving the
/// ids of the `tokenizers` library (tests/tokenizer/ checks 10⁴ strings per style against it).
///
/// The pipeline of encode(text): added and special tokens are matched first, on the raw text
/// (longest first); each stretch between them is normalized (NFC/NFKC/NFD/NFKD through ICU,
/// Prepend, Replace, Lowercase, Sequence), pre-tokenized (Split on a regex — run verbatim by PCRE2
/// with Unicode properties and JIT —, ByteLevel with its GPT-2 byte map, Metaspace, Sequence) and
/// each piece merged by BPE (lowest merge rank first; `ignore_merges` emits a piece found whole in
/// the vocabulary; `byte_fallback` spells unknown characters as <0xXX> tokens); with `add_special`
/// the post-processor's template (TemplateProcessing: Llama-3's <|begin_of_text|>) wraps the ids.
/// decode(ids) runs the decoders (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace) and
/// skips special tokens.
///
/// A file this cannot reproduce — another model type (WordPiece, Unigram, WordLevel), a component
/// not listed above, BPE dropout — is refused at load with an Error that names the file, the field
/// and what is supported. Optional: needs PCRE2 for Split regexes and ICU for Unicode normalizers
/// (CMake defines HYBRIDRL_WITH_PCRE2 / HYBRIDRL_WITH_ICU); the umbrella header does not include it.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/io/json.hpp"
#include "hybridrl/tokenizer/chat.hpp"
#include "hybridrl/tokenizer/tokenizer.hpp"

#if HYBRIDRL_WITH_PCRE2
#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#endif
#if HYBRIDRL_WITH_ICU
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>
#endif

namespace hybridrl {

namespace detail::hf {

/// Appends the UTF-8 encoding of code point `cp`.
inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

/// Length in bytes of the UTF-8 sequence that starts with byte `c` (1 for a stray byte).
inline size_t utf8_length(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

/// The byte offset of the first invalid UTF-8 sequence of `s`, or npos.
using io::invalid_utf8_at;

/// `s` with every ill-formed sequence replaced by U+FFFD, one per maximal subpart (the Unicode
/// practice Rust's String::from_utf8_lossy follows, which tokenizers' ByteLevel decoder calls):
/// a token cut inside a character, or a sampled run of stray bytes, still decodes to text.
inline std::string utf8_lossy(std::string_view s) {
  if (invalid_utf8_at(s) == std::string_view::npos) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    // the length and the second byte's range of a well-formed sequence starting with c
    size_t n = 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c == 0xE0) n = 3, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) n = 3;
    else if (c == 0xED) n = 3, hi = 0x9F;
    else if (c == 0xF0) n = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) n = 4;
    else if (c == 0xF4) n = 4, hi = 0x8F;
    size_t k = 1;
    for (; n > 0 && k < n && i + k < s.size(); ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if (d < (k == 1 ? lo : 0x80u) || d > (k == 1 ? hi : 0xBFu)) break;
    }
    if (n > 0 && k == n) {
      out.append(s.substr(i, n));
    } else {
      out.append("\xEF\xBF\xBD");  // the maximal subpart s[i, i + k) (one byte when c cannot start one)
    }
    i += n > 0 ? k : 1;
  }
  return out;
}

/// GPT-2's byte → character map (tokenizers' `bytes_char`): printable bytes map to themselves, the
/// other 68 to U+0100 onward. Each entry is the character's UTF-8.
inline const std::array<std::string, 256>& byte_chars() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      append_utf8(t[b], keep ? b : next++);
    }
    return t;
  }();
  return table;
}

/// The inverse of byte_chars: code point → byte (-1 for a code point outside the map).
inline int byte_of_char(uint32_t cp) {
  static const std::unordered_map<uint32_t, int> inverse = [] {
    std::unordered_map<uint32_t, int> m;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      m[keep ? b : next++] = static_cast<int>(b);
    }
    return m;
  }();
  auto it = inverse.find(cp);
  return it == inverse.end() ? -1 : it->second;
}

/// Decodes the code point at s[i] (valid UTF-8 assumed), advancing i.
inline uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = utf8_length(c);
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

inline void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (true) {
    const auto j = s.find(from, i);
    if (j == std::string::npos) break;
    out.append(s, i, j - i);
    out.append(to);
    i = j + from.size();
  }
  out.append(s, i, std::string::npos);
  s = std::move(out);
}

/// A `pattern` field ({"String": s} or {"Regex": r}): (is_regex, text).
inline std::pair<bool, std::string> pattern_of(const nlohmann::json& j, const std::string& where) {
  HYBRIDRL_CHECK(j.is_object() && (j.contains("String") || j.contains("Regex")),
                 fmt::format("{}.pattern is neither {{\"String\": ...}} nor {{\"Regex\": ...}}", where),
                 "use a tokenizer.json written by the tokenizers library");
  if (j.contains("String")) return {false, j.at("String").get<std::string>()};
  return {true, j.at("Regex").get<std::string>()};
}

#if HYBRIDRL_WITH_PCRE2
/// A compiled PCRE2 pattern (UTF, Unicode properties, JIT where available), shared by copies.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                              &err, &offset, nullptr),
                &pcre2_code_free);
    if (!code_) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(err, msg.data(), msg.size());
      throw Error(fmt::format("{}: the regex does not compile at offset {}: {}", where, offset,
                              reinterpret_cast<const char*>(msg.data())),
                  "use a tokenizer.json written by the tokenizers library (Oniguruma syntax)");
    }
    jit_ = pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE) == 0;
  }

  /// Calls f(begin, end) for each match in `s`, left to right (empty matches skipped).
  template <class F>
  void for_each_match(std::string_view s, F&& f) const {
    thread_local std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create(1, nullptr), &pcre2_match_data_free);
    size_t pos = 0;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    while (pos <= s.size()) {
      const int rc = jit_ ? pcre2_jit_match(code_.get(), subject, s.size(), pos, 0, md.get(), nullptr)
                          : pcre2_match(code_.get(), subject, s.size(), pos, 0, md.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      HYBRIDRL_CHECK(rc >= 0, fmt::format("pre-tokenizer regex: PCRE2 error {}", rc), "report this text as a bug");
      const auto* ov = pcre2_get_ovector_pointer(md.get());
      const size_t b = ov[0], e = ov[1];
      if (e > b) f(b, e);
      if (e == b) {  // an empty match: step one character
        pos = e < s.size() ? e + utf8_length(static_cast<unsigned char>(s[e])) : s.size() + 1;
      } else {
        pos = e;
      }
    }
  }

 private:
  std::shared_ptr<pcre2_code> code_;
  bool jit_ = false;
};
#endif

/// One normalizer step.
struct Normalizer {
  enum class Kind { nfc, nfkc, nfd, nfkd, prepend, replace, lowercase } kind;
  std::string a, b;  // prepend: a; replace: a → b
};

/// One pre-tokenizer step.
struct PreTokenizer {
  enum class Kind { split, byte_level, metaspace } kind;
  // split: the pattern and behavior; byte_level: add_prefix_space, use_regex (GPT-2's)
  bool regex = false, invert = false, add_prefix_space = false, use_regex = false;
  std::string pattern, behavior;
  // metaspace: the replacement, prepend_scheme (always | first | never), split
  std::string replacement, prepend_scheme;
  bool split_words = true;
#if HYBRIDRL_WITH_PCRE2
  std::shared_ptr<Regex> re;
#endif
};

/// One decoder step.
struct Decoder {
  enum class Kind { byte_level, replace, byte_fallback, fuse, strip, metaspace } kind;
  std::string a, b;  // replace: a → b; strip: a (content); metaspace: a (replacement)
  int start = 0, stop = 0;
  bool prepend_first = true;  // metaspace: drop the replacement's space at the start
};

/// An added token: matched in the raw text before anything else.
struct AddedToken {
  std::string content;
  int64_t id = -1;
  bool special = false, lstrip = false, rstrip = false;
};

/// GPT-2's own split (ByteLevel with use_regex).
inline const char* gpt2_pattern() {
  return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
}

}  // namespace detail::hf

/// A Hugging Face fast tokenizer (`tokenizer.json`, BPE). Satisfies the `tokenizer` concept.
class HFTokenizer {
 public:
  /// Loads `path`: a tokenizer.json, or a checkpoint directory holding one (and, optionally, its
  /// tokenizer_config.json — bos/eos/pad tokens — and generation_config.json — stop ids).
  explicit HFTokenizer(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const bool dir = fs::is_directory(path, ec);
    file_ = dir ? (fs::path(path) / "tokenizer.json").string() : path;
    HYBRIDRL_CHECK(fs::is_regular_file(file_, ec),
                   dir ? fmt::format("'{}' has no tokenizer.json", path) : fmt::format("'{}' does not exist", file_),
                   "pass a tokenizer.json or the checkpoint directory that holds one");
    // tokenizer.json nests 5 levels (normalizer sequences); the cap stops a stack overflow in the
    // recursive copies and destructors of a hostile file
    nlohmann::json j = io::read_json_file(file_, "tokenizer", "re-download tokenizer.json", size_t{1} << 30);
    HYBRIDRL_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(),
                   fmt::format("'{}' has no \"model\" object", file_), "pass a tokenizer.json of the tokenizers library");
    try {  // a field of the wrong type or a missing one (nlohmann's get, at, value) is an Error too
      const auto& m = j["model"];
      const auto added = j.value("added_tokens", nlohmann::json::array());
      id_limit_ = static_cast<int64_t>((m.contains("vocab") ? m["vocab"].size() : 0) + added.size()) + kIdGap;
      load_model(j["model"]);
      load_added(j.value("added_tokens", nlohmann::json::array()));
      if (j.contains("normalizer") && !j["normalizer"].is_null()) load_normalizer(j["normalizer"], "normalizer");
      if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) load_pre_tokenizer(j["pre_tokenizer"], "pre_tokenizer");
      if (j.contains("post_processor") && !j["post_processor"].is_null()) load_post(j["post_processor"], "post_processor");
      if (j.contains("decoder") && !j["decoder"].is_null()) load_decoder(j["decoder"], "decoder");
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("'{}': a field is missing or has the wrong type ({})", file_, e.what()),
                  "pass a tokenizer.json written by the tokenizers library");
    }
    const auto& chars = detail::hf::byte_chars();
    for (size_t b = 0; b < 256; ++b) byte_level_id_[b] = token_id(chars[b]);
    // a ByteLevel step before another step would need its mapped text: the general path
    for (size_t k = 0; k + 1 < pre_.size(); ++k) {
      if (pre_[k].kind == detail::hf::PreTokenizer::Kind::byte_level) views_only_ = false;
    }
    const auto base = fs::path(file_).parent_path();
    load_config(base / "tokenizer_config.json", base / "generation_config.json");
  }

  /// Token ids of `text`; with `add_special` the post-processor's special tokens too (Llama-3's
  /// <|begin_of_text|> first; Qwen2 adds none) — HF's add_special_tokens. Invalid UTF-8 throws.
  [[nodiscard]] std::vector<int64_t> encode(std::string_view text, bool add_special = true) const {
    const auto bad = detail::hf::invalid_utf8_at(text);
    HYBRIDRL_CHECK(bad == std::string_view::npos, fmt::format("text is not valid UTF-8 (byte {})", bad),
                   "give UTF-8 text (JSONL strings always are)");
    std::vector<int64_t> ids;
    ids.reserve(text.size() / 3 + 4);
    if (add_special) ids.insert(ids.end(), prefix_.begin(), prefix_.end());
    size_t i = 0, start = 0;
    bool first_segment = true;
    while (i < text.size()) {
      const AddedMatch m = match_added(text, i);
      if (m.length == 0) {
        i += detail::hf::utf8_length(static_cast<unsigned char>(text[i]));
        continue;
      }
      size_t seg_end = i;
      const auto& tok = added_[m.index];
      if (tok.lstrip) {
        while (seg_end > start && is_space(text[seg_end - 1])) --seg_end;
      }
      encode_segment(text.substr(start, seg_end - start), first_segment, ids);
      first_segment = false;
      ids.push_back(tok.id);
      i += m.length;
      if (tok.rstrip) {
        while (i < text.size() && is_space(text[i])) ++i;
      }
      start = i;
    }
    encode_segment(text.substr(start), first_segment, ids);
    if (add_special) ids.insert(ids.end(), suffix_.begin(), suffix_.end());
    return ids;
  }

  /// Text of `ids`, special tokens skipped (HF's skip_special_tokens=True). An id outside the
  /// vocabulary throws.
  [[nodiscard]] std::string decode(const std::vector<int64_t>& ids, bool skip_special = true) const {
    std::vector<std::string> pieces;
    pieces.reserve(ids.size());
    for (auto id : ids) {
      HYBRIDRL_CHECK(id >= 0 && id < vocab_size(),
                     fmt::format("HFTokenizer: id {} is outside the vocabulary [0, {})", id, vocab_size()),
                     "decode only ids of this tokenizer");
      const auto& t = tokens_[static_cast<size_t>(id)];
      if (special_[static_cast<size_t>(id)]) {
        if (!skip_special) pieces.push_back(t);
        continue;
      }
      pieces.push_back(t);
    }
    return run_decoders(std::move(pieces));
  }

  [[nodiscard]] int64_t vocab_size() const noexcept { return static_cast<int64_t>(tokens_.size()); }
  [[nodiscard]] int64_t bos_id() const noexcept { return bos_; }
  [[nodiscard]] int64_t eos_id() const noexcept { return eos_; }
  [[nodiscard]] int64_t pad_id() const noexcept { return pad_; }
  /// The ids that end a response: generation_config.json's eos_token_id (one or a list), else eos.
  [[nodiscard]] const std::vector<int64_t>& stop_ids() const noexcept { return stop_; }
  /// The id of token `text` (a vocabulary entry or an added token), or -1.
  [[nodiscard]] int64_t token_id(std::string_view text) const {
    auto it = vocab_.find(text);
    return it == vocab_.end() ? -1 : it->second;
  }
  /// The token text of `id` as the file spells it (byte-level tokens in GPT-2's byte map).
  [[nodiscard]] const std::string& token(int64_t id) const {
    HYBRIDRL_CHECK(id >= 0 && id < vocab_size(), fmt::format("HFTokenizer::token: id {} is outside [0, {})", id, vocab_size()),
                   "pass an id of this tokenizer");
    return tokens_[static_cast<size_t>(id)];
  }
  /// tokenizer_config.json's chat_template ("" when absent).
  [[nodiscard]] const std::string& chat_template() const noexcept { return chat_template_; }
  /// The built-in chat format recognised in chat_template() (ChatML, Llama-3), or nullopt.
  [[nodiscard]] std::optional<ChatFormat> chat_format() const { return ChatFormat::from_template(chat_template_); }
  /// The text of a conversation in chat_format() (PromptDataset's `messages`); an Error naming
  /// the fix when the template is not a built-in format.
  [[nodiscard]] std::string render_chat(const nlohmann::json& messages) const {
    const auto f = chat_format();
    HYBRIDRL_CHECK(f.has_value(),
                   fmt::format("'{}': the prompt is a conversation but the tokenizer_config.json chat_template is {}", file_,
                               chat_template_.empty() ? "missing" : "neither ChatML nor Llama-3"),
                   "render it with a ChatFormat of your own (ChatFormat::chatml(), llama3(), or fields filled in), or "
                   "set model.chat_format");
    return f->render(messages);
  }
  /// The tokenizer.json this was loaded from.
  [[nodiscard]] const std::string& file() const noexcept { return file_; }

 private:
  using Pair = uint64_t;
  static Pair pair_key(int64_t a, int64_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  struct AddedMatch {
    size_t index = 0, length = 0;
  };

  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

  [[noreturn]] void unsupported(const std::string& field, const std::string& what, const std::string& supported) const {
    throw Error(fmt::format("'{}': {} = {} is not supported", file_, field, what),
                fmt::format("hybridrl reads {}; for this checkpoint use its tokenizer.model (sentencepiece) if it has one",
                            supported));
  }

  void load_model(const nlohmann::json& m) {
    const auto type = m.value("type", std::string("BPE"));
    if (type != "BPE") {
      unsupported("model.type", "\"" + type + "\"",
                  "BPE models (byte-level as Qwen2 and Llama-3, or with byte_fallback); WordPiece, Unigram and "
                  "WordLevel are not");
    }
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0) {
      unsupported("model.dropout", m["dropout"].dump(), "BPE without dropout (dropout is for training tokenizers)");
    }
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty()) {
        unsupported(std::string("model.") + k, m[k].dump(), "BPE models without word prefixes or suffixes");
      }
    }
    HYBRIDRL_CHECK(m.contains("vocab") && m["vocab"].is_object(), fmt::format("'{}': model.vocab is missing", file_),
                   "pass a complete tokenizer.json");
    for (const auto& [tok, id] : m["vocab"].items()) {
      HYBRIDRL_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0,
                     fmt::format("'{}': model.vocab[\"{}\"] is not a non-negative integer", file_, tok),
                     "pass a complete tokenizer.json");
      set_token(tok, id.get<int64_t>(), false, "model.vocab");
    }
    ignore_merges_ = m.value("ignore_merges", false);
    byte_fallback_ = m.value("byte_fallback", false);
    fuse_unk_ = m.value("fuse_unk", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      const auto it = vocab_.find(m["unk_token"].get<std::string>());
      HYBRIDRL_CHECK(it != vocab_.end(), fmt::format("'{}': model.unk_token {} is not in the vocabulary", file_, m["unk_token"].dump()),
                     "pass a consistent tokenizer.json");
      unk_ = it->second;
    }
    const auto& merges = m.value("merges", nlohmann::json::array());
    merges_.reserve(merges.size() * 2);
    int32_t rank = 0;
    for (const auto& mg : merges) {
      std::string a, b;
      if (mg.is_string()) {  // "a b" (older files)
        const auto s = mg.get<std::string>();
        const auto sp = s.find(' ');
        HYBRIDRL_CHECK(sp != std::string::npos, fmt::format("'{}': model.merges[{}] \"{}\" has no space", file_, rank, s),
                       "pass a complete tokenizer.json");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        HYBRIDRL_CHECK(mg.is_array() && mg.size() == 2, fmt::format("'{}': model.merges[{}] is not a pair", file_, rank),
                       "pass a complete tokenizer.json");
        a = mg[0].get<std::string>();
        b = mg[1].get<std::string>();
      }
      const auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
      HYBRIDRL_CHECK(ia != vocab_.end() && ib != vocab_.end() && iab != vocab_.end(),
                     fmt::format("'{}': model.merges[{}] (\"{}\" \"{}\") names a token outside the vocabulary", file_, rank, a, b),
                     "pass a consistent tokenizer.json");
      merges_.emplace(pair_key(ia->second, ib->second), Merge{rank, static_cast<int32_t>(iab->second)});
      ++rank;
    }
    for (int b = 0; b < 256; ++b) {
      auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
      byte_token_[static_cast<size_t>(b)] = it == vocab_.end() ? -1 : it->second;
    }
  }

  /// Ids index a table of the tokens: an id lies below the file's count of tokens plus a gap of
  /// 2^16 (a vocabulary may leave holes, as padded ones do) and below 2^31 (a merge packs two ids
  /// in 64 bits), so a few bytes of JSON cannot make the table take gigabytes.
  /// A count or id field: a whole number in int64_t (nlohmann's get<int>() of 1e300 is undefined
  /// behaviour, of 2^64-1 a wrap to -1).
  int64_t integer_of(const nlohmann::json& v, const std::string& field) const {
    HYBRIDRL_CHECK(v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)),
                   fmt::format("'{}': {} = {} is not an integer", file_, field, io::brief(v)),
                   "pass a tokenizer.json written by the tokenizers library");
    return v.get<int64_t>();
  }

  void set_token(const std::string& tok, int64_t id, bool special, const char* field) {
    const int64_t limit = std::min<int64_t>(id_limit_, int64_t{1} << 31);
    HYBRIDRL_CHECK(id >= 0 && id < limit,
                   fmt::format("'{}': {} gives \"{}\" the id {}, outside [0, {}) (the file holds {} tokens)", file_, field,
                               tok.size() > 40 ? tok.substr(0, 40) + "..." : tok, id, limit, id_limit_ - kIdGap),
                   "pass a consistent tokenizer.json (ids count from 0, with few gaps)");
    vocab_[tok] = id;
    if (tokens_.size() <= static_cast<size_t>(id)) {
      tokens_.resize(static_cast<size_t>(id) + 1);
      special_.resize(static_cast<size_t>(id) + 1, false);
    }
    tokens_[static_cast<size_t>(id)] = tok;
    if (special) special_[static_cast<size_t>(id)] = true;
  }

  void load_added(const nlohmann::json& a) {
    HYBRIDRL_CHECK(a.is_array(), fmt::format("'{}': added_tokens is not a list", file_), "pass a complete tokenizer.json");
    for (const auto& t : a) {
      detail::hf::AddedToken x;
      x.content = t.at("content").get<std::string>();
      x.id = integer_of(t.at("id"), "added_tokens[].id");
      x.special = t.value("special", false);
      x.lstrip = t.value("lstrip", false);
      x.rstrip = t.value("rstrip", false);
      HYBRIDRL_CHECK(!x.content.empty(), fmt::format("'{}': added token {} is empty", file_, x.id), "pass a complete tokenizer.json");
      if (t.value("single_word", false)) {
        unsupported("added_tokens[" + std::to_string(x.id) + "].single_word", "true", "added tokens matched anywhere");
      }
      set_token(x.content, x.id, x.special, "added_tokens");
      added_.push_back(x);
    }
    // longest first at each position: sort by length, longest first
    std::stable_sort(added_.begin(), added_.end(), [](const auto& l, const auto& r) { return l.content.size() > r.content.size(); });
    for (size_t k = 0; k < added_.size(); ++k) {
      added_first_[static_cast<unsigned char>(added_[k].content[0])].push_back(k);
    }
  }

  void load_normalizer(const nlohmann::json& n, const std::string& where) {
    const auto type = n.value("type", std::string());
    using K = detail::hf::Normalizer::Kind;
    if (type == "Sequence") {
      size_t k = 0;
      for (const auto& x : n.at("normalizers")) load_normalizer(x, fmt::format("{}.normalizers[{}]", where, k++));
      return;
    }
    if (type == "NFC" || type == "NFKC" || type == "NFD" || type == "NFKD") {
#if HYBRIDRL_WITH_ICU
      normalizers_.push_back({type == "NFC" ? K::nfc : type == "NFKC" ? K::nfkc : type == "NFD" ? K::nfd : K::nfkd, {}, {}});
      return;
#else
      throw Error(fmt::format("'{}': {}.type = {} needs Unicode normalization, and this build has no ICU", file_, where, type),
                  "build hybridrl with libicu-dev");
#endif
    }
    if (type == "Prepend") {
      normalizers_.push_back({K::prepend, n.at("prepend").get<std::string>(), {}});
      return;
    }
    if (type == "Replace") {
      const auto [regex, pat] = detail::hf::pattern_of(n.at("pattern"), where);
      if (regex) unsupported(where + ".pattern", "a Regex", "Replace with a String pattern");
      normalizers_.push_back({K::replace, pat, n.at("content").get<std::string>()});
      return;
    }
    if (type == "Lowercase") {
      normalizers_.push_back({K::lowercase, {}, {}});
      return;
    }
    unsupported(where + ".type", "\"" + type + "\"", "normalizers NFC, NFKC, NFD, NFKD, Prepend, Replace, Lowercase, Sequence");
  }

  void load_pre_tokenizer(const nlohmann::json& p, const std::string& where) {
    const auto type = p.value("type", std::string());
    using K = detail::hf::PreTokenizer::Kind;
    if (type == "Sequence") {
      size_t k = 0;
      for (const auto& x : p.at("pretokenizers")) load_pre_tokenizer(x, fmt::format("{}.pretokenizers[{}]", where, k++));
      return;
    }
    detail::hf::PreTokenizer t{};
    if (type == "Split") {
      t.kind = K::split;
      std::tie(t.regex, t.pattern) = detail::hf::pattern_of(p.at("pattern"), where);
      t.behavior = p.value("behavior", std::string("Isolated"));
      t.invert = p.value("invert", false);
      if (t.behavior != "Isolated" || t.invert) {
        unsupported(where + ".behavior", "\"" + t.behavior + "\"" + (t.invert ? " (inverted)" : ""),
                    "Split with behavior Isolated, not inverted (Qwen2, Llama-3)");
      }
      if (t.regex) compile(t, where);
    } else if (type == "ByteLevel") {
      t.kind = K::byte_level;
      t.add_prefix_space = p.value("add_prefix_space", false);
      if (t.add_prefix_space) views_only_ = false;
      t.use_regex = p.value("use_regex", true);
      if (t.use_regex) {
        t.regex = true;
        t.pattern = detail::hf::gpt2_pattern();
        compile(t, where);
      }
      byte_level_ = true;
    } else if (type == "Metaspace") {
      views_only_ = false;
      t.kind = K::metaspace;
      t.replacement = p.value("replacement", std::string("\xE2\x96\x81"));
      // (tokenizers' replacement is one character; an empty one would split at every position)
      HYBRIDRL_CHECK(!t.replacement.empty(), fmt::format("'{}': {}.replacement is empty", file_, where),
                     "give the Metaspace pre-tokenizer its replacement character (\"\u2581\")");
      t.prepend_scheme = p.value("prepend_scheme", std::string(p.value("add_prefix_space", true) ? "always" : "never"));
      t.split_words = p.value("split", true);
    } else {
      unsupported(where + ".type", "\"" + type + "\"", "pre-tokenizers Split, ByteLevel, Metaspace, Sequence");
    }
    pre_.push_back(std::move(t));
  }

  void compile([[maybe_unused]] detail::hf::PreTokenizer& t, [[maybe_unused]] const std::string& where) {
#if HYBRIDRL_WITH_PCRE2
    t.re = std::make_shared<detail::hf::Regex>(t.pattern, fmt::format("'{}': {}", file_, where));
#else
    throw Error(fmt::format("'{}': {} splits on a regex, and this build has no PCRE2", file_, where),
                "build hybridrl with libpcre2-dev");
#endif
  }

  void load_post(const nlohmann::json& p, const std::string& where) {
    const auto type = p.value("type", std::string());
    if (type == "Sequence") {
      size_t k = 0;
      for (const auto& x : p.at("processors")) load_post(x, fmt::format("{}.processors[{}]", where, k++));
      return;
    }
    if (type == "ByteLevel") return;  // offsets only
    if (type == "TemplateProcessing") {
      prefix_.clear();
      suffix_.clear();
      bool seen = false;
      for (const auto& item : p.at("single")) {
        if (item.contains("Sequence")) {
          seen = true;
          continue;
        }
        const auto name = item.at("SpecialToken").at("id").get<std::string>();
        const auto it = vocab_.find(name);
        HYBRIDRL_CHECK(it != vocab_.end(), fmt::format("'{}': {}.single names {} outside the vocabulary", file_, where, name),
                       "pass a consistent tokenizer.json");
        (seen ? suffix_ : prefix_).push_back(it->second);
      }
      return;
    }
    unsupported(where + ".type", "\"" + type + "\"", "post-processors TemplateProcessing, ByteLevel, Sequence");
  }

  void load_decoder(const nlohmann::json& d, const std::string& where) {
    const auto type = d.value("type", std::string());
    using K = detail::hf::Decoder::Kind;
    if (type == "Sequence") {
      size_t k = 0;
      for (const auto& x : d.at("decoders")) load_decoder(x, fmt::format("{}.decoders[{}]", where, k++));
      return;
    }
    detail::hf::Decoder x{};
    if (type == "ByteLevel") {
      x.kind = K::byte_level;
    } else if (type == "Replace") {
      x.kind = K::replace;
      const auto [regex, pat] = detail::hf::pattern_of(d.at("pattern"), where);
      if (regex) unsupported(where + ".pattern", "a Regex", "Replace with a String pattern");
      x.a = pat;
      x.b = d.at("content").get<std::string>();
    } else if (type == "ByteFallback") {
      x.kind = K::byte_fallback;
    } else if (type == "Fuse") {
      x.kind = K::fuse;
    } else if (type == "Strip") {
      x.kind = K::strip;
      x.a = d.value("content", std::string(" "));
      // (tokenizers' content is one character; an empty one would be stripped `start` times)
      HYBRIDRL_CHECK(!x.a.empty(), fmt::format("'{}': {}.content is empty", file_, where),
                     "give the Strip decoder the character it strips (\" \")");
      x.start = static_cast<int>(std::min<int64_t>(d.contains("start") ? integer_of(d["start"], where + ".start") : 0, INT32_MAX));
      x.stop = static_cast<int>(std::min<int64_t>(d.contains("stop") ? integer_of(d["stop"], where + ".stop") : 0, INT32_MAX));
    } else if (type == "Metaspace") {
      x.kind = K::metaspace;
      x.a = d.value("replacement", std::string("\xE2\x96\x81"));
      x.prepend_first = d.value("prepend_scheme", std::string("always")) != "never" && d.value("add_prefix_space", true);
    } else {
      unsupported(where + ".type", "\"" + type + "\"", "decoders ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence");
    }
    decoders_.push_back(std::move(x));
  }

  /// bos/eos/pad from tokenizer_config.json (a token string or {"content": ...}), stop ids from
  /// generation_config.json; without a config, the post-processor's first special token is bos.
  void load_config(const std::filesystem::path& tokenizer_config, const std::filesystem::path& generation_config) {
    auto id_of = [&](const nlohmann::json& v, const char* key) -> int64_t {
      std::string name;
      if (v.is_string()) name = v.get<std::string>();
      else if (v.is_object() && v.contains("content")) name = v["content"].get<std::string>();
      else return -1;
      const auto it = vocab_.find(name);
      HYBRIDRL_CHECK(it != vocab_.end(),
                     fmt::format("'{}': {} \"{}\" is not a token of '{}'", tokenizer_config.string(), key, name, file_),
                     "fix tokenizer_config.json: its special tokens must be in tokenizer.json");
      return it->second;
    };
    std::error_code ec;
    if (std::filesystem::is_regular_file(tokenizer_config, ec)) {
      nlohmann::json c = io::read_json_file(tokenizer_config.string(), "tokenizer config", "fix or re-download it",
                                            size_t{64} << 20);
      try {
        if (c.contains("bos_token")) bos_ = id_of(c["bos_token"], "bos_token");
        if (c.contains("eos_token")) eos_ = id_of(c["eos_token"], "eos_token");
        if (c.contains("pad_token")) pad_ = id_of(c["pad_token"], "pad_token");
        if (c.contains("chat_template") && c["chat_template"].is_string()) chat_template_ = c["chat_template"].get<std::string>();
      } catch (const nlohmann::json::exception& e) {
        throw Error(fmt::format("'{}': a field has the wrong type ({})", tokenizer_config.string(), e.what()),
                    "fix or re-download it: a special token is a string or {\"content\": string}");
      }
    } else if (!prefix_.empty()) {
      bos_ = prefix_.front();
    }
    if (eos_ >= 0) stop_ = {eos_};
    if (std::filesystem::is_regular_file(generation_config, ec)) {
      const auto g = io::read_json_file(generation_config.string(), "generation config", "fix or re-download it",
                                        size_t{1} << 20);
      try {  // the rule ModelConfig reads the same field with (a string is an Error, not an empty list)
        if (g.contains("eos_token_id")) stop_ = io::json_id_list(g, "eos_token_id");
      } catch (const Error& e) {
        throw Error(fmt::format("'{}': eos_token_id is not an integer or a list of integers ({})",
                                generation_config.string(), e.problem()),
                    e.fix());
      }
    }
  }

  /// The longest added token at text[i] (length 0: none).
  AddedMatch match_added(std::string_view text, size_t i) const {
    const auto& candidates = added_first_[static_cast<unsigned char>(text[i])];
    for (auto k : candidates) {  // longest first
      const auto& c = added_[k].content;
      if (text.compare(i, c.size(), c) == 0) return {k, c.size()};
    }
    return {};
  }

  std::string normalize(std::string_view s) const {
    std::string out(s);
    using K = detail::hf::Normalizer::Kind;
    for (const auto& n : normalizers_) {
      switch (n.kind) {
        case K::prepend:
          if (!out.empty()) out = n.a + out;
          break;
        case K::replace:
          detail::hf::replace_all(out, n.a, n.b);
          break;
        case K::lowercase:
          out = unicode_lower(out);
          break;
        default:
          out = unicode_normalize(out, n.kind);
      }
    }
    return out;
  }

  static std::string unicode_normalize(const std::string& s, [[maybe_unused]] detail::hf::Normalizer::Kind kind) {
    if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return s;  // ASCII is invariant
#if HYBRIDRL_WITH_ICU
    UErrorCode status = U_ZERO_ERROR;
    using K = detail::hf::Normalizer::Kind;
    const icu::Normalizer2* norm = kind == K::nfc    ? icu::Normalizer2::getNFCInstance(status)
                                   : kind == K::nfkc ? icu::Normalizer2::getNFKCInstance(status)
                                   : kind == K::nfd  ? icu::Normalizer2::getNFDInstance(status)
                                                     : icu::Normalizer2::getNFKDInstance(status);
    HYBRIDRL_CHECK(U_SUCCESS(status), "ICU has no Unicode normalization data", "install ICU's data (libicu72)");
    const icu::StringPiece piece(s.data(), static_cast<int32_t>(s.size()));
    if (norm->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return s;  // the common case, no copy
    status = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(s.size()));
    norm->normalizeUTF8(0, piece, sink, nullptr, status);
    HYBRIDRL_CHECK(U_SUCCESS(status), "ICU could not normalize the text", "give valid UTF-8 text");
    return out;
#else
    return s;
#endif
  }

  static std::string unicode_lower(const std::string& s) {
#if HYBRIDRL_WITH_ICU
    auto u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
    u.toLower();
    std::string out;
    u.toUTF8String(out);
    return out;
#else
    std::string out = s;
    for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
#endif
  }

  /// Normalizes, pre-tokenizes and merges one stretch of text between added tokens.
  void encode_segment(std::string_view raw, bool first_segment, std::vector<int64_t>& ids) const {
    if (raw.empty()) return;
    const std::string text = normalizers_.empty() ? std::string(raw) : normalize(raw);
    if (views_only_) {  // Split and plain ByteLevel steps only: pieces are views of `text`
      std::vector<std::string_view> pieces{text}, next;
      using K = detail::hf::PreTokenizer::Kind;
      for (const auto& p : pre_) {
        if (p.kind == K::byte_level && !p.use_regex) continue;  // the byte map is applied in merge_piece
        next.clear();
        for (const auto piece : pieces) split_views(p, piece, next);
        std::swap(pieces, next);
      }
      for (const auto piece : pieces) {
        if (!piece.empty()) merge_piece(piece, byte_level_, ids);
      }
      return;
    }
    // pieces after each pre-tokenizer step; byte-level ones are in GPT-2's byte map
    std::vector<std::string> pieces{text};
    using K = detail::hf::PreTokenizer::Kind;
    for (const auto& p : pre_) {
      std::vector<std::string> next;
      next.reserve(pieces.size() * 2);
      for (auto& piece : pieces) {
        switch (p.kind) {
          case K::split:
            split(p, piece, next);
            break;
          case K::byte_level: {
            std::string s = std::move(piece);
            if (p.add_prefix_space && (s.empty() || s[0] != ' ')) s.insert(s.begin(), ' ');
            std::vector<std::string> parts;
            if (p.use_regex) {
              split(p, s, parts);
            } else {
              parts.push_back(std::move(s));
            }
            const auto& map = detail::hf::byte_chars();
            for (const auto& part : parts) {
              std::string mapped;
              mapped.reserve(part.size() * 2);
              for (unsigned char c : part) mapped += map[c];
              next.push_back(std::move(mapped));
            }
            break;
          }
          case K::metaspace: {
            std::string s = std::move(piece);
            detail::hf::replace_all(s, " ", p.replacement);
            const bool prepend = p.prepend_scheme == "always" || (p.prepend_scheme == "first" && first_segment);
            if (prepend && s.rfind(p.replacement, 0) != 0) s = p.replacement + s;
            if (!p.split_words) {
              next.push_back(std::move(s));
            } else {  // split before each replacement character (MergedWithNext)
              size_t b = 0;
              while (b < s.size()) {
                size_t e = s.find(p.replacement, b + (s.compare(b, p.replacement.size(), p.replacement) == 0 ? p.replacement.size() : 0));
                if (e == std::string::npos) e = s.size();
                next.push_back(s.substr(b, e - b));
                b = e;
              }
            }
            break;
          }
        }
      }
      pieces = std::move(next);
    }
    for (const auto& piece : pieces) {
      if (!piece.empty()) merge_piece(piece, false, ids);
    }
  }

  /// Split (or ByteLevel's GPT-2 regex) on a view: the matches and the text between them.
  void split_views([[maybe_unused]] const detail::hf::PreTokenizer& p, std::string_view s,
                   std::vector<std::string_view>& out) const {
    if (!p.regex) {
      size_t i = 0;
      while (true) {
        const auto j = p.pattern.empty() ? std::string_view::npos : s.find(p.pattern, i);
        if (j == std::string_view::npos) break;
        if (j > i) out.push_back(s.substr(i, j - i));
        out.push_back(s.substr(j, p.pattern.size()));
        i = j + p.pattern.size();
      }
      if (i < s.size()) out.push_back(s.substr(i));
      return;
    }
#if HYBRIDRL_WITH_PCRE2
    size_t last = 0;
    p.re->for_each_match(s, [&](size_t b, size_t e) {
      if (b > last) out.push_back(s.substr(last, b - last));
      out.push_back(s.substr(b, e - b));
      last = e;
    });
    if (last < s.size()) out.push_back(s.substr(last));
#endif
  }

  /// split_views with the pieces copied (the general path, whose steps rewrite the text).
  void split(const detail::hf::PreTokenizer& p, const std::string& s, std::vector<std::string>& out) const {
    std::vector<std::string_view> views;
    split_views(p, s, views);
    for (const auto v : views) out.emplace_back(v);
  }

  /// BPE on one pre-token: its characters' ids (`bytes`: its raw bytes through GPT-2's byte map),
  /// then the lowest-rank adjacent merge first (the leftmost among equal ranks) until none
  /// applies; `ignore_merges` first emits a pre-token found whole in the vocabulary. Results are
  /// cached per pre-token.
  void merge_piece(std::string_view word, bool bytes, std::vector<int64_t>& ids) const {
    {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      if (auto it = cache_.find(word); it != cache_.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int64_t> out;
    if (ignore_merges_) {
      std::string whole;
      if (bytes) {
        const auto& map = detail::hf::byte_chars();
        for (unsigned char c : word) whole += map[c];
      }
      if (auto it = vocab_.find(bytes ? std::string_view(whole) : word); it != vocab_.end()) out.push_back(it->second);
    }
    if (out.empty()) out = bpe(word, bytes);
    ids.insert(ids.end(), out.begin(), out.end());
    if (word.size() < 256) {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      if (cache_.size() > 200000) cache_.clear();
      cache_.emplace(std::string(word), std::move(out));
    }
  }

  std::vector<int64_t> bpe(std::string_view word, bool bytes) const {
    // the symbols: one per byte (byte-level) or per character (byte fallback: per byte of an
    // unknown character; else unk, consecutive ones fused when fuse_unk)
    std::vector<int64_t> sym;
    sym.reserve(word.size());
    if (bytes) {
      for (unsigned char c : word) {
        const int64_t id = byte_level_id_[c];
        HYBRIDRL_CHECK(id >= 0, fmt::format("'{}': byte 0x{:02X} has no byte-level token", file_, static_cast<int>(c)),
                       "pass a byte-level tokenizer.json whose vocabulary holds all 256 byte characters");
        sym.push_back(id);
      }
    } else {
      size_t i = 0;
      bool last_unk = false;
      while (i < word.size()) {
        const size_t n = std::min(detail::hf::utf8_length(static_cast<unsigned char>(word[i])), word.size() - i);
        const auto it = vocab_.find(word.substr(i, n));
        if (it != vocab_.end()) {
          sym.push_back(it->second);
          last_unk = false;
        } else if (byte_fallback_ && std::all_of(word.begin() + static_cast<std::ptrdiff_t>(i),
                                                 word.begin() + static_cast<std::ptrdiff_t>(i + n),
                                                 [&](char c) { return byte_token_[static_cast<unsigned char>(c)] >= 0; })) {
          for (size_t k = 0; k < n; ++k) sym.push_back(byte_token_[static_cast<unsigned char>(word[i + k])]);
          last_unk = false;
        } else {
          HYBRIDRL_CHECK(unk_ >= 0,
                         fmt::format("'{}': the character at byte {} of \"{}\" has no token and the model has no unk_token",
                                     file_, i, word),
                         "this tokenizer.json cannot encode this text");
          if (!(fuse_unk_ && last_unk)) sym.push_back(unk_);
          last_unk = true;
        }
        i += n;
      }
    }
    const size_t n = sym.size();
    if (n < 2) return sym;
    // merges: a min-heap of (rank, position) over adjacent pairs of a linked list of symbols
    std::vector<int64_t> prev(n), next(n);
    for (size_t k = 0; k < n; ++k) {
      prev[k] = static_cast<int64_t>(k) - 1;
      next[k] = k + 1 < n ? static_cast<int64_t>(k + 1) : -1;
    }
    std::vector<bool> alive(n, true);
    using Item = std::tuple<int32_t, int64_t, int64_t, int64_t>;  // rank, left position, left id, right id
    std::vector<Item> storage;
    storage.reserve(n);
    std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap(std::greater<Item>{}, std::move(storage));
    auto push = [&](int64_t l) {
      if (l < 0) return;
      const int64_t r = next[static_cast<size_t>(l)];
      if (r < 0) return;
      const auto it = merges_.find(pair_key(sym[static_cast<size_t>(l)], sym[static_cast<size_t>(r)]));
      if (it != merges_.end()) heap.emplace(it->second.rank, l, sym[static_cast<size_t>(l)], sym[static_cast<size_t>(r)]);
    };
    for (size_t k = 0; k + 1 < n; ++k) push(static_cast<int64_t>(k));
    while (!heap.empty()) {
      const auto [rank, l, left_id, right_id] = heap.top();
      heap.pop();
      const auto lu = static_cast<size_t>(l);
      if (!alive[lu] || sym[lu] != left_id) continue;
      const int64_t r = next[lu];
      if (r < 0 || sym[static_cast<size_t>(r)] != right_id) continue;
      const auto it = merges_.find(pair_key(left_id, right_id));
      if (it == merges_.end() || it->second.rank != rank) continue;
      sym[lu] = it->second.id;
      const auto ru = static_cast<size_t>(r);
      alive[ru] = false;
      next[lu] = next[ru];
      if (next[ru] >= 0) prev[static_cast<size_t>(next[ru])] = l;
      push(prev[lu]);
      push(l);
    }
    std::vector<int64_t> out;
    out.reserve(n);
    for (int64_t k = 0; k >= 0; k = next[static_cast<size_t>(k)]) out.push_back(sym[static_cast<size_t>(k)]);
    return out;
  }

  std::string run_decoders(std::vector<std::string> pieces) const {
    using K = detail::hf::Decoder::Kind;
    for (const auto& d : decoders_) {
      switch (d.kind) {
        case K::byte_level: {  // every piece to bytes, then one lossy UTF-8 text (as tokenizers' ByteLevel)
          for (auto& p : pieces) {
            std::string bytes;
            size_t i = 0;
            std::string_view sv(p);
            while (i < sv.size()) {
              const size_t at = i;
              const auto cp = detail::hf::next_code_point(sv, i);
              const int b = detail::hf::byte_of_char(cp);
              if (b < 0) {  // not a byte-level character (an added token's text): as it is
                bytes.append(sv.substr(at, i - at));
              } else {
                bytes.push_back(static_cast<char>(b));
              }
            }
            p = std::move(bytes);
          }
          std::string all;
          for (const auto& p : pieces) all += p;
          pieces = {detail::hf::utf8_lossy(all)};
          break;
        }
        case K::replace:
          for (auto& p : pieces) detail::hf::replace_all(p, d.a, d.b);
          break;
        case K::byte_fallback: {  // runs of <0xXX> tokens become their bytes (U+FFFD per byte when not UTF-8)
          std::vector<std::string> out;
          std::string run;
          size_t run_tokens = 0;
          auto flush = [&] {
            if (run_tokens == 0) return;
            if (detail::hf::invalid_utf8_at(run) == std::string_view::npos) {
              out.push_back(run);
            } else {
              for (size_t k = 0; k < run_tokens; ++k) out.push_back("\xEF\xBF\xBD");
            }
            run.clear();
            run_tokens = 0;
          };
          for (auto& p : pieces) {
            unsigned v = 0;
            if (p.size() == 6 && p.rfind("<0x", 0) == 0 && p[5] == '>' && std::sscanf(p.c_str() + 3, "%2X", &v) == 1) {
              run.push_back(static_cast<char>(v));
              ++run_tokens;
            } else {
              flush();
              out.push_back(std::move(p));
            }
          }
          flush();
          pieces = std::move(out);
          break;
        }
        case K::fuse: {
          std::string all;
          for (auto& p : pieces) all += p;
          pieces = {all};
          break;
        }
        case K::strip:
          for (auto& p : pieces) {
            int k = 0;
            while (k < d.start && p.rfind(d.a, 0) == 0) {
              p.erase(0, d.a.size());
              ++k;
            }
            k = 0;
            while (k < d.stop && p.size() >= d.a.size() && p.compare(p.size() - d.a.size(), d.a.size(), d.a) == 0) {
              p.erase(p.size() - d.a.size());
              ++k;
            }
          }
          break;
        case K::metaspace:
          for (size_t k = 0; k < pieces.size(); ++k) {
            detail::hf::replace_all(pieces[k], d.a, " ");
            if (k == 0 && d.prepend_first && !pieces[k].empty() && pieces[k][0] == ' ') pieces[k].erase(0, 1);
          }
          break;
      }
    }
    std::string out;
    for (const auto& p : pieces) out += p;
    return out;
  }

  std::string file_;
  static constexpr int64_t kIdGap = int64_t{1} << 16;  ///< set_token's allowance for holes between ids
  int64_t id_limit_ = kIdGap;                          ///< set_token's bound: the file's tokens + kIdGap
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view v) const noexcept { return std::hash<std::string_view>{}(v); }
  };
  using StringMap = std::unordered_map<std::string, int64_t, StringHash, std::equal_to<>>;
  StringMap vocab_;
  std::array<int64_t, 256> byte_level_id_{};
  bool views_only_ = true;
  std::vector<std::string> tokens_;
  std::vector<bool> special_;
  std::unordered_map<Pair, Merge> merges_;
  std::array<int64_t, 256> byte_token_{};
  bool ignore_merges_ = false, byte_fallback_ = false, fuse_unk_ = false, byte_level_ = false;
  int64_t unk_ = -1, bos_ = -1, eos_ = -1, pad_ = -1;
  std::vector<int64_t> stop_, prefix_, suffix_;
  std::vector<detail::hf::AddedToken> added_;
  std::array<std::vector<size_t>, 256> added_first_{};
  std::vector<detail::hf::Normalizer> normalizers_;
  std::vector<detail::hf::PreTokenizer> pre_;
  std::vector<detail::hf::Decoder> decoders_;
  std::string chat_template_;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>, StringHash, std::equal_to<>> cache_;
};
static_assert(tokenizer<HFTokenizer>);

}  // namespace hybridrl
