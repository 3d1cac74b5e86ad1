// Datasets from JSONL: fields, tokenisation, and every malformed-line case (raise with file and
// line; skip and count).

#include <sstream>
#include <stdexcept>
#include <streambuf>
#include <string>

#include "hybridrl/data/dataset.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;

namespace {

const std::string kFixtures = std::string(HYBRIDRL_FIXTURES_DIR) + "/data/";

// Runs a one-shot parse of `text` and returns the Error's problem() (empty if none was thrown).
template <class D>
std::string error_of(const std::string& text, DatasetOptions o = {}) {
  std::istringstream in(text);
  try {
    (void)D::from_stream(in, "mem.jsonl", ByteTokenizer{}, o);
  } catch (const Error& e) {
    return e.problem();
  }
  return {};
}

}  // namespace

TEST_SUITE("data/dataset") {
  TEST_CASE("prompts: fields, tokens, uid and extra fields are kept") {
    auto d = PromptDataset::from_jsonl(kFixtures + "prompts.jsonl", ByteTokenizer{});
    REQUIRE(d.size() == 3);
    // "What is 2+3?" is 12 bytes; BOS (257) comes first.
    CHECK(d[0].prompt_ids.size() == 13);
    CHECK(d[0].prompt_ids[0] == ByteTokenizer::kBos);
    CHECK(d[0].prompt_ids[1] == 'W');
    CHECK(d.unit_length(0) == 13);
    CHECK(d[0].data_source == "arith");
    CHECK(d[0].record["level"] == 1);
    CHECK(d[0].uid == "prompts:1");
    // line 2: numeric answer accepted, data_source defaults to the file stem
    CHECK(d[1].record["answer"] == 42);
    CHECK(d[1].data_source == "prompts");
    // the blank line 3 is skipped silently but counted; line 4 has its own uid
    CHECK(d[2].uid == "custom-7");
    CHECK(d.statistics().lines == 4);
    CHECK(d.statistics().blank_lines == 1);
    CHECK(d.statistics().samples == 3);
    CHECK(d.statistics().tokens == 13 + 15 + 7);
    CHECK(d.longest_sequence() == 15);
  }

  TEST_CASE("preference pairs: prompt shared, EOS appended, lengths") {
    auto d = PreferenceDataset::from_jsonl(kFixtures + "pairs.jsonl", ByteTokenizer{});
    REQUIRE(d.size() == 2);
    // BOS Q 1 | g o o d EOS
    CHECK(d[0].prompt_length == 3);
    CHECK(d[0].chosen_ids == std::vector<int64_t>{257, 'Q', '1', 'g', 'o', 'o', 'd', 258});
    CHECK(d[0].rejected_ids == std::vector<int64_t>{257, 'Q', '1', 'b', 'a', 'd', '!', 258});
    CHECK(d.unit_length(1) == 1 + 10 + 3 + 1);  // BOS "Question 2" "yes" EOS
    CHECK(d[1].data_source == "hh");
  }

  TEST_CASE("labelled completions: label must be a boolean") {
    std::string problem;
    try {
      (void)LabelledDataset::from_jsonl(kFixtures + "labelled.jsonl", ByteTokenizer{});
    } catch (const Error& e) {
      problem = e.problem();
    }
    CHECK(problem.find("labelled.jsonl:3") != std::string::npos);
    CHECK(problem.find("label") != std::string::npos);
    CHECK(problem.find("wrong_type") != std::string::npos);

    auto d = LabelledDataset::from_jsonl(kFixtures + "labelled.jsonl", ByteTokenizer{},
                                         DatasetOptions{}.on_error(OnError::skip));
    REQUIRE(d.size() == 2);
    CHECK(d[0].label);
    CHECK_FALSE(d[1].label);
    CHECK(d[0].ids == std::vector<int64_t>{257, 'A', 'x', 'y', 258});
    CHECK(d[1].completion_ids == std::vector<int64_t>{'z', 258});
    // KL pairs may join the longest prompt (BOS BB = 3) with the longest completion (xy EOS = 3)
    CHECK(d.longest_sequence() == 6);
    CHECK(d.statistics().skipped_for(LineError::wrong_type) == 1);
  }

  TEST_CASE("each malformed line raises with file and line number") {
    const std::string ok = "{\"prompt\": \"fine\"}\n";
    CHECK(error_of<PromptDataset>(ok + "{\"prompt\": \"x\"").find("mem.jsonl:2: bad JSON") == 0);
    CHECK(error_of<PromptDataset>(ok + ok + "[1, 2]").find("mem.jsonl:3: the line is a JSON array") == 0);
    CHECK(error_of<PromptDataset>(ok + "{\"answer\": \"5\"}").find("mem.jsonl:2: missing field \"prompt\" (missing_field)") == 0);
    CHECK(error_of<PromptDataset>(ok + "{\"prompt\": 3}").find("mem.jsonl:2: field \"prompt\" is number, expected a string (wrong_type)") == 0);
    CHECK(error_of<PromptDataset>(ok + "{\"prompt\": \"a\", \"answer\": [1]}").find("mem.jsonl:2: field \"answer\" is array") == 0);
    CHECK(error_of<PromptDataset>(ok + "{\"prompt\": \"a\", \"data_source\": 1}").find("(wrong_type)") != std::string::npos);
    CHECK(error_of<PromptDataset>(ok + "{\"prompt\": \"\"}").find("mem.jsonl:2: field \"prompt\" is empty (empty_text)") == 0);
    CHECK(error_of<PromptDataset>(ok + "{\"prompt\": \" \\t \"}").find("(empty_text)") != std::string::npos);
    // "fine" = 5 tokens with BOS; "too long" = 9 > 8
    CHECK(error_of<PromptDataset>(ok + "{\"prompt\": \"too long\"}", DatasetOptions{}.max_prompt_length(8))
              .find("mem.jsonl:2: the prompt is 9 tokens, longer than max_prompt_length = 8 (too_long)") == 0);
    CHECK(error_of<PromptDataset>(ok + "{\"prompt\": \"12345678\"}", DatasetOptions{}.max_prompt_length(9)).empty());
    CHECK(error_of<PreferenceDataset>("{\"prompt\": \"p\", \"chosen\": \"c\"}").find("mem.jsonl:1: missing field \"rejected\"") == 0);
    CHECK(error_of<PreferenceDataset>("{\"prompt\": \"p\", \"chosen\": \"\", \"rejected\": \"r\"}").find("(empty_text)") != std::string::npos);
    // prompt + chosen = BOS p | c c c EOS = 6 > 5
    CHECK(error_of<PreferenceDataset>("{\"prompt\": \"p\", \"chosen\": \"ccc\", \"rejected\": \"r\"}", DatasetOptions{}.max_length(5))
              .find("mem.jsonl:1: prompt + chosen is 6 tokens, longer than max_length = 5") == 0);
    CHECK(error_of<LabelledDataset>("{\"prompt\": \"p\", \"completion\": \"c\"}").find("missing field \"label\"") != std::string::npos);
    CHECK(error_of<LabelledDataset>("{\"prompt\": \"p\", \"completion\": \"c\", \"label\": 1}").find("expected true or false") != std::string::npos);
  }

  TEST_CASE("skip mode: every malformed line is skipped and counted by reason") {
    auto d = PromptDataset::from_jsonl(kFixtures + "prompts_bad.jsonl", ByteTokenizer{},
                                       DatasetOptions{}.on_error(OnError::skip).max_prompt_length(20));
    REQUIRE(d.size() == 2);
    CHECK(d[0].uid == "prompts_bad:1");
    CHECK(d[1].uid == "prompts_bad:7");
    const auto& s = d.statistics();
    CHECK(s.lines == 7);
    CHECK(s.skipped_for(LineError::bad_json) == 1);
    CHECK(s.skipped_for(LineError::missing_field) == 1);
    CHECK(s.skipped_for(LineError::wrong_type) == 1);
    CHECK(s.skipped_for(LineError::empty_text) == 1);
    CHECK(s.skipped_for(LineError::too_long) == 1);
    CHECK(s.skipped_total() == 5);
    REQUIRE(s.first_skips.size() == 5);
    CHECK(s.first_skips[0].find("prompts_bad.jsonl:2:") != std::string::npos);
    CHECK(s.first_skips[4].find("prompts_bad.jsonl:6:") != std::string::npos);
    CHECK(s.to_json()["skipped_too_long"] == 1);
    // raise mode stops at the first bad line (line 2)
    std::string problem;
    try {
      (void)PromptDataset::from_jsonl(kFixtures + "prompts_bad.jsonl", ByteTokenizer{});
    } catch (const Error& e) {
      problem = e.problem();
    }
    CHECK(problem.find("prompts_bad.jsonl:2: bad JSON") != std::string::npos);
  }

  TEST_CASE("prompts: prompt_key and prompt_template (GSM8K's question with an instruction)") {
    std::istringstream in(R"({"question": "2+3?", "answer": "5\n#### 5"})" "\n");
    const auto o = DatasetOptions{}.prompt_key("question").prompt_template("Q: {prompt} Show {prompt} then ####.");
    auto d = PromptDataset::from_stream(in, "gsm8k.jsonl", ByteTokenizer{}, o);
    REQUIRE(d.size() == 1);
    CHECK(d[0].prompt_ids == ByteTokenizer{}.encode("Q: 2+3? Show 2+3? then ####.", true));
    CHECK(d[0].record["answer"] == "5\n#### 5");  // the reward's ground truth, kept
    CHECK(o.templated("") == "Q:  Show  then ####.");
    CHECK(DatasetOptions{}.templated("as is {x}") == "as is {x}");
    CHECK(error_of<PromptDataset>(R"({"prompt": "x"})" "\n", DatasetOptions{}.prompt_key("question"))
              .find("missing field \"question\"") != std::string::npos);
    // as_chat needs a tokenizer with a chat format: ByteTokenizer has none
    CHECK(error_of<PromptDataset>(R"({"question": "x"})" "\n", DatasetOptions{}.prompt_key("question").as_chat(true))
              .find("\"question\" is a conversation but the tokenizer has no chat format") != std::string::npos);
    auto bad = [](const DatasetOptions& x) {
      try {
        x.validate();
      } catch (const Error& e) {
        return e.problem();
      }
      return std::string();
    };
    CHECK(bad(DatasetOptions{}.prompt_template("no placeholder")).find("prompt_template = \"no placeholder\" has no {prompt}") !=
          std::string::npos);
    CHECK(bad(DatasetOptions{}.prompt_key("")).find("prompt_key is empty") != std::string::npos);
  }

  TEST_CASE("missing file and bad options are errors") {
    CHECK_THROWS_AS((void)PromptDataset::from_jsonl(kFixtures + "nope.jsonl", ByteTokenizer{}), Error);
    CHECK_THROWS_AS(DatasetOptions{}.max_length(-1).validate(), Error);
    CHECK_THROWS_AS(DatasetOptions{}.max_length(4).max_prompt_length(8).validate(), Error);
  }

  TEST_CASE("JSONL defects: 1e400, deep nesting and NUL are bad_json lines (raise names file:line, skip counts)") {
    // before: 1e400 escaped as json::out_of_range without file:line, even with skip
    CHECK(error_of<PromptDataset>("{\"prompt\": \"a\"}\n{\"prompt\": \"b\", \"x\": 1e400}\n")
              .find("mem.jsonl:2: bad JSON") != std::string::npos);
    const std::string deep = "{\"prompt\": \"p\", \"x\": " + std::string(100000, '[') +
                             std::string(100000, ']') + "}";
    CHECK(error_of<PromptDataset>(deep).find("mem.jsonl:1: bad JSON (nesting deeper than 64") != std::string::npos);
    CHECK(error_of<PromptDataset>(std::string("{\"prompt\":\"kept\"}") + '\0' + "{\"prompt\":\"dropped\"}")
              .find("NUL byte") != std::string::npos);
    std::istringstream in("{\"prompt\": \"ok\"}\n{\"prompt\": \"b\", \"x\": -1e400}\n" + deep + "\n");
    auto d = PromptDataset::from_stream(in, "mem.jsonl", ByteTokenizer{}, DatasetOptions{}.on_error(OnError::skip));
    CHECK(d.size() == 1);
    CHECK(d.statistics().skipped_for(LineError::bad_json) == 2);
  }

  TEST_CASE("uid: integers keep their value over the whole unsigned range; other types are wrong_type") {
    // before: 2^64 - 1 went through int64_t and became "-1"
    std::istringstream in("{\"prompt\": \"a\", \"uid\": 18446744073709551615}\n"
                          "{\"prompt\": \"b\", \"id\": -3}\n{\"prompt\": \"c\", \"uid\": 9223372036854775808}\n");
    auto d = PromptDataset::from_stream(in, "mem.jsonl", ByteTokenizer{});
    REQUIRE(d.size() == 3);
    CHECK(d[0].uid == "18446744073709551615");
    CHECK(d[1].uid == "-3");
    CHECK(d[2].uid == "9223372036854775808");
    CHECK(error_of<PromptDataset>("{\"prompt\": \"a\", \"uid\": 1.5}\n")
              .find("mem.jsonl:1: field \"uid\" is number, expected a string or integer") != std::string::npos);
  }

  TEST_CASE("read_line: std::getline's lines at every chunk boundary; a line over max_line_bytes is never held") {
    // lengths around the 64 KiB piece (65535 stored + '\n'), empty lines, a last line without '\n'
    const std::vector<size_t> lengths{0, 3, 65534, 65535, 65536, 131071, 0, 200000, 7};
    std::string text;
    for (size_t i = 0; i < lengths.size(); ++i) {
      text += std::string(lengths[i], static_cast<char>('a' + i));
      if (i + 1 < lengths.size()) text += '\n';
    }
    for (const size_t cap : {size_t{1} << 30, size_t{65535}, size_t{3}}) {
      CAPTURE(cap);
      std::istringstream want(text), got(text);
      std::string w, g;
      bool too_long = false;
      size_t lines = 0;
      while (std::getline(want, w)) {
        REQUIRE(hybridrl::detail::read_line(got, g, cap, &too_long));
        CHECK(too_long == (w.size() > cap));
        CHECK(g == (w.size() > cap ? std::string() : w));
        ++lines;
      }
      CHECK(lines == lengths.size());
      CHECK_FALSE(hybridrl::detail::read_line(got, g, cap, &too_long));
      CHECK_FALSE(got.bad());
    }
    // in a dataset: too_long with file:line under raise, skipped and counted under skip
    const std::string data = "{\"prompt\": \"a\"}\n{\"prompt\": \"" + std::string(300000, 'x') +
                             "\"}\n{\"prompt\": \"b\"}";
    const auto msg = error_of<PromptDataset>(data, DatasetOptions{}.max_line_bytes(1000));
    CHECK(msg.find("mem.jsonl:2: the line is longer than max_line_bytes = 1000 bytes") != std::string::npos);
    CHECK(msg.find("(too_long)") != std::string::npos);
    std::istringstream in(data);
    auto d = PromptDataset::from_stream(in, "mem.jsonl", ByteTokenizer{},
                                        DatasetOptions{}.max_line_bytes(1000).on_error(OnError::skip));
    CHECK(d.size() == 2);
    CHECK(d.statistics().lines == 3);
    CHECK(d.statistics().skipped_for(LineError::too_long) == 1);
    CHECK(error_of<PromptDataset>("{}", DatasetOptions{}.max_line_bytes(0)).find("max_line_bytes = 0 is not positive") !=
          std::string::npos);
  }

  TEST_CASE("a read error is an Error, not a silently shorter dataset") {
    struct FailingBuf : std::streambuf {
      std::string data = "{\"prompt\": \"one\"}\n{\"prompt\": \"two\"}\n";
      bool served = false;
      int_type underflow() override {
        if (served) throw std::runtime_error("EIO");  // istream turns this into badbit
        served = true;
        setg(data.data(), data.data(), data.data() + data.size());
        return traits_type::to_int_type(*gptr());
      }
    } buf;
    std::istream in(&buf);
    try {
      (void)PromptDataset::from_stream(in, "mem.jsonl", ByteTokenizer{});
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.problem()).find("mem.jsonl: reading failed after line 2") != std::string::npos);
    }
    // a directory opens as an ifstream but cannot be read
    CHECK_THROWS_AS((void)PromptDataset::from_jsonl(kFixtures, ByteTokenizer{}), Error);
  }

  TEST_CASE("tokenizer errors get file:line and honour skip") {
    struct PickyTokenizer : ByteTokenizer {
      [[nodiscard]] std::vector<int64_t> encode(std::string_view text, bool add_bos = true) const {
        HYBRIDRL_CHECK(text.find("BAD") == std::string_view::npos, "text contains BAD", "remove it");
        return ByteTokenizer::encode(text, add_bos);
      }
    };
    const std::string text = "{\"prompt\": \"fine\"}\n{\"prompt\": \"BAD one\"}\n";
    std::istringstream raise_in(text);
    try {
      (void)PromptDataset::from_stream(raise_in, "mem.jsonl", PickyTokenizer{});
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.problem()).find("mem.jsonl:2: the tokenizer rejected the text: text contains BAD (bad_text)") !=
            std::string::npos);
    }
    std::istringstream skip_in(text);
    auto d = PromptDataset::from_stream(skip_in, "mem.jsonl", PickyTokenizer{}, DatasetOptions{}.on_error(OnError::skip));
    CHECK(d.size() == 1);
    CHECK(d.statistics().skipped_for(LineError::bad_text) == 1);
  }
}
