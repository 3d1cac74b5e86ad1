#pragma once
/// \file
/// `Sharding<FSDP>`: fully sharded data parallel. Parameters live as flat shards per layer unit,
/// are all-gathered before use and resharded after; gradients are reduce-scattered; optimizer state
/// is sharded. For generation it gathers full weights and exports the shard any WeightSpec asks for
/// (produces_tensor_parallel_shards = false: it can hand over full weights).
///
/// The engines here, FSDPEngine (the policy) and FSDPCriticEngine (the critic), run on one process
/// in the master dtype (no Communicator, or one of size 1, param_dtype = the weights' dtype: the
/// model trained in place, activation checkpointing) or through the units of sharding/
/// fsdp_units.hpp: one flat fp32 slice per layer unit and rank, gathered in param_dtype around
/// each layer, gradients reduce-scattered into the slices, AdamW on the slices, the gradient norm
/// global over the ranks — sharded over a Communicator's ranks, or with one shard on one process
/// for mixed precision (param_dtype other than the master dtype) or CPU offload. Both behind the same interface, with the shared Optimizer
/// (sharding/optimizer.hpp), checkpoint state and weight export.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/ScalarType.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridrl/core/config.hpp"  // dtype_name: dtypes as the configuration spells them
#include "hybridrl/core/error.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/distributed/communicator.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include "hybridrl/model/decoder.hpp"
#include "hybridrl/model/log_probs.hpp"
#include "hybridrl/model/parameter_init.hpp"
#include "hybridrl/sharding/concepts.hpp"
#include "hybridrl/sharding/frozen.hpp"
#include "hybridrl/sharding/fsdp_units.hpp"
#include "hybridrl/sharding/optimizer.hpp"
#include "hybridrl/sharding/score_batch.hpp"
#include "hybridrl/sharding/sharded_state.hpp"
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
  /// Keep this rank's master slices, their gradients and the AdamW state in (pinned) CPU memory
  /// (ZeRO-Offload; FSDP's CPUOffload): a unit's slice is copied to the compute device for its
  /// all-gather, its gradient back after the reduce-scatter, and AdamW steps on the CPU. Frees
  /// 16 bytes per parameter ÷ shards (fp32 master, gradient, two moments) on the GPU, for
  /// host-device copies and a CPU optimizer step. Works on one process too.
  HYBRIDRL_ARG(bool, cpu_offload) = false;
  /// Recompute each decoder block in backward instead of storing its activations (the one owner
  /// of this knob; the model applies it through its layer runner).
  HYBRIDRL_ARG(bool, activation_checkpointing) = false;
  /// Where a unit is not sharded (one process, or shard_group_size 1), keep its slice in
  /// param_dtype between uses, written by the optimizer's AdamW kernel as it steps the fp32 master
  /// (FSDP2 casts at every all-gather): no cast kernel per unit and forward (2.2 ms a step of the
  /// 1.1B update on an H100). Costs 2 bytes a parameter (bf16) of GPU memory; not with
  /// cpu_offload, nor when param_dtype is the master's. Sharded, a rank would cast only its
  /// 1/shards of a unit before the all-gather — not worth the memory, so nothing is kept.
  HYBRIDRL_ARG(bool, keep_param_copy) = true;

  HYBRIDRL_FIELDS(shard_group_size, param_dtype, reduce_dtype, cpu_offload,
                  activation_checkpointing, keep_param_copy)

  /// Throws hybridrl::Error for an impossible value (problem starts with the field name).
  void validate() const {
    HYBRIDRL_CHECK(shard_group_size_ == -1 || shard_group_size_ >= 1,
                   fmt::format("shard_group_size = {} is invalid", shard_group_size_),
                   "use -1 (shard over all ranks) or a positive group size that divides world_size");
    HYBRIDRL_CHECK(c10::isFloatingType(param_dtype_),
                   fmt::format("param_dtype = {} is not a floating-point type",
                               detail::dtype_name(param_dtype_)),
                   "use bfloat16, float16 or float32");
    HYBRIDRL_CHECK(c10::isFloatingType(reduce_dtype_),
                   fmt::format("reduce_dtype = {} is not a floating-point type",
                               detail::dtype_name(reduce_dtype_)),
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
  /// with `optim` over `total_steps` optimizer steps, on this process alone (`world_size` 1).
  BasicFSDPEngine(Model model, FSDPOptions options, OptimizerOptions optim, int64_t total_steps,
                  int64_t world_size = 1, int64_t bucket_bytes = int64_t{256} << 20)
      : BasicFSDPEngine(std::move(model), one_process(options, world_size), optim, total_steps, nullptr, bucket_bytes) {}

  /// Trains `model` sharded over the ranks of `comm` (every rank passes the same model: the same
  /// checkpoint or seed); nullptr or one rank is the single-process engine. Collective: every
  /// rank constructs its engine, and then calls forward, backward, step, state_dict,
  /// load_state_dict and export_weights in the same order.
  BasicFSDPEngine(Model model, FSDPOptions options, OptimizerOptions optim, int64_t total_steps,
                  std::shared_ptr<Communicator> comm, int64_t bucket_bytes = int64_t{256} << 20)
      : model_(std::move(model)), options_(options), bucket_bytes_(bucket_bytes), comm_(std::move(comm)) {
    options_.validate();
    const int64_t world = comm_ ? comm_->size() : 1;
    options_.check_world(world);
    model_->train();
    const auto master = model_->parameters().front().scalar_type();
    if (world == 1 && !options_.cpu_offload() && options_.param_dtype() == master) {
      // q|k|v and gate|up as one GEMM each, as on the units below (their weights lie back to back
      // in a unit's flat buffer): the same arithmetic on one process as on several
      model_->model->fuse_projections();
      std::vector<at::Tensor> params;
      for (auto& p : model_->parameters()) {
        if (p.requires_grad()) params.push_back(p);
      }
      optimizer_ = std::make_unique<Optimizer>(std::move(params), optim, total_steps);
      model_->model->set_layer_runner(options_.activation_checkpointing() ? activation_checkpoint_runner()
                                                                          : default_layer_runner());
      return;
    }
    // Mixed precision on one process takes the sharded path with one shard, as FSDP2's
    // MixedPrecisionPolicy does on one rank: each unit's fp32 master is one flat slice, cast to
    // param_dtype in one kernel when the unit runs (the layers and the head compute on the copy,
    // as a bf16 model does), its gradient cast back and accumulated into the slice. Autocast
    // instead cast every weight and every activation at every op and kept the residual stream in
    // fp32: a third of a 160M update's GPU time on the H200 went to casts and copies.
    HYBRIDRL_CHECK(model_->model->parallel().tp_size == 1,
                   "Sharding<FSDP>: the model is tensor-parallel (tp_size > 1)",
                   "shard a full model with FSDP; tensor parallelism is Sharding<TP3D>'s");
    sh_ = std::make_unique<detail::fsdp::State>();
    if (world > 1) sh_->groups = detail::fsdp::make_groups(comm_, options_.shard_group_size());  // one process offloading: no group
    sh_->units = detail::fsdp::make_units(model_->named_parameters(), model_->model->config().num_hidden_layers,
                                          sh_->groups, /*trainable=*/true, "Sharding<FSDP>");
    std::vector<at::Tensor> slices;
    for (auto& u : sh_->units) {
      if (options_.cpu_offload()) {  // the master slice and (so) its AdamW state live on the CPU
        c10::NoGradGuard ng;
        auto host = u.slice.detach().to(at::kCPU);
        if (u.device.is_cuda()) host = host.pin_memory();  // page-locked: faster copies to the GPU
        u.slice = host.requires_grad_(true);
      }
      slices.push_back(u.slice);
      shard_elements_ += u.slice.numel();
      total_elements_ += u.numel;
    }
    optimizer_ = std::make_unique<Optimizer>(std::move(slices), optim, total_steps);
    if (options_.keep_param_copy() && !options_.cpu_offload() && sh_->groups.shards() == 1) {
      optimizer_->set_param_copies(detail::fsdp::keep_param_copies(sh_->units, options_.param_dtype()));
    }
    // the slices of one shard group tile the model; the norm's all-reduce runs where the units compute
    optimizer_->set_norm_group(sh_->groups.shard.get(), {}, sh_->units.back().device);
    model_->model->set_layer_runner(detail::fsdp::sharded_layer_runner(
        &sh_->units, &sh_->groups, options_.param_dtype(), options_.reduce_dtype(), options_.activation_checkpointing()));
  }

  /// `options` checked for a group of `world_size` ranks that has no Communicator (must be 1).
  static FSDPOptions one_process(const FSDPOptions& options, int64_t world_size) {
    options.validate();
    options.check_world(world_size);
    HYBRIDRL_CHECK(world_size == 1,
                   fmt::format("Sharding<FSDP>: a group of {} ranks needs their Communicator", world_size),
                   "construct the engine with the data-parallel Communicator (Sharding<FSDP>::make(..., comm))");
    return options;
  }

  /// Ranks the parameters are sharded over (1: the single-process engine).
  [[nodiscard]] int64_t shard_count() const noexcept { return sh_ ? sh_->groups.shards() : 1; }
  /// Parameter elements this rank stores (its slices; the whole model on one process) and the
  /// model's: a rank's parameter, gradient and AdamW memory is about total / shard_count.
  [[nodiscard]] int64_t local_parameter_elements() const {
    if (sh_) return shard_elements_;
    int64_t n = 0;
    for (const auto& p : model_->parameters()) n += p.numel();
    return n;
  }
  [[nodiscard]] int64_t total_parameter_elements() const {
    if (sh_) return total_elements_;
    return local_parameter_elements();
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
    if (sh_) detail::fsdp::gather(sh_->units.back(), sh_->groups, options_.param_dtype());  // the root, until step()
    const auto dev = sh_ ? sh_->units.back().device : model_->parameters().front().device();
    return detail::score_batch(model_, batch, log_prob_options_, dev, "Sharding<FSDP>");
  }

  /// Accumulates the gradients of `loss` (sharded: averaged over the ranks into this rank's
  /// slices; each rank's loss is the mean over its share of the batch).
  void backward(const at::Tensor& loss) {
    loss.backward();
    if (!sh_) return;
    auto& root = sh_->units.back();  // its gradient is in the full parameters: reduce it into the slice
    std::vector<at::Tensor> grads;
    for (auto& p : root.params) grads.push_back(p.grad());
    auto part = detail::fsdp::reduce_unit_grad(root, sh_->groups, grads, options_.reduce_dtype());
    c10::NoGradGuard ng;
    if (root.slice.grad().defined()) {
      root.slice.mutable_grad().add_(part);
    } else {
      root.slice.mutable_grad() = part;
    }
    for (auto& p : root.params) p.mutable_grad().reset();
  }

  /// Clips, steps AdamW at the schedule's rate (or skips a non-finite step), zeroes the
  /// gradients; returns the 0-d gradient norm before clipping.
  at::Tensor step() {
    last_ = optimizer_->step();
    if (sh_) detail::fsdp::release(sh_->units.back());  // gathered again, updated, at the next forward
    return last_.grad_norm;
  }
  /// What the last step() did (its learning rate, whether it was skipped).
  [[nodiscard]] const Optimizer::Result& last_step() const noexcept { return last_; }

  /// The state: the parameters under "model.<Hugging Face name>" and the optimizer under
  /// "optimizer." (AdamW's moments per parameter, by the parameter's position). Sharded, the same
  /// keys and shapes, the slices all-gathered unit by unit (collective): a sharded run's state is
  /// a one-process state, so it resumes on any number of ranks (FSDP's full state dict; every rank
  /// holds it while it is saved).
  [[nodiscard]] StateDict state_dict() const {
    if (!sh_) {
      StateDict s = optimizer_->state_dict("optimizer.");
      for (const auto& p : model_->named_parameters()) s["model." + p.key()] = p.value().detach().clone();
      return s;
    }
    const auto opt = optimizer_->state_dict("");
    StateDict s;
    s["optimizer.step"] = opt.at("step");
    s["optimizer.skipped"] = opt.at("skipped");
    const auto& units = sh_->units;
    for (size_t ui = 0; ui < units.size(); ++ui) {
      const auto& u = units[ui];
      const auto dtype = u.slice.scalar_type();
      auto unflat = [&](const at::Tensor& flat, size_t i) {
        return flat.narrow(0, u.offsets[i], detail::fsdp::numel_of(u.shapes[i])).view(u.shapes[i]).clone();
      };
      const auto w = detail::fsdp::gather_flat(u, sh_->groups, dtype);
      for (size_t i = 0; i < u.params.size(); ++i) s["model." + u.names[i]] = unflat(w, i);
      const auto key = std::to_string(ui) + ".";
      if (opt.count(key + "exp_avg") == 0) continue;  // never stepped
      const auto m = detail::fsdp::gather_slices(opt.at(key + "exp_avg"), u.padded, sh_->groups, dtype, u.device);
      const auto v = detail::fsdp::gather_slices(opt.at(key + "exp_avg_sq"), u.padded, sh_->groups, dtype, u.device);
      for (size_t i = 0; i < u.params.size(); ++i) {
        const auto k = "optimizer." + std::to_string(u.index[i]) + ".";
        s[k + "exp_avg"] = unflat(m, i);
        s[k + "exp_avg_sq"] = unflat(v, i);
        s[k + "step"] = opt.at(key + "step").clone();
      }
    }
    return s;
  }
  /// This rank's part of the state, under state_dict's keys, gathering nothing (no collective):
  /// sharded, the pieces of each parameter and AdamW moment its slices cover (the first replica
  /// of hybrid sharding alone writes them; the others hold none), the step counts whole; on one
  /// process every tensor as one piece. A sharded checkpoint (trainer.checkpoint_format=sharded)
  /// writes it as one file per rank; load_state() reads it back on any number of ranks.
  [[nodiscard]] ShardedState sharded_state() const {
    ShardedState out;
    auto piece = [&](const std::string& key, int64_t start, const at::Tensor& t) {
      out.pieces.emplace(std::pair(key, start), t.detach().reshape({-1}));
    };
    if (!sh_) {
      for (const auto& p : model_->named_parameters()) {
        out.shapes["model." + p.key()] = p.value().sizes().vec();
        piece("model." + p.key(), 0, p.value());
      }
      for (auto& [k, v] : optimizer_->state_dict("optimizer.")) {
        const bool moment = k.size() > 7 && (k.ends_with(".exp_avg") || k.ends_with(".exp_avg_sq"));
        if (moment) {
          out.shapes[k] = v.sizes().vec();
          piece(k, 0, v);
        } else {
          out.whole[k] = v;
        }
      }
      return out;
    }
    const auto opt = optimizer_->state_dict("");
    out.whole["optimizer.step"] = opt.at("step");
    out.whole["optimizer.skipped"] = opt.at("skipped");
    const auto& g = sh_->groups;
    const bool writes = !g.replicate || g.replicate->rank() == 0;
    const int64_t r = g.shard ? g.shard->rank() : 0;
    for (size_t ui = 0; ui < sh_->units.size(); ++ui) {
      const auto& u = sh_->units[ui];
      const int64_t part = u.padded / g.shards(), lo0 = r * part;
      const auto key = std::to_string(ui) + ".";
      const bool stepped = opt.count(key + "exp_avg") > 0;
      for (size_t i = 0; i < u.params.size(); ++i) {
        const auto m = "optimizer." + std::to_string(u.index[i]) + ".";
        out.shapes["model." + u.names[i]] = u.shapes[i];
        if (stepped) {
          out.shapes[m + "exp_avg"] = u.shapes[i];
          out.shapes[m + "exp_avg_sq"] = u.shapes[i];
          out.whole[m + "step"] = opt.at(key + "step");
        }
        if (!writes) continue;
        const int64_t lo = std::max(lo0, u.offsets[i]);
        const int64_t hi = std::min(lo0 + part, u.offsets[i] + detail::fsdp::numel_of(u.shapes[i]));
        if (lo >= hi) continue;
        piece("model." + u.names[i], lo - u.offsets[i], u.slice.narrow(0, lo - lo0, hi - lo));
        if (stepped) {
          piece(m + "exp_avg", lo - u.offsets[i], opt.at(key + "exp_avg").narrow(0, lo - lo0, hi - lo));
          piece(m + "exp_avg_sq", lo - u.offsets[i], opt.at(key + "exp_avg_sq").narrow(0, lo - lo0, hi - lo));
        }
      }
    }
    return out;
  }

  /// Restores what state_dict wrote, on one process or sharded, whatever the number of ranks that
  /// wrote it (each rank keeps its slices). Everything is checked before anything changes.
  void load_state_dict(const StateDict& s) { load_state(StateDictSource(s)); }

  /// Restores a state from `src` (a StateDict, or a sharded checkpoint written by any number of
  /// ranks): sharded, each rank reads only the ranges its slices cover. Everything is checked
  /// before anything changes.
  void load_state(const StateSource& src) {
    c10::NoGradGuard g;
    constexpr const char* what = "Sharding<FSDP>.load_state_dict";
    if (sh_) {
      auto& units = sh_->units;
      const auto& groups = sh_->groups;
      const int64_t r = groups.shard ? groups.shard->rank() : 0;
      // this rank's slice of unit u, from the tensors key(i) of its parameters
      auto slice_from = [&](const detail::fsdp::Unit& u, const std::function<std::string(size_t)>& key) {
        const int64_t part = u.padded / groups.shards(), lo0 = r * part;
        at::Tensor out = at::zeros({part}, u.slice.options().requires_grad(false));
        for (size_t i = 0; i < u.params.size(); ++i) {
          const int64_t lo = std::max(lo0, u.offsets[i]);
          const int64_t hi = std::min(lo0 + part, u.offsets[i] + detail::fsdp::numel_of(u.shapes[i]));
          if (lo < hi) out.narrow(0, lo - lo0, hi - lo).copy_(src.read(key(i), lo - u.offsets[i], hi - lo));
        }
        return out;
      };
      std::vector<at::Tensor> slices;
      std::map<std::string, at::Tensor> opt;
      opt["step"] = src.full("optimizer.step", "load a state written by Sharding<FSDP> for the same model");
      opt["skipped"] = src.full("optimizer.skipped", "load a state written by Sharding<FSDP> for the same model");
      for (size_t ui = 0; ui < units.size(); ++ui) {
        const auto& u = units[ui];
        auto moment = [&](size_t i, const char* m) { return "optimizer." + std::to_string(u.index[i]) + "." + m; };
        for (size_t i = 0; i < u.params.size(); ++i) detail::check_state_shape(src, "model." + u.names[i], u.shapes[i], what);
        slices.push_back(slice_from(u, [&](size_t i) { return "model." + u.names[i]; }));
        if (!src.contains(moment(0, "exp_avg"))) continue;  // never stepped
        for (size_t i = 0; i < u.params.size(); ++i) {
          detail::check_state_shape(src, moment(i, "exp_avg"), u.shapes[i], what);
          detail::check_state_shape(src, moment(i, "exp_avg_sq"), u.shapes[i], what);
        }
        const auto key = std::to_string(ui) + ".";
        opt[key + "exp_avg"] = slice_from(u, [&](size_t i) { return moment(i, "exp_avg"); });
        opt[key + "exp_avg_sq"] = slice_from(u, [&](size_t i) { return moment(i, "exp_avg_sq"); });
        opt[key + "step"] = src.full(moment(0, "step"), "load a state written by Sharding<FSDP> for the same model");
      }
      optimizer_->load_state_dict(opt, "");
      for (size_t ui = 0; ui < units.size(); ++ui) {
        detail::fsdp::release(units[ui]);
        units[ui].slice.detach().copy_(slices[ui]);
      }
      return;
    }
    auto params = model_->named_parameters();
    for (auto& p : params) detail::check_state_shape(src, "model." + p.key(), p.value().sizes().vec(), what);  // all checked first
    StateDict s;
    for (const auto& k : src.keys()) {
      if (k.rfind("optimizer.", 0) == 0) s.emplace(k, src.full(k));
    }
    optimizer_->load_state_dict(s, "optimizer.");
    for (auto& p : params) p.value().copy_(src.full("model." + p.key()));
  }

  /// The weights for `spec` (full or a tensor-parallel shard, in its dtype), bucket by bucket.
  /// Sharded: one unit at a time is all-gathered (master dtype), cut for `spec` and bucketed, so
  /// beyond the bucket a rank holds one unit's full weights at most; every rank receives them.
  void export_weights(const WeightSpec& spec, const WeightSink& sink) const
    requires(!is_critic)
  {
    last_export_bytes_ = 0;
    if (!sh_) {
      hybridrl::export_weights(model_->named_parameters(), spec, bucket_bytes_, sink);
      return;
    }
    spec.validate();
    WeightBucketer out(bucket_bytes_, sink);
    for (const auto& u : sh_->units) {
      const auto full = detail::fsdp::gather_flat(u, sh_->groups, u.slice.scalar_type());
      last_export_bytes_ += (u.padded - u.slice.numel()) * static_cast<int64_t>(u.slice.element_size());
      for (size_t i = 0; i < u.params.size(); ++i) {
        auto t = export_shard(u.names[i], full.narrow(0, u.offsets[i], detail::fsdp::numel_of(u.shapes[i])).view(u.shapes[i]), spec);
        if (t.is_alias_of(full)) t = t.clone();  // never a view that keeps the whole unit alive
        out.add(u.names[i], std::move(t));
      }
    }
    (void)out.finish();
  }

  /// Bytes this rank received from the others in the last export_weights (0 on one process).
  [[nodiscard]] int64_t last_export_bytes() const noexcept { return last_export_bytes_; }

  /// The frozen reference in this engine's layout, a copy of the weights as they stand (call it
  /// before the first step): on units, a copy of this rank's slices in param_dtype (no
  /// communication), gathered around each use as the policy is; in the master dtype on one
  /// process, a full copy.
  [[nodiscard]] ShardedFrozen<CausalLM> make_reference() const
    requires(!is_critic)
  {
    if (!sh_) return ShardedFrozen<CausalLM>(hybridrl::make_reference(model_), nullptr, options_.param_dtype());
    CausalLM skeleton{nullptr};
    {  // the architecture without drawing or copying weights, in host memory that is never
       // touched (so never resident), emptied at once by ShardedFrozen and moved to the slices'
       // device: no full copy of the model exists on the GPU, even for a moment
      const auto& root = sh_->units.back().slice;
      ParameterInit scope(at::TensorOptions().device(at::kCPU).dtype(root.scalar_type()), /*random=*/false);
      skeleton = CausalLM(model_->config());
    }
    return ShardedFrozen<CausalLM>(std::move(skeleton), *sh_, options_.param_dtype());
  }

  /// A frozen reference given whole (the same weights on every rank: a checkpoint) in this
  /// engine's layout: sharded over its shard groups (collective; its parameters are emptied), on
  /// one process its weights cast to param_dtype.
  [[nodiscard]] ShardedFrozen<CausalLM> adopt_reference(CausalLM reference) const
    requires(!is_critic)
  {
    if (!sh_) return ShardedFrozen<CausalLM>(std::move(reference), nullptr, options_.param_dtype());
    return ShardedFrozen<CausalLM>(std::move(reference), sh_->groups, options_.param_dtype());
  }

  /// Sharded: all-gathers every unit into the model's parameters in the master dtype, so that
  /// model() holds the full trained weights (to save them with save_pretrained); reshard() frees
  /// them again before training continues. One process in the master dtype: nothing to do.
  void materialize() {
    if (!sh_) return;
    for (auto& u : sh_->units) {
      detail::fsdp::release(u);
      detail::fsdp::gather(u, sh_->groups, u.slice.scalar_type());
    }
  }
  /// Frees what materialize() gathered.
  void reshard() {
    if (!sh_) return;
    for (auto& u : sh_->units) detail::fsdp::release(u);
  }

  /// The model being trained (sharded: its parameters are empty except while a unit runs, or
  /// after materialize()).
  [[nodiscard]] const Model& model() const noexcept { return model_; }
  [[nodiscard]] const Optimizer& optimizer() const noexcept { return *optimizer_; }

 private:
  Model model_;
  FSDPOptions options_;
  int64_t bucket_bytes_;
  std::unique_ptr<Optimizer> optimizer_;
  LogProbOptions log_prob_options_;
  Optimizer::Result last_;
  std::shared_ptr<Communicator> comm_;
  std::unique_ptr<detail::fsdp::State> sh_;  // sharded only; behind a pointer: the layer runner holds its address
  int64_t shard_elements_ = 0, total_elements_ = 0;
  mutable int64_t last_export_bytes_ = 0;
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
  /// The engine training `model` sharded over the ranks of `comm` (the data-parallel group).
  static engine_type make(CausalLM model, const FSDPOptions& options, const OptimizerOptions& optim,
                          int64_t total_steps, std::shared_ptr<Communicator> comm) {
    return FSDPEngine(std::move(model), options, optim, total_steps, std::move(comm));
  }
  /// The engine training the critic `model` (PPO's value model), under the same sharding options
  /// and its own optimizer options.
  static critic_engine_type make_critic(ValueModel model, const FSDPOptions& options, const OptimizerOptions& optim,
                                        int64_t total_steps, int64_t world_size = 1) {
    return FSDPCriticEngine(std::move(model), options, optim, total_steps, world_size);
  }
  /// The critic's engine sharded over the ranks of `comm`.
  static critic_engine_type make_critic(ValueModel model, const FSDPOptions& options, const OptimizerOptions& optim,
                                        int64_t total_steps, std::shared_ptr<Communicator> comm) {
    return FSDPCriticEngine(std::move(model), options, optim, total_steps, std::move(comm));
  }
};
static_assert(sharding_policy<Sharding<FSDP>>,
              "hybridrl: Sharding<FSDP> must model sharding_policy (sharding/concepts.hpp)");

}  // namespace hybridrl
