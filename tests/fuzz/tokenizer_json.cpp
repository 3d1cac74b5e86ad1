// libFuzzer target: a Hugging Face tokenizer (tokenizer/hf_tokenizer.hpp). The input is, cut at
// its first three NUL bytes: tokenizer.json, tokenizer_config.json, generation_config.json (an
// empty part: no such file) and a text. The files go to a scratch directory that HFTokenizer
// loads as a checkpoint's; the text is then encoded (with and without the special tokens) and
// decoded, its bytes are decoded as ids, and a conversation is rendered in the chat format the
// tokenizer_config.json's chat_template names, when it names one.
#include <hybridrl/tokenizer/hf_tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fuzz = hybridrl::fuzz;
  const auto parts = fuzz::split_at_nul(fuzz::bytes_of(data, size), 3);
  const auto& dir = fuzz::scratch_dir();
  fuzz::write_file(dir / "tokenizer.json", parts[0]);
  fuzz::write_or_remove(dir / "tokenizer_config.json", parts[1]);
  fuzz::write_or_remove(dir / "generation_config.json", parts[2]);
  const std::string_view text = parts[3];
  try {
    const hybridrl::HFTokenizer tok(dir.string());
    for (const bool special : {true, false}) {
      try {
        const auto ids = tok.encode(text, special);
        for (const auto id : ids) (void)tok.token(id);
        (void)tok.decode(ids);
        (void)tok.decode(ids, false);
      } catch (const hybridrl::Error&) {
      }
    }
    // any ids: the text's bytes, as ids of the vocabulary (the decoders on what a sampler may emit)
    if (tok.vocab_size() > 0) {
      std::vector<int64_t> ids;
      for (const unsigned char c : text.substr(0, 256)) ids.push_back(c % tok.vocab_size());
      (void)tok.decode(ids);
      (void)tok.decode(ids, false);
    }
    if (tok.chat_format()) {
      const auto messages = nlohmann::json::array(
          {{{"role", "system"}, {"content", " be brief "}}, {{"role", "user"}, {"content", "hi"}}});
      (void)tok.encode(tok.render_chat(messages), false);
    }
  } catch (const hybridrl::Error&) {
  }
  return 0;
}
