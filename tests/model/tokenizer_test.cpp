// Tokenizers: sentencepiece against the ids the Python sentencepiece library gave for the fixture
// model (tests/fixtures/models/tokenizer), and the byte-level tokenizer.
#include <nlohmann/json.hpp>

#include <fstream>

#include "hybridrl/model/sentencepiece_tokenizer.hpp"
#include "hybridrl/model/tokenizer.hpp"
#include <doctest/doctest.h>  // last: c10 defines a CHECK macro of its own

using namespace hybridrl;

TEST_SUITE("model/tokenizer") {
  TEST_CASE("sentencepiece: ids, BOS/EOS and decode equal the reference") {
    const std::string dir = std::string(HYBRIDRL_FIXTURES_DIR) + "/models/tokenizer";
    std::ifstream in(dir + "/expected.json");
    REQUIRE(in.good());
    const auto want = nlohmann::json::parse(in);
    SentencePieceTokenizer tok(dir);  // a directory holding tokenizer.model
    CHECK(tok.vocab_size() == want["vocab_size"].get<int64_t>());
    CHECK(tok.bos_id() == want["bos_id"].get<int64_t>());
    CHECK(tok.eos_id() == want["eos_id"].get<int64_t>());
    CHECK(tok.pad_id() == want["pad_id"].get<int64_t>());
    for (const auto& c : want["cases"]) {
      const auto text = c["text"].get<std::string>();
      CAPTURE(text);
      CHECK(tok.encode(text, false) == c["ids"].get<std::vector<int64_t>>());
      const auto with_bos = tok.encode(text);
      CHECK(with_bos == c["ids_with_bos"].get<std::vector<int64_t>>());
      auto with_eos = tok.encode(text, true, true);
      CHECK(with_eos.back() == tok.eos_id());
      CHECK(tok.decode(with_eos) == c["decoded"].get<std::string>());
    }
    SentencePieceTokenizer copy = tok;  // copies share the read-only model
    CHECK(copy.encode("hello world") == tok.encode("hello world"));
  }

  TEST_CASE("sentencepiece: a missing or corrupt model is an Error naming the file") {
    try {
      SentencePieceTokenizer t("/nonexistent/tokenizer.model");
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("/nonexistent/tokenizer.model") != std::string::npos);
    }
    const std::string bad = std::string(HYBRIDRL_FIXTURES_DIR) + "/models/llama/config.json";
    CHECK_THROWS_AS(SentencePieceTokenizer{bad}, Error);
  }

  TEST_CASE("byte tokenizer: bytes, BOS, specials skipped on decode") {
    ByteTokenizer t;
    auto ids = t.encode("hé", true);
    CHECK(ids == std::vector<int64_t>{ByteTokenizer::kBos, 'h', 0xC3, 0xA9});
    ids.push_back(ByteTokenizer::kEos);
    CHECK(t.decode(ids) == "hé");
    CHECK_THROWS_AS(t.decode({999}), Error);
  }
}
