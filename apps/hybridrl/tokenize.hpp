#pragma once
// `hybridrl tokenize`: a checkpoint's tokenizer over a JSONL file — the way to check a tokenizer.
//   hybridrl tokenize --model DIR --input texts.jsonl --output ids.jsonl     each line's "text" -> "ids"
//   hybridrl tokenize --model DIR --input ids.jsonl --output texts.jsonl --decode   "ids" -> "text"
// The tokenizer is the checkpoint's tokenizer.json (or tokenizer.model); encode adds no special
// tokens (with --add-special, the post-processor's: Llama-3's <|begin_of_text|>), decode skips
// them. Other fields of a line are kept. Errors name the file and line; the output is written to a
// temporary file and renamed when complete.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include <hybridrl/io/atomic_file.hpp>
#include <hybridrl/io/json.hpp>
#include <hybridrl/trainer/run.hpp>

namespace hybridrl::app {

inline int run_tokenize(const std::string& model, const std::string& input, const std::string& output, bool decode,
                        bool add_special) {
  auto tok = load_checkpoint_tokenizer(model);
  HYBRIDRL_CHECK(tok.has_value(), fmt::format("'{}' has neither tokenizer.json nor tokenizer.model", model),
                 "pass --model with a Hugging Face checkpoint directory that holds its tokenizer");
  std::ifstream in(input);
  HYBRIDRL_CHECK(in.good(), fmt::format("cannot open --input '{}'", input), "pass a JSONL file that exists");
  io::AtomicFile out(output);
  std::string line;
  int64_t n = 0, tokens = 0;
  size_t bytes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto parsed = io::parse_json(line);  // depth-capped, NUL-rejecting, never throws
    HYBRIDRL_CHECK(static_cast<bool>(parsed), fmt::format("{} line {}: not JSON ({})", input, lineno, parsed.error),
                   "give one JSON object per line");
    nlohmann::json j = std::move(parsed.value);
    HYBRIDRL_CHECK(j.is_object(), fmt::format("{} line {}: not a JSON object", input, lineno), "give one JSON object per line");
    if (decode) {
      HYBRIDRL_CHECK(j.contains("ids") && j["ids"].is_array(), fmt::format("{} line {}: no \"ids\" list", input, lineno),
                     "give each line an \"ids\" list of token ids (--decode)");
      std::vector<int64_t> ids;
      for (const auto& x : j["ids"]) {
        HYBRIDRL_CHECK(x.is_number_integer(), fmt::format("{} line {}: \"ids\" holds {}", input, lineno, x.dump()),
                       "give integer token ids");
        ids.push_back(x.get<int64_t>());
      }
      for (auto id : ids) {
        HYBRIDRL_CHECK(id >= 0 && id < tok->vocab_size(),
                       fmt::format("{} line {}: id {} is outside the vocabulary [0, {})", input, lineno, id, tok->vocab_size()),
                       "decode ids of this tokenizer");
      }
      j["text"] = tok->decode(ids);
      tokens += static_cast<int64_t>(ids.size());
    } else {
      HYBRIDRL_CHECK(j.contains("text") && j["text"].is_string(), fmt::format("{} line {}: no \"text\" string", input, lineno),
                     "give each line a \"text\" string (or pass --decode for \"ids\")");
      const auto text = j["text"].get<std::string>();
      bytes += text.size();
      try {
        j["ids"] = tok->encode(text, add_special);
      } catch (const Error& e) {
        throw Error(fmt::format("{} line {}: {}", input, lineno, e.what()), "fix the line's text");
      }
      tokens += static_cast<int64_t>(j["ids"].size());
    }
    out.write(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    ++n;
  }
  out.commit();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "hybridrl tokenize: %lld lines, %lld tokens%s in %.2f s -> %s\n", static_cast<long long>(n),
               static_cast<long long>(tokens),
               decode ? "" : fmt::format(" from {:.2f} MB ({:.1f} MB/s)", bytes / 1e6, s > 0 ? bytes / 1e6 / s : 0.0).c_str(), s,
               output.c_str());
  return 0;
}

}  // namespace hybridrl::app
