#pragma once
/// \file
/// The job `hybridrl train` runs, as a library: a program's whole configuration (a trainer type's
/// Options plus the model.*, task.* and reward.* tables), read from a YAML or JSON file, the
/// HYBRIDRL_* environment and key=value arguments (defaults < file < environment < command line);
/// the policy and its tokenizer from a Hugging Face checkpoint or `model.init=tiny`; the data of a
/// built-in task or of JSONL files; the reward by name; and a registry of trainer types by
/// `algorithm.name`, `rollout.name` and `sharding.name`, so that a program with its own algorithm
/// runs the same configuration files as `hybridrl train` (examples/custom_algorithm).
///
///     int main(int argc, char** argv) {
///       auto trainers = hybridrl::builtin_trainers();            // ppo, grpo, dpo, kto, sft
///       trainers.add<RLOOTrainer>("rloo", "paged");              // and yours
///       return hybridrl::train_main(argc, argv, trainers);       // [--config F] [key=value ...]
///     }
///
/// Or step by step, as examples/grpo does: `configure_run<T>` → `load_run_tokenizer` →
/// `read_run_data` → `load_run_model` → `make_run_reward` → `T(cfg.run()).fit(...)`.
///
/// Not part of <hybridrl/hybridrl.hpp> (it reads YAML and sentencepiece where the build has them).
/// builtin_trainers() names every preset of trainer/presets.hpp: link `hybridrl::presets`, or the
/// translation unit that calls it compiles all their fit loops and run entry points (the
/// HYBRIDRL_RUN_PRESETS instantiations at the end of this file).

#include <ATen/Context.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hybridrl/core/config.hpp"
#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/io/json.hpp"
#include "hybridrl/model/config.hpp"
#include "hybridrl/model/pretrained.hpp"
#include "hybridrl/distributed/c10d_communicator.hpp"
#include "hybridrl/distributed/environment.hpp"
#include "hybridrl/sharding/tp3d.hpp"
#include "hybridrl/tokenizer/chat.hpp"
#include "hybridrl/tokenizer/hf_tokenizer.hpp"
#include "hybridrl/tokenizer/tokenizer.hpp"
#include "hybridrl/trainer/presets.hpp"
#include "hybridrl/trainer/rewards.hpp"
#include "hybridrl/trainer/scoring.hpp"
#include "hybridrl/trainer/tasks.hpp"
#include "hybridrl/trainer/trainer.hpp"
#if HYBRIDRL_WITH_YAML
#include "hybridrl/core/options_yaml.hpp"
#endif
#if HYBRIDRL_WITH_SENTENCEPIECE
#include "hybridrl/tokenizer/sentencepiece.hpp"
#endif

namespace hybridrl {

/// Throws for a `device` option that names no device, or one hybridrl does not run on (mps, xla,
/// ...: LibTorch parses them); the problem starts with the field name.
inline void check_device_option(const std::string& device) {
  std::optional<at::Device> d;
  try {
    d.emplace(device);
  } catch (const std::exception&) {
    throw Error(fmt::format("device = \"{}\" is not a device", device), "use cpu, cuda or cuda:<index>");
  }
  HYBRIDRL_CHECK(d->is_cpu() || d->is_cuda(), fmt::format("device = \"{}\" is neither cpu nor cuda", device),
                 "use cpu, cuda or cuda:<index> (the devices hybridrl runs on)");
}

/// Throws unless `device` (a checked device option, e.g. model.device) is a device this process
/// sees and `dtype` computes there (a 2×2 matrix product in it): run before anything loads, so a
/// GPU that is not there, or a dtype without kernels on the device (float16 on LibTorch's CPU), is
/// not a crash at the first forward. `key` names the options in the message ("model").
inline void check_device_available(const std::string& device, at::ScalarType dtype, std::string_view key = "model") {
  const at::Device d(device);
  if (d.is_cuda()) {
    const auto n = static_cast<int64_t>(torch::cuda::device_count());
    HYBRIDRL_CHECK(n > 0,
                   fmt::format("{}.device = {} but this process sees no CUDA device{}", key, device,
                               at::hasCUDA() ? "" : " (this LibTorch is built without CUDA)"),
                   fmt::format("use {}.device=cpu, or run where a GPU is visible (CUDA_VISIBLE_DEVICES, a CUDA build "
                               "of LibTorch)",
                               key));
    HYBRIDRL_CHECK(!d.has_index() || d.index() < n,
                   fmt::format("{}.device = {} but this process sees {} CUDA device(s), cuda:0 to cuda:{}", key, device,
                               n, n - 1),
                   fmt::format("use {}.device=cuda (a launched rank takes cuda:LOCAL_RANK) or an index below {}", key, n));
  }
  try {
    const auto x = at::ones({2, 2}, at::TensorOptions().dtype(dtype).device(d));
    (void)at::mm(x, x);
  } catch (const c10::Error&) {
    throw Error(fmt::format("{}.dtype = {} has no matrix multiply on {} in this LibTorch", key,
                            detail::dtype_name(dtype), device),
                d.is_cuda() ? fmt::format("use {}.dtype=float16 or float32 on this GPU (bfloat16 needs compute "
                                          "capability 8.0 or newer)", key)
                            : fmt::format("use {}.dtype=float32 or bfloat16 on the CPU (float16 is for CUDA)", key));
  }
}

/// Throws for a `chat_format` option other than auto, chatml, llama3 and none.
inline void check_chat_format_option(const std::string& chat_format) {
  HYBRIDRL_CHECK(chat_format == "auto" || chat_format == "chatml" || chat_format == "llama3" ||
                     chat_format == "llama3.1" || chat_format == "none",
                 fmt::format("chat_format = \"{}\" is not one of auto, chatml, llama3, llama3.1, none", chat_format),
                 "use model.chat_format=auto (the checkpoint's chat_template), chatml, llama3, llama3.1 or none");
}

/// model.*: where the policy comes from and where it trains.
struct RunModelOptions {
  /// A Hugging Face checkpoint directory (config.json + safetensors; its tokenizer.json or
  /// tokenizer.model when present).
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
  /// How `messages` prompts become text: auto (the chat_template of the checkpoint's
  /// tokenizer_config.json, when it is ChatML, Llama-3 or Llama-3.1), chatml, llama3, llama3.1 (its
  /// dated system header), or none.
  HYBRIDRL_ARG(std::string, chat_format) = "auto";
  HYBRIDRL_FIELDS(path, init, dtype, device, critic_path, chat_format)

  void validate() const {
    HYBRIDRL_CHECK(path_.empty() != init_.empty(),
                   fmt::format("path = \"{}\", init = \"{}\": {}", path_, init_,
                               path_.empty() ? "neither path nor init is set" : "both path and init are set"),
                   "pass model.path=DIR (a Hugging Face checkpoint) or model.init=tiny, one of them");
    HYBRIDRL_CHECK(init_.empty() || init_ == "tiny", fmt::format("init = \"{}\" is not a built-in model", init_),
                   "use model.init=tiny");
    HYBRIDRL_CHECK(c10::isFloatingType(dtype_),
                   fmt::format("dtype = {} is not a floating-point type", detail::dtype_name(dtype_)),
                   "use model.dtype=float32, bfloat16, or float16 on CUDA");
    check_device_option(device_);
    check_chat_format_option(chat_format_);
  }
};

/// reward.*: what scores an online run's responses.
struct RunRewardOptions {
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

/// distributed.*: how the ranks of a torchrun or Slurm launch meet (read only when the launch
/// has more than one rank).
struct RunDistributedOptions {
  /// auto (NCCL when model.device is CUDA, else Gloo), gloo or nccl.
  HYBRIDRL_ARG(std::string, backend) = "auto";
  /// Seconds a collective may wait for the other ranks before every rank stops with an error
  /// naming the collective (a dead or stuck peer).
  HYBRIDRL_ARG(double, timeout_s) = 600.0;
  /// Seconds the ranks have to meet at MASTER_ADDR:MASTER_PORT (a rank that never starts).
  HYBRIDRL_ARG(double, store_timeout_s) = 300.0;
  HYBRIDRL_FIELDS(backend, timeout_s, store_timeout_s)

  void validate() const {
    HYBRIDRL_CHECK(backend_ == "auto" || backend_ == "gloo" || backend_ == "nccl",
                   fmt::format("backend = \"{}\" is not one of auto, gloo, nccl", backend_),
                   "use distributed.backend=auto (NCCL on CUDA, Gloo on the CPU), gloo or nccl");
    HYBRIDRL_CHECK(timeout_s_ > 0 && store_timeout_s_ > 0,
                   fmt::format("timeout_s = {} and store_timeout_s = {} must be positive", timeout_s_, store_timeout_s_),
                   "give the seconds to wait, e.g. distributed.timeout_s=600");
  }
};

/// This process's place when a launcher (torchrun, Slurm, `hybridrl launch`) started several:
/// nullopt for a plain run (no RANK / SLURM_PROCID, or a world of one).
inline std::optional<LaunchEnvironment> launched_ranks(const EnvLookup& env = process_environment()) {
  if (!env("RANK") && !env("SLURM_PROCID")) return std::nullopt;
  auto launch = parse_launch_environment(env);
  if (launch.world_size <= 1) return std::nullopt;
  return launch;
}

/// The data-parallel group of a launch with several ranks (nullptr otherwise): meets the other
/// ranks as `o` says, on the backend model.device implies. With CUDA, model.device `cuda` becomes
/// this rank's `cuda:LOCAL_RANK` (returned in `device`).
inline std::shared_ptr<Communicator> connect_run_ranks(const RunDistributedOptions& o, std::string& device) {
  const auto launch = launched_ranks();
  if (!launch) return nullptr;
  std::string backend = o.backend();
  if (backend == "auto") backend = device.rfind("cuda", 0) == 0 ? "nccl" : "gloo";
  if (device == "cuda") device = fmt::format("cuda:{}", launch->local_rank);
  return init_from_environment(C10dOptions{}.backend(backend).timeout_s(o.timeout_s()).store_timeout_s(o.store_timeout_s()));
}

/// The layout line a launched run prints at start (rank 0): the ranks, launcher and backend, and
/// how `sharding` (the trainer's sharding Options) lays the policy over the actor's ranks
/// (`actor`: placement.actor's count; -1: all).
template <class ShardingOptions>
std::string describe_ranks(const Communicator& comm, const LaunchEnvironment& launch, const ShardingOptions& sharding,
                           int64_t actor = -1) {
  const int64_t dp = actor < 0 ? comm.size() : actor;
  std::string layout;
  if constexpr (requires { sharding.shard_group_size(); }) {  // Sharding<FSDP>
    const int64_t shards = sharding.shard_group_size() < 0 ? dp : sharding.shard_group_size();
    layout = fmt::format("data parallel {}{}, Sharding<FSDP> over {} rank(s){}", dp,
                         dp < comm.size() ? " (placement.actor)" : "", shards,
                         shards < dp ? fmt::format(" x {} replicas (hybrid)", dp / shards) : std::string());
  } else if constexpr (requires { sharding.resolve_data_parallel(dp); }) {  // Sharding<TP3D>
    layout = fmt::format("data parallel {} x tensor parallel {}, Sharding<TP3D>", sharding.resolve_data_parallel(dp),
                         sharding.tensor_parallel_size());
  } else {
    layout = fmt::format("data parallel {}", dp);
  }
  return fmt::format("{} ranks ({}, {} backend): {}", comm.size(), launch.launcher, comm.backend(), layout);
}

/// The whole configuration of a run of trainer type T: model.*, task.*, reward.* (online types),
/// distributed.*, then T's Options at the top level (algorithm.*, data.*, trainer.*, ...).
template <class T>
struct RunConfig {
  HYBRIDRL_ARG(RunModelOptions, model) = {};
  HYBRIDRL_ARG(TaskOptions, task) = {};
  HYBRIDRL_ARG(RunRewardOptions, reward) = {};
  HYBRIDRL_ARG(RunDistributedOptions, distributed) = {};
  HYBRIDRL_ARG(typename T::Options, run) = {};

  template <class Self, class F>
  static void visit_fields(Self& self, F&& f) {
    f("model", self.model_);
    f("task", self.task_);
    f("distributed", self.distributed_);
    if constexpr (T::has_rollout) f("reward", self.reward_);
    T::Options::visit_fields(self.run_, f);
  }
  /// Throws for the first impossible key. `world`: the ranks a launcher started (nullopt: one
  /// process), which the trainer's mesh, geometry and placement must fit.
  void validate(std::optional<int64_t> world = std::nullopt) const {
    detail::validate_member(model_, "model");
    detail::validate_member(task_, "task");
    detail::validate_member(distributed_, "distributed");
    if constexpr (T::has_rollout) detail::validate_member(reward_, "reward");
    HYBRIDRL_CHECK(distributed_.backend() != "nccl" || model_.device().rfind("cuda", 0) == 0,
                   fmt::format("distributed.backend = nccl but model.device = {}: NCCL carries CUDA tensors only",
                               model_.device()),
                   "use distributed.backend=gloo (or auto) for a CPU run, or model.device=cuda");
    run_.resolved(world).validate();
    HYBRIDRL_CHECK(!task_.name().empty() || !run_.data().train_files().empty(),
                   "neither task.name nor data.train_files is set",
                   "pass task.name=reverse (a built-in task) or data.train_files=[file.jsonl]");
  }
};

/// A tokenizer chosen at run time: the checkpoint's tokenizer.json or tokenizer.model, else the
/// byte tokenizer (the fixtures and model.init=tiny).
struct AnyTokenizer {
  std::function<std::vector<int64_t>(std::string_view, bool)> encode_fn;
  std::function<std::string(const std::vector<int64_t>&)> decode_fn;
  int64_t vocab = 0, bos = -1, eos = -1, pad = -1;
  std::optional<ChatFormat> chat;  ///< how `messages` prompts become text (none: they are an error)

  /// The text of a conversation in the chat format (PromptDataset's `messages`).
  [[nodiscard]] std::string render_chat(const nlohmann::json& messages) const {
    HYBRIDRL_CHECK(chat.has_value(), "the prompt is a conversation (\"messages\") but no chat format is set",
                   "use a checkpoint whose tokenizer_config.json has a ChatML or Llama-3(.1) chat_template, or set "
                   "model.chat_format=chatml, llama3 or llama3.1");
    return chat->render(messages);
  }

  /// Applies a model.chat_format option: auto keeps the checkpoint's, none drops it, chatml,
  /// llama3 and llama3.1 replace it.
  void use_chat_format(const std::string& option) {
    if (option == "none") chat.reset();
    if (option == "chatml" || option == "llama3" || option == "llama3.1") chat = ChatFormat::named(option);
  }

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
    if constexpr (requires { t->chat_format(); }) a.chat = t->chat_format();
    return a;
  }
};

/// The configuration of model.init=tiny: 2 layers × 128, 4 heads (2 KV heads), the byte
/// tokenizer's 259-token vocabulary, 256 positions, tied embeddings.
inline ModelConfig tiny_llama_config() {
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
  return c;
}

/// The small random model of model.init=tiny (tiny_llama_config), initialised from `seed` as
/// transformers initialises a Llama.
inline CausalLM tiny_llama(uint64_t seed, at::ScalarType dtype = at::kFloat, at::Device device = at::kCPU) {
  const ModelConfig c = tiny_llama_config();
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

/// The tokenizer of a run and the files to copy next to the final model.
struct RunTokenizer {
  AnyTokenizer tokenizer;
  std::vector<std::string> files;
};

/// The policy of a run, its tokenizer and the tokenizer files to copy next to the final model.
struct RunModel {
  CausalLM policy = nullptr;
  AnyTokenizer tokenizer;
  std::vector<std::string> tokenizer_files;
};

/// The tokenizer of checkpoint directory `dir`: its tokenizer.json (HFTokenizer: Qwen2, Llama-3,
/// ...), else its tokenizer.model (sentencepiece); nullopt when it has neither. `files` receives
/// the tokenizer files to copy next to a model trained from it.
inline std::optional<AnyTokenizer> load_checkpoint_tokenizer(const std::string& dir,
                                                             std::vector<std::string>* files = nullptr) {
  namespace fs = std::filesystem;
  const auto json = fs::path(dir) / "tokenizer.json", spm = fs::path(dir) / "tokenizer.model";
  auto note = [&](const fs::path& main) {
    if (files == nullptr) return;
    files->push_back(main.string());
    for (const char* extra : {"tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}) {
      if (fs::exists(fs::path(dir) / extra)) files->push_back((fs::path(dir) / extra).string());
    }
  };
  if (fs::exists(json)) {
    note(json);
    return AnyTokenizer::of(std::make_shared<const HFTokenizer>(dir));
  }
  if (fs::exists(spm)) {
#if HYBRIDRL_WITH_SENTENCEPIECE
    note(spm);
    return AnyTokenizer::of(std::make_shared<SentencePieceTokenizer>(dir));
#else
    throw Error(fmt::format("'{}' has a tokenizer.model but this build has no sentencepiece", dir),
                "build hybridrl with libsentencepiece-dev");
#endif
  }
  return std::nullopt;
}

/// The tokenizer of model.*, without the weights (cheap: read the data with it before loading
/// them): model.path's tokenizer.json or tokenizer.model, else the byte tokenizer (also
/// model.init=tiny's), with model.chat_format applied; checked against config.json's vocabulary.
inline RunTokenizer load_run_tokenizer(const RunModelOptions& mo) {
  RunTokenizer out;
  std::optional<AnyTokenizer> tok;
  if (mo.init().empty()) {
    tok = load_checkpoint_tokenizer(mo.path(), &out.files);
    out.tokenizer = tok ? *tok : AnyTokenizer::of(std::make_shared<ByteTokenizer>());
  } else {
    out.tokenizer = AnyTokenizer::of(std::make_shared<ByteTokenizer>());
  }
  out.tokenizer.use_chat_format(mo.chat_format());
  if (mo.init().empty()) check_vocabulary(out.tokenizer, load_config(mo.path()));
  return out;
}

/// One line for a run's log: which tokenizer and chat format a run uses.
inline std::string describe_tokenizer(const RunModelOptions& mo, const RunTokenizer& t) {
  const std::string file = t.files.empty() ? "the byte tokenizer" : t.files.front();
  const std::string chat = t.tokenizer.chat ? t.tokenizer.chat->describe() : "none";
  return fmt::format("tokenizer {} ({} ids), chat format {}{}", file, t.tokenizer.vocab_size(), chat,
                     mo.chat_format() == "auto" ? " (model.chat_format=auto)" : "");
}

/// Loads model.* : the checkpoint at model.path, or the tiny model drawn from `seed`, with the
/// tokenizer `tok` (load_run_tokenizer) checked against its vocabulary.
inline RunModel load_run_model(const RunModelOptions& mo, uint64_t seed, RunTokenizer tok) {
  const at::Device device(mo.device());
  RunModel out;
  out.policy = mo.init().empty() ? load_causal_lm(mo.path(), LoadOptions{}.dtype(mo.dtype()).device(device))
                                 : tiny_llama(seed, mo.dtype(), device);
  out.tokenizer = std::move(tok.tokenizer);
  out.tokenizer_files = std::move(tok.files);
  check_vocabulary(out.tokenizer, out.policy->config());
  return out;
}

/// As above, loading the tokenizer first (a bad tokenizer file fails before the weights load).
inline RunModel load_run_model(const RunModelOptions& mo, uint64_t seed) {
  return load_run_model(mo, seed, load_run_tokenizer(mo));
}

/// The data of a run: the built-in task's (task.name), or the JSONL files' (read in order into one
/// dataset), tokenized with `tok` as `options` (data.max_prompt_length, data.prompt_key, ...) say.
template <class Dataset>
std::shared_ptr<const Dataset> read_run_data(const TaskOptions& task, const std::vector<std::string>& files,
                                             const AnyTokenizer& tok, const DatasetOptions& options = {}) {
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
  return std::make_shared<const Dataset>(Dataset::from_stream(text, source, tok, options));
}

/// The reward reward.* names (online): the task's, a built-in rule, or a reward model loaded to
/// the policy's device and dtype (its vocabulary checked against `tok`) — on several ranks
/// (`comm`) sharded over them as Sharding<FSDP> shards the policy (`shard_group_size`: -1 all
/// ranks, else groups of that many that each hold a whole copy), so a rank stores 1/shards of it.
/// `custom`: rewards a program registered by name (TrainerRegistry::add_reward), looked up first.
inline BatchRewardFn make_run_reward(const RunRewardOptions& ro, const TaskOptions& task, const RunModelOptions& mo,
                                     const AnyTokenizer& tok,
                                     const std::map<std::string, BatchRewardFn>& custom = {},
                                     std::shared_ptr<Communicator> comm = nullptr, int64_t shard_group_size = -1) {
  auto name = ro.name();
  if (name.empty()) name = task.name().empty() ? "exact_match" : "task";
  if (auto it = custom.find(name); it != custom.end()) return it->second;
  if (name == "model") {
    auto rm = load_reward_model(ro.model_path(), LoadOptions{}.dtype(mo.dtype()).device(at::Device(mo.device())));
    check_vocabulary(tok, rm->config());
    if (comm && comm->size() > 1) {
      const auto dtype = rm->parameters().front().scalar_type();
      auto sharded = std::make_shared<ShardedFrozen<RewardModel>>(std::move(rm), comm, dtype, shard_group_size);
      return reward_model_reward(std::move(sharded), ro.micro_batch_size(), std::move(comm));
    }
    return reward_model_reward(rm, ro.micro_batch_size());
  }
  return batched(name == "task" ? task_reward() : builtin_reward(name));
}

/// Throws unless reward.* names a reward `make_run_reward` can make: one of `custom`, task, model,
/// or a built-in rule (checked before anything loads, not after the weights).
inline void check_reward_option(const RunRewardOptions& ro, const std::map<std::string, BatchRewardFn>& custom = {}) {
  const auto& name = ro.name();
  if (name.empty() || name == "task" || name == "model" || custom.count(name) != 0) return;
  (void)builtin_reward(name);  // throws: not a built-in reward, with the list
}

/// Throws when the run asks more of the model than its configuration `c` gives, before the
/// weights load: a prompt of data.max_prompt_length plus rollout.max_new_tokens past
/// max_position_embeddings (the responses of the longest prompts would be cut short), a KV pool
/// (rollout.kv_cache_tokens) that cannot hold one such sequence, attention heads, KV heads, MLP or
/// vocabulary that sharding.tensor_parallel_size does not split.
template <class T>
void check_run_fits_model(const RunConfig<T>& cfg, const ModelConfig& c) {
  const auto& run = cfg.run();
  if constexpr (T::has_rollout && requires { run.rollout().sampling().max_new_tokens(); }) {
    const int64_t prompt = run.data().dataset().max_prompt_length(), new_tokens = run.rollout().sampling().max_new_tokens();
    const int64_t context = c.max_position_embeddings;
    HYBRIDRL_CHECK(prompt == 0 || prompt + new_tokens <= context,
                   fmt::format("data.max_prompt_length + rollout.max_new_tokens = {} + {} = {} exceeds the model's "
                               "max_position_embeddings = {}: the responses of the longest prompts would stop after {} "
                               "tokens",
                               prompt, new_tokens, prompt + new_tokens, context, std::max<int64_t>(context - prompt, 0)),
                   fmt::format("lower data.max_prompt_length or rollout.max_new_tokens so that they add up to at most {}, "
                               "or use a model with a longer context",
                               context));
    if constexpr (requires { run.rollout().kv_cache_tokens(); run.rollout().block_size(); }) {
      const int64_t kv = run.rollout().kv_cache_tokens(), bs = run.rollout().block_size();
      if (kv > 0) {  // as Rollout<Paged> counts one request: prompt and response blocks, one more for a fork
        const int64_t longest = std::max<int64_t>(prompt, 1);
        const int64_t tokens = longest + std::min(new_tokens, context - longest) - 1;
        const int64_t need = (tokens + bs - 1) / bs + 1, have = (kv + bs - 1) / bs;
        HYBRIDRL_CHECK(need <= have,
                       fmt::format("rollout.kv_cache_tokens = {} holds {} KV block(s) of {} tokens, but one sequence "
                                   "({} prompt token(s), up to {} new) needs {}",
                                   kv, have, bs, longest, new_tokens, need),
                       fmt::format("raise rollout.kv_cache_tokens to at least {} (or 0: sized from free memory on "
                                   "CUDA), or lower rollout.max_new_tokens / data.max_prompt_length",
                                   need * bs));
      }
    }
  }
  if constexpr (requires { run.sharding().tensor_parallel_size(); }) {
    detail::tp3d::check_divisible(c, run.sharding().tensor_parallel_size());
  }
}

/// The response text a reward reads: `tok`'s decode, leaving out ids past its vocabulary (a model
/// whose embedding is padded beyond it samples them; they have no text).
inline DecodeFn run_decode(const AnyTokenizer& tok) {
  return [tok](const std::vector<int64_t>& ids) {
    std::vector<int64_t> known;
    known.reserve(ids.size());
    for (auto id : ids) {
      if (id >= 0 && id < tok.vocab_size()) known.push_back(id);
    }
    return tok.decode(known);
  };
}

/// Removes `table.key` from a parsed file, the environment and the overrides; returns the value the
/// highest layer gives (file < environment < command line).
inline std::optional<std::string> take_key(ConfigSources& s, const std::string& table, const std::string& key) {
  std::optional<std::string> v;
  if (s.file && s.file->is_object() && s.file->contains(table) && (*s.file)[table].is_object() &&
      (*s.file)[table].contains(key)) {
    const auto& x = (*s.file)[table][key];
    // a table or list where a name belongs is shown as JSON text, any bytes that are not UTF-8
    // replaced (dump() threw nlohmann's type_error 316 for them: found by the yaml_config fuzzer)
    v = x.is_string() ? x.get<std::string>() : x.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    (*s.file)[table].erase(key);
    if ((*s.file)[table].empty()) s.file->erase(table);
  }
  std::string env = s.env_prefix + table + "__" + key;
  for (auto& c : env) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (auto it = s.environment.begin(); it != s.environment.end();) {
    if (it->first == env) {
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

/// Every layer of a run's configuration, with the three keys that choose the trainer type taken
/// out (empty where no layer sets them): algorithm.name, rollout.name, sharding.name.
struct RunSources {
  std::string algorithm, rollout, sharding;
  ConfigSources sources;

  /// Throws unless the configuration names `algo` (or no algorithm), where given `engine` (or no
  /// rollout), and `shards` (or no sharding.name): a program that trains one trainer type refuses
  /// another's configuration.
  void require(std::string_view algo, std::string_view engine = {}, std::string_view shards = "fsdp") const {
    HYBRIDRL_CHECK(algorithm.empty() || algorithm == algo,
                   fmt::format("algorithm.name = {} but this program trains {}", algorithm, algo),
                   fmt::format("pass a configuration for {} (or run `hybridrl train` for the others)", algo));
    HYBRIDRL_CHECK(engine.empty() || rollout.empty() || rollout == engine,
                   fmt::format("rollout.name = {} but this program generates with {}", rollout, engine),
                   fmt::format("set rollout.name={} or leave it out", engine));
    HYBRIDRL_CHECK(sharding.empty() || sharding == shards,
                   fmt::format("sharding.name = {} but this program trains with {}", sharding, shards),
                   fmt::format("set sharding.name={} or leave it out (or run `hybridrl train`, which has both)", shards));
  }
};

/// The arguments of a training program: `[--config FILE] [--print-config] [--help] [key=value ...]`.
struct RunArgs {
  std::string config_file;
  std::vector<std::string> overrides;
  bool print_only = false, help = false;
};

/// Parses a training program's arguments (see RunArgs); anything else is an Error.
inline RunArgs parse_run_args(int argc, char** argv) {
  RunArgs out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) {
      out.config_file = argv[++i];
    } else if (a.rfind("--config=", 0) == 0) {
      out.config_file = a.substr(9);
    } else if (a == "--print-config") {
      out.print_only = true;
    } else if (a == "--help" || a == "-h") {
      out.help = true;
    } else if (a.find('=') != std::string::npos && a.rfind("--", 0) != 0) {
      out.overrides.push_back(a);
    } else {
      throw Error(fmt::format("unexpected argument '{}'", a),
                  "arguments are [--config FILE] [--print-config] [--help] [key=value ...]");
    }
  }
  return out;
}

/// Reads `config_file` (YAML, or JSON by its .json extension; "" for none), the HYBRIDRL_*
/// environment and `overrides` ("key=value"), and takes algorithm.name, rollout.name and
/// sharding.name out.
inline RunSources read_run_sources(const std::string& config_file, const std::vector<std::string>& overrides) {
  RunSources s;
  if (!config_file.empty()) {
    HYBRIDRL_CHECK(std::filesystem::exists(config_file), fmt::format("cannot open the configuration '{}'", config_file),
                   "pass --config with a YAML or JSON file that exists");
    const auto ext = std::filesystem::path(config_file).extension().string();
    if (ext == ".json") {
      s.sources.file = io::read_json_file(config_file, "configuration", "fix the file's syntax", size_t{64} << 20);
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
  if (auto h = take_key(s.sources, "sharding", "name")) s.sharding = *h;
  return s;
}

/// As above, from a program's arguments (parse_run_args; --print-config and --help are ignored).
inline RunSources read_run_sources(int argc, char** argv) {
  const auto args = parse_run_args(argc, argv);
  return read_run_sources(args.config_file, args.overrides);
}

/// The configuration of a run of T from `sources`, validated for the world a launcher started
/// (every key checked before anything is loaded: an unknown one names the nearest valid
/// spelling; a mesh or batch that does not fit the ranks names the arithmetic).
template <class T>
[[nodiscard]] RunConfig<T> configure_run(const ConfigSources& sources) {
  auto cfg = configure(RunConfig<T>{}, sources);
  const auto launch = launched_ranks();
  cfg.validate(launch ? std::optional<int64_t>(launch->world_size) : std::nullopt);
  return cfg;
}

/// The whole job for trainer type T: configuration → model → data → reward → fit, the effective
/// configuration printed first (`label`: how the trainer type was chosen) and saved with the run.
/// `print_only`: print it and stop. `rewards`: a program's own rewards by reward.name. Returns the
/// exit code (bad input throws Error).
template <class T>
int run_trainer(const ConfigSources& sources, const std::string& label, bool print_only,
                const std::map<std::string, BatchRewardFn>& rewards = {}) {
  auto cfg = configure_run<T>(sources);  // not const: a launched rank's model.device names its GPU
  const auto launch = launched_ranks();
  const std::optional<int64_t> launched_world = launch ? std::optional<int64_t>(launch->world_size) : std::nullopt;
  // the geometry and the placement checked for the launch's world (1 unlaunched) before anything loads
  const T trainer(cfg.run(), launched_world.value_or(1));
  RunConfig<T> effective = cfg;
  effective.run(trainer.options());
  const bool lead = !launch || launch->rank == 0;  // prints and writes for the run
  if (lead) std::fprintf(stderr, "hybridrl train: %s\n%s", label.c_str(), describe(effective).c_str());
  if (print_only) return 0;
  // several ranks: meet the others first (a missing rank fails here, within store_timeout_s)
  // what the model needs of the device and the configuration, before the rendezvous and any load
  check_device_available(cfg.model().device(), cfg.model().dtype());
  if constexpr (T::has_rollout) check_reward_option(cfg.reward(), rewards);
  check_run_fits_model(cfg, cfg.model().init().empty() ? load_config(cfg.model().path()) : tiny_llama_config());
  std::string device = cfg.model().device();
  auto comm = connect_run_ranks(cfg.distributed(), device);
  if (comm) {
    if (device != cfg.model().device()) check_device_available(device, cfg.model().dtype());  // cuda:LOCAL_RANK
    cfg.model().device(device);
    const auto actor = static_cast<int64_t>(cfg.run().placement().actor_ranks(comm->size()).size());
    if (lead) std::fprintf(stderr, "hybridrl train: %s\n", describe_ranks(*comm, *launch, cfg.run().sharding(), actor).c_str());
  }
  // the tokenizer and the data before the weights: a bad data line fails in seconds, not after
  // a multi-gigabyte load
  auto tok = load_run_tokenizer(cfg.model());
  if (lead) std::fprintf(stderr, "hybridrl train: %s\n", describe_tokenizer(cfg.model(), tok).c_str());
  auto data = read_run_data<dataset_of<T>>(cfg.task(), cfg.run().data().train_files(), tok.tokenizer,
                                           cfg.run().data().dataset());
  auto model = load_run_model(cfg.model(), cfg.run().trainer().seed(), std::move(tok));
  FitParts parts;
  if constexpr (T::has_critic) {
    if (!cfg.model().critic_path().empty()) {
      parts.critic = load_value_model(cfg.model().critic_path(),
                                      LoadOptions{}.dtype(cfg.model().dtype()).device(at::Device(cfg.model().device())));
    }
  }
  parts.tokenizer_files = model.tokenizer_files;
  parts.run_config = to_json(effective);
  parts.comm = comm;
  const int64_t world = comm ? static_cast<int64_t>(comm->size()) : 1;
  FitResult r;
  if constexpr (T::has_rollout) {
    int64_t shard_group = -1;
    if constexpr (requires { cfg.run().sharding().shard_group_size(); }) shard_group = cfg.run().sharding().shard_group_size();
    // a reward model shards over the reward's ranks (placement.reward; default the actor's): as
    // the policy does on the actor's, over all of its own ranks elsewhere
    auto reward_comm = comm;
    bool scores_here = true;
    int64_t reward_ranks = comm ? comm->size() : 1;
    if (comm && cfg.reward().name() == "model") {
      const auto& pm = cfg.run().placement();
      const auto ranks = pm.reward_ranks(comm->size());
      if (ranks != pm.actor_ranks(comm->size())) shard_group = -1;
      reward_comm = placement_group(comm, ranks);  // collective: every rank splits alike
      scores_here = reward_comm != nullptr;
      reward_ranks = static_cast<int64_t>(ranks.size());
    }
    BatchRewardFn reward = [](std::span<const RewardInput>) -> std::vector<double> {
      throw Error("hybridrl train: a reward asked of a rank outside placement.reward", "report this as a bug");
    };
    if (scores_here) {
      reward = make_run_reward(cfg.reward(), cfg.task(), cfg.model(), model.tokenizer, rewards, reward_comm, shard_group);
    }
    if (lead && comm && cfg.reward().name() == "model") {
      std::fprintf(stderr, "hybridrl train: the reward model is sharded over %lld ranks\n",
                   static_cast<long long>(shard_group < 0 || reward_ranks == 1 ? reward_ranks : shard_group));
    }
    parts.decode = run_decode(model.tokenizer);
    r = T(cfg.run(), world).fit(model.policy, data, std::move(reward), std::move(parts));
  } else {
    r = T(cfg.run(), world).fit(model.policy, data, std::move(parts));
  }
  if (!lead) return 0;
  std::fprintf(stderr, "hybridrl train: done, %lld steps%s%s\n", static_cast<long long>(r.steps),
               r.resumed_from > 0 ? fmt::format(" (resumed from step {})", r.resumed_from).c_str() : "",
               r.last_checkpoint.empty() ? "" : fmt::format("; last checkpoint {}", r.last_checkpoint).c_str());
  return 0;
}

/// The trainer types a program runs, by algorithm.name (and rollout.name for online ones), and
/// its own rewards by reward.name. The first algorithm added is the default, and for each online
/// algorithm its first rollout.
class TrainerRegistry {
 public:
  /// Adds a reward that `reward.name=name` chooses (before the built-in names: it may replace one).
  TrainerRegistry& add_reward(std::string name, BatchRewardFn reward) {
    HYBRIDRL_CHECK(static_cast<bool>(reward), fmt::format("TrainerRegistry::add_reward(\"{}\"): an empty function", name),
                   "pass a callable: add_reward(\"name\", batched(my_reward))");
    rewards_[std::move(name)] = std::move(reward);
    return *this;
  }
  /// As above, for a per-sample reward.
  TrainerRegistry& add_reward(std::string name, RewardFn reward) {
    HYBRIDRL_CHECK(static_cast<bool>(reward), fmt::format("TrainerRegistry::add_reward(\"{}\"): an empty function", name),
                   "pass a callable: add_reward(\"name\", my_reward)");
    return add_reward(std::move(name), batched(std::move(reward)));
  }

  /// Adds trainer type T as `algorithm` (with `rollout` for an online T); `sharding.name` chooses
  /// it by its Sharding policy's name in lower case (fsdp, tp3d).
  template <class T>
  TrainerRegistry& add(std::string algorithm, std::string rollout = {}) {
    HYBRIDRL_CHECK(T::has_rollout != rollout.empty(),
                   fmt::format("TrainerRegistry::add(\"{}\", \"{}\"): {}", algorithm, rollout,
                               T::has_rollout ? "an online trainer needs a rollout name" : "an offline trainer has no rollout"),
                   T::has_rollout ? "name its engine, e.g. add<T>(\"rloo\", \"paged\")" : "call add<T>(\"name\")");
    std::string sharding(T::sharding_type::name);
    for (auto& c : sharding) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    HYBRIDRL_CHECK(!find_entry(algorithm, rollout.empty() ? std::string("-") : rollout, sharding),
                   fmt::format("algorithm.name = {} {} sharding.name = {} is registered twice", algorithm, rollout, sharding),
                   "register each (algorithm, rollout, sharding) combination once");
    Entry e;
    e.algorithm = std::move(algorithm);
    e.rollout = std::move(rollout);
    e.sharding = std::move(sharding);
    e.run = [](const ConfigSources& s, const std::string& label, bool print_only,
               const std::map<std::string, BatchRewardFn>& rewards) { return run_trainer<T>(s, label, print_only, rewards); };
    e.help = [] { return ::hybridrl::help<RunConfig<T>>(); };
    entries_.push_back(std::move(e));
    return *this;
  }

  /// The algorithm names, in the order added (each once).
  [[nodiscard]] std::vector<std::string> algorithms() const {
    std::vector<std::string> out;
    for (const auto& e : entries_) {
      if (std::find(out.begin(), out.end(), e.algorithm) == out.end()) out.push_back(e.algorithm);
    }
    return out;
  }

  /// Runs the trainer type `s` names (defaults where it names none); the exit code.
  int run(const RunSources& s, bool print_only) const {
    const auto& e = resolve(s.algorithm, s.rollout, s.sharding);
    const auto label = fmt::format("algorithm.name = {}{}, sharding.name = {}", e.algorithm,
                                   e.rollout.empty() ? "" : fmt::format(", rollout.name = {}", e.rollout), e.sharding);
    return e.run(s.sources, label, print_only, rewards_);
  }

  /// Every key of the trainer type `algorithm`, `rollout` and `sharding` name, with its type and
  /// default.
  [[nodiscard]] std::string help(const std::string& algorithm = {}, const std::string& rollout = {},
                                 const std::string& sharding = {}) const {
    const auto& e = resolve(algorithm, rollout, sharding);
    std::vector<std::string> rollouts;
    for (const auto& x : entries_) {
      if (!x.rollout.empty() && std::find(rollouts.begin(), rollouts.end(), x.rollout) == rollouts.end()) {
        rollouts.push_back(x.rollout);
      }
    }
    std::string out = fmt::format(
        "configuration keys of algorithm.name={}{} sharding.name={} (another algorithm's: algorithm.name=NAME --help):\n"
        "  algorithm.name  <one of {{{}}}> (default: {})\n",
        e.algorithm, e.rollout.empty() ? "" : " rollout.name=" + e.rollout, e.sharding, fmt::join(algorithms(), ", "),
        entries_.front().algorithm);
    if (!rollouts.empty()) {
      out += fmt::format("  rollout.name  <one of {{{}}}> (default: the first of them; online algorithms)\n",
                         fmt::join(rollouts, ", "));
    }
    out += fmt::format("  sharding.name  <one of {{{}}}> (default: the first of them)\n",
                       fmt::join(shardings_of(e.algorithm, e.rollout), ", "));
    return out + e.help();
  }

 private:
  struct Entry {
    std::string algorithm, rollout, sharding;
    std::function<int(const ConfigSources&, const std::string&, bool, const std::map<std::string, BatchRewardFn>&)> run;
    std::function<std::string()> help;
  };

  /// The first entry of `algorithm` with `rollout` ("-": none; empty: any) and `sharding` (empty: any).
  [[nodiscard]] const Entry* find_entry(const std::string& algorithm, const std::string& rollout,
                                        const std::string& sharding = {}) const {
    for (const auto& e : entries_) {
      if (e.algorithm == algorithm && (rollout.empty() || e.rollout == rollout || (rollout == "-" && e.rollout.empty())) &&
          (sharding.empty() || e.sharding == sharding)) {
        return &e;
      }
    }
    return nullptr;
  }

  /// The sharding names registered for `algorithm` with `rollout` (empty: any), in order.
  [[nodiscard]] std::vector<std::string> shardings_of(const std::string& algorithm, const std::string& rollout) const {
    std::vector<std::string> out;
    for (const auto& e : entries_) {
      if (e.algorithm == algorithm && (rollout.empty() || e.rollout == rollout) &&
          std::find(out.begin(), out.end(), e.sharding) == out.end()) {
        out.push_back(e.sharding);
      }
    }
    return out;
  }

  /// The entry of (algorithm, rollout, sharding), defaults filled in (the first registered that
  /// fits); an Error naming the valid names.
  [[nodiscard]] const Entry& resolve(std::string algorithm, const std::string& rollout,
                                     const std::string& sharding = {}) const {
    HYBRIDRL_CHECK(!entries_.empty(), "no trainer type is registered", "add one: registry.add<MyTrainer>(\"name\")");
    if (algorithm.empty()) algorithm = entries_.front().algorithm;
    const auto names = algorithms();
    if (std::find(names.begin(), names.end(), algorithm) == names.end()) {
      throw Error(fmt::format("algorithm.name = \"{}\" is not one of {}{}", algorithm, fmt::join(names, ", "),
                              nearest_hint(algorithm, names)),
                  fmt::format("use algorithm.name={} (another algorithm: compose its Trainer in your program and "
                              "register it, as examples/custom_algorithm does)",
                              fmt::join(names, ", ")));
    }
    const Entry* first = find_entry(algorithm, "");
    if (first->rollout.empty()) {
      HYBRIDRL_CHECK(rollout.empty(), fmt::format("rollout.name = {} is set but algorithm.name = {} generates nothing", rollout, algorithm),
                     fmt::format("remove rollout.name: {} trains on its dataset", algorithm));
    } else if (!rollout.empty() && !find_entry(algorithm, rollout)) {
      std::vector<std::string> valid;
      for (const auto& e : entries_) {
        if (e.algorithm == algorithm && std::find(valid.begin(), valid.end(), e.rollout) == valid.end()) {
          valid.push_back(e.rollout);
        }
      }
      throw Error(fmt::format("rollout.name = \"{}\" is not one of {}", rollout, fmt::join(valid, ", ")),
                  fmt::format("use rollout.name={} with algorithm.name={}", fmt::join(valid, " or "), algorithm));
    }
    if (const Entry* e = find_entry(algorithm, rollout, sharding)) return *e;
    const auto valid = shardings_of(algorithm, rollout);
    const auto with = fmt::format("algorithm.name = {}{}", algorithm, rollout.empty() ? "" : ", rollout.name = " + rollout);
    const auto known = shardings_of(algorithm, "");
    const bool typo = std::find(known.begin(), known.end(), sharding) == known.end();
    throw Error(fmt::format("sharding.name = \"{}\" is not one of {} (with {}){}", sharding, fmt::join(valid, ", "), with,
                            typo ? nearest_hint(sharding, known) : std::string()),
                fmt::format("use sharding.name={}{}", fmt::join(valid, " or "),
                            sharding == "tp3d" ? "; Sharding<TP3D> needs Rollout<Paged> (rollout.name=paged), and an "
                                                 "offline algorithm with it is a Trainer a program composes"
                                               : ""));
  }

  static std::string nearest_hint(const std::string& name, const std::vector<std::string>& names) {
    const auto best = detail::nearest_key(name, names);  // the configuration's did-you-mean
    return best.empty() ? std::string() : fmt::format(" (did you mean {}?)", best);
  }

  std::vector<Entry> entries_;
  std::map<std::string, BatchRewardFn> rewards_;
};

/// The trainer types of `hybridrl train`: grpo and ppo (rollout.name paged, the default, or
/// naive; sharding.name fsdp, the default, or tp3d with paged), dpo, kto and sft (fsdp) — the
/// presets of trainer/presets.hpp.
inline TrainerRegistry builtin_trainers() {
  TrainerRegistry r;
  r.add<GRPOTrainer>("grpo", "paged")
      .add<NaiveGRPOTrainer>("grpo", "naive")
      .add<TP3DGRPOTrainer>("grpo", "paged")
      .add<PPOTrainer>("ppo", "paged")
      .add<NaivePPOTrainer>("ppo", "naive")
      .add<TP3DPPOTrainer>("ppo", "paged")
      .add<DPOTrainer>("dpo")
      .add<KTOTrainer>("kto")
      .add<SFTTrainer>("sft");
  return r;
}

/// A program's `main` for training runs with `trainers`: the arguments of `hybridrl train`
///   PROGRAM [--config FILE] [--print-config] [--help] [key=value ...]
/// Exit codes: 0 done, 1 bad input (the message names the problem and the fix), 2 a usage error,
/// 3 any other failure.
inline int train_main(int argc, char** argv, const TrainerRegistry& trainers) {
  const std::string program = argc > 0 ? std::filesystem::path(argv[0]).filename().string() : "train";
  RunArgs args;
  try {
    args = parse_run_args(argc, argv);
  } catch (const Error& e) {
    std::cerr << program << ": " << e.what() << '\n';
    return 2;
  }
  try {
    if (args.help) {
      std::string algorithm, rollout;
      for (const auto& o : args.overrides) {
        if (o.rfind("algorithm.name=", 0) == 0) algorithm = o.substr(15);
        if (o.rfind("rollout.name=", 0) == 0) rollout = o.substr(13);
      }
      std::cout << "usage: " << program << " [--config FILE] [--print-config] [--help] [key=value ...]\n"
                << "precedence: defaults < --config file < HYBRIDRL_* environment < command line\n"
                << trainers.help(algorithm, rollout);
      return 0;
    }
    return trainers.run(read_run_sources(args.config_file, args.overrides), args.print_only);
  } catch (const Error& e) {
    std::cerr << e.what() << '\n';
    return 1;
  } catch (const std::exception& e) {
    std::cerr << program << ": unexpected failure: " << e.what() << '\n';
    return 3;
  }
}

}  // namespace hybridrl

/// The run entry points of every preset trainer type — run_trainer, configure_run and the help
/// of its RunConfig — and read_run_data of every dataset kind: explicit instantiation
/// declarations (`prefix` extern) or definitions (`prefix` empty: src/presets/run.cpp), as
/// trainer/presets.hpp does for the trainers and their fit loops. A program or example linking
/// hybridrl::presets then compiles none of them (the program and examples/custom_algorithm
/// instantiated all nine run_trainer's through builtin_trainers(): ~40 s of each one's compile).
#define HYBRIDRL_RUN_PRESET(prefix, Alias)                                                                   \
  prefix template int run_trainer<Alias>(const ConfigSources&, const std::string&, bool,                      \
                                         const std::map<std::string, BatchRewardFn>&);                        \
  prefix template RunConfig<Alias> configure_run<Alias>(const ConfigSources&);                                 \
  prefix template std::string help<RunConfig<Alias>>(const RunConfig<Alias>&);
#define HYBRIDRL_RUN_DATASET(prefix, Dataset)                                                                \
  prefix template std::shared_ptr<const Dataset> read_run_data<Dataset>(                                      \
      const TaskOptions&, const std::vector<std::string>&, const AnyTokenizer&, const DatasetOptions&);
#define HYBRIDRL_RUN_PRESETS(prefix)                                                                         \
  HYBRIDRL_RUN_PRESET(prefix, GRPOTrainer)                                                                     \
  HYBRIDRL_RUN_PRESET(prefix, NaiveGRPOTrainer)                                                                \
  HYBRIDRL_RUN_PRESET(prefix, TP3DGRPOTrainer)                                                                 \
  HYBRIDRL_RUN_PRESET(prefix, PPOTrainer)                                                                      \
  HYBRIDRL_RUN_PRESET(prefix, NaivePPOTrainer)                                                                 \
  HYBRIDRL_RUN_PRESET(prefix, TP3DPPOTrainer)                                                                  \
  HYBRIDRL_RUN_PRESET(prefix, DPOTrainer)                                                                      \
  HYBRIDRL_RUN_PRESET(prefix, KTOTrainer)                                                                      \
  HYBRIDRL_RUN_PRESET(prefix, SFTTrainer)                                                                      \
  HYBRIDRL_RUN_DATASET(prefix, PromptDataset)                                                                  \
  HYBRIDRL_RUN_DATASET(prefix, PreferenceDataset)                                                              \
  HYBRIDRL_RUN_DATASET(prefix, LabelledDataset)                                                                \
  HYBRIDRL_RUN_DATASET(prefix, CompletionDataset)

#if defined(HYBRIDRL_EXTERN_PRESETS)
namespace hybridrl {
HYBRIDRL_RUN_PRESETS(extern)
}  // namespace hybridrl
#endif
