#pragma once
/// \file
/// The Sharding axis's contract. A Sharding policy is a compile-time descriptor — `tag`,
/// `options_type`, `name`, the trait `produces_tensor_parallel_shards` — whose `make(...)` builds
/// its run-time engine, a `sharded_model`: the trained model split over ranks, with its optimizer.
/// When the descriptor declares `using engine_type = ...;` the engine is checked here.

#include <ATen/core/Tensor.h>

#include <concepts>
#include <map>
#include <string>

#include "hybridrl/core/concepts.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/sharding/weight_spec.hpp"
#include "hybridrl/sharding/weights.hpp"

namespace hybridrl {

/// A sharded model's checkpoint state on this rank: parameter shards, optimizer state, counters,
/// by name.
using StateDict = std::map<std::string, at::Tensor>;

/// Engine hook: `TensorBatch forward(const TensorBatch&)` — the policy's per-token `log_probs`
/// (with grad) and `entropy` of the batch's tokens, aligned as core/keys.hpp says (to `responses`
/// in a rollout batch, to `input_ids` in an offline one).
template <class M>
concept scores_batches = requires(M& m, const TensorBatch& batch) {
  { m.forward(batch) } -> std::same_as<TensorBatch>;
};

/// Engine hooks: `void backward(const at::Tensor& loss)` accumulates gradients (reduced over the
/// ranks as the sharding needs), and `at::Tensor step()` clips, applies the optimizer, zeroes the
/// gradients and returns the 0-d gradient norm before clipping (detached: no device sync).
template <class M>
concept trains_with_optimizer = requires(M& m, const at::Tensor& loss) {
  m.backward(loss);
  { m.step() } -> std::same_as<at::Tensor>;
};

/// Engine hooks: `StateDict state_dict() const` and `void load_state_dict(const StateDict&)`, this
/// rank's checkpoint state (a model resumed from it continues bit for bit).
template <class M>
concept has_checkpoint_state = requires(M& m, const M& cm, const StateDict& state) {
  { cm.state_dict() } -> std::same_as<StateDict>;
  m.load_state_dict(state);
};

/// Engine hook: `void export_weights(const WeightSpec&, const WeightSink&) const` — the weights,
/// full and with Hugging Face names, cut to the shard and dtype a rollout engine asks for
/// (sharding/weights.hpp's rule), handed to the sink in buckets.
template <class M>
concept exports_weights = requires(const M& m, const WeightSpec& spec, const WeightSink& sink) {
  m.export_weights(spec, sink);
};

/// A run-time sharded model: forward, backward, optimizer step, checkpoint state and export of
/// weights for a WeightSpec.
template <class M>
concept sharded_model =
    scores_batches<M> && trains_with_optimizer<M> && has_checkpoint_state<M> && exports_weights<M>;

/// A run-time sharded critic: forward (the `values` of the batch's tokens, with grad), backward,
/// optimizer step and checkpoint state; nothing goes to a rollout engine.
template <class M>
concept sharded_critic = scores_batches<M> && trains_with_optimizer<M> && has_checkpoint_state<M>;

/// The Sharding descriptor's traits: `tag`, `options_type`, `name` and
/// `static constexpr bool produces_tensor_parallel_shards` — true when the weights it trains stay
/// split over a tensor-parallel group (TP3D), so what it hands a rollout are tensor-parallel shards;
/// false when it can gather full weights (FSDP, which still exports any WeightSpec at run time).
template <class P>
concept sharding_traits = named_policy<P> && requires {
  { P::produces_tensor_parallel_shards } -> std::convertible_to<bool>;
};

/// True when P declares no engine_type, or declares one that models sharded_model.
template <class P>
inline constexpr bool sharded_model_ok_v = [] {
  if constexpr (declares_engine<P>) {
    return sharded_model<typename P::engine_type>;
  } else {
    return true;
  }
}();

/// A Sharding policy: sharding_traits, and an engine_type (when declared) that models
/// sharded_model. `static engine_type make(...)` builds it; its arguments are fixed by the sharding
/// issue (model, options, Communicator).
template <class P>
concept sharding_policy = sharding_traits<P> && sharded_model_ok_v<P>;

}  // namespace hybridrl
