#pragma once
/// \file
/// `Sharding<FSDP>`: fully sharded data parallel. Parameters live as flat shards per layer unit,
/// are all-gathered before use and resharded after; gradients are reduce-scattered; optimizer state
/// is sharded. For generation it gathers full weights and exports the shard any WeightSpec asks for
/// (produces_tensor_parallel_shards = false: it can hand over full weights).
///
/// The engines here, FSDPEngine (the policy) and FSDPCriticEngine (the critic), are the single-process case (world size 1, where there is nothing
/// to shard): the whole model on this rank, mixed precision through autocast, activation
/// checkpointing, the shared Optimizer (sharding/optimizer.hpp), checkpoint state and weight
/// export. Sharding over several ranks comes with the sharding issue, behind the same interface.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/ScalarType.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include "hybridrl/model/decoder.hpp"
#include "hybridrl/model/log_probs.hpp"
#include "hybridrl/sharding/concepts.hpp"
#include "hybridrl/sharding/optimizer.hpp"
#include "hybridrl/sharding/weight_spec.hpp"
#include "hybridrl/sharding/weights.hpp"

namespace hybridrl {

/// Run-time options of Sharding<FSDP>.
struct FSDPOptions {
  /// Ranks one parameter is sharded over; -1 = all ranks (ZeRO-3), smaller = hybrid sharding.
  HYBRIDRL_ARG(int64_t, shard_group_size) = -1;
  /// dtype of gathered parameters in forward/backward (mixed precision).
  HYBRIDRL_ARG(c10::ScalarType, param_dtype) = c10::ScalarType::BFloat16;
  /// dtype in which gradients are reduce-scattered.
  HYBRIDRL_ARG(c10::ScalarType, reduce_dtype) = c10::ScalarType::Float;
  /// Keep sharded parameters and optimizer state on the CPU between uses.
  HYBRIDRL_ARG(bool, cpu_offload) = false;
  /// Recompute each decoder block in backward instead of storing its activations (the one owner
  /// of this knob; the model applies it through its layer runner).
  HYBRIDRL_ARG(bool, activation_checkpointing) = false;

  HYBRIDRL_FIELDS(shard_group_size, param_dtype, reduce_dtype, cpu_offload,
                  activation_checkpointing)

  /// Throws hybridrl::Error for an impossible value (problem starts with the field name).
  void validate() const {
    HYBRIDRL_CHECK(shard_group_size_ == -1 || shard_group_size_ >= 1,
                   fmt::format("shard_group_size = {} is invalid", shard_group_size_),
                   "use -1 (shard over all ranks) or a positive group size that divides world_size");
    HYBRIDRL_CHECK(c10::isFloatingType(param_dtype_),
                   fmt::format("param_dtype = {} is not a floating-point type",
                               c10::toString(param_dtype_)),
                   "use bfloat16, float16 or float32");
    HYBRIDRL_CHECK(c10::isFloatingType(reduce_dtype_),
                   fmt::format("reduce_dtype = {} is not a floating-point type",
                               c10::toString(reduce_dtype_)),
                   "use float32 (or bfloat16 to halve the gradient traffic)");
  }

  /// Throws when shard_group_size does not tile `world_size` ranks (checked once it is known).
  void check_world(int64_t world_size) const {
    HYBRIDRL_CHECK(shard_group_size_ == -1 || world_size % shard_group_size_ == 0,
                   fmt::format("shard_group_size = {} does not divide world_size {} ({} % {} = {})",
                               shard_group_size_, world_size, world_size, shard_group_size_,
                               world_size % shard_group_size_),
                   "use -1 (shard over all ranks) or a divisor of the number of GPUs");
  }
};

/// Sharding<FSDP>'s engine on one process, for the policy (`FSDPEngine`, a CausalLM) or the critic
/// (`FSDPCriticEngine`, a ValueModel): trains `model` in place. forward() scores a batch (the
/// policy's log_probs and entropy, the critic's values, with grad), backward() accumulates, step()
/// runs the Optimizer.
template <class Model>
class BasicFSDPEngine {
  static constexpr bool is_critic = std::is_same_v<Model, ValueModel>;
  static_assert(is_critic || std::is_same_v<Model, CausalLM>,
                "hybridrl: BasicFSDPEngine trains a CausalLM (the policy) or a ValueModel (the critic)");

 public:
  /// Trains `model` (its parameters' dtype is the master dtype, float32 usually) under `options`
  /// with `optim` over `total_steps` optimizer steps; `world_size` must be 1 here.
  BasicFSDPEngine(Model model, FSDPOptions options, OptimizerOptions optim, int64_t total_steps,
                  int64_t world_size = 1, int64_t bucket_bytes = int64_t{256} << 20)
      : model_(std::move(model)), options_(options), bucket_bytes_(bucket_bytes) {
    options_.validate();
    options_.check_world(world_size);
    HYBRIDRL_CHECK(world_size == 1,
                   fmt::format("Sharding<FSDP>: this build's engine runs one process, the group has {}", world_size),
                   "run one process for now (sharding over several ranks comes with the sharding issue)");
    model_->train();
    std::vector<at::Tensor> params;
    for (auto& p : model_->parameters()) {
      if (p.requires_grad()) params.push_back(p);
    }
    optimizer_ = std::make_unique<Optimizer>(std::move(params), optim, total_steps);
    const auto master = model_->parameters().front().scalar_type();
    LayerRunner runner = default_layer_runner();
    if (options_.param_dtype() != master) runner = autocast_runner(options_.param_dtype(), runner);
    if (options_.activation_checkpointing()) runner = activation_checkpoint_runner(runner);
    model_->model->set_layer_runner(runner);
  }

  /// How forward() computes log-probs (the trainer sets the rollout's temperature here).
  void set_log_prob_options(LogProbOptions o)
    requires(!is_critic)
  {
    o.validate();
    log_prob_options_ = o;
  }

  /// The policy: `log_probs` and `entropy` of the batch's tokens, with grad. The critic: `values`,
  /// the value of the state before each token (the score head at the position before it; 0 at
  /// position 0), float32, with grad. Aligned as core/keys.hpp says: to `responses` [B, R] when
  /// the batch has them (a rollout batch: input_ids = prompts then responses), else to `input_ids`
  /// [B, T]. Uses attention_mask, position_ids and cu_seqlens (packed rows) when present.
  TensorBatch forward(const TensorBatch& batch) {
    HYBRIDRL_CHECK(batch.has(keys::input_ids), "Sharding<FSDP>.forward: the batch has no 'input_ids'",
                   "pass a rollout batch or an offline batch (the Loader's)");
    ForwardArgs args;
    if (batch.has(keys::attention_mask)) args.attention_mask(batch.tensor(keys::attention_mask));
    if (batch.has(keys::position_ids)) args.position_ids(batch.tensor(keys::position_ids));
    if (batch.has(keys::cu_seqlens)) args.cu_seqlens(batch.tensor(keys::cu_seqlens));
    const auto dev = model_->parameters().front().device();
    const auto ids = batch.tensor(keys::input_ids).to(dev);
    auto to_responses = [&](at::Tensor x) {
      if (!batch.has(keys::responses) || !x.defined()) return x;
      const auto R = batch.tensor(keys::responses).size(1), T = x.size(1);
      return x.narrow(1, T - R, R);
    };
    if constexpr (is_critic) {
      // values[t] = V(tokens before t): the head's output one position back, as log_probs[t] is
      // the logits one position back (verl: values[:, -R - 1:-1] of a rollout batch)
      const auto raw = model_->forward(ids, args);
      const auto shifted = at::cat({at::zeros_like(raw.narrow(1, 0, 1)), raw.narrow(1, 0, raw.size(1) - 1)}, 1);
      return TensorBatch({{keys::values.str(), to_responses(shifted)}});
    } else {
      auto r = token_log_probs(model_, ids, args, log_prob_options_);
      TensorBatch out({{keys::log_probs.str(), to_responses(r.log_probs)}});
      if (r.entropy.defined()) out.set(keys::entropy, to_responses(r.entropy));
      return out;
    }
  }

  /// Accumulates the gradients of `loss`.
  void backward(const at::Tensor& loss) { loss.backward(); }

  /// Clips, steps AdamW at the schedule's rate (or skips a non-finite step), zeroes the
  /// gradients; returns the 0-d gradient norm before clipping.
  at::Tensor step() {
    last_ = optimizer_->step();
    return last_.grad_norm;
  }
  /// What the last step() did (its learning rate, whether it was skipped).
  [[nodiscard]] const Optimizer::Result& last_step() const noexcept { return last_; }

  /// Parameters under "model.<Hugging Face name>" and the optimizer under "optimizer.".
  [[nodiscard]] StateDict state_dict() const {
    StateDict s = optimizer_->state_dict("optimizer.");
    for (const auto& p : model_->named_parameters()) s["model." + p.key()] = p.value().detach().clone();
    return s;
  }
  /// Restores what state_dict wrote.
  void load_state_dict(const StateDict& s) {
    c10::NoGradGuard g;
    auto params = model_->named_parameters();
    for (auto& p : params) {  // check everything before changing anything
      auto it = s.find("model." + p.key());
      HYBRIDRL_CHECK(it != s.end(), fmt::format("Sharding<FSDP>.load_state_dict: the state has no 'model.{}'", p.key()),
                     "load a checkpoint of a model with the same config");
      HYBRIDRL_CHECK(it->second.sizes() == p.value().sizes(),
                     fmt::format("Sharding<FSDP>.load_state_dict: 'model.{}' has shape [{}], the model [{}]", p.key(),
                                 fmt::join(it->second.sizes(), ", "), fmt::join(p.value().sizes(), ", ")),
                     "load a checkpoint of a model with the same config");
    }
    optimizer_->load_state_dict(s, "optimizer.");
    for (auto& p : params) p.value().copy_(s.at("model." + p.key()));
  }

  /// The weights for `spec` (full or a tensor-parallel shard, in its dtype), bucket by bucket.
  void export_weights(const WeightSpec& spec, const WeightSink& sink) const
    requires(!is_critic)
  {
    hybridrl::export_weights(model_->named_parameters(), spec, bucket_bytes_, sink);
  }

  /// The model being trained.
  [[nodiscard]] const Model& model() const noexcept { return model_; }
  [[nodiscard]] const Optimizer& optimizer() const noexcept { return *optimizer_; }

 private:
  Model model_;
  FSDPOptions options_;
  int64_t bucket_bytes_;
  std::unique_ptr<Optimizer> optimizer_;
  LogProbOptions log_prob_options_;
  Optimizer::Result last_;
};
/// The policy's engine.
using FSDPEngine = BasicFSDPEngine<CausalLM>;
/// The critic's engine (PPO's value model).
using FSDPCriticEngine = BasicFSDPEngine<ValueModel>;
static_assert(sharded_model<FSDPEngine>, "hybridrl: FSDPEngine must model sharded_model (sharding/concepts.hpp)");
static_assert(sharded_critic<FSDPCriticEngine>,
              "hybridrl: FSDPCriticEngine must model sharded_critic (sharding/concepts.hpp)");

/// Fully sharded data parallel. The descriptor of Sharding<FSDP>; `make(model, options, optim,
/// total_steps, world_size)` builds its engine.
template <>
struct Sharding<FSDP> {
  using tag = FSDP;
  using options_type = FSDPOptions;
  using engine_type = FSDPEngine;
  using critic_engine_type = FSDPCriticEngine;
  static constexpr std::string_view name = "FSDP";
  static constexpr bool produces_tensor_parallel_shards = false;

  /// The engine training `model` (see FSDPEngine).
  static engine_type make(CausalLM model, const FSDPOptions& options, const OptimizerOptions& optim,
                          int64_t total_steps, int64_t world_size = 1) {
    return FSDPEngine(std::move(model), options, optim, total_steps, world_size);
  }
  /// The engine training the critic `model` (PPO's value model), under the same sharding options
  /// and its own optimizer options.
  static critic_engine_type make_critic(ValueModel model, const FSDPOptions& options, const OptimizerOptions& optim,
                                        int64_t total_steps, int64_t world_size = 1) {
    return FSDPCriticEngine(std::move(model), options, optim, total_steps, world_size);
  }
};
static_assert(sharding_policy<Sharding<FSDP>>,
              "hybridrl: Sharding<FSDP> must model sharding_policy (sharding/concepts.hpp)");

}  // namespace hybridrl
