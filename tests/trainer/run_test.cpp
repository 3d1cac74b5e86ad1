// The run machinery of trainer/run.hpp (what `hybridrl train` and the examples run): the trainer
// registry's names, defaults and errors, a program's own reward by name, the arguments, the
// configuration layers and the checks made before anything is loaded.
#include <doctest/doctest.h>

#include <hybridrl/hybridrl.hpp>
#include <hybridrl/trainer/run.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "../support/fit.hpp"

using namespace hybridrl;

namespace {

std::string run_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool mentions(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

RunSources run_sources(std::vector<std::string> overrides) {
  RunSources s = read_run_sources("", overrides);
  s.sources.environment.clear();  // the test's own environment does not count
  return s;
}

}  // namespace

TEST_SUITE("trainer/run") {
  TEST_CASE("the built-in registry: names in order, defaults grpo and paged, errors name the valid names") {
    const auto r = builtin_trainers();
    CHECK(r.algorithms() == std::vector<std::string>{"grpo", "ppo", "dpo", "kto", "sft"});
    // --help of the default is GRPO on Rollout<Paged>; of ppo naive, PPO's keys with critic.*
    const auto h = r.help();
    CHECK(mentions(h, "configuration keys of algorithm.name=grpo rollout.name=paged"));
    CHECK(mentions(h, "rollout.kv_cache_tokens"));
    const auto hp = r.help("ppo", "naive");
    CHECK(mentions(hp, "algorithm.name=ppo rollout.name=naive"));
    CHECK(mentions(hp, "critic.optim.lr"));
    CHECK(!mentions(hp, "rollout.kv_cache_tokens"));  // Rollout<Naive> has no KV pool
    CHECK(mentions(r.help("dpo"), "loader.row_length"));  // offline presets pack their rows
    // errors, before anything is read
    const auto unknown = run_error([&] { (void)r.help("grop"); });
    CHECK(mentions(unknown, "algorithm.name = \"grop\" is not one of grpo, ppo, dpo, kto, sft (did you mean grpo?)"));
    CHECK(mentions(unknown, "examples/custom_algorithm"));
    CHECK(mentions(run_error([&] { (void)r.help("grpo", "vllm"); }), "rollout.name = \"vllm\" is not one of paged, naive"));
    CHECK(mentions(run_error([&] { (void)r.run(run_sources({"algorithm.name=dpo", "rollout.name=paged"}), true); }),
                   "rollout.name = paged is set but algorithm.name = dpo generates nothing"));
    // sharding.name: fsdp (the default) or tp3d (grpo and ppo with Rollout<Paged>)
    CHECK(mentions(h, "sharding.name  <one of {fsdp, tp3d}>"));
    CHECK(mentions(h, "sharding.shard_group_size"));
    const auto ht = r.help("grpo", "", "tp3d");
    CHECK(mentions(ht, "algorithm.name=grpo rollout.name=paged sharding.name=tp3d"));
    CHECK(mentions(ht, "sharding.tensor_parallel_size"));
    CHECK(!mentions(ht, "sharding.shard_group_size"));
    const auto hpt = r.help("ppo", "paged", "tp3d");
    CHECK(mentions(hpt, "sharding.tensor_parallel_size"));
    CHECK(mentions(hpt, "critic.optim.lr"));
    CHECK(mentions(r.help("dpo"), "sharding.name  <one of {fsdp}>"));
    CHECK(mentions(run_error([&] { (void)r.help("dpo", "", "tp3d"); }),
                   "sharding.name = \"tp3d\" is not one of fsdp (with algorithm.name = dpo)"));
    const auto naive_tp = run_error([&] { (void)r.help("grpo", "naive", "tp3d"); });
    CHECK(mentions(naive_tp, "sharding.name = \"tp3d\" is not one of fsdp (with algorithm.name = grpo, rollout.name = naive)"));
    CHECK(mentions(naive_tp, "Sharding<TP3D> needs Rollout<Paged>"));
    CHECK(mentions(run_error([&] { (void)r.help("grpo", "", "fdsp"); }), "is not one of fsdp, tp3d (with algorithm.name = grpo) (did you mean fsdp?)"));
    // chosen from the command line, and checked for the world before anything loads: TP 2 on one process
    const auto tp_run = run_sources({"sharding.name=tp3d", "sharding.tensor_parallel_size=2", "task.name=reverse", "model.init=tiny",
                                     "trainer.total_steps=1"});
    CHECK(tp_run.sharding == "tp3d");
    CHECK(tp_run.sources.overrides.size() == 4);  // sharding.name is taken out; its table's other keys stay
    CHECK(mentions(run_error([&] { (void)r.run(tp_run, true); }),
                   "tensor_parallel_size × pipeline_parallel_size = 2 × 1 = 2 does not divide world_size 1"));
  }

  TEST_CASE("registering: a custom trainer type and reward join the built-ins; misuse is an Error") {
    auto r = builtin_trainers();
    using MyGRPO = NaiveGRPOTrainer;
    r.add<MyGRPO>("mine", "naive");
    CHECK(r.algorithms().back() == "mine");
    CHECK(mentions(r.help("mine"), "algorithm.name=mine rollout.name=naive"));
    CHECK(mentions(run_error([&] { r.add<MyGRPO>("mine", "naive"); }), "registered twice"));
    CHECK(mentions(run_error([&] { r.add<MyGRPO>("other"); }), "an online trainer needs a rollout name"));
    CHECK(mentions(run_error([&] { r.add<DPOTrainer>("other", "paged"); }), "an offline trainer has no rollout"));
    CHECK(mentions(run_error([&] { r.add_reward("none", RewardFn{}); }), "an empty function"));
    CHECK(mentions(run_error([] { (void)TrainerRegistry{}.help(); }), "no trainer type is registered"));
  }

  TEST_CASE("a registered reward is chosen by reward.name and scores the run") {
    // A reward that gives every response 0.25: the run's mean reward must be exactly that, which
    // no built-in reward of the reverse task gives a random model's responses.
    testing::FitTempDir dir("run_reward");
    auto r = TrainerRegistry{}.add<NaiveGRPOTrainer>("grpo", "naive");
    int calls = 0;
    r.add_reward("quarter", [&calls](const RewardInput&) {
      ++calls;
      return 0.25;
    });
    const auto s = run_sources({"task.name=reverse", "model.init=tiny", "reward.name=quarter", "trainer.total_steps=1",
                               "trainer.output_dir=" + dir.path, "trainer.save_model=false", "data.train_batch_size=2",
                               "rollout.n=2", "rollout.max_new_tokens=3", "geometry.ppo_mini_batch_size=2",
                               "geometry.micro_batch_size_per_gpu=4"});
    CHECK(r.run(s, false) == 0);
    CHECK(calls == 4);  // 2 prompts × 2 samples
    const auto m = testing::reproducible_metrics(dir.path);
    REQUIRE(m.size() == 1);
    CHECK(m[0]["reward_mean"].get<double>() == doctest::Approx(0.25).epsilon(1e-12));
    CHECK(m[0]["reward_std"].get<double>() == doctest::Approx(0.0));
    // print_only: the effective configuration and no run (no second metrics line)
    CHECK(r.run(s, true) == 0);
    CHECK(testing::reproducible_metrics(dir.path).size() == 1);
  }

  TEST_CASE("arguments, layers and the checks before loading") {
    char prog[] = "train", c1[] = "--config", c2[] = "run.yaml", o1[] = "a.b=1", p[] = "--print-config", h[] = "-h";
    char* argv[] = {prog, c1, c2, o1, p, h};
    const auto a = parse_run_args(6, argv);
    CHECK(a.config_file == "run.yaml");
    CHECK(a.overrides == std::vector<std::string>{"a.b=1"});
    CHECK(a.print_only);
    CHECK(a.help);
    char bad[] = "--verbose";
    char* argv2[] = {prog, bad};
    CHECK(mentions(run_error([&] { (void)parse_run_args(2, argv2); }), "unexpected argument '--verbose'"));

    // algorithm.name and rollout.name are taken out of every layer: file < environment < command line
    ConfigSources cs;
    cs.file = nlohmann::json{{"algorithm", {{"name", "dpo"}, {"beta", 0.2}}}, {"rollout", {{"name", "naive"}}}};
    cs.environment = {{"HYBRIDRL_ALGORITHM__NAME", "kto"}};
    cs.overrides = {"algorithm.name=sft", "trainer.seed=3"};
    CHECK(take_key(cs, "algorithm", "name") == std::optional<std::string>("sft"));
    CHECK(cs.file->at("algorithm") == nlohmann::json{{"beta", 0.2}});  // the other keys stay
    CHECK(cs.environment.empty());
    CHECK(cs.overrides == std::vector<std::string>{"trainer.seed=3"});
    CHECK(take_key(cs, "rollout", "name") == std::optional<std::string>("naive"));
    CHECK(!cs.file->contains("rollout"));  // an emptied table goes
    cs.environment = {{"HYBRIDRL_ROLLOUT__NAME", "paged"}};
    CHECK(take_key(cs, "rollout", "name") == std::optional<std::string>("paged"));
    CHECK(!take_key(cs, "rollout", "name").has_value());

    // a program that trains one type refuses another's configuration
    RunSources rs;
    rs.algorithm = "ppo";
    CHECK(mentions(run_error([&] { rs.require("grpo"); }), "algorithm.name = ppo but this program trains grpo"));
    rs.algorithm = "grpo";
    rs.rollout = "naive";
    CHECK(mentions(run_error([&] { rs.require("grpo", "paged"); }), "rollout.name = naive but this program generates with paged"));
    CHECK_NOTHROW(rs.require("grpo"));
    rs.sharding = "tp3d";
    CHECK(mentions(run_error([&] { rs.require("grpo"); }), "sharding.name = tp3d but this program trains with fsdp"));
    CHECK_NOTHROW(rs.require("grpo", "naive", "tp3d"));

    // checked before loading: one of model.path / model.init, a device, data
    CHECK(mentions(run_error([] { (void)configure_run<GRPOTrainer>(run_sources({"task.name=reverse"}).sources); }),
                   "neither path nor init is set"));
    CHECK(mentions(run_error([] {
                     (void)configure_run<GRPOTrainer>(run_sources({"task.name=reverse", "model.init=tiny", "model.device=gpu"}).sources);
                   }),
                   "device = \"gpu\" is not a device"));
    CHECK(mentions(run_error([] { (void)configure_run<SFTTrainer>(run_sources({"model.init=tiny"}).sources); }),
                   "neither task.name nor data.train_files is set"));
    CHECK(mentions(run_error([] { (void)configure_run<SFTTrainer>(run_sources({"model.init=tiny", "reward.name=gsm8k"}).sources); }),
                   "reward.name"));  // offline runs have no reward table
    CHECK(mentions(run_error([] { (void)read_run_sources("/nonexistent/run.yaml", {}); }), "cannot open the configuration"));
    // a JSON configuration (and a checkpoint's trainer_state.json) nested beyond 64 levels is an
    // Error naming the file, not a stack overflow in the later copies
    const auto dir = std::filesystem::temp_directory_path() / ("hybridrl_deep_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir / "step_00000001");
    const std::string deep = "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
    std::ofstream((dir / "run.json").string()) << deep;
    CHECK(mentions(run_error([&] { (void)read_run_sources((dir / "run.json").string(), {}); }),
                   "run.json' is not valid JSON (nesting deeper than 64 levels)"));
    for (const char* f : {"trainer_state.json", "model.safetensors", "trainer_state.safetensors"}) {
      std::ofstream((dir / "step_00000001" / f).string()) << deep;
    }
    CHECK(mentions(run_error([&] { (void)CheckpointManager::load((dir / "step_00000001").string()); }),
                   "trainer_state.json' is not valid JSON (nesting deeper than 64 levels)"));
    io::detail::remove_tree(dir.string());  // not remove_all: see below
  }

  TEST_CASE("a damaged checkpoint: any one flipped bit of its files is an Error or loads the same state, never another") {
#if HYBRIDRL_WITH_XXHASH
    namespace fs = std::filesystem;
    const auto dir = fs::temp_directory_path() / ("hybridrl_damaged_" + std::to_string(::getpid()));
    io::detail::remove_tree(dir.string());
    CheckpointManager ck(dir.string(), 2);
    const std::map<std::string, at::Tensor> tensors = {{"model.w", at::arange(6, at::kFloat).view({2, 3}) / 7.0},
                                                       {"optimizer.step", at::scalar_tensor(3, at::kLong)},
                                                       {"optimizer.m", at::linspace(-1, 1, 5)}};
    const nlohmann::json meta = {{"loader", {{"epoch", 1}, {"batch_in_epoch", 2}, {"seed", 7}}}};
    const auto path = ck.save(3, tensors, meta);
    const auto good = CheckpointManager::load(path);
    const auto same = [&](const CheckpointData& d) {
      if (d.step != good.step || d.meta != good.meta || d.tensors.size() != good.tensors.size()) return false;
      for (const auto& [k, v] : good.tensors) {
        if (d.tensors.count(k) == 0 || !at::equal(d.tensors.at(k), v)) return false;
      }
      return true;
    };
    // every bit 0 of every byte (XOR 1 turns a digit into another digit), file by file
    int64_t refused = 0, harmless = 0;
    for (const char* name : {"model.safetensors", "trainer_state.safetensors", "trainer_state.json"}) {
      CAPTURE(name);
      const auto file = (fs::path(path) / name).string();
      std::string bytes;
      {
        std::ifstream in(file, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
      }
      REQUIRE(!bytes.empty());
      for (size_t i = 0; i < bytes.size(); ++i) {
        CAPTURE(i);
        std::string bad = bytes;
        bad[i] = static_cast<char>(bad[i] ^ 0x01);
        std::ofstream(file, std::ios::binary | std::ios::trunc) << bad;
        try {
          const auto d = CheckpointManager::load(path);
          CHECK(same(d));  // a byte that carries nothing we read (the "format" tag, padding)
          ++harmless;
        } catch (const Error& e) {
          CHECK(std::string(e.what()).find(name) != std::string::npos);  // the error names the file
          ++refused;
        }
      }
      std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    }
    CHECK(same(CheckpointManager::load(path)));
    CHECK(refused > 10 * harmless);  // nearly every byte is covered by a checksum or the format
    MESSAGE(refused << " flips refused, " << harmless << " harmless");
    // a tensor's byte names the tensor; trainer_state.json's digit names the file
    {
      const auto file = (fs::path(path) / "model.safetensors").string();
      SafetensorsFile f(file);
      const auto at = f.entry("w").begin;
      std::string bytes;
      {
        std::ifstream in(file, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
      }
      uint64_t n = 0;
      std::memcpy(&n, bytes.data(), 8);
      bytes[8 + n + at] = static_cast<char>(bytes[8 + n + at] ^ 0x40);
      std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
      CHECK(mentions(run_error([&] { (void)CheckpointManager::load(path); }), "model.safetensors', tensor 'w'"));
    }
    io::detail::remove_tree(dir.string());
#else
    MESSAGE("built without xxHash: checkpoints carry no checksums");
#endif
  }

  TEST_CASE("a checkpoint's tokenizer: tokenizer.json first, its chat format, the files to copy; model.chat_format") {
#if HYBRIDRL_WITH_PCRE2 && HYBRIDRL_WITH_ICU
    const std::string dir = std::string(HYBRIDRL_FIXTURES_DIR) + "/tokenizers/qwen2";
    std::vector<std::string> files;
    const auto tok = load_checkpoint_tokenizer(dir, &files);
    REQUIRE(tok.has_value());
    CHECK(tok->vocab_size() == HFTokenizer(dir).vocab_size());
    CHECK(tok->encode("12 + 30", false) == HFTokenizer(dir).encode("12 + 30", false));
    REQUIRE(tok->chat.has_value());
    CHECK(tok->chat->name == "chatml");
    CHECK(files == std::vector<std::string>{dir + "/tokenizer.json", dir + "/tokenizer_config.json"});
    // load_run_tokenizer: no weights read, model.chat_format applied, the files, checked against
    // config.json's vocabulary before any weights load
    const std::string chat_model = std::string(HYBRIDRL_FIXTURES_DIR) + "/models/qwen2_chat";
    const auto rt = load_run_tokenizer(RunModelOptions{}.path(chat_model).chat_format("llama3.1"));
    REQUIRE(rt.tokenizer.chat.has_value());
    CHECK(rt.tokenizer.chat->name == "llama3.1");
    CHECK(rt.files.back() == chat_model + "/generation_config.json");
    CHECK(describe_tokenizer(RunModelOptions{}.path(chat_model), rt) ==
          fmt::format("tokenizer {}/tokenizer.json (2709 ids), chat format llama3.1 (dated 26 Jul 2024) "
                      "(model.chat_format=auto)", chat_model));
    const hybridrl::testing::FitTempDir mixed_dir("run_tok");  // (not std::filesystem::remove_all: torch 2.11's
    const std::filesystem::path mixed(mixed_dir.path);           // libtorch.so exports a copy that crashes)
    std::filesystem::copy_file(dir + "/tokenizer.json", mixed / "tokenizer.json",
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy_file(std::string(HYBRIDRL_FIXTURES_DIR) + "/models/qwen2/config.json", mixed / "config.json",
                               std::filesystem::copy_options::overwrite_existing);  // vocab 320, and no weights
    CHECK(mentions(run_error([&] { (void)load_run_tokenizer(RunModelOptions{}.path(mixed.string())); }),
                   "the model's vocab_size is 320"));
#endif
    CHECK(!load_checkpoint_tokenizer(std::string(HYBRIDRL_FIXTURES_DIR) + "/models/llama").has_value());
    CHECK(mentions(run_error([] {
                     (void)configure_run<GRPOTrainer>(
                         run_sources({"task.name=reverse", "model.init=tiny", "model.chat_format=vicuna"}).sources);
                   }),
                   "chat_format = \"vicuna\" is not one of auto, chatml, llama3, llama3.1, none"));
    // the byte tokenizer has no chat format: a conversation prompt is refused with the fix
    const auto bytes = AnyTokenizer::of(std::make_shared<ByteTokenizer>());
    CHECK(mentions(run_error([&] { (void)bytes.render_chat(nlohmann::json::array()); }), "no chat format is set"));
  }

  TEST_CASE("tiny_llama: the model.init=tiny shape, reproducible from its seed") {
    auto a = tiny_llama(7), b = tiny_llama(7), c = tiny_llama(8);
    CHECK(a->config().num_hidden_layers == 2);
    CHECK(a->config().vocab_size == ByteTokenizer().vocab_size());
    const auto x = at::tensor(std::vector<int64_t>{1, 2, 3}).unsqueeze(0);
    c10::NoGradGuard g;
    CHECK(at::equal(a->forward(x), b->forward(x)));
    CHECK(!at::equal(a->forward(x), c->forward(x)));
  }
}
