#pragma once
/// \file
/// ModelConfig: the Hugging Face `config.json` of a Llama-family causal LM (LlamaForCausalLM,
/// MistralForCausalLM, Qwen2ForCausalLM), read with nlohmann-json. Both rope spellings are read:
/// transformers 4.x (`rope_theta` + `rope_scaling`) and 5.x (`rope_parameters`). The original JSON
/// is kept so a saved checkpoint carries every field it was loaded with.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/io/json.hpp"

namespace hybridrl {

/// Rotary-embedding frequency scaling, as in transformers' `modeling_rope_utils.py`.
struct RopeScaling {
  std::string type = "default";       ///< "default", "linear" or "llama3"
  double factor = 1.0;                ///< scaling factor (linear, llama3)
  double low_freq_factor = 1.0;       ///< llama3
  double high_freq_factor = 4.0;      ///< llama3
  int64_t original_max_position_embeddings = 8192;  ///< llama3
};

/// The architecture hyper-parameters of a Llama-family decoder.
struct ModelConfig {
  std::string architecture = "LlamaForCausalLM";  ///< HF class name (`architectures[0]`)
  std::string model_type = "llama";               ///< HF `model_type`
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t head_dim = 128;              ///< `head_dim`, default hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool attention_bias = false;         ///< bias on q/k/v/o (Llama `attention_bias`)
  bool qkv_bias = false;               ///< bias on q/k/v only (Qwen2)
  bool mlp_bias = false;               ///< bias on gate/up/down (Llama `mlp_bias`)
  bool tie_word_embeddings = false;    ///< lm_head shares the embedding matrix
  std::optional<int64_t> sliding_window;  ///< Mistral / Qwen2 local attention window (keys)
  /// Per-layer attention kind, HF's `layer_types`: "sliding_attention" layers use sliding_window,
  /// "full_attention" layers see every earlier key. Empty: every layer uses sliding_window
  /// (Mistral). Qwen2 derives it from use_sliding_window and max_window_layers.
  std::vector<std::string> layer_types;
  double initializer_range = 0.02;
  std::optional<int64_t> bos_token_id, eos_token_id, pad_token_id;
  /// Every id that ends a generation (with eos_token_id): config.json's `eos_token_id` when it is a
  /// list (Llama-3.1), replaced by generation_config.json's (one id or a list: Qwen2.5-Instruct's
  /// [<|im_end|>, <|endoftext|>]) when load_config finds that file, as transformers' generate() does.
  std::vector<int64_t> eos_token_ids;
  std::string dtype = "float32";       ///< the checkpoint's stored dtype (`dtype`/`torch_dtype`)
  nlohmann::json raw = nlohmann::json::object();  ///< the config.json this was read from

  /// The attention window of layer `i`: sliding_window on a sliding layer, none on a full one.
  [[nodiscard]] std::optional<int64_t> layer_window(int64_t i) const {
    if (!sliding_window || layer_types.empty()) return sliding_window;
    return layer_types[static_cast<size_t>(i)] == "sliding_attention" ? sliding_window : std::nullopt;
  }
  /// True when some layers slide and others do not (the forward then builds two masks).
  [[nodiscard]] bool mixed_windows() const {
    if (!sliding_window || layer_types.empty()) return false;
    const auto n = std::count(layer_types.begin(), layer_types.end(), "sliding_attention");
    return n > 0 && n < static_cast<std::ptrdiff_t>(layer_types.size());
  }

  /// Checks the numbers are consistent; throws Error whose problem starts with the field's name.
  void validate() const {
    const std::string fix = "fix config.json (compare it with one written by transformers' save_pretrained)";
    auto pos = [&](int64_t v, const char* name) {
      HYBRIDRL_CHECK(v > 0, fmt::format("{} = {} must be positive", name, v), fix);
    };
    pos(vocab_size, "vocab_size");
    pos(hidden_size, "hidden_size");
    pos(intermediate_size, "intermediate_size");
    pos(num_hidden_layers, "num_hidden_layers");
    pos(num_attention_heads, "num_attention_heads");
    pos(num_key_value_heads, "num_key_value_heads");
    pos(head_dim, "head_dim");
    pos(max_position_embeddings, "max_position_embeddings");
    HYBRIDRL_CHECK(num_attention_heads % num_key_value_heads == 0,
                   fmt::format("num_attention_heads = {} is not a multiple of num_key_value_heads = {}",
                               num_attention_heads, num_key_value_heads),
                   "grouped-query attention needs heads = groups × kv heads");
    HYBRIDRL_CHECK(head_dim % 2 == 0, fmt::format("head_dim = {} is odd", head_dim),
                   "rotary embeddings need an even head_dim");
    auto positive = [&](double v, const char* name) {
      HYBRIDRL_CHECK(v > 0 && std::isfinite(v), fmt::format("{} = {} must be positive and finite", name, v), fix);
    };
    positive(rms_norm_eps, "rms_norm_eps");
    positive(rope_theta, "rope_theta");
    HYBRIDRL_CHECK(initializer_range >= 0 && std::isfinite(initializer_range),
                   fmt::format("initializer_range = {} must be non-negative", initializer_range), fix);
    HYBRIDRL_CHECK(!sliding_window || *sliding_window > 0,
                   fmt::format("sliding_window = {} must be positive (or null for full attention)",
                               sliding_window.value_or(0)),
                   fix);
    for (auto id : eos_token_ids) {
      HYBRIDRL_CHECK(id >= 0 && id < vocab_size,
                     fmt::format("eos_token_id {} lies outside the vocabulary [0, {})", id, vocab_size),
                     "fix eos_token_id in config.json or generation_config.json");
    }
    HYBRIDRL_CHECK(layer_types.empty() || static_cast<int64_t>(layer_types.size()) == num_hidden_layers,
                   fmt::format("layer_types has {} entries but num_hidden_layers = {}", layer_types.size(),
                               num_hidden_layers),
                   "give one \"full_attention\" or \"sliding_attention\" per layer (or leave layer_types out)");
    for (size_t i = 0; i < layer_types.size(); ++i) {
      HYBRIDRL_CHECK(layer_types[i] == "full_attention" || layer_types[i] == "sliding_attention",
                     fmt::format("layer_types[{}] = '{}' is not supported", i, layer_types[i]),
                     "hybridrl's layers are \"full_attention\" or \"sliding_attention\"");
    }
    HYBRIDRL_CHECK(rope_scaling.type == "default" || rope_scaling.type == "linear" ||
                       rope_scaling.type == "llama3",
                   fmt::format("rope_scaling.rope_type = '{}' is not supported", rope_scaling.type),
                   "hybridrl supports rope types default, linear and llama3");
    if (rope_scaling.type != "default") positive(rope_scaling.factor, "rope_scaling.factor");
    if (rope_scaling.type == "llama3") {
      positive(rope_scaling.low_freq_factor, "rope_scaling.low_freq_factor");
      HYBRIDRL_CHECK(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor,
                     fmt::format("rope_scaling.high_freq_factor = {} must exceed low_freq_factor = {}",
                                 rope_scaling.high_freq_factor, rope_scaling.low_freq_factor),
                     fix);
      pos(rope_scaling.original_max_position_embeddings, "rope_scaling.original_max_position_embeddings");
    }
  }
};

/// Checks that every id `tok` can produce indexes the model's embedding: a tokenizer vocabulary
/// larger than `config.vocab_size` would otherwise end in a raw torch "index out of range".
/// (A smaller tokenizer vocabulary is fine: checkpoints often pad vocab_size.)
template <class Tok>
void check_vocabulary(const Tok& tok, const ModelConfig& config) {
  const auto n = static_cast<int64_t>(tok.vocab_size());
  HYBRIDRL_CHECK(n <= config.vocab_size,
                 fmt::format("the tokenizer's vocabulary has {} ids but the model's vocab_size is {}: "
                             "token ids {}..{} would index past the embedding",
                             n, config.vocab_size, config.vocab_size, n - 1),
                 "use the tokenizer saved with this checkpoint (the tiny test fixtures with vocab_size "
                 "320 use ByteTokenizer)");
}

/// The architectures hybridrl implements, by Hugging Face class name.
inline const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> names = {"LlamaForCausalLM", "MistralForCausalLM",
                                                 "Qwen2ForCausalLM"};
  return names;
}

namespace detail {

/// "LlamaForCausalLM" → "Llama" (the prefix HF uses for sibling heads: ForTokenClassification
/// critics, ForSequenceClassification reward models).
inline std::string architecture_prefix(const std::string& arch) {
  for (const char* suffix : {"ForCausalLM", "ForTokenClassification", "ForSequenceClassification", "Model"}) {
    const std::string s = suffix;
    if (arch.size() > s.size() && arch.compare(arch.size() - s.size(), s.size(), s) == 0) {
      return arch.substr(0, arch.size() - s.size());
    }
  }
  return arch;
}

template <class T>
T json_or(const nlohmann::json& j, const char* key, T fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if constexpr (std::is_same_v<T, int64_t>) {
    // nlohmann would truncate 32000.7 to 32000 and wrap 2^64-1 to -1: integers only.
    HYBRIDRL_CHECK(j[key].is_number_integer() &&
                       (!j[key].is_number_unsigned() ||
                        j[key].get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)),
                   fmt::format("{} = {} is not an integer", key, io::brief(j[key])),
                   "write the field as a whole number");
  }
  return j[key].get<T>();
}

/// A required integer field.
inline int64_t json_int(const nlohmann::json& j, const char* key) {
  HYBRIDRL_CHECK(j.contains(key) && !j[key].is_null(), fmt::format("{} is missing", key),
                 "add the field (transformers' save_pretrained writes it)");
  return json_or<int64_t>(j, key, 0);
}


}  // namespace detail

/// The most layers config_from_json lists in a derived `layer_types` (Qwen2's sliding layers).
inline constexpr int64_t kMaxDerivedLayers = int64_t{1} << 16;

/// Parses a config.json object. `source` names the file in errors. An architecture hybridrl does not
/// implement is an Error that lists the supported ones.
inline ModelConfig config_from_json(const nlohmann::json& j, const std::string& source = "config.json") {
  ModelConfig c;
  HYBRIDRL_CHECK(j.is_object(), fmt::format("'{}' is not a JSON object", source),
                 "pass a config.json written by transformers' save_pretrained");
  c.raw = j;  // callers parse with io::parse_json, whose depth cap keeps this copy shallow
  try {
    std::string arch;
    if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty()) {
      arch = j["architectures"][0].get<std::string>();
    }
    const std::string prefix = detail::architecture_prefix(arch);
    const bool known = prefix == "Llama" || prefix == "Mistral" || prefix == "Qwen2";
    HYBRIDRL_CHECK(known,
                   fmt::format("unknown architecture '{}'",
                               arch.empty() ? std::string("(none given)") : arch),
                   "hybridrl implements LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM "
                   "(and their ForTokenClassification critics and ForSequenceClassification reward models)");
    c.architecture = prefix + "ForCausalLM";
    c.model_type = detail::json_or<std::string>(j, "model_type", prefix == "Qwen2" ? "qwen2"
                                                                  : prefix == "Mistral" ? "mistral"
                                                                                        : "llama");
    c.vocab_size = detail::json_int(j, "vocab_size");
    c.hidden_size = detail::json_int(j, "hidden_size");
    c.intermediate_size = detail::json_int(j, "intermediate_size");
    c.num_hidden_layers = detail::json_int(j, "num_hidden_layers");
    c.num_attention_heads = detail::json_int(j, "num_attention_heads");
    c.num_key_value_heads = detail::json_or<int64_t>(j, "num_key_value_heads", c.num_attention_heads);
    // The fallback divides: only with a positive head count (validate() reports the rest).
    const int64_t derived_head_dim =
        c.num_attention_heads > 0 && c.hidden_size > 0 ? c.hidden_size / c.num_attention_heads : 0;
    c.head_dim = detail::json_or<int64_t>(j, "head_dim", derived_head_dim);
    c.max_position_embeddings = detail::json_or<int64_t>(j, "max_position_embeddings", 2048);
    c.rms_norm_eps = detail::json_or<double>(j, "rms_norm_eps", 1e-6);
    c.attention_bias = detail::json_or<bool>(j, "attention_bias", false);
    c.mlp_bias = detail::json_or<bool>(j, "mlp_bias", false);
    c.qkv_bias = prefix == "Qwen2";
    c.tie_word_embeddings = detail::json_or<bool>(j, "tie_word_embeddings", false);
    c.initializer_range = detail::json_or<double>(j, "initializer_range", 0.02);
    auto id = [&](const char* key) -> std::optional<int64_t> {
      if (!j.contains(key) || !j[key].is_number_integer()) return std::nullopt;
      return j[key].get<int64_t>();
    };
    const bool has_window = j.contains("sliding_window") && !j["sliding_window"].is_null();
    if (prefix == "Mistral" && has_window) c.sliding_window = detail::json_int(j, "sliding_window");
    // Qwen2 (as transformers' Qwen2Config): the window applies only with use_sliding_window, and
    // only on the layers layer_types marks sliding (by default layers >= max_window_layers).
    if (prefix == "Qwen2" && detail::json_or<bool>(j, "use_sliding_window", false)) {
      HYBRIDRL_CHECK(has_window, "use_sliding_window = true (Qwen2) but sliding_window is null",
                     "give sliding_window (the window in tokens) or set use_sliding_window to false");
      c.sliding_window = detail::json_int(j, "sliding_window");
    }
    // (Mistral's modeling ignores layer_types: its window is on every layer)
    if (prefix == "Qwen2" && j.contains("layer_types") && !j["layer_types"].is_null()) {
      HYBRIDRL_CHECK(j["layer_types"].is_array(), "layer_types is not a list",
                     "give one \"full_attention\" or \"sliding_attention\" per layer");
      c.layer_types = j["layer_types"].get<std::vector<std::string>>();
    } else if (prefix == "Qwen2" && c.sliding_window) {
      // one entry per layer, so the count is bounded first: 10^12 layers was a 10^12-entry list
      // (a count below it that the checkpoint does not hold is refused when the weights load)
      HYBRIDRL_CHECK(c.num_hidden_layers <= kMaxDerivedLayers,
                     fmt::format("num_hidden_layers = {} is more layers than any model has (at most {} with "
                                 "use_sliding_window)", c.num_hidden_layers, kMaxDerivedLayers),
                     "fix num_hidden_layers in config.json");
      const auto first = detail::json_or<int64_t>(j, "max_window_layers", 28);
      for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        c.layer_types.emplace_back(i >= first ? "sliding_attention" : "full_attention");
      }
    }
    c.bos_token_id = id("bos_token_id");
    c.eos_token_id = id("eos_token_id");
    c.eos_token_ids = io::json_id_list(j, "eos_token_id");
    if (!c.eos_token_id && !c.eos_token_ids.empty()) c.eos_token_id = c.eos_token_ids.front();
    c.pad_token_id = id("pad_token_id");
    c.dtype = detail::json_or<std::string>(j, "dtype", detail::json_or<std::string>(j, "torch_dtype", "float32"));
    // rope: transformers 5 writes rope_parameters (with rope_theta inside); 4.x rope_theta + rope_scaling.
    nlohmann::json rope = nlohmann::json::object();
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
      rope = j["rope_parameters"];
    } else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
      rope = j["rope_scaling"];
    }
    c.rope_theta = detail::json_or<double>(rope, "rope_theta", detail::json_or<double>(j, "rope_theta", 10000.0));
    c.rope_scaling.type = detail::json_or<std::string>(rope, "rope_type", detail::json_or<std::string>(rope, "type", "default"));
    c.rope_scaling.factor = detail::json_or<double>(rope, "factor", 1.0);
    c.rope_scaling.low_freq_factor = detail::json_or<double>(rope, "low_freq_factor", 1.0);
    c.rope_scaling.high_freq_factor = detail::json_or<double>(rope, "high_freq_factor", 4.0);
    c.rope_scaling.original_max_position_embeddings =
        detail::json_or<int64_t>(rope, "original_max_position_embeddings", 8192);
    const auto act = detail::json_or<std::string>(j, "hidden_act", "silu");
    HYBRIDRL_CHECK(act == "silu", fmt::format("hidden_act = '{}' is not supported", act),
                   "hybridrl's SwiGLU MLP uses silu, as Llama, Mistral and Qwen2 do");
    c.validate();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("'{}': missing or mistyped field ({})", source, e.what()),
                "compare the file with a config.json written by transformers' save_pretrained");
  } catch (const Error& e) {
    throw Error(fmt::format("'{}': {}", source, e.problem()), e.fix());
  }
  return c;
}

/// Reads `<dir>/config.json` (or `dir` itself when it names a file).
inline ModelConfig load_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code dir_ec;
  const auto file = fs::is_directory(path, dir_ec) ? (fs::path(path) / "config.json").string() : path;
  std::error_code ec;
  HYBRIDRL_CHECK(fs::is_regular_file(file, ec), fmt::format("cannot read '{}': no such file", file),
                 "pass a Hugging Face checkpoint directory that holds config.json");
  const auto text = io::read_text_file(file, "config", size_t{64} << 20);
  auto parsed = io::parse_json(text);
  HYBRIDRL_CHECK(static_cast<bool>(parsed), fmt::format("'{}' is not valid JSON ({})", file, parsed.error),
                 "repair or re-save config.json");
  auto c = config_from_json(parsed.value, file);
  // generation_config.json (transformers' generate() reads its stop ids from there)
  const auto gen = fs::path(file).parent_path() / "generation_config.json";
  if (fs::is_regular_file(gen, ec)) {
    auto g = io::parse_json(io::read_text_file(gen.string(), "generation config", size_t{1} << 20));
    HYBRIDRL_CHECK(static_cast<bool>(g) && g.value.is_object(),
                   fmt::format("'{}' is not a JSON object ({})", gen.string(), g ? "another JSON value" : g.error),
                   "repair or re-save generation_config.json, or remove it");
    try {
      if (g.value.contains("eos_token_id")) c.eos_token_ids = io::json_id_list(g.value, "eos_token_id");
      c.validate();
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("'{}': {}", gen.string(), e.what()), "eos_token_id must be a token id or a list of them");
    } catch (const Error& e) {
      throw Error(fmt::format("'{}': {}", gen.string(), e.problem()), e.fix());
    }
  }
  return c;
}

/// config.json for `c` under the HF class name `architecture` (default: c.architecture), starting
/// from the JSON it was loaded from so unknown fields survive. `dtype` is the stored dtype's HF name.
inline nlohmann::json config_to_json(const ModelConfig& c, const std::string& architecture = "",
                                     const std::string& dtype = "") {
  nlohmann::json j = c.raw.is_object() ? c.raw : nlohmann::json::object();
  j["architectures"] = {architecture.empty() ? c.architecture : architecture};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  // LlamaConfig and MistralConfig always carry head_dim; Qwen2Config has none (it derives it), so
  // it is written there only when it differs from hidden_size / num_attention_heads.
  if (c.model_type != "qwen2" || j.contains("head_dim") ||
      c.head_dim * c.num_attention_heads != c.hidden_size) {
    j["head_dim"] = c.head_dim;
  }
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["initializer_range"] = c.initializer_range;
  if (c.model_type == "llama") {
    j["attention_bias"] = c.attention_bias;
    j["mlp_bias"] = c.mlp_bias;
  }
  if (c.model_type == "mistral") {
    j["sliding_window"] = c.sliding_window ? nlohmann::json(*c.sliding_window) : nlohmann::json(nullptr);
  }
  if (c.model_type == "qwen2") {
    // with the window off, published configs keep a sliding_window value (unused): leave it
    j["use_sliding_window"] = c.sliding_window.has_value();
    if (c.sliding_window) {
      j["sliding_window"] = *c.sliding_window;
    } else if (!j.contains("sliding_window")) {
      j["sliding_window"] = nullptr;
    }
  }
  if (!c.layer_types.empty()) {
    j["layer_types"] = c.layer_types;
  } else if (c.model_type == "qwen2") {
    j.erase("layer_types");  // transformers derives it from max_window_layers
  }
  nlohmann::json rope = {{"rope_type", c.rope_scaling.type}, {"rope_theta", c.rope_theta}};
  if (c.rope_scaling.type != "default") rope["factor"] = c.rope_scaling.factor;
  if (c.rope_scaling.type == "llama3") {
    rope["low_freq_factor"] = c.rope_scaling.low_freq_factor;
    rope["high_freq_factor"] = c.rope_scaling.high_freq_factor;
    rope["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
  }
  // Keep the spelling the checkpoint came with: transformers 5 writes rope_parameters, 4.x (and
  // most published checkpoints) rope_theta + rope_scaling; transformers 5 reads both.
  if (j.contains("rope_parameters")) {
    j["rope_parameters"] = rope;
    j.erase("rope_scaling");
    j.erase("rope_theta");
  } else {
    rope.erase("rope_theta");
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = c.rope_scaling.type == "default" ? nlohmann::json(nullptr) : rope;
  }
  auto put_id = [&](const char* key, const std::optional<int64_t>& v) {
    j[key] = v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  put_id("bos_token_id", c.bos_token_id);
  if (!(j.contains("eos_token_id") && j["eos_token_id"].is_array())) put_id("eos_token_id", c.eos_token_id);  // a list stays
  put_id("pad_token_id", c.pad_token_id);
  const auto d = dtype.empty() ? c.dtype : dtype;
  j[j.contains("torch_dtype") && !j.contains("dtype") ? "torch_dtype" : "dtype"] = d;
  return j;
}

}  // namespace hybridrl
