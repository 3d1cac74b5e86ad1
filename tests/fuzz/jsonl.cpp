// libFuzzer target: the JSONL datasets (data/dataset.hpp). The input's first byte picks the
// dataset and its options, the rest is the stream:
//   bits 0-1  PromptDataset (RL), PreferenceDataset (DPO), LabelledDataset (KTO), CompletionDataset (SFT)
//   bit 2     OnError::skip (else raise)
//   bit 3     a byte tokenizer with a ChatML chat format (else ByteTokenizer: no render_chat)
//   bit 4     as_chat (prompts as one user message)
//   bit 5     a prompt_template
//   bit 6     max_prompt_length 16 and max_length 32 (else no limit)
//   bit 7     max_line_bytes 64 (else 1 GiB)
// A dataset that reads is walked (units, lengths, statistics).
#include <hybridrl/data/dataset.hpp>
#include <hybridrl/tokenizer/chat.hpp>
#include <hybridrl/tokenizer/tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <sstream>
#include <string>

#include "fuzz_support.hpp"

namespace {

/// ByteTokenizer with a chat format, so `messages` and as_chat prompts render.
struct ChatByteTokenizer : hybridrl::ByteTokenizer {
  hybridrl::ChatFormat chat = hybridrl::ChatFormat::chatml("You are a helpful assistant.");
  [[nodiscard]] std::string render_chat(const nlohmann::json& messages) const { return chat.render(messages); }
};

template <class Dataset, class Tok>
void read(const std::string& text, const Tok& tok, const hybridrl::DatasetOptions& options) {
  std::istringstream in(text);
  const auto d = Dataset::from_stream(in, "fuzz.jsonl", tok, options);
  int64_t total = d.longest_sequence() + d.pad_id();
  for (int64_t i = 0; i < d.size(); ++i) total += d.unit_length(i) + static_cast<int64_t>(d[i].uid.size());
  total += static_cast<int64_t>(d.statistics().to_json().dump().size());
  volatile int64_t keep = total;
  (void)keep;
}

template <class Tok>
void read_kind(int kind, const std::string& text, const Tok& tok, const hybridrl::DatasetOptions& options) {
  switch (kind) {
    case 0: read<hybridrl::PromptDataset>(text, tok, options); break;
    case 1: read<hybridrl::PreferenceDataset>(text, tok, options); break;
    case 2: read<hybridrl::LabelledDataset>(text, tok, options); break;
    default: read<hybridrl::CompletionDataset>(text, tok, options); break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const unsigned flags = data[0];
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  hybridrl::DatasetOptions options;
  options.on_error((flags & 4) != 0 ? hybridrl::OnError::skip : hybridrl::OnError::raise);
  options.as_chat((flags & 16) != 0);
  if ((flags & 32) != 0) options.prompt_template("Question: {prompt} Answer after ####. {prompt}");
  if ((flags & 64) != 0) options.max_prompt_length(16).max_length(32);
  if ((flags & 128) != 0) options.max_line_bytes(64);
  try {
    if ((flags & 8) != 0) {
      read_kind(static_cast<int>(flags & 3), text, ChatByteTokenizer{}, options);
    } else {
      read_kind(static_cast<int>(flags & 3), text, hybridrl::ByteTokenizer{}, options);
    }
  } catch (const hybridrl::Error&) {
  }
  return 0;
}
