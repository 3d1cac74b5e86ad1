// tokenizer.json (HFTokenizer) against Hugging Face `tokenizers`: the ids, the ids with special
// tokens and the decoded text of 10⁴ strings per fixture style (tests/fixtures/tokenizers/, made by
// tests/fixtures/make_tokenizer_fixtures.py: Qwen2, Llama-3 and a byte-fallback BPE), the special
// ids of tokenizer_config.json and generation_config.json, and every refusal of a file it cannot
// reproduce.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "hybridrl/data/dataset.hpp"
#include "hybridrl/io/atomic_file.hpp"
#include "hybridrl/tokenizer/chat.hpp"
#include "hybridrl/tokenizer/tokenizer.hpp"
#if HYBRIDRL_WITH_PCRE2 && HYBRIDRL_WITH_ICU
#include "hybridrl/tokenizer/hf_tokenizer.hpp"
#endif
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;

#if HYBRIDRL_WITH_PCRE2 && HYBRIDRL_WITH_ICU
namespace {

std::string tokenizer_fixture(const std::string& style) {
  return std::string(HYBRIDRL_FIXTURES_DIR) + "/tokenizers/" + style;
}

std::string hf_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

/// A scratch directory holding `tokenizer.json` = the Qwen2 fixture's JSON after `edit`.
struct EditedTokenizer {
  std::string dir;
  explicit EditedTokenizer(const std::string& tag, const std::function<void(nlohmann::json&)>& edit) {
    dir = (std::filesystem::temp_directory_path() / ("hybridrl_hf_" + tag + "_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir);
    std::ifstream in(tokenizer_fixture("qwen2") + "/tokenizer.json");
    auto j = nlohmann::json::parse(in);
    edit(j);
    std::ofstream(dir + "/tokenizer.json") << j.dump();
  }
  ~EditedTokenizer() { io::detail::remove_tree(dir); }
};

}  // namespace

TEST_SUITE("model/hf_tokenizer") {
  TEST_CASE("tokenizer.json: ids, special ids and decode equal Hugging Face tokenizers on 10^4 strings per style") {
    for (const std::string style : {"qwen2", "llama3", "fallback"}) {
      CAPTURE(style);
      const HFTokenizer tok(tokenizer_fixture(style));
      std::ifstream in(tokenizer_fixture(style) + "/conformance.jsonl");
      REQUIRE(in.good());
      std::string line;
      int lines = 0, wrong_ids = 0, wrong_special = 0, wrong_text = 0, with_special = 0;
      while (std::getline(in, line)) {
        const auto j = nlohmann::json::parse(line);
        const auto text = j["text"].get<std::string>();
        const auto want = j["ids"].get<std::vector<int64_t>>();
        const auto got = tok.encode(text, false);
        if (got != want && wrong_ids++ < 3) {  // the first few in full
          CAPTURE(text);
          CHECK(got == want);
        }
        const auto decoded = j.contains("decoded") ? j["decoded"].get<std::string>() : text;
        if (tok.decode(want) != decoded && wrong_text++ < 3) {
          CAPTURE(text);
          CHECK(tok.decode(want) == decoded);
        }
        if (j.contains("ids_special")) {
          ++with_special;
          if (tok.encode(text, true) != j["ids_special"].get<std::vector<int64_t>>()) ++wrong_special;
        }
        ++lines;
      }
      CHECK(lines == 10000);
      CHECK(with_special == 200);
      CHECK(wrong_ids == 0);
      CHECK(wrong_text == 0);
      CHECK(wrong_special == 0);
    }
  }

  TEST_CASE("decode of any ids equals tokenizers', U+FFFD where the bytes are not UTF-8 (2000 sequences per style)") {
    for (const std::string style : {"qwen2", "llama3", "fallback"}) {
      CAPTURE(style);
      const HFTokenizer tok(tokenizer_fixture(style));
      std::ifstream in(tokenizer_fixture(style) + "/decode.jsonl");
      REQUIRE(in.good());
      std::string line;
      int lines = 0, wrong = 0, lossy = 0;
      while (std::getline(in, line)) {
        const auto j = nlohmann::json::parse(line);
        const auto want = j["text"].get<std::string>();
        const auto got = tok.decode(j["ids"].get<std::vector<int64_t>>());
        if (got != want && wrong++ < 3) {
          CAPTURE(j["ids"].dump());
          CHECK(got == want);
        }
        if (want.find("\xEF\xBF\xBD") != std::string::npos) ++lossy;
        ++lines;
      }
      CHECK(lines == 2000);
      CHECK(lossy > 100);  // the cases do cut characters
      CHECK(wrong == 0);
    }
    // the maximal-subpart rule by hand: a cut 3-byte character is one U+FFFD, a stray byte one each
    CHECK(hybridrl::detail::hf::utf8_lossy("a\xE2\x82") == "a\xEF\xBF\xBD");
    CHECK(hybridrl::detail::hf::utf8_lossy("\xE2\x82\xAC\x80\xFFz") == "\xE2\x82\xAC\xEF\xBF\xBD\xEF\xBF\xBDz");
    CHECK(hybridrl::detail::hf::utf8_lossy("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate: 3
    CHECK(hybridrl::detail::hf::utf8_lossy("\xF0\x9F\x98") == "\xEF\xBF\xBD");
  }

  TEST_CASE("the pipelines by hand: Qwen2 single digits and NFC, Llama-3 digit triples and <|begin_of_text|>") {
    const HFTokenizer qwen(tokenizer_fixture("qwen2")), llama(tokenizer_fixture("llama3"));
    // Qwen2's regex takes digits one by one; Llama-3's in runs of up to three
    const auto q = qwen.encode("12345", false), l = llama.encode("12345", false);
    CHECK(q.size() == 5);
    CHECK(l == std::vector<int64_t>{llama.token_id("123"), llama.token_id("45")});
    // NFC: a decomposed é (e + U+0301) encodes as the composed one in Qwen2, not in Llama-3
    CHECK(qwen.encode("caf\xC3\xA9", false) == qwen.encode("cafe\xCC\x81", false));
    CHECK(llama.encode("caf\xC3\xA9", false) != llama.encode("cafe\xCC\x81", false));
    // special tokens inside text are single ids; add_special follows the post-processor
    const auto im_start = qwen.token_id("<|im_start|>");
    CHECK(qwen.encode("<|im_start|>user", false).front() == im_start);
    CHECK(qwen.encode("hi", true) == qwen.encode("hi", false));  // Qwen2 adds nothing
    const auto bot = llama.token_id("<|begin_of_text|>");
    CHECK(llama.encode("hi", true).front() == bot);
    CHECK(llama.encode("hi", true).size() == llama.encode("hi", false).size() + 1);
    // decode skips special tokens and round-trips what it encodes
    const std::string s = "Hello, 世界! 🙂  x\r\n";
    CHECK(llama.decode(llama.encode(s, true)) == s);
    CHECK(llama.decode(llama.encode(s, true), false) == "<|begin_of_text|>" + s);
    // the byte map: every byte of an unseen code point is a token of its own byte character
    CHECK(qwen.encode("\xF0\x9F\xAA\xBF", false).size() >= 1);  // U+1FABF, absent from the corpus
    CHECK(qwen.decode(qwen.encode("\xF0\x9F\xAA\xBF", false)) == "\xF0\x9F\xAA\xBF");
  }

  TEST_CASE("special ids: tokenizer_config.json (bos, eos, pad), generation_config.json (stop ids)") {
    const HFTokenizer qwen(tokenizer_fixture("qwen2")), llama(tokenizer_fixture("llama3"));
    CHECK(qwen.bos_id() == -1);  // Qwen2 has none
    CHECK(qwen.eos_id() == qwen.token_id("<|im_end|>"));
    CHECK(qwen.pad_id() == qwen.token_id("<|endoftext|>"));
    CHECK(qwen.stop_ids() == std::vector<int64_t>{qwen.eos_id()});
    CHECK(llama.bos_id() == llama.token_id("<|begin_of_text|>"));
    CHECK(llama.pad_id() == -1);
    CHECK(qwen.vocab_size() == 2709);
    // generation_config.json's eos_token_id list replaces the stop ids
    EditedTokenizer d("stops", [](nlohmann::json&) {});
    std::ofstream(d.dir + "/generation_config.json") << R"({"eos_token_id": [1, 2]})";
    std::ofstream(d.dir + "/tokenizer_config.json") << R"({"eos_token": {"content": "<|im_end|>"}, "pad_token": null})";
    const HFTokenizer t(d.dir);
    CHECK(t.stop_ids() == std::vector<int64_t>{1, 2});
    CHECK(t.eos_id() == t.token_id("<|im_end|>"));
    CHECK(t.pad_id() == -1);
    std::ofstream(d.dir + "/tokenizer_config.json") << R"({"eos_token": "<|nope|>"})";
    CHECK(hf_error([&] { HFTokenizer x(d.dir); }).find("eos_token \"<|nope|>\" is not a token") != std::string::npos);
  }

  TEST_CASE("refusals name the file, the field and what is supported") {
    auto refused = [](const std::string& tag, const std::function<void(nlohmann::json&)>& edit) {
      EditedTokenizer d(tag, edit);
      return hf_error([&] { HFTokenizer t(d.dir); });
    };
    const auto wp = refused("wordpiece", [](auto& j) { j["model"]["type"] = "WordPiece"; });
    CHECK(wp.find("model.type = \"WordPiece\" is not supported") != std::string::npos);
    CHECK(wp.find("tokenizer.json") != std::string::npos);
    CHECK(wp.find("BPE models") != std::string::npos);
    CHECK(refused("unigram", [](auto& j) { j["model"]["type"] = "Unigram"; }).find("\"Unigram\" is not supported") != std::string::npos);
    CHECK(refused("dropout", [](auto& j) { j["model"]["dropout"] = 0.1; }).find("model.dropout") != std::string::npos);
    CHECK(refused("pre", [](auto& j) { j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Whitespace"}}; })
              .find("pre_tokenizer.pretokenizers[0].type = \"Whitespace\" is not supported") != std::string::npos);
    CHECK(refused("norm", [](auto& j) { j["normalizer"] = {{"type", "BertNormalizer"}}; }).find("normalizer.type") != std::string::npos);
    CHECK(refused("dec", [](auto& j) { j["decoder"] = {{"type", "WordPiece"}}; }).find("decoder.type") != std::string::npos);
    CHECK(refused("merge", [](auto& j) { j["model"]["merges"][0] = {"nope", "x"}; }).find("model.merges[0]") != std::string::npos);
    CHECK(refused("regex", [](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; })
              .find("the regex does not compile") != std::string::npos);
    CHECK(refused("behavior", [](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; })
              .find("behavior Isolated") != std::string::npos);
    // not JSON, no file, invalid UTF-8 text
    EditedTokenizer bad("json", [](auto&) {});
    std::ofstream(bad.dir + "/tokenizer.json") << "{\"model\": ";
    CHECK(hf_error([&] { HFTokenizer t(bad.dir); }).find("is not valid JSON") != std::string::npos);
    CHECK(hf_error([] { HFTokenizer t("/nonexistent"); }).find("does not exist") != std::string::npos);
    // nesting beyond 64 levels in any of the three files is an Error, not a stack overflow (before:
    // nlohmann::json::parse accepted it and the recursive destructor could overflow the stack)
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    std::ofstream(bad.dir + "/tokenizer.json") << "{\"model\": " << deep << "}";
    CHECK(hf_error([&] { HFTokenizer t(bad.dir); }).find("tokenizer.json' is not valid JSON (nesting deeper than 64") !=
          std::string::npos);
    EditedTokenizer cfg("deep_cfg", [](auto&) {});
    std::ofstream(cfg.dir + "/tokenizer_config.json") << "{\"x\": " << deep << "}";
    CHECK(hf_error([&] { HFTokenizer t(cfg.dir); }).find("tokenizer_config.json' is not valid JSON (nesting deeper") !=
          std::string::npos);
    std::filesystem::remove(cfg.dir + "/tokenizer_config.json");
    std::ofstream(cfg.dir + "/generation_config.json") << "{\"eos_token_id\": " << deep << "}";
    CHECK(hf_error([&] { HFTokenizer t(cfg.dir); }).find("generation_config.json' is not valid JSON (nesting deeper") !=
          std::string::npos);
    std::ofstream(cfg.dir + "/generation_config.json") << "{\"eos_token_id\": \"two\"}";
    CHECK(hf_error([&] { HFTokenizer t(cfg.dir); }).find("eos_token_id is not an integer or a list") != std::string::npos);
    const HFTokenizer qwen(tokenizer_fixture("qwen2"));
    CHECK(hf_error([&] { (void)qwen.encode("ab\xC3(", false); }).find("not valid UTF-8 (byte 2)") != std::string::npos);
    CHECK(hf_error([&] { (void)qwen.decode({qwen.vocab_size()}); }).find("outside the vocabulary") != std::string::npos);
  }

  TEST_CASE("chat formats: the checkpoint's template recognised, ids equal transformers' apply_chat_template") {
    for (const std::string style : {"qwen2", "llama3"}) {
      CAPTURE(style);
      const HFTokenizer tok(tokenizer_fixture(style));
      const auto f = tok.chat_format();
      REQUIRE(f.has_value());
      CHECK(f->name == (style == "qwen2" ? "chatml" : "llama3"));
      if (style == "qwen2") CHECK(f->default_system == "You are a helpful assistant.");
      std::ifstream in(tokenizer_fixture(style) + "/chat.jsonl");
      std::string line;
      int n = 0;
      while (std::getline(in, line)) {
        const auto j = nlohmann::json::parse(line);
        CAPTURE(j["messages"].dump());
        CHECK(f->render(j["messages"]) == j["text"].get<std::string>());
        CHECK(tok.encode(tok.render_chat(j["messages"]), false) == j["ids"].get<std::vector<int64_t>>());
        ++n;
      }
      CHECK(n == 10);
    }
    // by name; an unknown template is not guessed; errors name the problem
    CHECK(ChatFormat::named("llama3").bos == "<|begin_of_text|>");
    CHECK(!ChatFormat::from_template("{{ messages[0]['content'] }}").has_value());
    CHECK(hf_error([] { (void)ChatFormat::named("vicuna"); }).find("\"vicuna\" is not built in") != std::string::npos);
    CHECK(hf_error([] { (void)ChatFormat::chatml().render(nlohmann::json::array()); }).find("not a non-empty list") != std::string::npos);
    CHECK(hf_error([] { (void)ChatFormat::chatml().render(nlohmann::json::parse(R"([{"role": "user"}])")); })
              .find("messages[0] is not") != std::string::npos);
    const HFTokenizer fallback(tokenizer_fixture("fallback"));  // its config has no chat_template
    CHECK(hf_error([&] { (void)fallback.render_chat(nlohmann::json::parse(R"([{"role": "user", "content": "x"}])")); })
              .find("chat_template is missing") != std::string::npos);
  }

  TEST_CASE("chat formats: Llama-3.1/3.2's dated system header equals transformers' apply_chat_template") {
    const HFTokenizer tok(tokenizer_fixture("llama3"));
    for (const std::string version : {"3.1", "3.2"}) {
      CAPTURE(version);
      std::ifstream tf(tokenizer_fixture("llama3") + "/chat_template_llama" + version + ".jinja");
      std::stringstream tpl;
      tpl << tf.rdbuf();
      REQUIRE(!tpl.str().empty());
      auto f = ChatFormat::from_template(tpl.str());
      REQUIRE(f.has_value());
      CHECK(f->name == "llama3.1");
      // 3.1 fixes the date; 3.2 calls strftime_now: today's, as transformers renders it
      CHECK(f->date == (version == "3.1" ? "26 Jul 2024" : ""));
      std::ifstream in(tokenizer_fixture("llama3") + "/chat_llama" + version + ".jsonl");
      std::string line;
      int n = 0;
      while (std::getline(in, line)) {
        const auto j = nlohmann::json::parse(line);
        CAPTURE(j["messages"].dump());
        if (j.contains("date_string")) f->date = j["date_string"].get<std::string>();  // the generator fixed it
        const auto text = f->render(j["messages"]);
        CHECK(text == j["text"].get<std::string>());
        CHECK(tok.encode(text, false) == j["ids"].get<std::vector<int64_t>>());
        ++n;
      }
      CHECK(n == 12);
    }
    // today's date when the template dates with strftime_now ("%d %b %Y", local time): computed
    // here from the calendar, not with strftime
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    static const char* months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    const auto today = fmt::format("{:02d} {} {}", tm.tm_mday, months[tm.tm_mon], 1900 + tm.tm_year);
    const auto dated = ChatFormat::llama31("").render(nlohmann::json::parse(R"([{"role": "user", "content": "hi"}])"));
    CHECK(dated.find("Today Date: " + today + "\n\n<|eot_id|>") != std::string::npos);
    CHECK(ChatFormat::llama31("").describe() == "llama3.1 (dated today)");
    // by name: 3.1's fixed date; the plain Llama-3 template is still llama3
    CHECK(ChatFormat::named("llama3.1").date == "26 Jul 2024");
    CHECK(ChatFormat::named("llama3.1").render(nlohmann::json::parse(R"([{"role": "system", "content": " S "}])")) ==
          "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
          "Today Date: 26 Jul 2024\n\nS<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    CHECK(tok.chat_format()->name == "llama3");
  }

  TEST_CASE("PromptDataset: a `messages` line is rendered by the tokenizer's chat format") {
    const HFTokenizer tok(tokenizer_fixture("qwen2"));
    std::ifstream in(tokenizer_fixture("qwen2") + "/chat.jsonl");
    std::string first;
    std::getline(in, first);
    const auto want = nlohmann::json::parse(first);
    std::stringstream jsonl;
    jsonl << nlohmann::json{{"messages", want["messages"]}, {"answer", "42"}}.dump() << "\n"
          << nlohmann::json{{"prompt", "plain text"}}.dump() << "\n";
    const auto d = PromptDataset::from_stream(jsonl, "<chat>", tok);
    REQUIRE(d.size() == 2);
    CHECK(d[0].prompt_ids == want["ids"].get<std::vector<int64_t>>());
    CHECK(d[1].prompt_ids == tok.encode("plain text", true));
    std::stringstream both;
    both << R"({"prompt": "x", "messages": [{"role": "user", "content": "x"}]})" << "\n";
    CHECK(hf_error([&] { (void)PromptDataset::from_stream(both, "<both>", tok); }).find("both \"prompt\" and \"messages\"") !=
          std::string::npos);
    std::stringstream no_chat;
    no_chat << R"({"messages": [{"role": "user", "content": "x"}]})" << "\n";
    CHECK(hf_error([&] { (void)PromptDataset::from_stream(no_chat, "<bytes>", ByteTokenizer{}); })
              .find("the tokenizer has no chat format") != std::string::npos);
  }

  TEST_CASE("PromptDataset: GSM8K's `question` as one user turn (prompt_key, prompt_template, as_chat)") {
    const HFTokenizer tok(tokenizer_fixture("qwen2"));
    std::ifstream in(tokenizer_fixture("qwen2") + "/chat.jsonl");
    std::string first;
    std::getline(in, first);
    const auto want = nlohmann::json::parse(first);  // [user: "What is 12 + 30?"], transformers' ids
    REQUIRE(want["messages"].size() == 1);
    REQUIRE(want["messages"][0]["content"] == "What is 12 + 30?");
    const auto ids = want["ids"].get<std::vector<int64_t>>();
    auto read = [&](const std::string& line, const DatasetOptions& o) {
      std::stringstream jsonl(line + "\n");
      return PromptDataset::from_stream(jsonl, "<gsm8k>", tok, o);
    };
    const auto o = DatasetOptions{}.prompt_key("question").as_chat(true);
    CHECK(read(R"({"question": "What is 12 + 30?", "answer": "#### 42"})", o)[0].prompt_ids == ids);
    CHECK(read(R"({"question": "What is 12"})", DatasetOptions{o}.prompt_template("{prompt} + 30?"))[0].prompt_ids == ids);
    // a conversation under the key is rendered as it stands (as_chat or not)
    CHECK(read(nlohmann::json{{"question", want["messages"]}}.dump(), DatasetOptions{}.prompt_key("question"))[0].prompt_ids ==
          ids);
    // without as_chat the string is plain text
    CHECK(read(R"({"question": "What is 12 + 30?"})", DatasetOptions{}.prompt_key("question"))[0].prompt_ids ==
          tok.encode("What is 12 + 30?", true));
    CHECK(hf_error([&] { (void)read(R"({"prompt": "x"})", o); }).find("missing field \"question\"") != std::string::npos);
    CHECK(hf_error([&] { (void)read(R"({"question": 7})", o); }).find("field \"question\" is number") != std::string::npos);
  }
}
#endif
