#pragma once
// `hybridrl train`: one training run from a configuration file, the environment and key=value
// overrides (precedence defaults < file < HYBRIDRL_* environment < command line).
//   hybridrl train [--config run.yaml] [--print-config] [key=value ...]
// `algorithm.name` (ppo | grpo | dpo | kto | sft) and `rollout.name` (paged | naive) choose, once at
// start, one of the trainer types compiled here (the online ones in train_online.cpp, the offline
// ones in train_offline.cpp: two translation units that build side by side); every other key belongs to that trainer's Options or to the
// program's own tables: model.* (a Hugging Face checkpoint, or model.init=tiny for a small random
// model with the byte tokenizer), task.* (a built-in task instead of data.train_files) and
// reward.name (online). Every key is checked before the model is loaded: an unknown one names
// the nearest valid spelling.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <hybridrl/hybridrl.hpp>

#include "generate.hpp"
#if HYBRIDRL_WITH_YAML
#include <hybridrl/core/options_yaml.hpp>
#endif

namespace hybridrl::app {

/// model.*: where the policy comes from and where it trains.
struct TrainModelOptions {
  /// A Hugging Face checkpoint directory (config.json + safetensors; tokenizer.model when present).
  HYBRIDRL_ARG(std::string, path) = "";
  /// Instead of a checkpoint: `tiny`, a randomly initialised 2-layer Llama with the byte tokenizer
  /// (for built-in tasks and smoke runs).
  HYBRIDRL_ARG(std::string, init) = "";
  /// Master dtype of the trained weights.
  HYBRIDRL_ARG(at::ScalarType, dtype) = at::kFloat;
  /// cpu, cuda, cuda:1, ...
  HYBRIDRL_ARG(std::string, device) = "cpu";
  /// PPO's critic: a `...ForTokenClassification` checkpoint, or a policy checkpoint whose trunk
  /// starts the critic (score head fresh); empty: the policy's own trunk, a fresh score head.
  HYBRIDRL_ARG(std::string, critic_path) = "";
  HYBRIDRL_FIELDS(path, init, dtype, device, critic_path)

  void validate() const {
    HYBRIDRL_CHECK(path_.empty() != init_.empty(),
                   path_.empty() ? std::string("neither path nor init is set") : std::string("both path and init are set"),
                   "pass model.path=DIR (a Hugging Face checkpoint) or model.init=tiny, one of them");
    HYBRIDRL_CHECK(init_.empty() || init_ == "tiny", fmt::format("init = \"{}\" is not a built-in model", init_),
                   "use model.init=tiny");
    check_device_option(device_);
  }
};

/// reward.*: what scores an online run's responses.
struct TrainRewardOptions {
  /// task (the built-in task's), exact_match, gsm8k, gsm8k_flexible, boxed_math, or model (a
  /// reward model: reward.model_path); empty: task when task.name is set, else exact_match.
  HYBRIDRL_ARG(std::string, name) = "";
  /// reward.name=model: a `...ForSequenceClassification` checkpoint with one label, sharing the
  /// policy's tokenizer (prompt and response tokens are scored as the policy drew them).
  HYBRIDRL_ARG(std::string, model_path) = "";
  /// reward.name=model: rows per reward-model forward.
  HYBRIDRL_ARG(int64_t, micro_batch_size) = 16;
  HYBRIDRL_FIELDS(name, model_path, micro_batch_size)
  void validate() const {
    HYBRIDRL_CHECK(name_ != "model" || !model_path_.empty(), "name = model but model_path is empty",
                   "pass reward.model_path=DIR (a ...ForSequenceClassification checkpoint)");
    HYBRIDRL_CHECK(name_ == "model" || model_path_.empty(),
                   fmt::format("model_path is set but name = \"{}\"", name_), "set reward.name=model to score with it");
    HYBRIDRL_CHECK(micro_batch_size_ >= 1, fmt::format("micro_batch_size = {} is below 1", micro_batch_size_),
                   "score at least one row per forward, e.g. 16");
  }
};

/// The whole configuration of one trainer type T: the program's tables, then T's.
template <class T>
struct TrainConfig {
  HYBRIDRL_ARG(TrainModelOptions, model) = {};
  HYBRIDRL_ARG(TaskOptions, task) = {};
  HYBRIDRL_ARG(TrainRewardOptions, reward) = {};
  HYBRIDRL_ARG(typename T::Options, run) = {};

  template <class Self, class F>
  static void visit_fields(Self& self, F&& f) {
    f("model", self.model_);
    f("task", self.task_);
    if constexpr (T::has_rollout) f("reward", self.reward_);
    T::Options::visit_fields(self.run_, f);
  }
  void validate() const {
    detail::validate_member(model_, "model");
    detail::validate_member(task_, "task");
    if constexpr (T::has_rollout) detail::validate_member(reward_, "reward");
    run_.validate();
    HYBRIDRL_CHECK(!task_.name().empty() || !run_.data().train_files().empty(),
                   "neither task.name nor data.train_files is set", "pass task.name=reverse (a built-in task) or data.train_files=[file.jsonl]");
  }
};

/// A tokenizer chosen at run time: sentencepiece when the checkpoint has tokenizer.model, else the
/// byte tokenizer (the fixtures and model.init=tiny).
struct AnyTokenizer {
  std::function<std::vector<int64_t>(std::string_view, bool)> encode_fn;
  std::function<std::string(const std::vector<int64_t>&)> decode_fn;
  int64_t vocab = 0, bos = -1, eos = -1, pad = -1;

  [[nodiscard]] std::vector<int64_t> encode(std::string_view text, bool add_bos = true) const { return encode_fn(text, add_bos); }
  [[nodiscard]] std::string decode(const std::vector<int64_t>& ids) const { return decode_fn(ids); }
  [[nodiscard]] int64_t vocab_size() const noexcept { return vocab; }
  [[nodiscard]] int64_t bos_id() const noexcept { return bos; }
  [[nodiscard]] int64_t eos_id() const noexcept { return eos; }
  [[nodiscard]] int64_t pad_id() const noexcept { return pad; }

  template <class Tok>
  static AnyTokenizer of(std::shared_ptr<Tok> t) {
    AnyTokenizer a;
    a.encode_fn = [t](std::string_view s, bool b) { return t->encode(s, b); };
    a.decode_fn = [t](const std::vector<int64_t>& ids) { return t->decode(ids); };
    a.vocab = t->vocab_size();
    a.bos = t->bos_id();
    a.eos = t->eos_id();
    a.pad = t->pad_id();
    return a;
  }
};

/// The configuration file and every layer above it, with the two keys that choose the trainer type
/// taken out: (algorithm.name, rollout.name, the rest).
struct TrainSources {
  std::string algorithm = "grpo", rollout = "paged";
  ConfigSources sources;
};

/// Removes `table.key` from a parsed file, the environment and the overrides; returns the value the
/// highest layer gives (file < environment < command line).
inline std::optional<std::string> take_key(ConfigSources& s, const std::string& table, const std::string& key) {
  std::optional<std::string> v;
  if (s.file && s.file->is_object() && s.file->contains(table) && (*s.file)[table].is_object() &&
      (*s.file)[table].contains(key)) {
    const auto& x = (*s.file)[table][key];
    v = x.is_string() ? x.get<std::string>() : x.dump();
    (*s.file)[table].erase(key);
    if ((*s.file)[table].empty()) s.file->erase(table);
  }
  const auto env = s.env_prefix + table + "__" + key;
  for (auto it = s.environment.begin(); it != s.environment.end();) {
    std::string upper = env;
    for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (it->first == upper) {
      v = it->second;
      it = s.environment.erase(it);
    } else {
      ++it;
    }
  }
  const auto dotted = table + "." + key + "=";
  for (auto it = s.overrides.begin(); it != s.overrides.end();) {
    if (it->rfind(dotted, 0) == 0) {
      v = it->substr(dotted.size());
      it = s.overrides.erase(it);
    } else {
      ++it;
    }
  }
  return v;
}

/// The small random model of model.init=tiny: 2 layers × 128, 4 heads (2 KV heads), the byte
/// tokenizer's 259-token vocabulary, 256 positions, tied embeddings; initialised from `seed` as
/// transformers initialises a Llama.
inline CausalLM tiny_model(uint64_t seed, at::ScalarType dtype, at::Device device) {
  ModelConfig c;
  const ByteTokenizer bt;
  c.vocab_size = bt.vocab_size();
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.max_position_embeddings = 256;
  c.bos_token_id = bt.bos_id();
  c.eos_token_id = bt.eos_id();
  c.tie_word_embeddings = true;
  torch::manual_seed(static_cast<int64_t>(seed));
  CausalLM m(c);
  {  // as transformers initialises a Llama: matrices ~ N(0, initializer_range), norms 1
    c10::NoGradGuard g;
    for (auto& p : m->parameters()) {
      if (p.dim() >= 2) p.normal_(0.0, c.initializer_range);
    }
  }
  m->to(device, dtype);
  return m;
}

/// The data of a run: the built-in task's, or the JSONL files' (read in order into one dataset).
template <class Dataset>
std::shared_ptr<const Dataset> read_train_data(const TaskOptions& task, const std::vector<std::string>& files,
                                               const AnyTokenizer& tok) {
  std::stringstream text;
  std::string source;
  if (!task.name().empty()) {
    text << task_jsonl(task, Dataset::data_kind);
    source = "task " + task.name();
  } else {
    for (const auto& f : files) {
      std::ifstream in(f);
      HYBRIDRL_CHECK(in.good(), fmt::format("cannot open data.train_files entry '{}'", f),
                     "give JSONL files that exist (data.train_files=[a.jsonl, b.jsonl])");
      text << in.rdbuf() << '\n';
      source += (source.empty() ? "" : "+") + f;
    }
  }
  return std::make_shared<const Dataset>(Dataset::from_stream(text, source, tok));
}

/// Runs one trainer type T over `src`; `print_only`: print the effective configuration and stop.
template <class T, class Dataset>
int run_train_as(const TrainSources& src, bool print_only) {
  auto cfg = configure(TrainConfig<T>{}, src.sources);
  cfg.validate();
  const T trainer(cfg.run());
  TrainConfig<T> effective = cfg;
  effective.run(trainer.options());
  std::fprintf(stderr, "hybridrl train: algorithm.name = %s%s\n%s", src.algorithm.c_str(),
               T::has_rollout ? fmt::format(", rollout.name = {}", src.rollout).c_str() : "",
               describe(effective).c_str());
  if (print_only) return 0;
  // the model and its tokenizer
  const auto& mo = cfg.model();
  const at::Device device(mo.device());
  CausalLM policy = nullptr;
  AnyTokenizer tok;
  std::vector<std::string> tokenizer_files;
  if (!mo.init().empty()) {
    policy = tiny_model(cfg.run().trainer().seed(), mo.dtype(), device);
    tok = AnyTokenizer::of(std::make_shared<ByteTokenizer>());
  } else {
    policy = load_causal_lm(mo.path(), LoadOptions{}.dtype(mo.dtype()).device(device));
    const auto spm = std::filesystem::path(mo.path()) / "tokenizer.model";
    if (std::filesystem::exists(spm)) {
#if HYBRIDRL_WITH_SENTENCEPIECE
      tok = AnyTokenizer::of(std::make_shared<SentencePieceTokenizer>(mo.path()));
      tokenizer_files.push_back(spm.string());
#else
      throw Error(fmt::format("'{}' has a tokenizer.model but this build has no sentencepiece", mo.path()),
                  "build hybridrl with libsentencepiece-dev");
#endif
    } else {
      tok = AnyTokenizer::of(std::make_shared<ByteTokenizer>());
    }
  }
  check_vocabulary(tok, policy->config());
  auto data = read_train_data<Dataset>(cfg.task(), cfg.run().data().train_files(), tok);
  FitParts parts;
  if constexpr (T::has_critic) {
    if (!mo.critic_path().empty()) parts.critic = load_value_model(mo.critic_path(), LoadOptions{}.dtype(mo.dtype()).device(device));
  }
  parts.tokenizer_files = tokenizer_files;
  parts.run_config = to_json(effective);
  FitResult r;
  if constexpr (T::has_rollout) {
    auto name = cfg.reward().name();
    if (name.empty()) name = cfg.task().name().empty() ? "exact_match" : "task";
    BatchRewardFn reward;
    if (name == "model") {
      auto rm = load_reward_model(cfg.reward().model_path(), LoadOptions{}.dtype(mo.dtype()).device(device));
      check_vocabulary(tok, rm->config());
      reward = reward_model_reward(rm, cfg.reward().micro_batch_size());
    } else {
      reward = batched(name == "task" ? task_reward() : builtin_reward(name));
    }
    // ids past the tokenizer's vocabulary (a model whose embedding is padded beyond it) have no
    // text: they are left out of the decoded response, as they would be of a detokenizer's
    parts.decode = [tok](const std::vector<int64_t>& ids) {
      std::vector<int64_t> known;
      known.reserve(ids.size());
      for (auto id : ids) {
        if (id >= 0 && id < tok.vocab_size()) known.push_back(id);
      }
      return tok.decode(known);
    };
    r = T(cfg.run()).fit(policy, data, reward, parts);
  } else {
    r = T(cfg.run()).fit(policy, data, parts);
  }
  std::fprintf(stderr, "hybridrl train: done, %lld steps%s%s\n", static_cast<long long>(r.steps),
               r.resumed_from > 0 ? fmt::format(" (resumed from step {})", r.resumed_from).c_str() : "",
               r.last_checkpoint.empty() ? "" : fmt::format("; last checkpoint {}", r.last_checkpoint).c_str());
  return 0;
}

/// The trainer types this program compiles, by algorithm.name and rollout.name.
using TrainPPOPaged = Trainer<Algorithm<PPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
using TrainPPONaive = Trainer<Algorithm<PPO>, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>;
using TrainGRPOPaged = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
using TrainGRPONaive = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>;
using TrainDPO = Trainer<Algorithm<DPO>, Sharding<FSDP>, Loader<Bucketed>>;
using TrainKTO = Trainer<Algorithm<KTO>, Sharding<FSDP>, Loader<Bucketed>>;
using TrainSFT = Trainer<Algorithm<SFT>, Sharding<FSDP>, Loader<Bucketed>>;

/// The algorithms `hybridrl train` runs: online (ppo, grpo; rollout.name chooses the engine) and
/// offline (dpo, kto, sft).
inline bool is_online_algorithm(const std::string& a) { return a == "ppo" || a == "grpo"; }
inline bool is_offline_algorithm(const std::string& a) { return a == "dpo" || a == "kto" || a == "sft"; }

/// Runs the online trainer types (train_online.cpp).
int run_train_online(const TrainSources& s, bool print_only);
/// Runs the offline trainer types (train_offline.cpp).
int run_train_offline(const TrainSources& s, bool print_only);

/// Checks algorithm.name and rollout.name before anything is read.
inline void check_train_type(const TrainSources& s) {
  HYBRIDRL_CHECK(is_online_algorithm(s.algorithm) || is_offline_algorithm(s.algorithm),
                 fmt::format("algorithm.name = \"{}\" is not one of ppo, grpo, dpo, kto, sft", s.algorithm),
                 "use algorithm.name=ppo, grpo, dpo, kto or sft (a custom algorithm: compose its Trainer in "
                 "your program, as examples/custom_algorithm does)");
  HYBRIDRL_CHECK(!is_online_algorithm(s.algorithm) || s.rollout == "paged" || s.rollout == "naive",
                 fmt::format("rollout.name = \"{}\" is not one of paged, naive", s.rollout), "use rollout.name=paged or naive");
}

/// `hybridrl train`: reads the configuration (`config_file`, the HYBRIDRL_* environment,
/// `overrides`), picks the trainer type and runs it. Returns the exit code (errors throw).
inline int run_train(const std::string& config_file, const std::vector<std::string>& overrides, bool print_only) {
  TrainSources s;
  if (!config_file.empty()) {
    HYBRIDRL_CHECK(std::filesystem::exists(config_file), fmt::format("cannot open the configuration '{}'", config_file),
                   "pass --config with a YAML or JSON file that exists");
    const auto ext = std::filesystem::path(config_file).extension().string();
    if (ext == ".json") {
      std::ifstream in(config_file);
      try {
        s.sources.file = nlohmann::json::parse(in);
      } catch (const nlohmann::json::exception& e) {
        throw Error(fmt::format("'{}' is not valid JSON ({})", config_file, e.what()), "fix the file's syntax");
      }
    } else {
#if HYBRIDRL_WITH_YAML
      s.sources.file = read_yaml_file(config_file);
      s.sources.file_scalars_are_text = true;
#else
      throw Error(fmt::format("'{}' is YAML but this build has no yaml-cpp", config_file),
                  "pass a .json configuration, or build hybridrl with libyaml-cpp-dev");
#endif
    }
    s.sources.file_name = config_file;
  }
  s.sources.environment = environment_variables();
  s.sources.overrides = overrides;
  if (auto a = take_key(s.sources, "algorithm", "name")) s.algorithm = *a;
  if (auto r = take_key(s.sources, "rollout", "name")) s.rollout = *r;
  check_train_type(s);
  return is_online_algorithm(s.algorithm) ? run_train_online(s, print_only) : run_train_offline(s, print_only);
}

/// Every key of the trainer type that `algorithm` and `rollout` choose, with its type and
/// default, for `hybridrl train --help` (e.g. `hybridrl train algorithm.name=ppo --help`).
inline std::string train_keys_help(const std::string& algorithm = "grpo", const std::string& rollout = "paged") {
  TrainSources s;
  s.algorithm = algorithm;
  s.rollout = rollout;
  check_train_type(s);
  std::string out = fmt::format(
      "configuration keys of algorithm.name={}{} (another algorithm's: hybridrl train algorithm.name=NAME --help):\n"
      "  algorithm.name  <one of {{ppo, grpo, dpo, kto, sft}}> (default: grpo)\n"
      "  rollout.name  <one of {{paged, naive}}> (default: paged; ppo and grpo)\n",
      algorithm, is_online_algorithm(algorithm) ? " rollout.name=" + rollout : std::string());
  if (algorithm == "ppo") return out + (rollout == "paged" ? help<TrainConfig<TrainPPOPaged>>() : help<TrainConfig<TrainPPONaive>>());
  if (algorithm == "grpo") return out + (rollout == "paged" ? help<TrainConfig<TrainGRPOPaged>>() : help<TrainConfig<TrainGRPONaive>>());
  if (algorithm == "dpo") return out + help<TrainConfig<TrainDPO>>();
  if (algorithm == "kto") return out + help<TrainConfig<TrainKTO>>();
  return out + help<TrainConfig<TrainSFT>>();
}

/// The `algorithm.name=` and `rollout.name=` arguments of a command line (for --help, which is
/// answered before the subcommand runs), defaults grpo and paged.
inline std::pair<std::string, std::string> train_type_of(int argc, char** argv) {
  std::pair<std::string, std::string> out{"grpo", "paged"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("algorithm.name=", 0) == 0) out.first = a.substr(15);
    if (a.rfind("rollout.name=", 0) == 0) out.second = a.substr(13);
  }
  return out;
}

}  // namespace hybridrl::app
