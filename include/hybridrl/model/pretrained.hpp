#pragma once
/// \file
/// Hugging Face checkpoint I/O: `config.json` plus `model.safetensors` or sharded
/// `model-0000k-of-0000n.safetensors` with `model.safetensors.index.json`, by HF tensor names, in
/// fp32 / bf16 / fp16. Loading validates every tensor (present, right shape) before copying any,
/// so a bad checkpoint is an Error naming the file and tensor, never a half-loaded model. Files are
/// memory-mapped and copied once, straight into the parameters. Saving writes each file through
/// io::AtomicFile, removes the HF weight files of an earlier save (only those), and writes
/// config.json last.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "hybridrl/core/device.hpp"
#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/io/atomic_file.hpp"
#include "hybridrl/io/json.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include "hybridrl/model/config.hpp"
#include "hybridrl/model/parameter_init.hpp"
#include "hybridrl/model/safetensors.hpp"

namespace hybridrl {

/// Where and how to put loaded weights.
struct LoadOptions {
  /// Parameter dtype after loading (stored tensors are converted).
  HYBRIDRL_ARG(at::ScalarType, dtype) = at::kFloat;
  /// Device of the parameters.
  HYBRIDRL_ARG(at::Device, device) = at::Device(at::kCPU);
  /// Reject tensors in the checkpoint that the model does not use (except known extras such as a
  /// tied `lm_head.weight` or a critic's `score.*`).
  HYBRIDRL_ARG(bool, strict) = true;
  /// Bytes the parameters may take on `device`; 0 = what the device has available now (the CPU's
  /// MemAvailable, the GPU's free memory). A checkpoint whose config implies more is refused
  /// before any parameter is allocated.
  HYBRIDRL_ARG(int64_t, max_memory) = 0;
};

/// How to write a checkpoint.
struct SaveOptions {
  /// Stored dtype; default: the parameters' dtype.
  HYBRIDRL_ARG(std::optional<at::ScalarType>, dtype) = std::nullopt;
  /// Largest shard in bytes before splitting into model-0000k-of-0000n files (HF's max_shard_size).
  HYBRIDRL_ARG(int64_t, max_shard_bytes) = int64_t{5} << 30;
};

/// HF's name for a dtype ("float32", "bfloat16", "float16").
inline std::string hf_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kDouble: return "float64";
    default: return c10::toString(t);
  }
}

/// The tensors of a Hugging Face model directory (pretrained weights; "checkpoint" in hybridrl
/// means a training checkpoint): every shard memory-mapped, names mapped to their file.
class PretrainedReader {
 public:
  /// Opens `dir`: model.safetensors, or the shards listed by model.safetensors.index.json.
  explicit PretrainedReader(const std::string& dir) : dir_(dir) {
    namespace fs = std::filesystem;
    const auto single = fs::path(dir) / "model.safetensors";
    const auto index = fs::path(dir) / "model.safetensors.index.json";
    std::error_code ec;
    if (fs::exists(single, ec)) {
      source_ = single.string();
      files_.emplace_back(single.string());
      for (const auto& n : files_.back().names()) where_[n] = 0;
      return;
    }
    HYBRIDRL_CHECK(fs::exists(index, ec),
                   fmt::format("'{}' has neither model.safetensors nor model.safetensors.index.json", dir),
                   "save the checkpoint with save_pretrained (safe_serialization, the default)");
    source_ = index.string();
    auto parsed = io::parse_json(io::read_text_file(index.string(), "index", size_t{256} << 20));
    HYBRIDRL_CHECK(static_cast<bool>(parsed),
                   fmt::format("'{}' is not valid JSON ({})", index.string(), parsed.error), "re-save the checkpoint");
    const nlohmann::json& j = parsed.value;
    HYBRIDRL_CHECK(j.is_object(), fmt::format("'{}' is not a JSON object", index.string()), "re-save the checkpoint");
    HYBRIDRL_CHECK(j.contains("weight_map") && j["weight_map"].is_object(),
                   fmt::format("'{}' has no weight_map object", index.string()), "re-save the checkpoint");
    std::map<std::string, size_t> file_index;
    for (const auto& [name, file] : j["weight_map"].items()) {
      HYBRIDRL_CHECK(file.is_string(), fmt::format("'{}': weight_map['{}'] is not a file name", index.string(), name),
                     "re-save the checkpoint");
      const auto f = file.get<std::string>();
      check_shard_name(f, name, index.string());
      auto it = file_index.find(f);
      if (it == file_index.end()) {
        files_.emplace_back((fs::path(dir) / f).string());
        it = file_index.emplace(f, files_.size() - 1).first;
      }
      HYBRIDRL_CHECK(files_[it->second].contains(name),
                     fmt::format("'{}' lists tensor '{}' but '{}' does not hold it", index.string(), name,
                                 files_[it->second].path()),
                     "the checkpoint is incomplete or mixed from two saves: re-save it");
      where_[name] = it->second;
    }
  }
  /// Whether the checkpoint holds `name`.
  [[nodiscard]] bool contains(const std::string& name) const { return where_.count(name) > 0; }
  /// The file holding `name` (the directory when absent).
  [[nodiscard]] std::string file_of(const std::string& name) const {
    auto it = where_.find(name);
    return it == where_.end() ? dir_ : files_[it->second].path();
  }
  /// Dtype, shape and offsets of `name` from its file's header (no tensor is created).
  [[nodiscard]] const SafetensorsEntry& entry(const std::string& name) const {
    auto it = where_.find(name);
    HYBRIDRL_CHECK(it != where_.end(), fmt::format("checkpoint '{}' has no tensor '{}'", dir_, name),
                   "check that the checkpoint matches config.json's architecture and sizes");
    return files_[it->second].entry(name);
  }
  /// Zero-copy CPU view of `name` (see SafetensorsFile::get).
  [[nodiscard]] at::Tensor get(const std::string& name) const {
    auto it = where_.find(name);
    HYBRIDRL_CHECK(it != where_.end(), fmt::format("checkpoint '{}' has no tensor '{}'", dir_, name),
                   "check that the checkpoint matches config.json's architecture and sizes");
    return files_[it->second].get(name);
  }
  /// Every tensor name, sorted.
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : where_) out.push_back(k);
    return out;
  }
  /// The checkpoint directory.
  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }
  /// The file that lists the tensors: model.safetensors or model.safetensors.index.json.
  [[nodiscard]] const std::string& source() const noexcept { return source_; }

 private:
  /// A shard name stays inside the directory: not empty, not absolute, no `..` component, no NUL
  /// (HF shard names are plain file names), so an index cannot point at /etc/passwd or ../x.
  static void check_shard_name(const std::string& f, const std::string& tensor, const std::string& index) {
    bool ok = !f.empty() && f.front() != '/' && f.find('\0') == std::string::npos;
    for (const auto& part : std::filesystem::path(f)) ok = ok && part != "..";
    HYBRIDRL_CHECK(ok,
                   fmt::format("'{}': weight_map['{}'] names the file '{}', which is not inside the "
                               "checkpoint directory", index, tensor, f.size() > 200 ? f.substr(0, 200) + "..." : f),
                   "shard names must be plain relative file names such as model-00001-of-00002.safetensors");
  }

  std::string dir_;
  std::string source_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;
};

/// Copies the checkpoint's tensors into `module`'s same-named parameters. Every parameter is
/// checked (present, same shape) before any is written. `ignore_missing` lists names that may be
/// absent (left as they are); with `strict`, checkpoint tensors the module does not have are an
/// error unless listed in `allowed_extra` (exact names or prefixes ending in '.').
inline void load_weights(torch::nn::Module& module, const PretrainedReader& ckpt, bool strict = true,
                         const std::set<std::string>& allowed_extra = {},
                         const std::set<std::string>& ignore_missing = {}) {
  auto params = module.named_parameters();
  std::vector<std::pair<at::Tensor, at::Tensor>> plan;
  for (auto& p : params) {
    const auto& name = p.key();
    if (!ckpt.contains(name)) {
      HYBRIDRL_CHECK(ignore_missing.count(name) > 0,
                     fmt::format("'{}' has no tensor '{}' (shape [{}])", ckpt.source(), name,
                                 fmt::join(p.value().sizes(), ", ")),
                     "check that the checkpoint matches config.json (architecture, layers, tied embeddings)");
      continue;
    }
    auto t = ckpt.get(name);
    HYBRIDRL_CHECK(t.sizes() == p.value().sizes(),
                   fmt::format("'{}': tensor '{}' has shape [{}] but config.json implies [{}]", ckpt.file_of(name),
                               name, fmt::join(t.sizes(), ", "), fmt::join(p.value().sizes(), ", ")),
                   "the weights do not belong to this config.json: use the config saved with them");
    HYBRIDRL_CHECK(at::isFloatingType(t.scalar_type()),
                   fmt::format("'{}': tensor '{}' has dtype {}, not a float type", ckpt.file_of(name), name,
                               c10::toString(t.scalar_type())),
                   "store weights as F32, BF16 or F16");
    plan.emplace_back(p.value(), t);
  }
  if (strict) {
    for (const auto& name : ckpt.names()) {
      if (params.contains(name) || allowed_extra.count(name) > 0) continue;
      bool prefixed = false;
      for (const auto& a : allowed_extra) {
        prefixed = prefixed || (!a.empty() && a.back() == '.' && name.rfind(a, 0) == 0);
      }
      HYBRIDRL_CHECK(prefixed,
                     fmt::format("'{}': tensor '{}' is not a parameter of this model", ckpt.file_of(name), name),
                     "check that config.json's architecture matches the weights, or load with "
                     "LoadOptions{}.strict(false)");
    }
  }
  c10::NoGradGuard no_grad;
  for (auto& [param, src] : plan) param.copy_(src);
}

/// One tensor a model has: its Hugging Face name and shape.
struct ParameterShape {
  std::string name;            ///< e.g. model.layers.0.mlp.up_proj.weight
  std::vector<int64_t> shape;  ///< e.g. [intermediate_size, hidden_size]
};

/// The head on a checkpoint's decoder trunk: the causal LM's `lm_head`, the critic's `score` with
/// bias (`...ForTokenClassification`), or the reward model's `score` without (`...ForSequenceClassification`).
enum class ModelHead { language_model, value, reward };

/// The tensors a Llama-family decoder with `c` and `head` has, in HF order (embedding; per layer
/// attention, MLP, norms; final norm; `lm_head.weight` unless tied, or the critic's
/// `score.weight`/`score.bias`, or the reward model's `score.weight`). Computed from the config
/// alone, so a checkpoint is checked before any model memory is allocated.
inline std::vector<ParameterShape> expected_parameter_shapes(const ModelConfig& c, ModelHead head) {
  std::vector<ParameterShape> s;
  const int64_t H = c.hidden_size, I = c.intermediate_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim;
  auto add = [&](std::string name, std::vector<int64_t> shape) { s.push_back({std::move(name), std::move(shape)}); };
  add("model.embed_tokens.weight", {c.vocab_size, H});
  const bool qkv_bias = c.attention_bias || c.qkv_bias;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const auto p = fmt::format("model.layers.{}.", l);
    add(p + "self_attn.q_proj.weight", {q, H});
    add(p + "self_attn.k_proj.weight", {kv, H});
    add(p + "self_attn.v_proj.weight", {kv, H});
    add(p + "self_attn.o_proj.weight", {H, q});
    if (qkv_bias) {
      add(p + "self_attn.q_proj.bias", {q});
      add(p + "self_attn.k_proj.bias", {kv});
      add(p + "self_attn.v_proj.bias", {kv});
    }
    if (c.attention_bias) add(p + "self_attn.o_proj.bias", {H});
    add(p + "mlp.gate_proj.weight", {I, H});
    add(p + "mlp.up_proj.weight", {I, H});
    add(p + "mlp.down_proj.weight", {H, I});
    if (c.mlp_bias) {
      add(p + "mlp.gate_proj.bias", {I});
      add(p + "mlp.up_proj.bias", {I});
      add(p + "mlp.down_proj.bias", {H});
    }
    add(p + "input_layernorm.weight", {H});
    add(p + "post_attention_layernorm.weight", {H});
  }
  add("model.norm.weight", {H});
  if (head == ModelHead::value) {
    add("score.weight", {1, H});
    add("score.bias", {1});
  } else if (head == ModelHead::reward) {
    add("score.weight", {1, H});
  } else if (!c.tie_word_embeddings) {
    add("lm_head.weight", {c.vocab_size, H});
  }
  return s;
}
/// As above: the critic's tensors when `critic`, else the causal LM's.
inline std::vector<ParameterShape> expected_parameter_shapes(const ModelConfig& c, bool critic = false) {
  return expected_parameter_shapes(c, critic ? ModelHead::value : ModelHead::language_model);
}

namespace detail {

/// Checks every tensor the config implies against the checkpoint headers, before the model is
/// built: a config.json whose sizes disagree with the weights (or a tiny config claiming 10^9
/// layers) fails here without allocating the model. `optional` names may be absent.
inline void check_shapes_before_building(const ModelConfig& c, const PretrainedReader& ckpt, ModelHead head,
                                         const std::set<std::string>& optional = {}) {
  // The layer count first, so a config claiming 10^9 layers fails before its name list is built.
  const auto last = fmt::format("model.layers.{}.input_layernorm.weight", c.num_hidden_layers - 1);
  HYBRIDRL_CHECK(ckpt.contains(last),
                 fmt::format("'{}' has no tensor '{}': config.json's num_hidden_layers = {} is more than "
                             "the checkpoint holds", ckpt.source(), last, c.num_hidden_layers),
                 "the weights do not belong to this config.json: use the config saved with them");
  for (const auto& [name, shape] : expected_parameter_shapes(c, head)) {
    if (!ckpt.contains(name)) {
      HYBRIDRL_CHECK(optional.count(name) > 0,
                     fmt::format("'{}' has no tensor '{}' (shape [{}])", ckpt.source(), name, fmt::join(shape, ", ")),
                     "check that the checkpoint matches config.json (architecture, layers, tied embeddings)");
      continue;
    }
    const auto& have = ckpt.entry(name).shape;
    HYBRIDRL_CHECK(have == shape,
                   fmt::format("'{}': tensor '{}' has shape [{}] but config.json implies [{}]", ckpt.file_of(name),
                               name, fmt::join(have, ", "), fmt::join(shape, ", ")),
                   "the weights do not belong to this config.json: use the config saved with them");
  }
}

/// Bytes the parameters of `c` with `head` take in `dtype`, from the config alone.
inline int64_t parameter_bytes(const ModelConfig& c, ModelHead head, at::ScalarType dtype) {
  int64_t n = 0;
  for (const auto& p : expected_parameter_shapes(c, head)) {
    int64_t k = 1;
    for (auto d : p.shape) k *= d;
    n += k;
  }
  return n * static_cast<int64_t>(c10::elementSize(dtype));
}

/// Refuses to build `c` with `head` when its parameters in `o.dtype()` exceed `o.max_memory()`
/// (or, at 0, the memory `o.device()` has available now; not checked where that is unknown).
inline void check_fits_in_memory(const ModelConfig& c, ModelHead head, const LoadOptions& o, const std::string& dir) {
  const auto need = parameter_bytes(c, head, o.dtype());
  const auto limit = o.max_memory() > 0 ? std::optional<int64_t>(o.max_memory()) : available_memory(o.device());
  if (!limit) return;
  constexpr double gib = 1024.0 * 1024.0 * 1024.0;
  HYBRIDRL_CHECK(need <= *limit,
                 fmt::format("'{}': the parameters take {} bytes ({:.2f} GiB) in {} but {} has {} bytes "
                             "({:.2f} GiB) {}",
                             dir, need, static_cast<double>(need) / gib, hf_dtype_name(o.dtype()), o.device().str(),
                             *limit, static_cast<double>(*limit) / gib,
                             o.max_memory() > 0 ? "allowed (LoadOptions::max_memory)" : "available"),
                 "load in a smaller dtype (model.dtype=bfloat16), free memory or use a device with more, or "
                 "shard the model over several devices (Sharding<FSDP>)");
}

/// Builds `Model` for `c` on the load's device and dtype without drawing parameters (they are all
/// copied from the checkpoint next), after checking that it fits.
template <class Model>
Model build_for_loading(const ModelConfig& c, ModelHead head, const LoadOptions& o, const std::string& dir) {
  check_fits_in_memory(c, head, o, dir);
  ParameterInit scope(at::TensorOptions().device(o.device()).dtype(o.dtype()), /*random=*/false);
  Model m(c);
  m->to(o.device(), o.dtype());  // the few parameters our layers do not create (a critic's score)
  return m;
}

}  // namespace detail

/// Loads a causal LM (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) from a Hugging Face
/// checkpoint directory. Every tensor shape is checked against config.json before the model is
/// built, and the parameters' size against LoadOptions::max_memory (default: what the device has
/// free). The model is then built on the target device in the target dtype, uninitialised
/// (ParameterInit), and every parameter copied from the checkpoint: the peak memory is the model
/// in its final dtype, with no fp32 copy on the host.
inline CausalLM load_causal_lm(const std::string& dir, const LoadOptions& o = {}) {
  const auto config = load_config(dir);
  PretrainedReader ckpt(dir);
  detail::check_shapes_before_building(config, ckpt, ModelHead::language_model);
  auto m = detail::build_for_loading<CausalLM>(config, ModelHead::language_model, o, dir);
  load_weights(*m, ckpt, o.strict(), {"lm_head.weight", "score.weight", "score.bias"});
  return m;
}

/// Loads a critic from a `...ForTokenClassification` checkpoint, or from a policy checkpoint (the
/// trunk is loaded and `score` freshly initialised, as verl's critic starts).
inline ValueModel load_value_model(const std::string& dir, const LoadOptions& o = {}) {
  const auto config = load_config(dir);
  PretrainedReader ckpt(dir);
  detail::check_shapes_before_building(config, ckpt, ModelHead::value, {"score.weight", "score.bias"});
  auto m = detail::build_for_loading<ValueModel>(config, ModelHead::value, o, dir);
  load_weights(*m, ckpt, o.strict(), {"lm_head.weight"}, {"score.weight", "score.bias"});
  return m;
}

/// Loads a frozen reward model (eval mode, no grads) from a `...ForSequenceClassification`
/// checkpoint with one label — a reward model trained with TRL's RewardTrainer or OpenRLHF, e.g.
/// Skywork-Reward. A checkpoint of another head is an Error: a reward model's score head must be
/// trained, never freshly drawn.
inline RewardModel load_reward_model(const std::string& dir, const LoadOptions& o = {}) {
  const auto config = load_config(dir);
  std::string arch;
  if (config.raw.contains("architectures") && config.raw["architectures"].is_array() &&
      !config.raw["architectures"].empty() && config.raw["architectures"][0].is_string()) {
    arch = config.raw["architectures"][0].get<std::string>();
  }
  const std::string want = "ForSequenceClassification";
  HYBRIDRL_CHECK(arch.size() > want.size() && arch.compare(arch.size() - want.size(), want.size(), want) == 0,
                 fmt::format("'{}' holds a {} checkpoint, not a reward model", dir, arch.empty() ? "(no architecture)" : arch),
                 "pass a ...ForSequenceClassification checkpoint with one label (trained with TRL's RewardTrainer or "
                 "OpenRLHF), or score with a rule (reward.name=task, exact_match, gsm8k, boxed_math)");
  PretrainedReader ckpt(dir);
  detail::check_shapes_before_building(config, ckpt, ModelHead::reward);
  auto m = detail::build_for_loading<RewardModel>(config, ModelHead::reward, o, dir);
  load_weights(*m, ckpt, o.strict(), {"lm_head.weight"});
  for (auto& p : m->parameters()) p.requires_grad_(false);
  m->eval();
  return m;
}

namespace detail {

/// Whether `f` is a file an HF save owns, which a new save may replace: `model.safetensors`,
/// `model-NNNNN-of-NNNNN.safetensors`, the index, or a temporary hybridrl left from one of them.
/// (transformers removes only these too; `model_ema.safetensors` and friends are the user's.)
inline bool is_hf_weight_file(const std::string& f) {
  auto shard = [](std::string_view n) {
    // model-\d{5}-of-\d{5}.safetensors
    if (n.size() != 32 || n.substr(0, 6) != "model-" || n.substr(11, 4) != "-of-" ||
        n.substr(20) != ".safetensors") {
      return false;
    }
    for (size_t i : {6, 7, 8, 9, 10, 15, 16, 17, 18, 19}) {
      if (n[i] < '0' || n[i] > '9') return false;
    }
    return true;
  };
  std::string_view n = f;
  if (const auto t = n.find(io::kTempMarker); t != std::string_view::npos) n = n.substr(0, t);
  return n == "model.safetensors" || n == "model.safetensors.index.json" || shard(n) ||
         (n != f && n == "config.json");
}

/// Writes `module`'s parameters as HF safetensors (sharded when larger than max_shard_bytes) and
/// `config` as config.json into `dir`.
inline void save_module(const torch::nn::Module& module, const nlohmann::json& config, const std::string& dir,
                        const SaveOptions& o) {
  namespace fs = std::filesystem;
  HYBRIDRL_CHECK(o.max_shard_bytes() > 0, "SaveOptions: max_shard_bytes must be positive",
                 "set SaveOptions{}.max_shard_bytes(bytes) with bytes > 0");
  fs::create_directories(dir);
  std::vector<std::map<std::string, at::Tensor>> shards(1);
  int64_t shard_bytes = 0, total = 0;
  for (const auto& p : module.named_parameters()) {
    auto t = p.value().detach();
    if (o.dtype()) t = t.to(*o.dtype());
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    if (shard_bytes > 0 && shard_bytes + bytes > o.max_shard_bytes()) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace(p.key(), t);
    shard_bytes += bytes;
    total += bytes;
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  std::set<std::string> written;
  const auto n = shards.size();
  if (n == 1) {
    save_safetensors((fs::path(dir) / "model.safetensors").string(), shards[0], meta);
    written.insert("model.safetensors");
  } else {
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", nlohmann::json::object()}};
    for (size_t k = 0; k < n; ++k) {
      const auto name = fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, n);
      save_safetensors((fs::path(dir) / name).string(), shards[k], meta);
      for (const auto& [t, v] : shards[k]) index["weight_map"][t] = name;
      written.insert(name);
    }
    io::write_file_atomic((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2));
    written.insert("model.safetensors.index.json");
  }
  // Remove what an earlier save left behind (its shards, index or single file, and temporaries of
  // crashed saves), so HF never reads a mix of two saves; other files are the user's and stay.
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto f = e.path().filename().string();
    if (is_hf_weight_file(f) && written.count(f) == 0) stale.push_back(e.path());
  }
  for (const auto& p : stale) ::unlink(p.c_str());
  // config.json last: until it is replaced, the directory's config still describes readable weights.
  io::write_file_atomic((fs::path(dir) / "config.json").string(), config.dump(2));
}

}  // namespace detail

/// Saves a causal LM as a Hugging Face checkpoint (`AutoModelForCausalLM.from_pretrained` reads it).
inline void save_pretrained(const CausalLM& model, const std::string& dir, const SaveOptions& o = {}) {
  const auto dtype = o.dtype().value_or(model->parameters().front().scalar_type());
  detail::save_module(*model, config_to_json(model->config(), "", hf_dtype_name(dtype)), dir, o);
}

/// Saves a critic as `<Arch>ForTokenClassification` with one label (AutoModelForTokenClassification reads it).
inline void save_pretrained(const ValueModel& model, const std::string& dir, const SaveOptions& o = {}) {
  const auto dtype = o.dtype().value_or(model->parameters().front().scalar_type());
  const auto& c = model->config();
  auto j = config_to_json(c, detail::architecture_prefix(c.architecture) + "ForTokenClassification",
                          hf_dtype_name(dtype));
  j["id2label"] = {{"0", "LABEL_0"}};
  j["label2id"] = {{"LABEL_0", 0}};
  j["num_labels"] = 1;
  detail::save_module(*model, j, dir, o);
}

}  // namespace hybridrl
