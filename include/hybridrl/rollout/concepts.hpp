#pragma once
/// \file
/// The Rollout axis's contract. A Rollout policy is a compile-time descriptor — `tag`,
/// `options_type`, `name`, the trait `accepts_tensor_parallel_weights` — whose `make(...)` builds
/// its run-time engine, a `rollout_engine`: a stateful object that owns the KV cache and generates.
/// When the descriptor declares `using engine_type = ...;` the engine is checked here.

#include <array>
#include <concepts>
#include <cstdint>
#include <string_view>

#include "hybridrl/core/concepts.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/rollout/sampling.hpp"
#include "hybridrl/sharding/weight_spec.hpp"
#include "hybridrl/sharding/weights.hpp"

namespace hybridrl {

/// What one generate() call did (the engine's `stats()` reports the last call).
struct RolloutStats {
  int64_t sequences = 0;         ///< rows generated
  int64_t prompt_tokens = 0;     ///< real (unpadded) prompt tokens processed
  int64_t generated_tokens = 0;  ///< response tokens sampled
  int64_t preemptions = 0;       ///< sequences preempted and recomputed (Paged)
  int64_t kv_cache_bytes = 0;    ///< KV memory held during the call
  double seconds = 0.0;          ///< wall time of the call
  double prefill_seconds = 0.0;  ///< time in steps that computed prompt tokens (Paged; Naive: the prompt forward)
  double decode_seconds = 0.0;   ///< time in steps of drawn tokens only
  int64_t cached_prompt_tokens = 0;  ///< prompt tokens taken from the prefix cache or a fork, not computed (Paged)
  double kv_peak_utilization = 0.0;  ///< most KV blocks held at once / blocks in the pool (Paged)
  int64_t steps = 0;             ///< forwards run
  int64_t graph_steps = 0;       ///< decode steps replayed from a captured CUDA graph (Paged)
  int64_t overlapped_steps = 0;  ///< of those, launched before the previous step's tokens were read (Paged, async_scheduling)
};

/// The keys every generate() writes (core/keys.hpp): prompts, responses, response_mask,
/// rollout_log_probs, finish_reason, the full sequences as input_ids / attention_mask /
/// position_ids, and group_ids copied from the prompt batch.
inline constexpr std::array<Key, 9> rollout_output_keys{
    keys::prompts,       keys::responses,     keys::response_mask, keys::rollout_log_probs, keys::finish_reason,
    keys::input_ids,     keys::attention_mask, keys::position_ids, keys::group_ids};

/// Engine hook: `TensorBatch generate(const TensorBatch& prompts)` with the engine's own sampling
/// options, and `generate(prompts, const SamplingOptions&)` for one call's overrides. `prompts`
/// holds left-padded input_ids / attention_mask (and group_ids); the result holds
/// rollout_output_keys.
template <class E>
concept generates_batches = requires(E& e, const TensorBatch& prompts, const SamplingOptions& s) {
  { e.generate(prompts) } -> std::same_as<TensorBatch>;
  { e.generate(prompts, s) } -> std::same_as<TensorBatch>;
};

/// Engine hooks: `WeightSpec weight_spec() const`, the shard and dtype this engine wants, and
/// `void load_weights(const WeightBucket&)`, which copies one bucket of named tensors (Hugging
/// Face names, shaped for weight_spec()) into the engine's model.
template <class E>
concept loads_weights = requires(E& e, const E& ce, const WeightBucket& bucket) {
  { ce.weight_spec() } -> std::same_as<WeightSpec>;
  e.load_weights(bucket);
};

/// Engine hooks: `release_memory()` frees the KV cache (so the update can use the memory) and
/// `resume_memory()` allocates it again before the next generate().
template <class E>
concept releases_memory = requires(E& e) {
  e.release_memory();
  e.resume_memory();
};

/// Engine hook: `RolloutStats stats() const`, the counters of the last generate() call.
template <class E>
concept reports_rollout_stats = requires(const E& e) {
  { e.stats() } -> std::convertible_to<RolloutStats>;
};

/// A run-time rollout engine: generates, loads weights by name in buckets, releases and resumes
/// its KV memory, and reports per-call stats.
template <class E>
concept rollout_engine = generates_batches<E> && loads_weights<E> && releases_memory<E> && reports_rollout_stats<E>;

/// The Rollout descriptor's traits: `tag`, `options_type`, `name` and
/// `static constexpr bool accepts_tensor_parallel_weights` (whether its engine can generate from
/// weights split over a tensor-parallel group).
template <class P>
concept rollout_traits = named_policy<P> && requires {
  { P::accepts_tensor_parallel_weights } -> std::convertible_to<bool>;
};

/// True when P declares no engine_type, or declares one that models rollout_engine.
template <class P>
inline constexpr bool rollout_engine_ok_v = [] {
  if constexpr (declares_engine<P>) {
    return rollout_engine<typename P::engine_type>;
  } else {
    return true;
  }
}();

/// A Rollout policy: rollout_traits, and an engine_type (when declared) that models
/// rollout_engine. `static engine_type make(...)` builds the engine; its arguments are fixed by the
/// engine issue (model configuration, options, device and the WeightSpec it serves).
template <class P>
concept rollout_policy = rollout_traits<P> && rollout_engine_ok_v<P>;

}  // namespace hybridrl
