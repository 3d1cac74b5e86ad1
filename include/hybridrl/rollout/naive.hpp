#pragma once
/// \file
/// `Rollout<Naive>`: a dense padded KV cache; all sequences of a chunk of the batch advance
/// together, finished ones ride along masked. Simple, and the reference oracle for Rollout<Paged>
/// (greedy outputs must match). Needs full weights (accepts_tensor_parallel_weights = false), so it
/// does not pair with Sharding<TP3D>.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include "hybridrl/rollout/concepts.hpp"
#include "hybridrl/rollout/generation.hpp"
#include "hybridrl/rollout/naive/dense_kv_cache.hpp"
#include "hybridrl/rollout/sampler.hpp"
#include "hybridrl/rollout/sampling.hpp"
#include "hybridrl/sharding/weight_spec.hpp"
#include "hybridrl/sharding/weights.hpp"

namespace hybridrl {

/// Run-time options of Rollout<Naive>.
struct NaiveOptions {
  /// Samples per prompt (GRPO's group size): the trainer repeats each prompt n times with one
  /// group id (the geometry's rollout_n is read from here); generate() takes its requests as given.
  HYBRIDRL_ARG(int64_t, n) = 1;
  HYBRIDRL_ARG(SamplingOptions, sampling) = {};
  /// Sequences generated together (the dense cache is max_batch_size × (prompt + max_new_tokens)).
  HYBRIDRL_ARG(int64_t, max_batch_size) = 64;
  /// Tensor-parallel size of the generation engine. Rollout<Naive> holds full weights, so only 1
  /// is valid; the key exists so that every rollout spells it the same way (the Trainer reports
  /// a larger value with the fix).
  HYBRIDRL_ARG(int64_t, tensor_parallel_size) = 1;

  HYBRIDRL_FIELDS(n, sampling, max_batch_size, tensor_parallel_size)

  /// Throws hybridrl::Error for an impossible value (problem starts with the field name).
  void validate() const {
    sampling_.validate();  // inline fields: rollout.temperature, not rollout.sampling.temperature
    HYBRIDRL_CHECK(n_ >= 1, fmt::format("n = {} is below 1", n_), "sample at least one response per prompt");
    HYBRIDRL_CHECK(max_batch_size_ >= 1,
                   fmt::format("max_batch_size = {} is below 1", max_batch_size_),
                   "use a positive batch size");
    HYBRIDRL_CHECK(tensor_parallel_size_ >= 1,
                   fmt::format("tensor_parallel_size = {} is below 1", tensor_parallel_size_),
                   "use 1: Rollout<Naive> runs one full copy of the model per rank");
  }
};

/// The engine of Rollout<Naive>: generates with a dense KV cache [rows, kv_heads, prompt +
/// max_new_tokens, head_dim] per chunk of max_batch_size rows, from a full (tp_size 1) model.
class NaiveEngine {
 public:
  /// Generates with `model` (its device and dtype) under `options`.
  NaiveEngine(CausalLM model, NaiveOptions options) : model_(std::move(model)), options_(std::move(options)) {
    options_.validate();
    HYBRIDRL_CHECK(!model_->parallel().sharded(), "Rollout<Naive>: the model is a tensor-parallel shard",
                   "give Rollout<Naive> a full model (tensor-parallel generation is Rollout<Paged>'s)");
    model_->eval();
  }

  /// An engine with a randomly initialised model for `c` on `device` in `dtype`; load its weights
  /// with load_weights (the trainer's export) before generating.
  static NaiveEngine make(const ModelConfig& c, const NaiveOptions& options, at::Device device = at::kCPU,
                          at::ScalarType dtype = at::kFloat) {
    return NaiveEngine(inference_model(c, device, dtype), options);
  }

  /// Generates responses for `prompts` with the engine's sampling options.
  TensorBatch generate(const TensorBatch& prompts) { return generate(prompts, options_.sampling()); }

  /// Generates responses for `prompts` (input_ids [B, P], attention_mask, optional group_ids and
  /// sampling_seeds) under `s`; returns rollout_output_keys plus the prompts batch's other data.
  TensorBatch generate(const TensorBatch& prompts, const SamplingOptions& s) {
    HYBRIDRL_CHECK(!released_, "Rollout<Naive>.generate: the engine's memory is released",
                   "call resume_memory() after the weight update, before generating");
    detail::validate_member(s, "rollout");  // keys: rollout.temperature, ...
    const auto start = std::chrono::steady_clock::now();
    const auto& c = model_->config();
    auto requests = read_requests(prompts, s, c, "Rollout<Naive>");
    const auto rule = StopRule::make(s, c);
    std::vector<GeneratedSequence> seqs(requests.size());
    stats_ = {};
    c10::NoGradGuard no_grad;
    const auto chunk = options_.max_batch_size();
    for (size_t first = 0; first < requests.size(); first += static_cast<size_t>(chunk)) {
      const auto last = std::min(requests.size(), first + static_cast<size_t>(chunk));
      run_chunk(requests, seqs, first, last, s, rule);
    }
    stats_.sequences = static_cast<int64_t>(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      stats_.prompt_tokens += static_cast<int64_t>(requests[i].prompt.size());
      stats_.generated_tokens += static_cast<int64_t>(seqs[i].tokens.size());
    }
    stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return rollout_batch(prompts, requests, seqs, c.pad_token_id.value_or(0));
  }

  /// Full weights in the model's dtype.
  [[nodiscard]] WeightSpec weight_spec() const {
    WeightSpec w;
    w.dtype = model_->parameters().front().scalar_type();
    return w;
  }

  /// Copies a bucket of named tensors (Hugging Face names, full shapes) into the model's parameters.
  void load_weights(const WeightBucket& bucket) {
    load_named_weights(model_, bucket, "Rollout<Naive>");
  }


  /// Rollout<Naive> allocates its cache per call and frees it at the end, so releasing holds
  /// nothing back; generate() refuses to run until resume_memory(), as the Paged engine does.
  void release_memory() { released_ = true; }
  /// Allows generate() again.
  void resume_memory() { released_ = false; }

  /// Counters of the last generate() call.
  [[nodiscard]] RolloutStats stats() const { return stats_; }
  /// The model the engine generates with.
  [[nodiscard]] const CausalLM& model() const noexcept { return model_; }
  /// The engine's options.
  [[nodiscard]] const NaiveOptions& options() const noexcept { return options_; }

 private:
  void run_chunk(const std::vector<GenerationRequest>& req, std::vector<GeneratedSequence>& seqs, size_t first,
                 size_t last, const SamplingOptions& s, const StopRule& rule) {
    const auto& c = model_->config();
    const auto dev = model_->parameters().front().device();
    const auto dtype = model_->parameters().front().scalar_type();
    const auto b = static_cast<int64_t>(last - first);
    int64_t P = 0, steps = 0;
    for (size_t i = first; i < last; ++i) {
      const auto L = static_cast<int64_t>(req[i].prompt.size());
      P = std::max(P, L);
      steps = std::max(steps, rule.budget(L));
    }
    // left-padded prompts; the mask carries the padding through attention and positions
    std::vector<std::vector<int64_t>> prompt_rows;
    std::vector<int64_t> seed_v, sample_v;
    for (size_t i = first; i < last; ++i) {
      prompt_rows.push_back(req[i].prompt);
      seed_v.push_back(static_cast<int64_t>(req[i].seed));
      sample_v.push_back(req[i].sample);
    }
    const auto padded = left_padded_prompts(prompt_rows, c.pad_token_id.value_or(0));
    const auto ids = padded.tensor(keys::input_ids);
    auto mask = padded.tensor(keys::attention_mask);
    SamplingRows rows;
    rows.seeds = at::tensor(seed_v, at::kLong).to(dev);
    rows.samples = at::tensor(sample_v, at::kLong).to(dev);
    auto cache = KVCache::allocate(c, b, P + steps, at::TensorOptions().dtype(dtype).device(dev));
    stats_.kv_cache_bytes = std::max<int64_t>(
        stats_.kv_cache_bytes, 2 * c.num_hidden_layers * b * c.num_key_value_heads * (P + steps) * c.head_dim *
                                   static_cast<int64_t>(c10::elementSize(dtype)));
    mask = mask.to(dev);
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    bool in_prefill = true;
    auto logits = forward_decode(model_, ids.to(dev), cache, ForwardArgs{}.attention_mask(mask)).select(1, P - 1);
    ++stats_.steps;
    std::vector<int64_t> generated(static_cast<size_t>(b), 0);
    for (int64_t t = 0; t < steps; ++t) {
      if (t == 1) {  // the prompt forward and the first draw: prefill; the rest: decode
        stats_.prefill_seconds += std::chrono::duration<double>(clock::now() - t0).count();
        t0 = clock::now();
        in_prefill = false;
      }
      rows.positions = at::full({b}, t, at::TensorOptions().dtype(at::kLong).device(dev));
      rows.banned = rule.banned(generated, c.vocab_size, dev);
      auto drawn = sample_tokens(logits, s, rows);
      auto tok = drawn.tokens.to(at::kCPU).contiguous();
      auto lp = drawn.log_probs.to(at::kCPU).contiguous();
      bool all_done = true;
      for (int64_t r = 0; r < b; ++r) {
        auto& seq = seqs[first + static_cast<size_t>(r)];
        if (!seq.done) {
          rule.append(seq, static_cast<int64_t>(req[first + static_cast<size_t>(r)].prompt.size()),
                      tok.data_ptr<int64_t>()[r], lp.data_ptr<float>()[r]);
          generated[static_cast<size_t>(r)] = static_cast<int64_t>(seq.tokens.size());
        }
        all_done = all_done && seq.done;
      }
      if (all_done) break;
      mask = at::cat({mask, at::ones({b, 1}, mask.options())}, 1);
      logits = forward_decode(model_, drawn.tokens.view({b, 1}), cache, ForwardArgs{}.attention_mask(mask)).select(1, 0);
      ++stats_.steps;
    }
    (in_prefill ? stats_.prefill_seconds : stats_.decode_seconds) +=
        std::chrono::duration<double>(clock::now() - t0).count();
  }

  CausalLM model_;
  NaiveOptions options_;
  RolloutStats stats_;
  bool released_ = false;
};

/// Dense padded KV cache. The descriptor of Rollout<Naive>; `make(config, options, device,
/// dtype)` builds its engine.
template <>
struct Rollout<Naive> {
  using tag = Naive;
  using options_type = NaiveOptions;
  using engine_type = NaiveEngine;
  static constexpr std::string_view name = "Naive";
  static constexpr bool accepts_tensor_parallel_weights = false;

  /// The engine for a model of config `c` on `device` in `dtype`.
  static engine_type make(const ModelConfig& c, const NaiveOptions& options, at::Device device = at::kCPU,
                          at::ScalarType dtype = at::kFloat) {
    return NaiveEngine::make(c, options, device, dtype);
  }
};
static_assert(rollout_policy<Rollout<Naive>>,
              "hybridrl: Rollout<Naive> must model rollout_policy (rollout/concepts.hpp)");
static_assert(rollout_engine<NaiveEngine>, "hybridrl: NaiveEngine must model rollout_engine (rollout/concepts.hpp)");

}  // namespace hybridrl
