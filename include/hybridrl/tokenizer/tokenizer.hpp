#pragma once
/// \file
/// The `tokenizer` concept every dataset and rollout uses, and ByteTokenizer: a dependency-free
/// byte-level tokenizer (ids 0–255 are bytes, then PAD, BOS, EOS) for tests and built-in tasks.
/// The sentencepiece tokenizer for real checkpoints lives in tokenizer/sentencepiece.hpp (optional:
/// include it yourself; the umbrella header does not). Beside data/ and model/, which both use it.

#include <fmt/format.h>

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hybridrl/core/error.hpp"

namespace hybridrl {

/// A tokenizer provides `encode(text, add_bos)`, `decode(ids)`, `vocab_size()`, and the special ids
/// `bos_id()`, `eos_id()`, `pad_id()` (each -1 when the vocabulary has none).
template <class T>
concept tokenizer = requires(const T& t, std::string_view text, const std::vector<int64_t>& ids) {
  { t.encode(text, true) } -> std::same_as<std::vector<int64_t>>;
  { t.decode(ids) } -> std::same_as<std::string>;
  { t.vocab_size() } -> std::convertible_to<int64_t>;
  { t.bos_id() } -> std::convertible_to<int64_t>;
  { t.eos_id() } -> std::convertible_to<int64_t>;
  { t.pad_id() } -> std::convertible_to<int64_t>;
};

/// Byte-level tokenizer: every UTF-8 byte is one token. ids 256, 257, 258 are PAD, BOS, EOS.
class ByteTokenizer {
 public:
  static constexpr int64_t kPad = 256;
  static constexpr int64_t kBos = 257;
  static constexpr int64_t kEos = 258;

  /// Bytes of `text`, preceded by BOS when `add_bos` (as HF Llama tokenizers do by default).
  [[nodiscard]] std::vector<int64_t> encode(std::string_view text, bool add_bos = true) const {
    std::vector<int64_t> ids;
    ids.reserve(text.size() + (add_bos ? 1 : 0));
    if (add_bos) ids.push_back(kBos);
    for (unsigned char c : text) ids.push_back(static_cast<int64_t>(c));
    return ids;
  }

  /// Text of `ids`; special tokens are skipped. An id outside the vocabulary throws.
  [[nodiscard]] std::string decode(const std::vector<int64_t>& ids) const {
    std::string out;
    out.reserve(ids.size());
    for (auto id : ids) {
      HYBRIDRL_CHECK(id >= 0 && id < vocab_size(),
                     fmt::format("ByteTokenizer: id {} is outside the vocabulary [0, {})", id,
                                 vocab_size()),
                     "decode only ids produced by a model with vocab_size >= 259");
      if (id < 256) out.push_back(static_cast<char>(id));
    }
    return out;
  }

  [[nodiscard]] int64_t vocab_size() const noexcept { return 259; }
  [[nodiscard]] int64_t bos_id() const noexcept { return kBos; }
  [[nodiscard]] int64_t eos_id() const noexcept { return kEos; }
  [[nodiscard]] int64_t pad_id() const noexcept { return kPad; }
};
static_assert(tokenizer<ByteTokenizer>);

}  // namespace hybridrl
