#pragma once
/// \file
/// Configuration over any reflectable Options struct (core/options.hpp's HYBRIDRL_FIELDS), from
/// one field visitor: JSON in and out (`to_json` / `from_json`, also the checkpoint metadata),
/// dotted overrides (`apply_override(opts, "algorithm.clip_high", "0.28")`), environment overrides
/// (`HYBRIDRL_ALGORITHM__CLIP_HIGH=0.28`: prefix, then the path in upper case with `__` for each
/// dot), the printed effective configuration (`describe`) and `--help` text (`help`).
///
/// Field types: nested Options (recursed into; a struct with `static constexpr bool inline_fields
/// = true` lends its fields to its parent's level), named enums (by name, enum_names), bool,
/// integers, floating point, std::string, at::ScalarType ("bfloat16"...), at::Device ("cuda:0"),
/// std::optional<T> (null = empty) and std::vector<T>.
///
/// Errors are hybridrl::Error with the full dotted key: an unknown key names the nearest valid one
/// ("did you mean algorithm.clip_high?"), a wrong type names the expected type, an enum value not
/// in the list names the valid ones. Layers apply in the order defaults < file < environment <
/// command line (`configure`); a key a layer does not mention keeps the value below it.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/detail/dependent_false.hpp"
#include "hybridrl/io/json.hpp"

extern char** environ;  // POSIX: the process environment (read by environment_overrides)

namespace hybridrl {

/// An Options struct whose fields appear at its parent's level in the configuration (composition
/// in code, one flat table in the file): it sets `static constexpr bool inline_fields = true`.
template <class O>
concept inline_options = reflectable_options<O> && requires {
  requires O::inline_fields;
};

namespace detail {

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {
  using value_type = T;
};
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {
  using value_type = T;
};

/// dtype names as configuration files spell them (the first spelling of each is the one written).
inline constexpr std::array<std::pair<c10::ScalarType, std::string_view>, 14> dtype_names{{
    {c10::ScalarType::Float, "float32"},   {c10::ScalarType::BFloat16, "bfloat16"},
    {c10::ScalarType::Half, "float16"},    {c10::ScalarType::Double, "float64"},
    {c10::ScalarType::Long, "int64"},      {c10::ScalarType::Int, "int32"},
    {c10::ScalarType::Short, "int16"},     {c10::ScalarType::Char, "int8"},
    {c10::ScalarType::Byte, "uint8"},      {c10::ScalarType::Bool, "bool"},
    {c10::ScalarType::Float, "float"},     {c10::ScalarType::Half, "half"},
    {c10::ScalarType::BFloat16, "bf16"},   {c10::ScalarType::Float, "fp32"},
}};

/// The canonical configuration name of a dtype.
inline std::string dtype_name(c10::ScalarType t) {
  for (const auto& [v, n] : dtype_names) {
    if (v == t) return std::string(n);
  }
  return c10::toString(t);
}

template <named_enum E>
std::string enum_list() {
  std::string out;
  for (const auto& [v, n] : enum_names<E>::values) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

/// The type of a field as --help and type errors name it.
template <class T>
std::string type_name() {
  if constexpr (std::is_same_v<T, bool>) {
    return "bool";
  } else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>) {
    return "unsigned integer";
  } else if constexpr (std::is_integral_v<T>) {
    return "integer";
  } else if constexpr (std::is_floating_point_v<T>) {
    return "number";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "string";
  } else if constexpr (named_enum<T>) {
    return "one of {" + enum_list<T>() + "}";
  } else if constexpr (std::is_same_v<T, c10::ScalarType>) {
    return "dtype (float32, bfloat16, float16, float64, int64, ...)";
  } else if constexpr (std::is_same_v<T, c10::Device>) {
    return "device (cpu, cuda, cuda:N)";
  } else if constexpr (is_optional<T>::value) {
    return type_name<typename is_optional<T>::value_type>() + " or null";
  } else if constexpr (is_vector<T>::value) {
    return "list of " + type_name<typename is_vector<T>::value_type>();
  } else if constexpr (reflectable_options<T>) {
    return "table";
  } else {
    static_assert(dependent_false<T>, "hybridrl: this Options field type has no configuration "
                                        "form; use bool, an integer, a number, std::string, a "
                                        "named enum, at::ScalarType, at::Device, std::optional, "
                                        "std::vector or a nested Options struct.");
  }
}

/// Calls `f(name, field)` for every field of `o`, descending into inline_options members.
template <class O, class F>
void for_each_field(O& o, F&& f) {
  std::remove_const_t<O>::visit_fields(o, [&](std::string_view name, auto& field) {
    using T = std::remove_cvref_t<decltype(field)>;
    if constexpr (inline_options<T>) {
      for_each_field(field, f);
    } else {
      f(name, field);
    }
  });
}

inline std::string join_path(std::string_view prefix, std::string_view name) {
  return prefix.empty() ? std::string(name) : std::string(prefix) + "." + std::string(name);
}

/// Every key path of O (tables and leaves), for the did-you-mean search.
template <class O>
void collect_keys(const O& o, const std::string& prefix, std::vector<std::string>& out) {
  for_each_field(o, [&](std::string_view name, const auto& field) {
    using T = std::remove_cvref_t<decltype(field)>;
    const std::string path = join_path(prefix, name);
    out.push_back(path);
    if constexpr (reflectable_options<T>) collect_keys(field, path, out);
  });
}

/// Levenshtein distance (the did-you-mean metric) of `a` and `b` when it is at most `limit`, else
/// `limit + 1`. Only the band of cells within `limit` of the diagonal is computed and the work stops
/// once a row's smallest entry passes the limit: a mistyped key of any length costs
/// O(min(|a|, |b|) × limit) per candidate, not O(|a| × |b|) (a 4 KB garbage key against every
/// configuration key took most of a configuration read's time before).
inline std::size_t edit_distance(std::string_view a, std::string_view b,
                                 std::size_t limit = std::numeric_limits<std::size_t>::max() - 1) {
  const std::size_t over = limit + 1;
  if ((a.size() > b.size() ? a.size() - b.size() : b.size() - a.size()) > limit) return over;
  if (a.size() < b.size()) std::swap(a, b);  // b, the row, is the shorter
  // row[j]: the distance of a[0, i) and b[0, j), capped at `over` outside the band
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = std::min(j, over);
  for (std::size_t i = 1; i <= a.size(); ++i) {
    const std::size_t lo = i > limit ? i - limit : 1;           // the band: |i − j| ≤ limit
    const std::size_t hi = limit >= b.size() ? b.size() : std::min(b.size(), i + limit);
    std::size_t diag = row[lo - 1];
    row[lo - 1] = lo == 1 ? std::min(i, over) : over;  // left of the band: beyond the limit
    std::size_t smallest = row[lo - 1];
    for (std::size_t j = lo; j <= hi; ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({up + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0u : 1u), over});
      diag = up;
      smallest = std::min(smallest, row[j]);
    }
    if (hi < b.size()) row[hi + 1] = over;  // right of the band
    if (smallest >= over) return over;
  }
  return std::min(row[b.size()], over);
}

/// The valid key nearest to `key` (empty when none is close: more than max(3, |key| / 3) edits).
inline std::string nearest_key(std::string_view key, const std::vector<std::string>& keys) {
  const std::size_t threshold = std::max<std::size_t>(3, key.size() / 3);
  std::string best;
  std::size_t best_d = threshold + 1;
  for (const auto& k : keys) {
    // only a strictly nearer key can win: ask for no more than best_d − 1 edits
    const std::size_t d = edit_distance(key, k, best_d - 1);
    if (d < best_d) best_d = d, best = k;
    if (best_d == 0) break;
  }
  return best;
}

/// A verl key and the key that holds its value here (docs/configuration.md, "From verl"), with a
/// note where the meaning differs.
struct RenamedKey {
  std::string_view verl, key, note;
};

/// verl's spellings of the keys a verl run sets most. Edit distance alone pairs some of them with
/// the wrong key (ppo_micro_batch_size → ppo_mini_batch_size, total_epochs → total_steps).
inline constexpr std::array<RenamedKey, 43> verl_keys{{
    {"actor_rollout_ref.actor.ppo_mini_batch_size", "geometry.ppo_mini_batch_size", ""},
    {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "geometry.micro_batch_size_per_gpu", ""},
    {"actor_rollout_ref.actor.ppo_micro_batch_size", "geometry.micro_batch_size_per_gpu",
     "it counts sequences over all GPUs, this key per GPU: divide it by the number of GPUs"},
    {"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "geometry.micro_batch_size_per_gpu",
     "one micro-batch size serves the scoring and the update passes"},
    {"actor_rollout_ref.rollout.log_prob_micro_batch_size", "geometry.micro_batch_size_per_gpu",
     "it counts sequences over all GPUs, this key per GPU, and serves the scoring and the update passes"},
    {"critic.ppo_micro_batch_size_per_gpu", "geometry.micro_batch_size_per_gpu", "the critic trains on the policy's micro-batches"},
    {"actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "geometry.max_tokens_per_micro_batch", ""},
    {"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", "geometry.max_tokens_per_micro_batch", ""},
    {"actor_rollout_ref.actor.use_dynamic_bsz", "geometry.adaptive_micro_batch", ""},
    {"actor_rollout_ref.actor.ppo_epochs", "geometry.ppo_epochs", ""},
    {"actor_rollout_ref.actor.ulysses_sequence_parallel_size", "geometry.sequence_parallel_size", ""},
    {"actor_rollout_ref.rollout.n", "rollout.n", ""},
    {"actor_rollout_ref.rollout.tensor_model_parallel_size", "rollout.tensor_parallel_size", ""},
    {"actor_rollout_ref.actor.megatron.tensor_model_parallel_size", "sharding.tensor_parallel_size", ""},
    {"actor_rollout_ref.rollout.gpu_memory_utilization", "rollout.memory_fraction",
     "a fraction of the memory left free after the weights"},
    {"data.max_response_length", "rollout.max_new_tokens", ""},
    {"actor_rollout_ref.rollout.response_length", "rollout.max_new_tokens", ""},
    {"actor_rollout_ref.rollout.temperature", "rollout.temperature", ""},
    {"actor_rollout_ref.rollout.top_k", "rollout.top_k", ""},
    {"actor_rollout_ref.rollout.top_p", "rollout.top_p", ""},
    {"actor_rollout_ref.rollout.free_cache_engine", "rollout.free_cache_engine", ""},
    {"actor_rollout_ref.model.path", "model.path", ""},
    {"actor_rollout_ref.model.enable_gradient_checkpointing", "sharding.activation_checkpointing", ""},
    {"actor_rollout_ref.actor.fsdp_config.param_offload", "sharding.cpu_offload", ""},
    {"actor_rollout_ref.actor.fsdp_config.optimizer_offload", "sharding.cpu_offload", ""},
    {"actor_rollout_ref.actor.optim.lr", "optim.lr", ""},
    {"actor_rollout_ref.actor.optim.lr_warmup_steps", "optim.warmup_steps", ""},
    {"actor_rollout_ref.actor.optim.weight_decay", "optim.weight_decay", ""},
    {"actor_rollout_ref.actor.optim.warmup_style", "optim.schedule", ""},
    {"actor_rollout_ref.actor.grad_clip", "optim.max_grad_norm", ""},
    {"actor_rollout_ref.actor.clip_ratio_low", "algorithm.clip_low", ""},
    {"actor_rollout_ref.actor.clip_ratio_high", "algorithm.clip_high", ""},
    {"actor_rollout_ref.actor.clip_ratio_c", "algorithm.clip_c", ""},
    {"actor_rollout_ref.actor.loss_agg_mode", "algorithm.loss_agg", ""},
    {"actor_rollout_ref.actor.entropy_coeff", "algorithm.entropy_coeff", ""},
    {"actor_rollout_ref.actor.use_kl_loss", "algorithm.use_kl_loss", ""},
    {"actor_rollout_ref.actor.kl_loss_coef", "algorithm.kl_loss_coef", ""},
    {"algorithm.norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std", ""},
    {"critic.cliprange_value", "algorithm.cliprange_value", ""},
    {"critic.model.path", "model.critic_path", ""},
    {"trainer.critic_warmup", "critic.warmup_steps", ""},
    {"trainer.total_training_steps", "trainer.total_steps", ""},
    {"trainer.total_epochs", "loader.epochs", ""},
}};

/// The last component of a dotted key.
inline std::string_view key_leaf(std::string_view key) {
  const auto dot = key.rfind('.');
  return dot == std::string_view::npos ? key : key.substr(dot + 1);
}

/// The key here that the verl key `key` names, with the hint for an unknown-key message
/// ("; did you mean K? (verl's ...)"), or "" when `key` is no verl key this configuration has. A
/// key matches by its whole path, or by its last component when that is verl's own spelling (no
/// key here ends with it): `geometry.ppo_micro_batch_size` is verl's too.
inline std::string verl_key_hint(std::string_view key, const std::vector<std::string>& keys) {
  auto has = [&](std::string_view k) { return std::find(keys.begin(), keys.end(), k) != keys.end(); };
  const auto leaf = key_leaf(key);
  const bool leaf_is_ours = std::any_of(keys.begin(), keys.end(), [&](const std::string& k) { return key_leaf(k) == leaf; });
  const RenamedKey* found = nullptr;
  for (const auto& r : verl_keys) {
    if (r.verl == key && has(r.key)) {
      found = &r;
      break;
    }
  }
  if (found == nullptr && !leaf_is_ours) {
    for (const auto& r : verl_keys) {
      if (key_leaf(r.verl) == leaf && has(r.key)) {
        found = &r;
        break;
      }
    }
  }
  if (found == nullptr) return {};
  return fmt::format("; did you mean {}? (verl's {}{})", found->key, found->verl == key ? found->verl : leaf,
                     found->note.empty() ? "" : ": " + std::string(found->note));
}

/// How a value reached a field: text (overrides, environment, YAML scalars) is parsed by the
/// field's type; JSON values must already have it.
enum class ValueForm { json, text };

/// "a number", "an integer", "one of {...}": the expected type as a sentence says it.
inline std::string with_article(std::string_view type) {
  if (type.rfind("one of", 0) == 0) return std::string(type);
  const bool vowel = !type.empty() && std::string_view("aeiou").find(type[0]) != std::string_view::npos;
  return (vowel ? "an " : "a ") + std::string(type);
}

/// The value as io::brief shows it: bounded, not recursive, and no exception for a string that is
/// not UTF-8 (a YAML scalar or an override may hold any bytes; dump() would throw).
[[noreturn]] inline void type_error(const std::string& path, std::string_view expected,
                                    const nlohmann::json& got, std::string_view source) {
  throw Error(fmt::format("{} = {} is not {}{}", path, io::brief(got), with_article(expected),
                          source.empty() ? "" : fmt::format(" (from {})", source)),
              fmt::format("give {} a value of type {}", path, expected));
}

inline bool is_null_text(const std::string& s) { return s == "null" || s == "~" || s.empty(); }

template <class T>
void read_value(const nlohmann::json& j, T& v, const std::string& path, ValueForm form,
                std::string_view source);

/// Reads the fields of `o` that `j` names; any other key is an error naming the nearest valid key.
template <class O>
void read_options(const nlohmann::json& j, O& o, const std::string& prefix, ValueForm form,
                  std::string_view source, const std::vector<std::string>& all_keys) {
  if (!j.is_object()) type_error(prefix.empty() ? "the configuration" : prefix, "table", j, source);
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool found = false;
    for_each_field(o, [&](std::string_view name, auto& field) {
      if (found || name != it.key()) return;
      found = true;
      using T = std::remove_cvref_t<decltype(field)>;
      const std::string path = join_path(prefix, name);
      if constexpr (reflectable_options<T>) {
        read_options(it.value(), field, path, form, source, all_keys);
      } else {
        read_value(it.value(), field, path, form, source);
      }
    });
    if (!found) {
      // the full key: an override's or environment variable's nested remainder is part of it,
      // and of a file's unknown table its first key (a verl file: actor_rollout_ref.actor.<key>)
      std::string path = join_path(prefix, it.key());
      for (const nlohmann::json* v = &it.value(); v->is_object() && !v->empty();
           v = &v->begin().value()) {
        path += "." + v->begin().key();
      }
      std::string hint = verl_key_hint(path, all_keys);
      if (hint.empty()) {
        const std::string near = nearest_key(path, all_keys);
        if (!near.empty()) hint = fmt::format("; did you mean {}?", near);
      }
      std::vector<std::string> level;
      for (const auto& k : all_keys) {
        const bool under = prefix.empty() ? k.find('.') == std::string::npos
                                          : k.rfind(prefix + ".", 0) == 0 &&
                                                k.find('.', prefix.size() + 1) == std::string::npos;
        if (under) level.push_back(k);
      }
      std::string listed;
      for (const auto& k : level) listed += (listed.empty() ? "" : ", ") + k;
      throw Error(fmt::format("unknown configuration key {}{}{}", path,
                              source.empty() ? "" : fmt::format(" (from {})", source), hint),
                  fmt::format("use a key this configuration has ({}); --help lists all of them",
                              listed));
    }
  }
}

template <class T>
void read_value(const nlohmann::json& j, T& v, const std::string& path, ValueForm form,
                std::string_view source) {
  const bool text = form == ValueForm::text && j.is_string();
  const std::string s = j.is_string() ? j.get<std::string>() : std::string{};
  if constexpr (std::is_same_v<T, bool>) {
    if (j.is_boolean()) {
      v = j.get<bool>();
    } else if (text && (s == "true" || s == "false")) {
      v = s == "true";
    } else {
      type_error(path, type_name<T>(), j, source);
    }
  } else if constexpr (std::is_integral_v<T>) {
    nlohmann::json n = j;
    if (text) {
      n = nlohmann::json::parse(s, nullptr, false);
      if (n.is_discarded()) type_error(path, type_name<T>(), j, source);
    }
    if (n.is_number_unsigned()) {
      const auto u = n.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
        type_error(path, type_name<T>() + " in range", j, source);
      }
      v = static_cast<T>(u);
    } else if (n.is_number_integer()) {
      const auto i = n.get<int64_t>();
      if (i < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          (std::is_signed_v<T> && i > static_cast<int64_t>(std::numeric_limits<T>::max()))) {
        type_error(path, type_name<T>() + " in range", j, source);
      }
      v = static_cast<T>(i);
    } else {
      type_error(path, type_name<T>(), j, source);
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    nlohmann::json n = j;
    if (text) {
      if (s == ".inf" || s == "inf") n = std::numeric_limits<double>::infinity();
      else if (s == "-.inf" || s == "-inf") n = -std::numeric_limits<double>::infinity();
      else n = nlohmann::json::parse(s, nullptr, false);
    }
    if (!n.is_number()) type_error(path, type_name<T>(), j, source);
    v = n.get<T>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!j.is_string()) type_error(path, type_name<T>(), j, source);
    // a configuration is written back as JSON (run_config.json, the checkpoint's): text only
    if (const auto bad = io::invalid_utf8_at(s); bad != std::string::npos) {
      throw Error(fmt::format("{} = {} is not UTF-8 text (byte {}){}", path, io::brief(j), bad,
                              source.empty() ? "" : fmt::format(" (from {})", source)),
                  fmt::format("write {} as UTF-8 text", path));
    }
    v = s;
  } else if constexpr (named_enum<T>) {
    if (!j.is_string()) type_error(path, type_name<T>(), j, source);
    const auto e = enum_from_name<T>(s);
    if (!e) {
      throw Error(fmt::format("{} = \"{}\" is not one of {}{}", path, s, enum_list<T>(),
                              source.empty() ? "" : fmt::format(" (from {})", source)),
                  fmt::format("set {} to one of: {}", path, enum_list<T>()));
    }
    v = *e;
  } else if constexpr (std::is_same_v<T, c10::ScalarType>) {
    if (!j.is_string()) type_error(path, type_name<T>(), j, source);
    for (const auto& [t, n] : dtype_names) {
      if (n == s) {
        v = t;
        return;
      }
    }
    throw Error(fmt::format("{} = \"{}\" is not a dtype name{}", path, s,
                            source.empty() ? "" : fmt::format(" (from {})", source)),
                fmt::format("set {} to one of: float32, bfloat16, float16, float64, int64, int32, "
                            "int16, int8, uint8, bool",
                            path));
  } else if constexpr (std::is_same_v<T, c10::Device>) {
    if (!j.is_string()) type_error(path, type_name<T>(), j, source);
    try {
      v = c10::Device(s);
    } catch (const std::exception&) {
      throw Error(fmt::format("{} = \"{}\" is not a device{}", path, s,
                              source.empty() ? "" : fmt::format(" (from {})", source)),
                  fmt::format("set {} to cpu, cuda or cuda:N", path));
    }
  } else if constexpr (is_optional<T>::value) {
    if (j.is_null() || (text && is_null_text(s))) {
      v.reset();
    } else {
      typename is_optional<T>::value_type x{};
      if (v) x = *v;
      read_value(j, x, path, form, source);
      v = std::move(x);
    }
  } else if constexpr (is_vector<T>::value) {
    nlohmann::json a = j;
    ValueForm elements = form;
    if (text) {
      // a JSON list ("[2, 5]", "[\"a\", \"b\"]"), else items written bare: "[a.jsonl, b.jsonl]"
      // or one item "a.jsonl", each parsed as text by the element type
      a = nlohmann::json::parse(s, nullptr, false);
      elements = ValueForm::json;
      if (a.is_discarded() || !a.is_array()) {
        std::string_view body = s;
        const bool bracketed = body.size() >= 2 && body.front() == '[' && body.back() == ']';
        if (bracketed) body = body.substr(1, body.size() - 2);
        a = nlohmann::json::array();
        auto trim = [](std::string_view x) {
          while (!x.empty() && std::isspace(static_cast<unsigned char>(x.front()))) x.remove_prefix(1);
          while (!x.empty() && std::isspace(static_cast<unsigned char>(x.back()))) x.remove_suffix(1);
          return x;
        };
        if (!trim(body).empty()) {
          for (std::size_t start = 0;;) {
            const auto comma = body.find(',', start);
            a.push_back(std::string(trim(body.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start))));
            if (comma == std::string_view::npos) break;
            start = comma + 1;
          }
        }
        elements = ValueForm::text;
      }
    }
    if (!a.is_array()) type_error(path, type_name<T>(), j, source);
    T out;
    out.reserve(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      typename is_vector<T>::value_type x{};
      read_value(a[i], x, fmt::format("{}[{}]", path, i), elements, source);
      out.push_back(std::move(x));
    }
    v = std::move(out);
  } else {
    (void)type_name<T>();  // static_assert with the list of supported types
  }
}

template <class T>
nlohmann::json write_value(const T& v);

template <class O>
nlohmann::json write_options(const O& o) {
  nlohmann::json j = nlohmann::json::object();
  for_each_field(o, [&](std::string_view name, const auto& field) {
    j[std::string(name)] = write_value(field);
  });
  return j;
}

template <class T>
nlohmann::json write_value(const T& v) {
  if constexpr (reflectable_options<T>) {
    return write_options(v);
  } else if constexpr (named_enum<T>) {
    return std::string(enum_name(v));
  } else if constexpr (std::is_same_v<T, c10::ScalarType>) {
    return dtype_name(v);
  } else if constexpr (std::is_same_v<T, c10::Device>) {
    return v.str();
  } else if constexpr (is_optional<T>::value) {
    return v ? write_value(*v) : nlohmann::json(nullptr);
  } else if constexpr (is_vector<T>::value) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& x : v) a.push_back(write_value(x));
    return a;
  } else {
    (void)type_name<T>();  // rejects unsupported types with a sentence
    return nlohmann::json(v);
  }
}

/// Builds the nested JSON object {"a": {"b": value}} for the dotted key "a.b".
inline nlohmann::json nest(std::string_view dotted, nlohmann::json value) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = dotted.find('.', start);
    parts.emplace_back(dotted.substr(start, dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    nlohmann::json o = nlohmann::json::object();
    o[*it] = std::move(value);
    value = std::move(o);
  }
  return value;
}

template <class O>
std::vector<std::string> all_keys(const O& o) {
  std::vector<std::string> keys;
  collect_keys(o, "", keys);
  return keys;
}

template <class O>
void flatten(const O& o, const std::string& prefix,
             std::vector<std::pair<std::string, std::string>>& out, bool with_types) {
  for_each_field(o, [&](std::string_view name, const auto& field) {
    using T = std::remove_cvref_t<decltype(field)>;
    const std::string path = join_path(prefix, name);
    if constexpr (reflectable_options<T>) {
      flatten(field, path, out, with_types);
    } else {
      const std::string value = write_value(field).dump();
      out.emplace_back(path, with_types ? fmt::format("<{}> (default: {})", type_name<T>(), value)
                                        : value);
    }
  });
}

}  // namespace detail

/// Every leaf key of O's configuration (full dotted paths), in declaration order.
template <reflectable_options O>
[[nodiscard]] std::vector<std::string> config_keys(const O& o = O{}) {
  std::vector<std::pair<std::string, std::string>> flat;
  detail::flatten(o, "", flat, false);
  std::vector<std::string> keys;
  for (auto& [k, v] : flat) keys.push_back(std::move(k));
  return keys;
}

/// `o` as a JSON object: nested Options are tables, enums and dtypes their names. This is also
/// the configuration a checkpoint stores (`checkpoint_metadata`).
template <reflectable_options O>
[[nodiscard]] nlohmann::json to_json(const O& o) {
  return detail::write_options(o);
}

/// nlohmann's conversion hook (found by ADL): `nlohmann::json j = opts;`.
template <reflectable_options O>
void to_json(nlohmann::json& j, const O& o) {
  j = detail::write_options(o);
}

/// Sets the fields `j` names (others keep their values); throws hybridrl::Error for an unknown key
/// (with the nearest valid one), a wrong type or an unknown enum value. `source` (a file name,
/// "environment") goes into the message.
template <reflectable_options O>
void from_json(const nlohmann::json& j, O& o, std::string_view source = {}) {
  detail::read_options(j, o, "", detail::ValueForm::json, source, detail::all_keys(o));
}

/// Default options with the fields `j` names set: `auto o = from_json<PagedOptions>(j);`.
template <reflectable_options O>
[[nodiscard]] O from_json(const nlohmann::json& j) {
  O o{};
  from_json(j, o);
  return o;
}

/// The configuration a checkpoint stores with the weights: `to_json(o)`.
template <reflectable_options O>
[[nodiscard]] nlohmann::json checkpoint_metadata(const O& o) {
  return to_json(o);
}

/// Sets one field by its dotted key from text, parsed by the field's type ("0.28", "true",
/// "token_mean", "bfloat16", "[1, 2]", "null"); throws hybridrl::Error like from_json.
template <reflectable_options O>
void apply_override(O& o, std::string_view dotted_key, std::string_view value,
                    std::string_view source = "override") {
  HYBRIDRL_CHECK(!dotted_key.empty(), fmt::format("empty configuration key (from {})", source),
                 "write overrides as key=value, e.g. algorithm.clip_high=0.28");
  detail::read_options(detail::nest(dotted_key, std::string(value)), o, "",
                       detail::ValueForm::text, source, detail::all_keys(o));
}

/// Applies command-line style overrides, each "key=value", in order (later ones win).
template <reflectable_options O>
void apply_overrides(O& o, const std::vector<std::string>& overrides,
                     std::string_view source = "command line") {
  for (const auto& kv : overrides) {
    const auto eq = kv.find('=');
    HYBRIDRL_CHECK(eq != std::string::npos && eq > 0,
                   fmt::format("override \"{}\" (from {}) has no key=value form", kv, source),
                   "write overrides as key=value, e.g. algorithm.clip_high=0.28");
    apply_override(o, std::string_view(kv).substr(0, eq), std::string_view(kv).substr(eq + 1),
                   source);
  }
}

/// The dotted key an environment variable names: prefix removed, lower case, "__" = ".".
/// `HYBRIDRL_ALGORITHM__CLIP_HIGH` → `algorithm.clip_high`.
[[nodiscard]] inline std::string env_key(std::string_view variable, std::string_view prefix) {
  std::string key;
  const std::string_view rest = variable.substr(prefix.size());
  for (std::size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] == '_' && i + 1 < rest.size() && rest[i + 1] == '_') {
      key += '.';
      ++i;
    } else {
      key += static_cast<char>(std::tolower(static_cast<unsigned char>(rest[i])));
    }
  }
  return key;
}

/// The process environment's variables that start with `prefix`, as (name, value) pairs.
[[nodiscard]] inline std::vector<std::pair<std::string, std::string>> environment_variables(
    std::string_view prefix = "HYBRIDRL_") {
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view kv(*e);
    const auto eq = kv.find('=');
    if (eq == std::string_view::npos || kv.substr(0, prefix.size()) != prefix) continue;
    out.emplace_back(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// The library's own switches, read where they act and not configuration keys: fault injection
/// (io/fault.hpp), the fused CUDA kernels (cuda/fused.hpp), cuDNN's dense attention
/// (detail/compat.hpp) and programmatic dependent launch (src/cuda/launch.cuh). A new
/// `std::getenv("HYBRIDRL_...")` belongs here, or `hybridrl train` calls it an unknown key.
inline constexpr std::array<std::string_view, 4> process_variables{"HYBRIDRL_FAULT", "HYBRIDRL_FUSED_KERNELS",
                                                                   "HYBRIDRL_CUDNN_ATTENTION", "HYBRIDRL_PDL"};

/// Applies environment overrides: each (NAME, value) with NAME starting with `prefix` sets the key
/// env_key(NAME) (e.g. HYBRIDRL_ROLLOUT__SAMPLING__TEMPERATURE=0.7); an unknown key is an error.
/// The process_variables are skipped.
template <reflectable_options O>
void apply_environment(O& o, const std::vector<std::pair<std::string, std::string>>& variables,
                       std::string_view prefix = "HYBRIDRL_") {
  for (const auto& [name, value] : variables) {
    if (std::string_view(name).substr(0, prefix.size()) != prefix) continue;
    if (std::find(process_variables.begin(), process_variables.end(), name) != process_variables.end()) continue;
    apply_override(o, env_key(name, prefix), value, "environment variable " + name);
  }
}

/// The layers of a configuration, lowest first after the defaults: a parsed file (JSON, or YAML
/// through options_yaml.hpp), environment variables, command-line "key=value" overrides.
struct ConfigSources {
  std::optional<nlohmann::json> file;                            ///< parsed configuration file
  std::string file_name = "configuration file";                  ///< named in errors
  bool file_scalars_are_text = false;  ///< true for YAML (read_yaml_file): field types parse them
  std::vector<std::pair<std::string, std::string>> environment;  ///< (NAME, value) pairs
  std::string env_prefix = "HYBRIDRL_";                          ///< only these variables count
  std::vector<std::string> overrides;                            ///< "key=value", last wins
};

/// `defaults` with each layer applied in precedence order: defaults < file < environment <
/// command line. Does not validate (the caller's validate() does, once, on the result).
template <reflectable_options O>
[[nodiscard]] O configure(O defaults, const ConfigSources& sources) {
  if (sources.file) {
    detail::read_options(*sources.file, defaults, "",
                         sources.file_scalars_are_text ? detail::ValueForm::text
                                                       : detail::ValueForm::json,
                         sources.file_name, detail::all_keys(defaults));
  }
  apply_environment(defaults, sources.environment, sources.env_prefix);
  apply_overrides(defaults, sources.overrides);
  return defaults;
}

/// The effective configuration, one line per field: `full.dotted.path = value` (JSON spelling).
template <reflectable_options O>
[[nodiscard]] std::string describe(const O& o) {
  std::vector<std::pair<std::string, std::string>> flat;
  detail::flatten(o, "", flat, false);
  std::string out;
  for (const auto& [k, v] : flat) out += fmt::format("{} = {}\n", k, v);
  return out;
}

/// `--help` text: every key with its type and default (the values of `defaults`).
template <reflectable_options O>
[[nodiscard]] std::string help(const O& defaults = O{}) {
  std::vector<std::pair<std::string, std::string>> flat;
  detail::flatten(defaults, "", flat, true);
  std::size_t width = 0;
  for (const auto& [k, v] : flat) width = std::max(width, k.size());
  std::string out =
      "configuration keys (file: nested tables; command line: key=value; environment: "
      "HYBRIDRL_<KEY> with __ for each dot):\n";
  for (const auto& [k, v] : flat) out += fmt::format("  {:<{}}  {}\n", k, width, v);
  return out;
}

}  // namespace hybridrl
