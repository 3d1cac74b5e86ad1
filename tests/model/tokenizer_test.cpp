// Tokenizers: sentencepiece against the ids transformers (AutoTokenizer, a `tokenizers` conversion of
// tokenizer.model) and the Python sentencepiece library gave for the fixture model
// (tests/fixtures/models/tokenizer), and the byte-level tokenizer.
#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>

#include "hybridrl/model/config.hpp"
#include "hybridrl/tokenizer/tokenizer.hpp"
#if HYBRIDRL_WITH_SENTENCEPIECE
#include "hybridrl/tokenizer/sentencepiece.hpp"
#endif
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using namespace hybridrl::testing;

namespace {
}  // namespace

TEST_SUITE("model/tokenizer") {
#if HYBRIDRL_WITH_SENTENCEPIECE && !HYBRIDRL_ADDRESS_SANITIZER
  TEST_CASE("sentencepiece: ids and decode equal transformers' (AutoTokenizer on tokenizer.model) and sentencepiece's") {
    const std::string dir = std::string(HYBRIDRL_FIXTURES_DIR) + "/models/tokenizer";
    std::ifstream in(dir + "/expected.json");
    REQUIRE(in.good());
    const auto want = nlohmann::json::parse(in);
    REQUIRE_MESSAGE(want.contains("hf_tokenizer"),
                    "regenerate: tests/fixtures/make_model_fixtures.py --hf-token-ids (transformers' ids)");
    MESSAGE("reference: " << want["hf_tokenizer"].get<std::string>());
    SentencePieceTokenizer tok(dir);  // a directory holding tokenizer.model
    CHECK(tok.vocab_size() == want["vocab_size"].get<int64_t>());
    CHECK(tok.bos_id() == want["bos_id"].get<int64_t>());
    CHECK(tok.eos_id() == want["eos_id"].get<int64_t>());
    CHECK(tok.pad_id() == want["pad_id"].get<int64_t>());
    for (const auto& c : want["cases"]) {
      const auto text = c["text"].get<std::string>();
      CAPTURE(text);
      CHECK(tok.encode(text, false) == c["ids"].get<std::vector<int64_t>>());
      REQUIRE(c.contains("hf_ids"));
      CHECK(tok.encode(text, false) == c["hf_ids"].get<std::vector<int64_t>>());  // transformers' tokenizers
      CHECK(tok.decode(tok.encode(text, false)) == c["hf_decoded"].get<std::string>());
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
    // a checkpoint directory without any tokenizer: the fix must not blame tokenizer.json
    const auto msg = error_of([] { SentencePieceTokenizer t(std::string(HYBRIDRL_FIXTURES_DIR) + "/models/llama"); });
    CHECK(msg.find("has no tokenizer.model") != std::string::npos);
    CHECK(msg.find("ByteTokenizer") != std::string::npos);
    CHECK(msg.find("tokenizer.json") == std::string::npos);
  }

  TEST_CASE("sentencepiece: piece() range-checks the id; vocabulary 400 vs model 320 is a clear Error") {
    SentencePieceTokenizer tok(std::string(HYBRIDRL_FIXTURES_DIR) + "/models/tokenizer");
    CHECK(tok.piece(tok.bos_id()) == "<s>");
    CHECK(error_of([&] { (void)tok.piece(tok.vocab_size()); }).find("outside the vocabulary") != std::string::npos);
    CHECK(error_of([&] { (void)tok.piece(-1); }).find("outside the vocabulary") != std::string::npos);
    // 2^32 + 5 would have been truncated to 5 by the int cast
    CHECK_THROWS_AS((void)tok.piece((int64_t{1} << 32) + 5), Error);
    auto config = load_config(std::string(HYBRIDRL_FIXTURES_DIR) + "/models/llama");
    REQUIRE(config.vocab_size == 320);
    REQUIRE(tok.vocab_size() == 400);
    const auto msg = error_of([&] { check_vocabulary(tok, config); });
    CHECK(msg.find("vocabulary has 400 ids but the model's vocab_size is 320") != std::string::npos);
    CHECK(msg.find("320..399") != std::string::npos);
  }
#elif HYBRIDRL_WITH_SENTENCEPIECE
  TEST_CASE("sentencepiece under AddressSanitizer: a clear Error, not ASan's abort at dlopen (RTLD_DEEPBIND)") {
    const auto e = error_of([] { SentencePieceTokenizer t(std::string(HYBRIDRL_FIXTURES_DIR) + "/models/tokenizer"); });
    CHECK(contains(e, "which AddressSanitizer does not support"));
  }
#endif

  TEST_CASE("check_vocabulary: a tokenizer within the model's vocabulary passes") {
    ModelConfig c;
    c.vocab_size = 320;
    check_vocabulary(ByteTokenizer{}, c);  // 259 <= 320
    c.vocab_size = 258;
    CHECK(error_of([&] { check_vocabulary(ByteTokenizer{}, c); }).find("259 ids") != std::string::npos);
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
