#pragma once
// `hybridrl generate`: offline batch generation from a Hugging Face checkpoint directory.
//   hybridrl generate --input prompts.jsonl --output out.jsonl model.path=DIR rollout.n=4
//       rollout.max_new_tokens=256 rollout.temperature=0.7 ...
// Input lines hold `prompt_ids` (token ids) or `prompt` (text, through the checkpoint's
// tokenizer.json or tokenizer.model), and optionally `seed`. Output: one line per sample, in input order (the n
// samples of line i together): prompt_ids, response_ids, log_probs, finish_reason, and response
// text when the checkpoint has a tokenizer. Everything the input can get wrong is checked before
// the weights are loaded; the output is written to a temporary file and renamed when complete.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <hybridrl/core/config.hpp>
#include <hybridrl/core/error.hpp>
#include <hybridrl/core/keys.hpp>
#include <hybridrl/core/options.hpp>
#include <hybridrl/core/tensor_batch.hpp>
#include <hybridrl/io/atomic_file.hpp>
#include <hybridrl/io/json.hpp>
#include <hybridrl/model/config.hpp>
#include <hybridrl/model/pretrained.hpp>
#include <hybridrl/rollout/generation.hpp>
#include <hybridrl/rollout/naive.hpp>
#include <hybridrl/rollout/paged.hpp>
#include <hybridrl/rollout/sampling.hpp>
#include <hybridrl/trainer/run.hpp>

namespace hybridrl::app {

/// model.*: the checkpoint and where it runs.
struct GenerateModelOptions {
  /// A Hugging Face checkpoint directory (config.json + safetensors).
  HYBRIDRL_ARG(std::string, path) = "";
  /// Compute dtype of the weights and the KV cache.
  HYBRIDRL_ARG(at::ScalarType, dtype) = at::kFloat;
  /// Device: cpu, cuda, cuda:1, ...
  HYBRIDRL_ARG(std::string, device) = "cpu";
  /// How `messages` lines become text: auto (the checkpoint's tokenizer_config.json chat_template,
  /// when it is ChatML, Llama-3 or Llama-3.1), chatml, llama3, llama3.1 (its
  /// dated system header), or none.
  HYBRIDRL_ARG(std::string, chat_format) = "auto";
  HYBRIDRL_FIELDS(path, dtype, device, chat_format)

  void validate() const {
    HYBRIDRL_CHECK(!path_.empty(), "path is not set", "pass model.path=DIR, a Hugging Face checkpoint directory");
    check_device_option(device_);
    check_chat_format_option(chat_format_);
  }
};

/// rollout.*: the engine, samples per prompt, sampling (rollout.temperature, ...).
struct GenerateRolloutOptions {
  /// naive (dense KV cache) or paged.
  HYBRIDRL_ARG(std::string, name) = "naive";
  /// Samples per prompt.
  HYBRIDRL_ARG(int64_t, n) = 1;
  HYBRIDRL_ARG(SamplingOptions, sampling) = {};
  /// Sequences generated together (Rollout<Naive>).
  HYBRIDRL_ARG(int64_t, max_batch_size) = 64;
  /// Rollout<Paged>: tokens per KV block.
  HYBRIDRL_ARG(int64_t, block_size) = 16;
  /// Rollout<Paged>: tokens the KV pool holds; 0 = memory_fraction of free device memory on CUDA,
  /// 16384 on the CPU.
  HYBRIDRL_ARG(int64_t, kv_cache_tokens) = 0;
  /// Rollout<Paged>: fraction of free device memory for the KV pool (CUDA, kv_cache_tokens 0).
  HYBRIDRL_ARG(double, memory_fraction) = 0.5;
  /// Rollout<Paged>: sequences decoded together at most.
  HYBRIDRL_ARG(int64_t, max_num_seqs) = 256;
  /// Rollout<Paged>: tokens per scheduler step at most.
  HYBRIDRL_ARG(int64_t, max_num_batched_tokens) = 8192;
  /// Rollout<Paged>: a prompt's n samples share its prefill and prompt blocks.
  HYBRIDRL_ARG(bool, prefix_sharing) = true;
  HYBRIDRL_FIELDS(name, n, sampling, max_batch_size, block_size, kv_cache_tokens, memory_fraction, max_num_seqs,
                  max_num_batched_tokens, prefix_sharing)

  /// The Rollout<Paged> options these keys describe.
  [[nodiscard]] PagedOptions paged() const {
    return PagedOptions{}
        .sampling(sampling_)
        .block_size(block_size_)
        .kv_cache_tokens(kv_cache_tokens_)
        .memory_fraction(memory_fraction_)
        .max_num_seqs(max_num_seqs_)
        .max_num_batched_tokens(max_num_batched_tokens_)
        .prefix_sharing(prefix_sharing_);
  }

  void validate() const {
    HYBRIDRL_CHECK(name_ == "naive" || name_ == "paged", fmt::format("name = \"{}\" is not a rollout", name_),
                   "use naive or paged");
    HYBRIDRL_CHECK(n_ >= 1, fmt::format("n = {} is below 1", n_), "ask for at least one sample per prompt");
    HYBRIDRL_CHECK(max_batch_size_ >= 1, fmt::format("max_batch_size = {} is below 1", max_batch_size_),
                   "use a positive batch size, e.g. 64");
    sampling_.validate();  // inline fields: rollout.temperature
    paged().validate();    // the same field names: rollout.block_size, ...
  }
};

/// Everything `hybridrl generate` reads from key=value arguments.
struct GenerateOptions {
  HYBRIDRL_ARG(GenerateModelOptions, model) = {};
  HYBRIDRL_ARG(GenerateRolloutOptions, rollout) = {};
  HYBRIDRL_FIELDS(model, rollout)

  void validate() const {
    detail::validate_member(model_, "model");
    detail::validate_member(rollout_, "rollout");
  }
};

/// One input line.
struct PromptLine {
  std::vector<int64_t> ids;
  std::optional<std::string> text;
  std::optional<nlohmann::json> messages;  ///< a conversation, rendered in the chat format
  std::optional<int64_t> seed;
};

/// Reads the input JSONL: every line must hold one of prompt_ids (a list of integers), prompt (a
/// string) or messages (a conversation); blank lines are skipped. Errors name the file and line.
inline std::vector<PromptLine> read_prompt_lines(const std::string& path) {
  std::ifstream in(path);
  HYBRIDRL_CHECK(in.good(), fmt::format("cannot open the input '{}'", path), "pass --input with a JSONL file that exists");
  std::vector<PromptLine> out;
  std::string line;
  for (int64_t no = 1; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto where = fmt::format("{} line {}", path, no);
    // depth-capped and NUL-rejecting; 1e400 (out_of_range, not a parse_error) is caught there too
    auto parsed = io::parse_json(line);
    HYBRIDRL_CHECK(static_cast<bool>(parsed), fmt::format("{}: not JSON ({})", where, parsed.error),
                   "write one JSON object per line");
    nlohmann::json j = std::move(parsed.value);
    HYBRIDRL_CHECK(j.is_object(), fmt::format("{}: not a JSON object", where),
                   "write one object per line, e.g. {\"prompt_ids\": [1, 2, 3]}");
    const bool has_ids = j.contains("prompt_ids"), has_text = j.contains("prompt"), has_chat = j.contains("messages");
    const int given = int{has_ids} + int{has_text} + int{has_chat};
    HYBRIDRL_CHECK(given == 1,
                   fmt::format("{}: {}", where, given == 0 ? "has none of prompt_ids, prompt and messages"
                                                           : "has more than one of prompt_ids, prompt and messages"),
                   "give each line prompt_ids (token ids), prompt (text) or messages (a conversation), one of them");
    PromptLine p;
    if (has_chat) {
      HYBRIDRL_CHECK(j["messages"].is_array() && !j["messages"].empty(),
                     fmt::format("{}: messages is not a non-empty list", where),
                     "write messages as [{\"role\": \"user\", \"content\": \"...\"}]");
      p.messages = j["messages"];
    } else if (has_ids) {
      const auto& a = j["prompt_ids"];
      HYBRIDRL_CHECK(a.is_array() && !a.empty(), fmt::format("{}: prompt_ids is not a non-empty list", where),
                     "write prompt_ids as a list of token ids, e.g. [1, 2, 3]");
      for (const auto& v : a) {
        HYBRIDRL_CHECK(v.is_number_integer(), fmt::format("{}: prompt_ids holds {}, not an integer", where, v.dump()),
                       "write token ids as integers");
        p.ids.push_back(v.get<int64_t>());
      }
    } else {
      HYBRIDRL_CHECK(j["prompt"].is_string(), fmt::format("{}: prompt is not a string", where),
                     "write the prompt text as a JSON string");
      p.text = j["prompt"].get<std::string>();
    }
    if (j.contains("seed")) {
      HYBRIDRL_CHECK(j["seed"].is_number_integer(), fmt::format("{}: seed is not an integer", where), "write seed as an integer");
      p.seed = j["seed"].get<int64_t>();
    }
    out.push_back(std::move(p));
  }
  HYBRIDRL_CHECK(!out.empty(), fmt::format("the input '{}' holds no prompts", path), "write one JSON object per line");
  return out;
}

/// Generates for `lines` with `engine`, `prompts_per_call` prompts (times n samples) per
/// generate() call, writing one JSONL line per sample in input order; progress and final stats
/// go to stderr.
template <class Engine>
int generate_lines(Engine& engine, const char* engine_name, int64_t prompts_per_call, const std::vector<PromptLine>& lines,
                   const ModelConfig& config, const GenerateRolloutOptions& ro,
                   const std::function<std::string(const std::vector<int64_t>&)>& decode, const std::string& output) {
  const auto P = static_cast<int64_t>(lines.size()), n = ro.n();
  io::AtomicFile out(output);
  const auto start = std::chrono::steady_clock::now();
  int64_t done = 0, generated = 0, prompt_tokens = 0;
  double kv_bytes = 0, prefill_s = 0, decode_s = 0, kv_peak = 0;
  int64_t cached = 0, preemptions = 0;
    for (int64_t first = 0; first < P; first += prompts_per_call) {
    const auto last = std::min(P, first + prompts_per_call);
    std::vector<std::vector<int64_t>> rows;
    std::vector<int64_t> groups, seeds;
    bool any_seed = false;
    for (int64_t i = first; i < last; ++i) {
      for (int64_t s = 0; s < n; ++s) {
        rows.push_back(lines[static_cast<size_t>(i)].ids);
        groups.push_back(i);
        const auto& ls = lines[static_cast<size_t>(i)].seed;
        any_seed = any_seed || ls.has_value();
        seeds.push_back(ls ? *ls : static_cast<int64_t>(request_seed(ro.sampling().seed(), i)));
      }
    }
    auto batch = left_padded_prompts(rows, config.pad_token_id.value_or(0));
    batch.set(keys::group_ids, at::tensor(groups, at::kLong));
    const auto B = static_cast<int64_t>(rows.size());
    if (any_seed) batch.set(keys::sampling_seeds, at::tensor(seeds, at::kLong));
    const TensorBatch res = engine.generate(batch);
    const auto resp = res.tensor(keys::responses).contiguous(), rmask = res.tensor(keys::response_mask).contiguous();
    const auto lps = res.tensor(keys::rollout_log_probs).contiguous(), reasons = res.tensor(keys::finish_reason).contiguous();
    const auto R = resp.size(1);
    for (int64_t b = 0; b < B; ++b) {
      nlohmann::json j;
      j["prompt_ids"] = rows[static_cast<size_t>(b)];
      std::vector<int64_t> r;
      std::vector<float> lp;
      for (int64_t t = 0; t < R; ++t) {
        if (rmask.data_ptr<int64_t>()[b * R + t] == 0) break;
        r.push_back(resp.data_ptr<int64_t>()[b * R + t]);
        lp.push_back(lps.data_ptr<float>()[b * R + t]);
      }
      j["response_ids"] = r;
      j["log_probs"] = lp;
      j["finish_reason"] = finish_reason_name(static_cast<FinishReason>(reasons.data_ptr<int64_t>()[b]));
      if (decode) j["response"] = decode(r);
      const auto text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";  // any decoder's text
      out.write(text.data(), text.size());
    }
    const auto st = engine.stats();
    done += st.sequences;
    generated += st.generated_tokens;
    prompt_tokens += st.prompt_tokens;
    kv_bytes = std::max(kv_bytes, static_cast<double>(st.kv_cache_bytes));
    prefill_s += st.prefill_seconds;
    decode_s += st.decode_seconds;
    kv_peak = std::max(kv_peak, st.kv_peak_utilization);
    cached += st.cached_prompt_tokens;
    preemptions += st.preemptions;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double eta = done > 0 ? secs / static_cast<double>(done) * static_cast<double>(P * n - done) : 0.0;
    std::fprintf(stderr, "generate: %lld/%lld sequences, %.1f tokens/s, ETA %.0f s\n", static_cast<long long>(done),
                 static_cast<long long>(P * n), static_cast<double>(generated) / std::max(secs, 1e-9), eta);
  }
  out.commit();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr,
               "generate: done, %lld sequences, %lld prompt + %lld generated tokens in %.2f s (%.1f generated "
               "tokens/s; prefill %.2f s, decode %.2f s), KV cache %.1f MiB (peak use %.0f%%), %lld prompt tokens "
               "from cache, %lld preemptions (%s); wrote %s\n",
               static_cast<long long>(done), static_cast<long long>(prompt_tokens), static_cast<long long>(generated),
               secs, static_cast<double>(generated) / std::max(secs, 1e-9), prefill_s, decode_s, kv_bytes / (1024.0 * 1024.0),
               100.0 * kv_peak, static_cast<long long>(cached), static_cast<long long>(preemptions), engine_name,
               output.c_str());
  return 0;
}

/// Runs `hybridrl generate`; returns the process exit code (errors are thrown as hybridrl::Error).
inline int run_generate(const std::string& input, const std::string& output, const std::vector<std::string>& overrides) {
  GenerateOptions o;
  apply_overrides(o, overrides);
  o.validate();
  const auto& mo = o.model();
  const auto& ro = o.rollout();
  // everything that can be wrong with the input is found before the weights are loaded
  const auto config = load_config(mo.path());
  auto lines = read_prompt_lines(input);
  std::function<std::string(const std::vector<int64_t>&)> decode;
  bool needs_tokenizer = false;
  for (const auto& l : lines) needs_tokenizer = needs_tokenizer || l.text.has_value() || l.messages.has_value();
  std::vector<std::string> tok_files;
  if (auto tok = load_checkpoint_tokenizer(mo.path(), &tok_files)) {  // tokenizer.json or tokenizer.model
    tok->use_chat_format(mo.chat_format());
    const bool chats = std::any_of(lines.begin(), lines.end(), [](const auto& l) { return l.messages.has_value(); });
    if (chats) {
      std::fprintf(stderr, "generate: chat format %s\n", tok->chat ? tok->chat->describe().c_str() : "none");
    }
    for (size_t i = 0; i < lines.size(); ++i) {
      auto& l = lines[i];
      if (l.text) l.ids = tok->encode(*l.text, true);
      if (l.messages) {
        try {
          l.ids = tok->encode(tok->render_chat(*l.messages), false);  // the format's own special tokens
        } catch (const Error& e) {
          throw Error(fmt::format("{} prompt {}: {}", input, i + 1, e.problem()), e.fix());
        }
      }
    }
    decode = run_decode(*tok);  // ids past the tokenizer's vocabulary (a padded embedding) have no text
  } else {
    HYBRIDRL_CHECK(!needs_tokenizer, fmt::format("{}: a line holds prompt text, but '{}' has no tokenizer", input, mo.path()),
                   "pass prompt_ids, or a checkpoint with tokenizer.json or tokenizer.model");
  }
  const auto P = static_cast<int64_t>(lines.size()), n = ro.n();
  for (int64_t i = 0; i < P; ++i) {
    const auto& ids = lines[static_cast<size_t>(i)].ids;
    HYBRIDRL_CHECK(!ids.empty(), fmt::format("{} line {}: the prompt has no tokens", input, i + 1), "give each prompt some text");
    for (auto t : ids) {
      HYBRIDRL_CHECK(t >= 0 && t < config.vocab_size,
                     fmt::format("{} prompt {}: token id {} is outside the vocabulary [0, {})", input, i + 1, t,
                                 config.vocab_size),
                     "tokenize with this checkpoint's tokenizer");
    }
    HYBRIDRL_CHECK(static_cast<int64_t>(ids.size()) < config.max_position_embeddings,
                   fmt::format("{} prompt {}: {} tokens leave no room in the model's context of {}", input, i + 1,
                               ids.size(), config.max_position_embeddings),
                   "shorten the prompt");
  }
  auto model = load_causal_lm(mo.path(), LoadOptions{}.dtype(mo.dtype()).device(at::Device(mo.device())));
  if (ro.name() == "paged") {
    PagedEngine engine(model, ro.paged());
    // calls of a few batches' worth of sequences: the scheduler refills slots within a call
    return generate_lines(engine, "Rollout<Paged>", std::max<int64_t>(1, 4 * ro.max_num_seqs() / n), lines, config,
                          ro, decode, output);
  }
  NaiveEngine engine(model, NaiveOptions{}.sampling(ro.sampling()).max_batch_size(ro.max_batch_size()));
  return generate_lines(engine, "Rollout<Naive>", std::max<int64_t>(1, ro.max_batch_size() / n), lines, config, ro,
                        decode, output);
}

}  // namespace hybridrl::app
