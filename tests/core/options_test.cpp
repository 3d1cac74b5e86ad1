// Options reflection (core/config.hpp, core/options_yaml.hpp): JSON and YAML round trips for every
// Options type, dotted and environment overrides with their precedence, type / enum / unknown-key
// errors with the nearest valid key, describe and --help, and docs/configuration.md kept complete.
// Expected values are written out by hand (formats, messages) or derived from a per-field
// perturbation that makes every field differ from its default.

#include <hybridrl/hybridrl.hpp>
#include <hybridrl/core/config.hpp>
#if HYBRIDRL_WITH_YAML
#include <hybridrl/core/options_yaml.hpp>
#endif

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using namespace hybridrl::testing;
using nlohmann::json;

namespace {

// ---- a user algorithm with reflectable options, so Trainer::Options can be tested here ----
enum class Mode { fast, careful };
}  // namespace
namespace hybridrl {
HYBRIDRL_ENUM_NAMES(Mode, fast, careful);
}
namespace {

struct ClipOptions {
  HYBRIDRL_ARG(double, clip_low) = 0.2;
  HYBRIDRL_ARG(double, clip_high) = 0.2;
  HYBRIDRL_ARG(Mode, mode) = Mode::fast;
  HYBRIDRL_FIELDS(clip_low, clip_high, mode)
  void validate() const {
    HYBRIDRL_CHECK(clip_low_ > 0 && clip_low_ < 1, fmt::format("clip_low = {} must lie in (0, 1)", clip_low_),
                   "use 0.2");
  }
};
struct OnlineAlgo {};
struct OfflineAlgo {};

// Every field type the configuration supports.
struct Inner {
  HYBRIDRL_ARG(int64_t, depth) = 2;
  HYBRIDRL_FIELDS(depth)
};
struct AllTypes {
  HYBRIDRL_ARG(bool, flag) = false;
  HYBRIDRL_ARG(int32_t, small) = 3;
  HYBRIDRL_ARG(int64_t, count) = -4;
  HYBRIDRL_ARG(uint64_t, big) = 5;
  HYBRIDRL_ARG(double, ratio) = 0.5;
  HYBRIDRL_ARG(std::string, name) = "abc";
  HYBRIDRL_ARG(Mode, mode) = Mode::fast;
  HYBRIDRL_ARG(c10::ScalarType, dtype) = c10::ScalarType::BFloat16;
  HYBRIDRL_ARG(c10::Device, device) = c10::Device(c10::kCPU);
  HYBRIDRL_ARG(std::optional<double>, limit) = std::nullopt;
  HYBRIDRL_ARG(std::vector<std::string>, tags) = {};
  HYBRIDRL_ARG(Inner, inner) = {};
  HYBRIDRL_FIELDS(flag, small, count, big, ratio, name, mode, dtype, device, limit, tags, inner)
  void validate() const {}
};

}  // namespace

template <>
struct hybridrl::Algorithm<OnlineAlgo>
    : hybridrl::algorithm_base<OnlineAlgo, ClipOptions, DataKind::prompts> {
  static constexpr std::string_view name = "OnlineAlgo";
  static void compute_advantages(TensorBatch&, const options_type&, state_type&) {}
  static LossOutput loss(const TensorBatch& b, const options_type&, const state_type&,
                         const LossCounts&) {
    return {b.tensor("x").sum(), {}};
  }
};
template <>
struct hybridrl::Algorithm<OfflineAlgo>
    : hybridrl::algorithm_base<OfflineAlgo, ClipOptions, DataKind::preference_pairs> {
  static constexpr std::string_view name = "OfflineAlgo";
  static LossOutput loss(const TensorBatch& b, const options_type&, const state_type&,
                         const LossCounts&) {
    return {b.tensor("x").sum(), {}};
  }
};

using PagedTrainer = Trainer<Algorithm<OnlineAlgo>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
using MeshTrainer = Trainer<Algorithm<OnlineAlgo>, Sharding<TP3D>, Rollout<Paged>, Loader<Packed>>;
using OfflineTrainer = Trainer<Algorithm<OfflineAlgo>, Sharding<FSDP>, Loader<Packed>>;

// Every Options type of rollout/, sharding/, data/, the geometry, and a few trainers. Algorithm
// option types (algorithm/*.hpp) are added to this list by one line each.
#define HYBRIDRL_TEST_OPTION_TYPES                                                               \
  SamplingOptions, NaiveOptions, PagedOptions, FSDPOptions, TP3DOptions, LoaderCommonOptions,    \
      BucketedOptions, PackedOptions, BatchGeometry, AllTypes, PagedTrainer::Options,             \
      MeshTrainer::Options, OfflineTrainer::Options, ActorLossOptions, KLControlOptions,          \
      PPOOptions, GRPOOptions, DPOOptions, KTOOptions, GRPOTrainer::Options, DPOTrainer::Options

namespace {

// A value different from `v`, per type: every field of a perturbed struct differs from its default.
template <class T>
void perturb(T& v) {
  if constexpr (reflectable_options<T>) {
    hybridrl::detail::for_each_field(v, [](std::string_view, auto& f) { perturb(f); });
  } else if constexpr (std::is_same_v<T, bool>) {
    v = !v;
  } else if constexpr (std::is_integral_v<T>) {
    v = static_cast<T>(v + 3);
  } else if constexpr (std::is_floating_point_v<T>) {
    v = v * 2 + 0.125;
  } else if constexpr (std::is_same_v<T, std::string>) {
    v += "-x";
  } else if constexpr (named_enum<T>) {
    const auto& vals = enum_names<T>::values;
    for (std::size_t i = 0; i < vals.size(); ++i) {
      if (vals[i].first == v) {
        v = vals[(i + 1) % vals.size()].first;
        return;
      }
    }
  } else if constexpr (std::is_same_v<T, c10::ScalarType>) {
    v = v == c10::ScalarType::Half ? c10::ScalarType::Float : c10::ScalarType::Half;
  } else if constexpr (std::is_same_v<T, c10::Device>) {
    v = v.is_cpu() ? c10::Device("cuda:1") : c10::Device(c10::kCPU);
  } else if constexpr (hybridrl::detail::is_optional<T>::value) {
    if (v) v.reset(); else v = typename hybridrl::detail::is_optional<T>::value_type{};
  } else if constexpr (hybridrl::detail::is_vector<T>::value) {
    typename hybridrl::detail::is_vector<T>::value_type x{};
    perturb(x);
    v.push_back(x);
  }
}

// The value of the dotted key `k` in the JSON tree `j`.
json leaf(const json& j, const std::string& k) {
  std::string pointer = "/" + k;
  std::replace(pointer.begin(), pointer.end(), '.', '/');
  return j.at(json::json_pointer(pointer));
}

// The line of `--help` text for `key`.
std::string help_line(const std::string& help, const std::string& key) {
  std::istringstream in(help);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("  " + key + " ", 0) == 0) return line;
  }
  return "no line for " + key;
}
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}


}  // namespace

TEST_SUITE("core/options") {
  TEST_CASE_TEMPLATE("JSON round trip of every field, and every field reaches the file", O,
                     HYBRIDRL_TEST_OPTION_TYPES) {
    O changed{};
    perturb(changed);
    const json defaults = to_json(O{});
    const json j = to_json(changed);
    // every leaf differs from its default: from_json below must read each one to round-trip
    const auto keys = config_keys<O>();
    REQUIRE(!keys.empty());
    for (const auto& k : keys) {
      CAPTURE(k);
      CHECK(leaf(j, k) != leaf(defaults, k));
    }
    const O back = from_json<O>(j);
    CHECK(to_json(back) == j);
    CHECK(checkpoint_metadata(back) == j);
    // nlohmann's own conversions find the same functions (by ADL: for types of namespace hybridrl)
    if constexpr (!std::is_same_v<O, AllTypes>) {
      const json via_adl = back;
      CHECK(via_adl == j);
      CHECK(to_json(j.get<O>()) == j);
    }
    // through text, as a checkpoint stores it
    CHECK(to_json(from_json<O>(json::parse(j.dump()))) == j);
    // a file that names nothing keeps the defaults
    CHECK(to_json(from_json<O>(json::object())) == defaults);
  }

#if HYBRIDRL_WITH_YAML
  TEST_CASE_TEMPLATE("YAML -> Options -> YAML round trip", O, HYBRIDRL_TEST_OPTION_TYPES) {
    O changed{};
    perturb(changed);
    const std::string y = to_yaml(changed);
    const O back = from_yaml<O>(y);
    CHECK(to_yaml(back) == y);
    CHECK(to_json(back) == to_json(changed));
    CHECK(to_json(from_yaml<O>(to_yaml(O{}))) == to_json(O{}));
  }

  TEST_CASE("YAML: scalars are parsed by the field's type; errors carry the path") {
    const std::string y = R"(
flag: true
small: 7
count: -12
big: 18446744073709551615
ratio: 0.28
name: "0.5"
mode: careful
dtype: float16
device: cuda:1
limit: 2.5
tags: [a, b]
inner:
  depth: 9
)";
    const auto o = from_yaml<AllTypes>(y);
    CHECK(o.flag());
    CHECK(o.small() == 7);
    CHECK(o.count() == -12);
    CHECK(o.big() == 18446744073709551615ull);
    CHECK(o.ratio() == 0.28);
    CHECK(o.name() == "0.5");  // a string field keeps number-like text as text
    CHECK(o.mode() == Mode::careful);
    CHECK((o.dtype() == c10::ScalarType::Half));
    CHECK((o.device() == c10::Device(c10::kCUDA, 1)));
    CHECK(o.limit() == 2.5);
    CHECK(o.tags() == std::vector<std::string>{"a", "b"});
    CHECK(o.inner().depth() == 9);
    CHECK(!from_yaml<AllTypes>("limit: ~").limit().has_value());
    const auto e = error_of([] { AllTypes a; from_yaml("inner:\n  depht: 3\n", a, "run.yaml"); });
    CHECK(contains(e, "unknown configuration key inner.depht (from run.yaml); did you mean inner.depth?"));
    CHECK(contains(error_of([] { (void)from_yaml<AllTypes>("small: many"); }), "small = \"many\" is not an integer"));
    CHECK(contains(error_of([] { (void)from_yaml<AllTypes>("a: [unclosed"); }), "is not valid YAML"));
  }
#endif

  TEST_CASE("JSON spelling: enums, dtypes and devices by name, nested tables") {
    // written out by hand: the format a file and a checkpoint use
    const json expected = json::parse(R"({
      "flag": false, "small": 3, "count": -4, "big": 5, "ratio": 0.5, "name": "abc",
      "mode": "fast", "dtype": "bfloat16", "device": "cpu", "limit": null, "tags": [],
      "inner": {"depth": 2}})");
    CHECK(to_json(AllTypes{}) == expected);
    CHECK(to_json(SamplingOptions{}) == json::parse(R"({"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                                                      "max_new_tokens": 256, "min_new_tokens": 0, "stop_token_ids": [],
                                                      "ignore_eos": false, "seed": 0})"));
    // loader: the common fields sit at the loader's level; batch_size and seed are not keys
    CHECK(config_keys<BucketedOptions>() ==
          std::vector<std::string>{"shuffle", "drop_last", "epochs", "prefetch_factor", "pin_memory",
                                   "prompt_padding", "max_tokens_per_batch", "window_batches"});
    // geometry: prompts per step (data.train_batch_size), samples per prompt (rollout.n), world_size
    // and rollout_tensor_parallel_size are owned elsewhere
    CHECK(config_keys<BatchGeometry>() ==
          std::vector<std::string>{"ppo_mini_batch_size", "micro_batch_size_per_gpu", "sequence_parallel_size",
                                   "ppo_epochs", "adaptive_micro_batch", "micro_batch_memory_fraction",
                                   "max_tokens_per_micro_batch", "old_log_probs_from_update"});
    // sampling: every field is a key (rollout.seed; a Trainer derives it from its run seed)
    CHECK(config_keys<SamplingOptions>() ==
          std::vector<std::string>{"temperature", "top_k", "top_p", "min_p", "max_new_tokens",
                                   "min_new_tokens", "stop_token_ids", "ignore_eos", "seed"});
    // an offline trainer has no rollout table
    const auto off = config_keys<OfflineTrainer::Options>();
    CHECK(std::none_of(off.begin(), off.end(), [](const std::string& k) { return k.rfind("rollout", 0) == 0; }));
    for (const char* k : {"trainer.seed", "trainer.total_steps", "trainer.output_dir", "trainer.save_every",
                          "trainer.keep_last", "trainer.resume", "data.train_files", "data.train_batch_size", "optim.lr"}) {
      CAPTURE(k);
      CHECK(std::find(off.begin(), off.end(), k) != off.end());
    }
  }

  TEST_CASE("enums round-trip by name; an unknown name lists the valid ones") {
    for (const auto& [v, n] : enum_names<PaddingSide>::values) {
      BucketedOptions o;
      apply_override(o, "prompt_padding", n);
      CHECK(o.prompt_padding() == v);
      CHECK(to_json(o)["prompt_padding"] == std::string(n));
    }
    BucketedOptions o;
    const auto e = error_of([&] { apply_override(o, "prompt_padding", "middle"); });
    CHECK(contains(e, "prompt_padding = \"middle\" is not one of left, right"));
    CHECK(contains(error_of([&] { FSDPOptions f; apply_override(f, "param_dtype", "bfloat8"); }),
                   "param_dtype = \"bfloat8\" is not a dtype name"));
  }

  TEST_CASE("dotted overrides set one field, parsed by its type") {
    PagedTrainer::Options o;
    apply_override(o, "algorithm.clip_high", "0.28");
    CHECK(o.algorithm().clip_high() == 0.28);
    apply_overrides(o, {"rollout.temperature=0.7", "rollout.prefix_sharing=false",
                        "rollout.stop_token_ids=[2, 5]", "sharding.param_dtype=float32",
                        "geometry.ppo_epochs=4", "loader.shuffle=false", "trainer.seed=11", "algorithm.mode=careful"});
    CHECK(o.rollout().sampling().temperature() == 0.7);
    CHECK(!o.rollout().prefix_sharing());
    CHECK(o.rollout().sampling().stop_token_ids() == std::vector<int64_t>{2, 5});
    CHECK((o.sharding().param_dtype() == c10::ScalarType::Float));
    CHECK(o.geometry().ppo_epochs() == 4);
    CHECK(!o.loader().shuffle());
    CHECK(o.trainer().seed() == 11u);
    CHECK(o.algorithm().mode() == Mode::careful);
    // the rest kept its defaults
    CHECK(o.rollout().block_size() == 16);
    CHECK(o.algorithm().clip_low() == 0.2);

    AllTypes a;
    apply_overrides(a, {"limit=3.5", "device=cuda:0", "big=7", "name=hello world"});
    CHECK(a.limit() == 3.5);
    CHECK((a.device() == c10::Device(c10::kCUDA, 0)));
    CHECK(a.big() == 7u);
    CHECK(a.name() == "hello world");
    apply_override(a, "limit", "null");
    CHECK(!a.limit().has_value());
  }

  TEST_CASE("override errors: unknown key with the nearest one, wrong type with the expected one") {
    PagedTrainer::Options o;
    const auto typo = error_of([&] { apply_override(o, "algorithm.clip_hihg", "0.28"); });
    CHECK(contains(typo, "unknown configuration key algorithm.clip_hihg (from override); did you mean algorithm.clip_high?"));
    CHECK(contains(typo, "algorithm.clip_low, algorithm.clip_high, algorithm.mode"));  // the keys at that level
    CHECK(contains(error_of([&] { apply_override(o, "rollot.block_size", "32"); }), "did you mean rollout.block_size?"));
    CHECK(contains(error_of([&] { apply_override(o, "geometry.world_size", "8"); }), "unknown configuration key geometry.world_size"));
    const auto far = error_of([&] { apply_override(o, "completely_unrelated_thing", "1"); });
    CHECK(contains(far, "unknown configuration key completely_unrelated_thing"));
    CHECK(!contains(far, "did you mean"));

    const auto type = error_of([&] { apply_override(o, "rollout.top_k", "abc"); });
    CHECK(contains(type, "rollout.top_k = \"abc\" is not an integer"));
    CHECK(contains(type, "give rollout.top_k a value of type integer"));
    CHECK(contains(error_of([&] { apply_override(o, "rollout.block_size", "1.5"); }), "rollout.block_size = \"1.5\" is not an integer"));
    CHECK(contains(error_of([&] { apply_override(o, "rollout.prefix_sharing", "yes"); }), "is not a bool"));
    CHECK(contains(error_of([&] { apply_override(o, "trainer.seed", "-1"); }),
                   "trainer.seed = \"-1\" is not an unsigned integer in range"));
    CHECK(contains(error_of([&] { apply_override(o, "rollout", "3"); }), "rollout = \"3\" is not a table"));
    CHECK(contains(error_of([&] { apply_overrides(o, {"rollout.block_size"}); }), "has no key=value form"));
    // JSON files are typed: a string where a number belongs is an error
    CHECK(contains(error_of([&] { from_json(json{{"rollout", {{"block_size", "32"}}}}, o, "run.json"); }),
                   "rollout.block_size = \"32\" is not an integer (from run.json)"));
    AllTypes a;
    CHECK(contains(error_of([&] { apply_override(a, "small", "4294967296"); }), "small = \"4294967296\" is not an integer in range"));
    CHECK(contains(error_of([&] { apply_override(a, "tags", "[1, 2]"); }), "tags[0] = 1 is not a string"));
    // a list of strings may be written bare on the command line, or as one item
    apply_override(a, "tags", "[a.jsonl, dir/b c.jsonl]");
    CHECK(a.tags() == std::vector<std::string>{"a.jsonl", "dir/b c.jsonl"});
    apply_override(a, "tags", "one.jsonl");
    CHECK(a.tags() == std::vector<std::string>{"one.jsonl"});
    apply_override(a, "tags", "[]");
    CHECK(a.tags().empty());
    PagedTrainer::Options p;
    apply_override(p, "rollout.stop_token_ids", "7");
    CHECK(p.rollout().sampling().stop_token_ids() == std::vector<int64_t>{7});
    CHECK(contains(error_of([&] { apply_override(p, "rollout.stop_token_ids", "[2, x]"); }),
                   "rollout.stop_token_ids[1] = \"x\" is not an integer"));
  }

  TEST_CASE("precedence: defaults < file < environment < command line") {
    ConfigSources s;
    s.file = json::parse(R"({"rollout": {"block_size": 32, "max_num_seqs": 64, "n": 4}, "trainer": {"seed": 1}})");
    s.file_name = "run.json";
    s.environment = {{"HYBRIDRL_ROLLOUT__BLOCK_SIZE", "64"}, {"HYBRIDRL_TRAINER__SEED", "2"},
                     {"HYBRIDRL_ROLLOUT__N", "8"}, {"OTHER_SEED", "99"}};
    s.overrides = {"trainer.seed=3"};
    const auto o = configure(PagedTrainer::Options{}, s);
    CHECK(o.rollout().block_size() == 64);      // environment over file
    CHECK(o.rollout().max_num_seqs() == 64);    // file over default
    CHECK(o.rollout().n() == 8);                // environment over file
    CHECK(o.trainer().seed() == 3u);            // command line over environment
    CHECK(o.rollout().memory_fraction() == 0.5);  // default
    CHECK(env_key("HYBRIDRL_ROLLOUT__TOP_P", "HYBRIDRL_") == "rollout.top_p");

    ConfigSources bad;
    bad.environment = {{"HYBRIDRL_ROLOUT__BLOCK_SIZE", "64"}};
    const auto e = error_of([&] { (void)configure(PagedTrainer::Options{}, bad); });
    CHECK(contains(e, "unknown configuration key rolout.block_size (from environment variable HYBRIDRL_ROLOUT__BLOCK_SIZE); did you mean rollout.block_size?"));
    // the library's own switches are not keys (HYBRIDRL_FAULT was "unknown configuration key fault")
    ConfigSources switches;
    switches.environment = {{"HYBRIDRL_FAULT", "kill:model.safetensors"},
                            {"HYBRIDRL_FUSED_KERNELS", "0"},
                            {"HYBRIDRL_CUDNN_ATTENTION", "0"},
                            {"HYBRIDRL_PDL", "1"}};
    CHECK(error_of([&] { (void)configure(PagedTrainer::Options{}, switches); }) == "(no error)");
    // ... and every switch the library reads is one of them (HYBRIDRL_CUDNN_ATTENTION was not)
    {
      namespace fs = std::filesystem;
      const fs::path root = fs::path(HYBRIDRL_FIXTURES_DIR) / ".." / "..";
      const std::regex read_switch(R"re(getenv\("(HYBRIDRL_[A-Z0-9_]+)"\))re");
      std::vector<std::string> found;
      for (const auto* dir : {"include/hybridrl", "src/cuda", "apps"}) {
        for (const auto& entry : fs::recursive_directory_iterator(root / dir)) {
          if (!entry.is_regular_file()) continue;
          std::ifstream in(entry.path());
          const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
          for (std::sregex_iterator it(text.begin(), text.end(), read_switch), end; it != end; ++it) found.push_back((*it)[1]);
        }
      }
      CHECK(found.size() >= 4);
      for (const auto& name : found) {
        CAPTURE(name);
        CHECK(std::find(process_variables.begin(), process_variables.end(), name) != process_variables.end());
      }
    }

    // the real process environment
    ::setenv("HYBRIDRL_TESTOPT_ROLLOUT__CUDA_GRAPHS", "false", 1);
    PagedTrainer::Options p;
    apply_environment(p, environment_variables("HYBRIDRL_TESTOPT_"), "HYBRIDRL_TESTOPT_");
    ::unsetenv("HYBRIDRL_TESTOPT_ROLLOUT__CUDA_GRAPHS");
    CHECK(!p.rollout().cuda_graphs());
  }

  TEST_CASE_TEMPLATE("describe and help list every field with its full path", O, HYBRIDRL_TEST_OPTION_TYPES) {
    O changed{};
    perturb(changed);
    const auto keys = config_keys<O>();
    const json j = to_json(changed);
    const std::string d = describe(changed), h = help<O>();
    std::size_t lines = 0;
    for (char c : d) lines += c == '\n';
    CHECK(lines == keys.size());
    for (const auto& k : keys) {
      CAPTURE(k);
      CHECK(contains(d, k + " = " + leaf(j, k).dump() + "\n"));
      CHECK(ends_with(help_line(h, k), " (default: " + leaf(to_json(O{}), k).dump() + ")"));
    }
  }

  TEST_CASE("help shows type and default; describe shows values") {
    const auto h = help<PagedOptions>();
    CHECK(ends_with(help_line(h, "block_size"), " <integer> (default: 16)"));
    CHECK(ends_with(help_line(h, "temperature"), " <number> (default: 1.0)"));
    CHECK(ends_with(help_line(h, "prefix_sharing"), " <bool> (default: true)"));
    CHECK(ends_with(help_line(help<BucketedOptions>(), "prompt_padding"), " <one of {left, right}> (default: \"left\")"));
    CHECK(ends_with(help_line(help<FSDPOptions>(), "param_dtype"),
                    " <dtype (float32, bfloat16, float16, float64, int64, ...)> (default: \"bfloat16\")"));
    CHECK(describe(TP3DOptions{}.tensor_parallel_size(2)) ==
          "data_parallel_size = -1\ntensor_parallel_size = 2\npipeline_parallel_size = 1\nsequence_parallel = false\n"
          "param_dtype = \"bfloat16\"\nactivation_checkpointing = false\n");
  }

  TEST_CASE("did-you-mean uses edit distance") {
    CHECK(hybridrl::detail::edit_distance("kitten", "sitting") == 3);
    CHECK(hybridrl::detail::edit_distance("", "abc") == 3);
    CHECK(hybridrl::detail::edit_distance("clip_high", "clip_high") == 0);
    CHECK(hybridrl::detail::nearest_key("algorithm.clip_hihg", {"algorithm.clip_low", "algorithm.clip_high"}) == "algorithm.clip_high");
  }

  TEST_CASE("the bounded edit distance equals the full one up to its limit") {
    // the textbook O(|a| × |b|) table, written out here as the reference
    const auto full = [](const std::string& a, const std::string& b) {
      std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
      for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
      for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
      for (std::size_t i = 1; i <= a.size(); ++i) {
        for (std::size_t j = 1; j <= b.size(); ++j) {
          d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0u : 1u)});
        }
      }
      return d[a.size()][b.size()];
    };
    CHECK(hybridrl::detail::edit_distance("kitten", "sitting", 2) == 3);  // over the limit: limit + 1
    CHECK(hybridrl::detail::edit_distance("kitten", "sitting", 3) == 3);
    CHECK(hybridrl::detail::edit_distance("abc", "", 1) == 2);
    uint64_t state = 12345;  // strings over a 3-letter alphabet, so that most pairs share letters
    const auto next = [&] { return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
    int checked = 0;
    for (int n = 0; n < 3000; ++n) {
      std::string a(next() % 12, 'a'), b(next() % 12, 'a');
      for (auto& c : a) c = static_cast<char>('a' + next() % 3);
      for (auto& c : b) c = static_cast<char>('a' + next() % 3);
      const std::size_t want = full(a, b);
      for (std::size_t limit = 0; limit <= 13; ++limit) {
        const std::size_t got = hybridrl::detail::edit_distance(a, b, limit);
        if (want <= limit) {
          REQUIRE_MESSAGE(got == want, a, " / ", b, " limit ", limit);
        } else {
          REQUIRE_MESSAGE(got == limit + 1, a, " / ", b, " limit ", limit);
        }
        ++checked;
      }
      REQUIRE(hybridrl::detail::edit_distance(a, b) == want);
    }
    CHECK(checked == 3000 * 14);
    // a long mistyped key gets no suggestion; the nearest of several is the first at the least distance
    CHECK(hybridrl::detail::nearest_key(std::string(4000, 'x'), {"algorithm.clip_low", "algorithm.clip_high"}).empty());
    CHECK(hybridrl::detail::nearest_key("rollout.nn", {"rollout.n", "rollout.m", "rollout.nnn"}) == "rollout.n");
    CHECK(hybridrl::detail::nearest_key("abcdefgh", {"zzzzzzzz"}).empty());  // 8 edits > max(3, 8 / 3)
    CHECK(hybridrl::detail::nearest_key("abcdefgh", {"abcdzzzz"}).empty());  // 4 edits > 3
    CHECK(hybridrl::detail::nearest_key("abcdefgh", {"abcdezzz"}) == "abcdezzz");  // 3 edits
  }

  TEST_CASE("docs/configuration.md lists every key with its type and default") {
    std::ifstream in(std::string(HYBRIDRL_FIXTURES_DIR) + "/../../docs/configuration.md");
    REQUIRE(in.good());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string doc = ss.str();
    auto check_all = [&](const std::string& prefix, const std::string& table) {
      std::istringstream lines(table);
      std::string line;
      std::getline(lines, line);  // header
      while (std::getline(lines, line)) {
        // "  key  <type> (default: value)" -> "| `prefix.key` | type | value |"
        const auto k0 = line.find_first_not_of(' ');
        const auto k1 = line.find(' ', k0);
        const auto t0 = line.find('<'), t1 = line.rfind("> (default: ");
        const std::string key = line.substr(k0, k1 - k0);
        const std::string type = line.substr(t0 + 1, t1 - t0 - 1);
        const std::string def = line.substr(t1 + 12, line.size() - t1 - 13);
        const std::string row = "| `" + prefix + key + "` | " + type + " | `" + def + "` |";
        CAPTURE(row);
        CHECK(contains(doc, row));
      }
    };
    check_all("trainer.", help<TrainerOptions>());
    check_all("data.", help<DataOptions>());
    check_all("optim.", help<OptimizerOptions>());
    check_all("geometry.", help<BatchGeometry>());
    check_all("rollout.", help<PagedOptions>());
    check_all("rollout.", help<NaiveOptions>());
    check_all("sharding.", help<FSDPOptions>());
    check_all("sharding.", help<TP3DOptions>());
    check_all("loader.", help<BucketedOptions>());
    check_all("loader.", help<PackedOptions>());
    check_all("placement.", help<PlacementOptions>());
    CHECK(contains(doc, "| `trainer.seed` | unsigned integer | `0` |"));
  }

  // Prints the tables of docs/configuration.md: ./build/tests/core_tests -tc="print*" --no-skip
  TEST_CASE("print the configuration tables" * doctest::skip()) {
    auto table = [](const std::string& prefix, const std::string& help) {
      std::istringstream lines(help);
      std::string line, out = "| key | type | default |\n|---|---|---|\n";
      std::getline(lines, line);
      while (std::getline(lines, line)) {
        const auto k0 = line.find_first_not_of(' ');
        const auto k1 = line.find(' ', k0);
        const auto t0 = line.find('<'), t1 = line.rfind("> (default: ");
        out += "| `" + prefix + line.substr(k0, k1 - k0) + "` | " + line.substr(t0 + 1, t1 - t0 - 1) +
               " | `" + line.substr(t1 + 12, line.size() - t1 - 13) + "` |\n";
      }
      return out;
    };
    std::cout << "## trainer\n" << table("trainer.", help<TrainerOptions>())
              << "\n## data\n" << table("data.", help<DataOptions>())
              << "\n## optim\n" << table("optim.", help<OptimizerOptions>())
              << "\n## critic (algorithms with a critic: PPO)\n" << table("critic.", help<CriticOptions>())
              << "\n## geometry\n" << table("geometry.", help<BatchGeometry>())
              << "\n## rollout: Rollout<Paged>\n" << table("rollout.", help<PagedOptions>())
              << "\n## rollout: Rollout<Naive>\n" << table("rollout.", help<NaiveOptions>())
              << "\n## sharding: Sharding<FSDP>\n" << table("sharding.", help<FSDPOptions>())
              << "\n## sharding: Sharding<TP3D>\n" << table("sharding.", help<TP3DOptions>())
              << "\n## loader: Loader<Bucketed>\n" << table("loader.", help<BucketedOptions>())
              << "\n## loader: Loader<Packed>\n" << table("loader.", help<PackedOptions>())
              << "\n## placement\n" << table("placement.", help<PlacementOptions>());
  }
}
