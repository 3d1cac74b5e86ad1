#pragma once
/// \file
/// SentencePieceTokenizer: the `tokenizer.model` of Llama / Mistral style checkpoints through the
/// sentencepiece library. Plain prompt encoding (no chat template) with BOS/EOS as Hugging Face's
/// LlamaTokenizer adds them: BOS first by default, EOS only when asked.
///
/// Optional: needs the sentencepiece headers at build time (CMake defines
/// HYBRIDRL_WITH_SENTENCEPIECE=1 when it finds them) and libsentencepiece at run time. The
/// umbrella <hybridrl/hybridrl.hpp> does not include it: include this header yourself.

#if !__has_include(<sentencepiece_processor.h>)
#error "hybridrl/tokenizer/sentencepiece.hpp needs the sentencepiece headers (Debian/Ubuntu: apt-get install libsentencepiece-dev); reconfigure hybridrl after installing them"
#endif

#include <fmt/format.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/detail/sentencepiece_library.hpp"
#include "hybridrl/tokenizer/tokenizer.hpp"

namespace hybridrl {

/// A sentencepiece model (`tokenizer.model`). Satisfies the `tokenizer` concept.
class SentencePieceTokenizer {
 public:
  /// Loads `path`: a tokenizer.model file, or a checkpoint directory that holds one.
  explicit SentencePieceTokenizer(const std::string& path)
      : sp_(detail::SentencePieceLibrary::get().create(), &detail::SentencePieceLibrary::destroy) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const bool dir = fs::is_directory(path, ec);
    const auto file = dir ? (fs::path(path) / "tokenizer.model").string() : path;
    if (!fs::is_regular_file(file, ec)) {
      const bool has_json = dir && fs::exists(fs::path(path) / "tokenizer.json", ec);
      throw Error(dir ? fmt::format("'{}' has no tokenizer.model", path)
                      : fmt::format("sentencepiece model '{}' does not exist", file),
                  has_json ? "this checkpoint ships only tokenizer.json (a Hugging Face fast "
                             "tokenizer), which hybridrl cannot read yet: use a checkpoint with a "
                             "sentencepiece tokenizer.model"
                           : "pass a sentencepiece tokenizer.model, or the checkpoint directory that "
                             "holds one; checkpoints without a tokenizer (such as the tiny test "
                             "fixtures, vocab_size 320) work with ByteTokenizer");
    }
    const auto [ok, message] = lib().status_of([&] { return sp_->Load(file); });
    HYBRIDRL_CHECK(ok, fmt::format("cannot load sentencepiece model '{}': {}", file, message),
                   "the file is not a valid sentencepiece model: re-download tokenizer.model");
  }

  /// Token ids of `text`, BOS first when `add_bos` (HF LlamaTokenizer's default), EOS last when `add_eos`.
  [[nodiscard]] std::vector<int64_t> encode(std::string_view text, bool add_bos = true, bool add_eos = false) const {
    std::vector<int> pieces;
    const auto [ok, message] = lib().status_of([&] { return sp_->Encode(std::string(text), &pieces); });
    HYBRIDRL_CHECK(ok, fmt::format("sentencepiece could not encode text: {}", message),
                   "check that the text is valid UTF-8");
    std::vector<int64_t> ids;
    ids.reserve(pieces.size() + 2);
    if (add_bos && bos_id() >= 0) ids.push_back(bos_id());
    for (int p : pieces) ids.push_back(p);
    if (add_eos && eos_id() >= 0) ids.push_back(eos_id());
    return ids;
  }

  /// Text of `ids`; BOS, EOS and PAD are skipped (HF's skip_special_tokens=True).
  [[nodiscard]] std::string decode(const std::vector<int64_t>& ids) const {
    std::vector<int> keep;
    keep.reserve(ids.size());
    for (auto id : ids) {
      HYBRIDRL_CHECK(id >= 0 && id < vocab_size(),
                     fmt::format("SentencePieceTokenizer: id {} is outside the vocabulary [0, {})", id, vocab_size()),
                     "decode only ids of this tokenizer's model");
      if (id == bos_id() || id == eos_id() || id == pad_id()) continue;
      keep.push_back(static_cast<int>(id));
    }
    std::string out;
    const auto [ok, message] = lib().status_of([&] { return sp_->Decode(keep, &out); });
    HYBRIDRL_CHECK(ok, fmt::format("sentencepiece could not decode: {}", message),
                   "decode only ids of this tokenizer's model");
    return out;
  }

  /// Number of pieces.
  [[nodiscard]] int64_t vocab_size() const { return sp_->GetPieceSize(); }
  /// Beginning-of-sequence id (-1 when the model has none).
  [[nodiscard]] int64_t bos_id() const { return sp_->bos_id(); }
  /// End-of-sequence id (-1 when the model has none).
  [[nodiscard]] int64_t eos_id() const { return sp_->eos_id(); }
  /// Padding id (-1 when the model has none, as Llama's).
  [[nodiscard]] int64_t pad_id() const { return sp_->pad_id(); }
  /// The piece (sub-word string) of `id`; an id outside [0, vocab_size()) throws (the library
  /// itself indexes without a check).
  [[nodiscard]] std::string piece(int64_t id) const {
    HYBRIDRL_CHECK(id >= 0 && id < vocab_size(),
                   fmt::format("SentencePieceTokenizer::piece: id {} is outside the vocabulary [0, {})",
                               id, vocab_size()),
                   "pass an id of this tokenizer's model");
    return sp_->IdToPiece(static_cast<int>(id));
  }

 private:
  static const detail::SentencePieceLibrary& lib() { return detail::SentencePieceLibrary::get(); }

  // The library is opened at run time (detail/sentencepiece_library.hpp says why).
  std::shared_ptr<sentencepiece::SentencePieceProcessor> sp_;  // shared: copies are cheap, the model is read-only
};
static_assert(tokenizer<SentencePieceTokenizer>);

}  // namespace hybridrl
