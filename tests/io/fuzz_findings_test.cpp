// What the libFuzzer targets (tests/fuzz/, scripts/fuzz.sh) found, one case per finding: each input
// here crashed, hung, ran out of memory or let an exception other than hybridrl::Error escape
// before its fix, and is now an Error that names the field. docs/reliability.md ("Fuzzing") lists
// them with the target that found each.
#include <hybridrl/hybridrl.hpp>
#include <hybridrl/trainer/run.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using namespace hybridrl::testing;

namespace {

namespace fs = std::filesystem;

/// A fresh scratch directory, removed at scope exit.
struct FuzzScratch {
  fs::path path;
  explicit FuzzScratch(const std::string& tag)
      : path(fs::temp_directory_path() / ("hybridrl_fuzzfind_" + tag + "_" + std::to_string(::getpid()))) {
    io::detail::remove_tree(path.string());
    fs::create_directories(path);
  }
  ~FuzzScratch() { io::detail::remove_tree(path.string()); }
};

void fuzz_write(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes; }

/// The message of the hybridrl::Error `f` throws; any other exception fails the case (that was the
/// finding: a nlohmann or yaml-cpp exception past the parser).
std::string fuzz_only_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("not a hybridrl::Error: " << e.what());
  }
  return "(no error)";
}

}  // namespace

TEST_SUITE("io/fuzz_findings") {
  TEST_CASE("yaml_config: a string value that is not UTF-8 is refused when read (it could not be written back)") {
    // a raw 0xFF in a YAML scalar: yaml-cpp passes it on; run_config.json's dump() threw
    // nlohmann's type_error 316 after the run had started
    RunConfig<GRPOTrainer> cfg;
    const auto yaml = fuzz_only_error([&] { from_yaml("trainer:\n  output_dir: out\xFFput\n", cfg, "run.yaml"); });
    CHECK(contains(yaml, "trainer.output_dir = \"out\xFFput\" is not UTF-8 text (byte 3) (from run.yaml)"));
    CHECK(contains(fuzz_only_error([&] { apply_override(cfg, "trainer.output_dir", "\xC3("); }), "is not UTF-8 text (byte 0)"));
    // an overlong form and a surrogate are not UTF-8 either; a 4-byte character is
    CHECK(contains(fuzz_only_error([&] { apply_override(cfg, "trainer.output_dir", "a\xC0\xAF"); }), "(byte 1)"));
    CHECK(contains(fuzz_only_error([&] { apply_override(cfg, "trainer.output_dir", "\xED\xA0\x80"); }), "(byte 0)"));
    CHECK(fuzz_only_error([&] { apply_override(cfg, "trainer.output_dir", "runs/\xF0\x9F\x9A\x80"); }) == "(no error)");
    CHECK(cfg.run().trainer().output_dir() == "runs/\xF0\x9F\x9A\x80");
    // a wrong type whose text is not UTF-8: the message quoted it through json::dump(), which threw
    CHECK(contains(fuzz_only_error([&] { apply_override(cfg, "trainer.total_steps", "\xFF"); }), "is not an integer"));
  }

  TEST_CASE("yaml_config: a mapping key that is not a scalar is invalid YAML, not a yaml-cpp exception") {
    RunConfig<GRPOTrainer> cfg;
    CHECK(contains(fuzz_only_error([&] { from_yaml("? [a, b]\n: 1\n", cfg, "run.yaml"); }), "run.yaml is not valid YAML"));
    CHECK(contains(fuzz_only_error([&] { from_yaml("trainer:\n  ? {x: 1}\n  : 2\n", cfg, "run.yaml"); }), "is not valid YAML"));
  }

  TEST_CASE("yaml_config: a table of non-UTF-8 bytes where algorithm.name belongs is a name like any other") {
    // the fuzzer's input (build-fuzz/findings/yaml_config/crash-df1464ca…): take_key dumped the table
    // with json::dump(), which threw type_error 316 for the bytes 0xCA
    FuzzScratch d("yaml");
    const auto path = d.path / "run.yaml";
    fuzz_write(path, "algorithm:\n  name:\n    tds: [1,\xCA\xCA\xCA 5]\ntrainer:\n  total_steps: 2\n");
    std::string algorithm;
    CHECK(fuzz_only_error([&] { algorithm = read_run_sources(path.string(), {}).algorithm; }) == "(no error)");
    CHECK(io::invalid_utf8_at(algorithm) == std::string::npos);
    CHECK(contains(algorithm, "tds"));
  }

  TEST_CASE("config_json: Qwen2's derived layer_types is bounded (10^12 layers was a 10^12-entry list)") {
    auto j = nlohmann::json::parse(std::ifstream(std::string(HYBRIDRL_FIXTURES_DIR) + "/models/qwen2_swa/config.json"));
    j.erase("layer_types");  // transformers 4.x files: derived from max_window_layers
    CHECK(config_from_json(j).layer_types == std::vector<std::string>{"full_attention", "sliding_attention"});
    j["num_hidden_layers"] = 1000000000000;
    CHECK(contains(fuzz_only_error([&] { (void)config_from_json(j); }),
                   "num_hidden_layers = 1000000000000 is more layers than any model has (at most 65536"));
  }

  TEST_CASE("tokenizer_json: ids, counts and fields of the wrong kind are Errors, not an allocation or UB") {
#if HYBRIDRL_WITH_PCRE2 && HYBRIDRL_WITH_ICU
    FuzzScratch d("tok");
    const auto original = nlohmann::json::parse(std::ifstream(std::string(HYBRIDRL_FIXTURES_DIR) + "/tokenizers/qwen2/tokenizer.json"));
    const auto refused = [&](const std::function<void(nlohmann::json&)>& edit) {
      auto j = original;
      edit(j);
      fuzz_write(d.path / "tokenizer.json", j.dump());
      return fuzz_only_error([&] { const HFTokenizer t(d.path.string()); });
    };
    CHECK(refused([](auto&) {}) == "(no error)");
    // an id of 2^40: the token table was resized to it (8 TB)
    const auto huge = refused([](auto& j) { j["model"]["vocab"]["hello"] = int64_t{1} << 40; });
    CHECK(contains(huge, "model.vocab gives \"hello\" the id 1099511627776, outside [0, "));
    CHECK(contains(huge, "fix: pass a consistent tokenizer.json"));
    CHECK(contains(refused([](auto& j) { j["added_tokens"][0]["id"] = -3; }), "added_tokens gives"));
    // 1e300 as an id: get<int64_t>() of it is undefined behaviour; 2^64 - 1 wrapped to -1
    CHECK(contains(refused([](auto& j) { j["added_tokens"][0]["id"] = 1e300; }), "added_tokens[].id = 1e+300 is not an integer"));
    CHECK(contains(refused([](auto& j) { j["added_tokens"][0]["id"] = 18446744073709551615ull; }),
                   "added_tokens[].id = 18446744073709551615 is not an integer"));
    // a field of the wrong type: nlohmann's type_error escaped
    CHECK(contains(refused([](auto& j) { j["model"]["ignore_merges"] = "yes"; }),
                   "a field is missing or has the wrong type"));
    CHECK(contains(refused([](auto& j) { j["added_tokens"][0].erase("content"); }), "a field is missing or has the wrong type"));
    // an empty Metaspace replacement split at every position, an empty Strip content looped
    CHECK(contains(refused([](auto& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", ""}}; }),
                   "pre_tokenizer.replacement is empty"));
    CHECK(contains(refused([](auto& j) { j["decoder"] = {{"type", "Strip"}, {"content", ""}, {"start", 1}, {"stop", 0}}; }),
                   "decoder.content is empty"));
    CHECK(contains(refused([](auto& j) { j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", 1e300}, {"stop", 0}}; }),
                   "decoder.start = 1e+300 is not an integer"));
    // tokenizer_config.json: a special token's content of the wrong type
    fuzz_write(d.path / "tokenizer.json", original.dump());
    fuzz_write(d.path / "tokenizer_config.json", R"({"bos_token": {"content": 5}})");
    CHECK(contains(fuzz_only_error([&] { const HFTokenizer t(d.path.string()); }),
                   "tokenizer_config.json': a field has the wrong type"));
#else
    MESSAGE("built without PCRE2 or ICU: no HFTokenizer");
#endif
  }

  TEST_CASE("tokenizer_json: a chat template of a megabyte is read in linear time (std::regex overflowed the stack)") {
    const std::string big(size_t{1} << 20, 'a');
    const auto plain = ChatFormat::from_template("<|im_start|>system\n" + big);
    REQUIRE(plain.has_value());
    CHECK(plain->default_system.empty());  // no <|im_end|>: no literal system turn
    // what the regex found, the loop finds: the first literal system turn, after \n or the escaped \\n
    const auto sys = ChatFormat::from_template("{{ '<|im_start|>system\\nYou are Qwen.<|im_end|>' }}" + big);
    REQUIRE(sys.has_value());
    CHECK(sys->default_system == "You are Qwen.");
    CHECK(ChatFormat::from_template("<|im_start|>system{x}<|im_end|><|im_start|>system\nSecond.<|im_end|>")->default_system ==
          "Second.");
    const auto dated = ChatFormat::from_template("<|start_header_id|><|eot_id|>Cutting Knowledge Date: " + big +
                                                 "\"{% set date_string = '1 Jan 2025' %}");
    REQUIRE(dated.has_value());
    CHECK(dated->date == "1 Jan 2025");
    CHECK(dated->system_preamble == "Cutting Knowledge Date: " + big + "\nToday Date: {date}\n\n");  // to the quote
  }

  TEST_CASE("checkpoint_dir: trainer_state.json's numbers and a shard index of impossible sizes are Errors") {
    FuzzScratch d("ckpt");
    const auto dir = d.path / "step";
    fs::create_directories(dir);
    const std::map<std::string, at::Tensor> none;
    // without its checksum (an older checkpoint), trainer_state.json is read as it stands
    save_safetensors((dir / "trainer_state.safetensors").string(), {{"x", at::ones({2})}});
    save_safetensors((dir / "model.safetensors").string(), {{"w", at::ones({2})}});
    const auto load = [&](const std::string& state) {
      fuzz_write(dir / "trainer_state.json", state);
      return fuzz_only_error([&] {
        const auto c = CheckpointManager::load(dir.string());
        (void)c.algorithm_state();
      });
    };
    CHECK(load(R"({"step": 3})") == "(no error)");
    // algorithm_state of the wrong type: get<std::map<std::string, double>> threw a type_error
    CHECK(contains(load(R"({"step": 3, "algorithm_state": {"kl_coef": "high"}})"),
                   "trainer_state.json's algorithm_state['kl_coef'] = \"high\" is not a number"));
    CHECK(contains(load(R"({"step": 3, "algorithm_state": [1, 2]})"), "algorithm_state is array, not an object"));
    CHECK(contains(load(R"({"step": 1e300})"), "trainer_state.json's step = 1e+300 is not a step number"));
    CHECK(contains(load(R"({"step": 18446744073709551615})"), "is not a step number"));
    // a sharded index: a shape whose element count overflows, a piece offset past 2^63 (std::stoll threw)
    CHECK(contains(load(R"({"step": 3, "checkpoint_format": "sharded",
                            "shards": {"files": [], "shapes": {"w": [4611686018427387904, 4]}}})"),
                   "gives 'w' the impossibly large shape [4611686018427387904, 4]"));
    save_safetensors((dir / "shard.safetensors").string(), {{"w@99999999999999999999", at::ones({4})}});
    CHECK(contains(load(R"({"step": 3, "checkpoint_format": "sharded",
                            "shards": {"files": ["shard.safetensors"], "shapes": {"w": [4]}}})"),
                   "tensor 'w@99999999999999999999': not a piece name"));
  }
}
