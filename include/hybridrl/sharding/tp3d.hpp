#pragma once
/// \file
/// `Sharding<TP3D>`: a data × tensor (× pipeline) mesh (Megatron-LM's layout inside one model
/// replica, data parallelism across replicas). Every rank of a tensor-parallel group holds its
/// shard of each column/row-parallel linear layer, of the vocabulary-parallel embedding and
/// lm_head (model/parallel.hpp; the split rule is sharding/weights.hpp's tensor_parallel_dim), and
/// the norms whole; log-probs and entropy are computed vocabulary-parallel. The ranks of one
/// tensor-parallel group see the same data; gradients are averaged over the data-parallel group
/// once per step; the gradient norm counts each shard once and each replicated parameter once.
///
/// For generation it exports any WeightSpec: its own shards when the rollout runs with the same
/// tensor-parallel size, otherwise the tensors all-gathered over the tensor group one at a time and
/// cut again (HybridFlow's TP = 2 training → TP = 1 generation), in buckets, never a second full
/// copy. Checkpoint state is the one-process layout (full tensors by Hugging Face name, AdamW
/// moments by parameter position), gathered tensor by tensor: it resumes at any world size, and
/// under Sharding<FSDP> too.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/ScalarType.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridrl/core/config.hpp"  // dtype_name: dtypes as the configuration spells them
#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/distributed/communicator.hpp"
#include "hybridrl/distributed/device_mesh.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include "hybridrl/model/decoder.hpp"
#include "hybridrl/model/log_probs.hpp"
#include "hybridrl/model/parameter_init.hpp"
#include "hybridrl/sharding/concepts.hpp"
#include "hybridrl/sharding/optimizer.hpp"
#include "hybridrl/sharding/score_batch.hpp"
#include "hybridrl/sharding/weight_spec.hpp"
#include "hybridrl/sharding/weights.hpp"

namespace hybridrl {

/// Run-time options of Sharding<TP3D>: the training mesh. data × tensor × pipeline must equal
/// world_size (checked when the world size is known); data = -1 means "whatever is left". The
/// tensor-parallel size here is the training one; generation has its own (rollout.
/// tensor_parallel_size) and receives weights in the layout it asks for (WeightSpec).
struct TP3DOptions {
  HYBRIDRL_ARG(int64_t, data_parallel_size) = -1;
  HYBRIDRL_ARG(int64_t, tensor_parallel_size) = 1;
  HYBRIDRL_ARG(int64_t, pipeline_parallel_size) = 1;
  /// Split the sequence dimension of norms/dropouts over the tensor group (Megatron SP).
  HYBRIDRL_ARG(bool, sequence_parallel) = false;
  /// dtype of the forward and backward computation (mixed precision under autocast; the
  /// parameters and AdamW state stay in the model's dtype, float32 usually).
  HYBRIDRL_ARG(c10::ScalarType, param_dtype) = c10::ScalarType::BFloat16;
  /// Recompute each decoder block in backward instead of storing its activations.
  HYBRIDRL_ARG(bool, activation_checkpointing) = false;

  HYBRIDRL_FIELDS(data_parallel_size, tensor_parallel_size, pipeline_parallel_size,
                  sequence_parallel, param_dtype, activation_checkpointing)

  /// Throws hybridrl::Error for an impossible mesh (problem starts with the field name).
  void validate() const {
    HYBRIDRL_CHECK(data_parallel_size_ == -1 || data_parallel_size_ >= 1,
                   fmt::format("data_parallel_size = {} is invalid", data_parallel_size_),
                   "use -1 (take the ranks the other axes leave) or a positive size");
    HYBRIDRL_CHECK(tensor_parallel_size_ >= 1,
                   fmt::format("tensor_parallel_size = {} is below 1", tensor_parallel_size_),
                   "use 1 (no tensor parallelism) or a divisor of the number of GPUs");
    HYBRIDRL_CHECK(pipeline_parallel_size_ >= 1,
                   fmt::format("pipeline_parallel_size = {} is below 1", pipeline_parallel_size_),
                   "use 1 (no pipeline parallelism) or a divisor of the number of GPUs");
    HYBRIDRL_CHECK(pipeline_parallel_size_ == 1,
                   fmt::format("pipeline_parallel_size = {}: pipeline parallelism is not implemented yet",
                               pipeline_parallel_size_),
                   "use pipeline_parallel_size = 1 and more data- or tensor-parallel ranks");
    HYBRIDRL_CHECK(!sequence_parallel_,
                   "sequence_parallel = true: Megatron sequence parallelism is not implemented yet",
                   "set sequence_parallel = false (the activations of norms stay replicated)");
    HYBRIDRL_CHECK(c10::isFloatingType(param_dtype_),
                   fmt::format("param_dtype = {} is not a floating-point type", detail::dtype_name(param_dtype_)),
                   "use bfloat16, float16 or float32");
  }

  /// The data-parallel size on `world_size` ranks; throws when the mesh does not tile the world.
  [[nodiscard]] int64_t resolve_data_parallel(int64_t world_size) const {
    const int64_t model = tensor_parallel_size_ * pipeline_parallel_size_;
    HYBRIDRL_CHECK(world_size % model == 0,
                   fmt::format("tensor_parallel_size × pipeline_parallel_size = {} × {} = {} does "
                               "not divide world_size {} ({} % {} = {})",
                               tensor_parallel_size_, pipeline_parallel_size_, model, world_size,
                               world_size, model, world_size % model),
                   "choose tensor and pipeline sizes whose product divides the number of GPUs");
    const int64_t dp = world_size / model;
    HYBRIDRL_CHECK(data_parallel_size_ == -1 || data_parallel_size_ == dp,
                   fmt::format("data_parallel_size × tensor_parallel_size × pipeline_parallel_size "
                               "= {} × {} × {} = {} but world_size is {}",
                               data_parallel_size_, tensor_parallel_size_, pipeline_parallel_size_,
                               data_parallel_size_ * model, world_size),
                   fmt::format("set data_parallel_size to {} or -1", dp));
    return dp;
  }

  /// Throws when the mesh does not tile `world_size` ranks (the Trainer's cross-axis check).
  void check_world(int64_t world_size) const { (void)resolve_data_parallel(world_size); }
};

namespace detail::tp3d {

/// Throws unless `c` splits over `tp` tensor-parallel ranks (heads, KV heads, the MLP, the
/// vocabulary), naming the field and the sizes that would work.
inline void check_divisible(const ModelConfig& c, int64_t tp) {
  const std::pair<const char*, int64_t> sizes[] = {{"num_attention_heads", c.num_attention_heads},
                                                    {"num_key_value_heads", c.num_key_value_heads},
                                                    {"intermediate_size", c.intermediate_size},
                                                    {"vocab_size", c.vocab_size}};
  for (const auto& [name, n] : sizes) {
    if (n % tp == 0) continue;
    std::vector<int64_t> fits;
    for (int64_t d = 1; d <= std::min<int64_t>(n, 64); ++d) {
      bool all = true;
      for (const auto& [_, m] : sizes) all = all && m % d == 0;
      if (all) fits.push_back(d);
    }
    throw Error(fmt::format("Sharding<TP3D>: the model's {} = {} is not divisible by tensor_parallel_size = {}", name, n,
                            tp),
                fmt::format("choose a tensor_parallel_size that divides the heads, KV heads, intermediate_size and "
                            "vocab_size of this model (here: {}), or pad the vocabulary to a multiple of it",
                            fmt::join(fits, ", ")));
  }
}

/// The full tensor of `local`, a shard split on `dim` over `group` (rank-major), all-gathered.
inline at::Tensor gather_dim(const at::Tensor& local, int64_t dim, Communicator& group) {
  auto x = local.detach().movedim(dim, 0).contiguous();
  auto shape = x.sizes().vec();
  shape[0] *= group.size();
  auto out = at::empty(shape, x.options());
  group.all_gather_into(out, x);
  return out.movedim(0, dim).contiguous();
}

}  // namespace detail::tp3d

/// Sharding<TP3D>'s engine for the policy (`TP3DEngine`, a CausalLM) or the critic
/// (`TP3DCriticEngine`, a ValueModel). Given the full model (every rank the same checkpoint or
/// seed), each rank builds its tensor-parallel shard of it on the model's device and dtype and
/// frees the full parameters (materialize() fills them with the trained weights again).
/// Collective: every rank of the world constructs its engine, then calls forward, backward, step,
/// state_dict, load_state_dict and export_weights in the same order; the ranks of one
/// tensor-parallel group pass the same batches.
template <class Model>
class BasicTP3DEngine {
  static constexpr bool is_critic = std::is_same_v<Model, ValueModel>;
  static_assert(is_critic || std::is_same_v<Model, CausalLM>,
                "hybridrl: BasicTP3DEngine trains a CausalLM (the policy) or a ValueModel (the critic)");

 public:
  /// Trains `model` over the ranks of `world` laid out as options' mesh (nullptr: one process,
  /// which needs tensor_parallel_size 1).
  BasicTP3DEngine(Model model, TP3DOptions options, OptimizerOptions optim, int64_t total_steps,
                  std::shared_ptr<Communicator> world, int64_t bucket_bytes = int64_t{256} << 20)
      : full_(std::move(model)), options_(options), bucket_bytes_(bucket_bytes) {
    options_.validate();
    if (!world) world = ThreadCommunicator::world(1)[0];
    const auto dp = options_.resolve_data_parallel(world->size());
    const auto tp = options_.tensor_parallel_size();
    HYBRIDRL_CHECK(full_->parallel().tp_size == 1, "Sharding<TP3D>: the model given is already a tensor-parallel shard",
                   "pass the full model (load_causal_lm / load_value_model); the engine cuts each rank's shard");
    detail::tp3d::check_divisible(full_->config(), tp);
    mesh_ = std::make_shared<DeviceMesh>(world, MeshShape{static_cast<int>(dp), static_cast<int>(tp), 1});
    tensor_ = mesh_->group(MeshAxis::tensor);
    data_ = mesh_->group(MeshAxis::data);
    pc_ = ParallelContext{mesh_->coordinates().tensor, tp, tensor_.get()};
    if (tp > 1) {
      c10::NoGradGuard g;
      const auto p0 = full_->parameters().front();
      {
        ParameterInit scope(p0.options().requires_grad(false), /*random=*/false);
        model_ = Model(full_->config(), pc_);  // the critic's score head is drawn and broadcast: replaced below
      }
      model_->to(p0.device(), p0.scalar_type());
      detail::copy_parameters(*model_, *full_, pc_);
      for (auto& p : full_->parameters()) p.set_data(at::empty({0}, p.options()));
    } else {
      model_ = full_;
    }
    model_->train();
    std::vector<at::Tensor> params;
    std::vector<double> weights;  // a replicated parameter's square counts once over the tensor group
    for (auto& item : model_->named_parameters()) {
      if (!item.value().requires_grad()) continue;
      names_.push_back(item.key());
      params.push_back(item.value());
      dims_.push_back(pc_.sharded() ? tensor_parallel_dim(item.key()) : std::nullopt);
      weights.push_back(dims_.back() || !pc_.sharded() ? 1.0 : 1.0 / static_cast<double>(tp));
      local_elements_ += item.value().numel();
      total_elements_ += item.value().numel() * (dims_.back() ? tp : 1);
    }
    params_ = params;
    optimizer_ = std::make_unique<Optimizer>(std::move(params), optim, total_steps);
    if (pc_.sharded()) optimizer_->set_norm_group(tensor_.get(), std::move(weights));
    const auto master = params_.front().scalar_type();
    LayerRunner runner = default_layer_runner();
    if (options_.param_dtype() != master) runner = autocast_runner(options_.param_dtype(), runner);
    if (options_.activation_checkpointing()) runner = activation_checkpoint_runner(runner);
    model_->model->set_layer_runner(runner);
  }

  /// One process (`world_size` 1, tensor_parallel_size 1): the plain trainer.
  BasicTP3DEngine(Model model, TP3DOptions options, OptimizerOptions optim, int64_t total_steps, int64_t world_size = 1,
                  int64_t bucket_bytes = int64_t{256} << 20)
      : BasicTP3DEngine(std::move(model), one_process(options, world_size), optim, total_steps, nullptr, bucket_bytes) {}

  /// `options` checked for a group of `world_size` ranks that has no Communicator (must be 1).
  static TP3DOptions one_process(const TP3DOptions& options, int64_t world_size) {
    options.validate();
    HYBRIDRL_CHECK(world_size == 1,
                   fmt::format("Sharding<TP3D>: a group of {} ranks needs their Communicator", world_size),
                   "construct the engine with the world's Communicator (Sharding<TP3D>::make(..., comm))");
    return options;
  }

  /// The mesh (data × tensor) this engine trains over.
  [[nodiscard]] const DeviceMesh& mesh() const noexcept { return *mesh_; }
  /// The ranks that see different data (gradients are averaged over them).
  [[nodiscard]] std::shared_ptr<Communicator> data_parallel_group() const { return data_; }
  /// The ranks that hold the shards of one replica (and see the same data).
  [[nodiscard]] std::shared_ptr<Communicator> tensor_parallel_group() const { return tensor_; }
  /// This rank's tensor-parallel place (the layout of model_shard()).
  [[nodiscard]] const ParallelContext& parallel() const noexcept { return pc_; }
  /// Parameter elements this rank stores and the model's: a rank's parameter, gradient and AdamW
  /// memory is about total / tensor_parallel_size (plus the replicated norms).
  [[nodiscard]] int64_t local_parameter_elements() const noexcept { return local_elements_; }
  [[nodiscard]] int64_t total_parameter_elements() const noexcept { return total_elements_; }

  /// How forward() computes log-probs (the trainer sets the rollout's temperature here).
  void set_log_prob_options(LogProbOptions o)
    requires(!is_critic)
  {
    o.validate();
    log_prob_options_ = o;
  }

  /// The policy's `log_probs` and `entropy` (or the critic's `values`) of the batch's tokens,
  /// with grad, replicated over the tensor group (see detail::score_batch). Collective over it.
  TensorBatch forward(const TensorBatch& batch) {
    return detail::score_batch(model_, batch, log_prob_options_, params_.front().device(), "Sharding<TP3D>");
  }

  /// Accumulates the gradients of `loss` (this rank's mean over its data-parallel share).
  void backward(const at::Tensor& loss) { loss.backward(); }

  /// Averages the gradients over the data-parallel group (in buckets of about bucket_bytes), then
  /// clips by the global norm, steps AdamW (or skips a non-finite step) and zeroes the gradients;
  /// returns the 0-d gradient norm before clipping.
  at::Tensor step() {
    if (data_->size() > 1) average_gradients();
    last_ = optimizer_->step();
    return last_.grad_norm;
  }
  /// What the last step() did (its learning rate, whether it was skipped).
  [[nodiscard]] const Optimizer::Result& last_step() const noexcept { return last_; }

  /// The state in the one-process layout: "model.<Hugging Face name>" full tensors and
  /// "optimizer." AdamW state by parameter position, each sharded tensor all-gathered over the
  /// tensor group (collective), so it resumes at any world size and mesh, or under Sharding<FSDP>.
  [[nodiscard]] StateDict state_dict() const {
    StateDict s;
    for (const auto& p : model_->named_parameters()) s["model." + p.key()] = full_of(p.key(), p.value());
    const auto opt = optimizer_->state_dict("");
    s["optimizer.step"] = opt.at("step");
    s["optimizer.skipped"] = opt.at("skipped");
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto key = std::to_string(i) + ".";
      if (opt.count(key + "exp_avg") == 0) continue;  // never stepped
      s["optimizer." + key + "exp_avg"] = full_of(names_[i], opt.at(key + "exp_avg"));
      s["optimizer." + key + "exp_avg_sq"] = full_of(names_[i], opt.at(key + "exp_avg_sq"));
      s["optimizer." + key + "step"] = opt.at(key + "step");
    }
    return s;
  }

  /// Restores what state_dict wrote, whatever the mesh that wrote it (each rank cuts its shards).
  /// Everything is checked before anything changes.
  void load_state_dict(const StateDict& s) {
    c10::NoGradGuard g;
    auto need = [&](const std::string& k) -> const at::Tensor& {
      auto it = s.find(k);
      HYBRIDRL_CHECK(it != s.end(), fmt::format("Sharding<TP3D>.load_state_dict: the state has no '{}'", k),
                     "load a checkpoint of a model with the same config");
      return it->second;
    };
    auto shard_of = [&](const std::string& key, const std::string& name, const at::Tensor& local) {
      const auto& full = need(key);
      auto want = local.sizes().vec();
      if (const auto d = pc_.sharded() ? tensor_parallel_dim(name) : std::nullopt) want[static_cast<size_t>(*d)] *= pc_.tp_size;
      HYBRIDRL_CHECK(full.sizes() == at::IntArrayRef(want),
                     fmt::format("Sharding<TP3D>.load_state_dict: '{}' has shape [{}], the model [{}]", key,
                                 fmt::join(full.sizes(), ", "), fmt::join(want, ", ")),
                     "load a checkpoint of a model with the same config");
      return detail::tp_shard(full, name, pc_);
    };
    std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (parameter, its shard of the state)
    for (auto& p : model_->named_parameters()) copies.emplace_back(p.value(), shard_of("model." + p.key(), p.key(), p.value()));
    std::map<std::string, at::Tensor> opt;
    opt["optimizer.step"] = need("optimizer.step");
    opt["optimizer.skipped"] = need("optimizer.skipped");
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto key = "optimizer." + std::to_string(i) + ".";
      if (s.count(key + "exp_avg") == 0) continue;
      opt[key + "exp_avg"] = shard_of(key + "exp_avg", names_[i], params_[i]);
      opt[key + "exp_avg_sq"] = shard_of(key + "exp_avg_sq", names_[i], params_[i]);
      opt[key + "step"] = need(key + "step");
    }
    optimizer_->load_state_dict(opt, "optimizer.");
    for (auto& [p, t] : copies) p.copy_(t);
  }

  /// The weights for `spec`, bucket by bucket. When the rollout runs with this tensor-parallel
  /// layout (spec.tp_size = tensor_parallel_size, the same rank) each rank hands over its own
  /// shards; otherwise each sharded tensor is all-gathered over the tensor group, cut for `spec`
  /// and freed before the next (TP = 2 training → TP = 1 generation). Collective over the tensor
  /// group; every rank receives its weights. last_export_bytes() counts what arrived.
  void export_weights(const WeightSpec& spec, const WeightSink& sink) const
    requires(!is_critic)
  {
    spec.validate();
    last_export_bytes_ = 0;
    if (!pc_.sharded()) {
      hybridrl::export_weights(model_->named_parameters(), spec, bucket_bytes_, sink);
      return;
    }
    const bool same_layout = spec.tp_size == pc_.tp_size && spec.tp_rank == pc_.tp_rank;
    const WeightSpec as_is{1, 0, spec.dtype};
    WeightBucketer out(bucket_bytes_, sink);
    for (const auto& p : model_->named_parameters()) {
      const auto dim = tensor_parallel_dim(p.key());
      if (!dim) {
        out.add(p.key(), export_shard(p.key(), p.value(), spec));  // replicated: whole on every rank
      } else if (same_layout) {
        out.add(p.key(), export_shard(p.key(), p.value(), as_is));
      } else {
        const auto full = detail::tp3d::gather_dim(p.value(), *dim, *tensor_);
        last_export_bytes_ += (full.numel() - p.value().numel()) * static_cast<int64_t>(full.element_size());
        auto t = export_shard(p.key(), full, spec);
        if (t.is_alias_of(full)) t = t.clone();  // never a view that keeps the whole tensor alive
        out.add(p.key(), std::move(t));
      }
    }
    (void)out.finish();
  }
  /// Bytes this rank received from the others in the last export_weights.
  [[nodiscard]] int64_t last_export_bytes() const noexcept { return last_export_bytes_; }

  /// The frozen reference model in this engine's layout: a copy of this rank's shards (call it
  /// before the first step), so the reference is sharded like the policy.
  [[nodiscard]] CausalLM make_reference() const
    requires(!is_critic)
  {
    auto ref = hybridrl::make_reference(model_);
    if (options_.param_dtype() != params_.front().scalar_type()) {
      ref->model->set_layer_runner(autocast_runner(options_.param_dtype(), default_layer_runner()));
    }
    return ref;
  }

  /// All-gathers the trained weights into the full model's parameters (model()), to save them
  /// with save_pretrained; reshard() frees them again. Collective over the tensor group.
  void materialize() {
    if (!pc_.sharded()) return;
    c10::NoGradGuard g;
    auto full = full_->named_parameters();
    for (const auto& p : model_->named_parameters()) full[p.key()].set_data(full_of(p.key(), p.value()));
  }
  /// Frees what materialize() gathered.
  void reshard() {
    if (!pc_.sharded()) return;
    for (auto& p : full_->parameters()) p.set_data(at::empty({0}, p.options()));
  }

  /// The full model (its parameters are empty under tensor parallelism, except after
  /// materialize()); model_shard() is what this rank trains.
  [[nodiscard]] const Model& model() const noexcept { return full_; }
  [[nodiscard]] const Model& model_shard() const noexcept { return model_; }
  [[nodiscard]] const Optimizer& optimizer() const noexcept { return *optimizer_; }

 private:
  /// The full tensor of `t` (a parameter `name`'s shard, or a tensor shaped like it), a copy.
  at::Tensor full_of(const std::string& name, const at::Tensor& t) const {
    const auto dim = pc_.sharded() ? tensor_parallel_dim(name) : std::nullopt;
    return dim ? detail::tp3d::gather_dim(t, *dim, *tensor_) : t.detach().clone();
  }

  /// Every gradient averaged over the data-parallel group, flattened into buckets per dtype.
  void average_gradients() {
    c10::NoGradGuard g;
    for (auto& p : params_) {  // a parameter the loss did not reach still takes part (zeros)
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    }
    size_t i = 0;
    while (i < params_.size()) {
      std::vector<at::Tensor> bucket;
      int64_t bytes = 0;
      const auto dtype = params_[i].grad().scalar_type();
      while (i < params_.size() && params_[i].grad().scalar_type() == dtype &&
             (bucket.empty() || bytes + params_[i].grad().numel() * params_[i].grad().element_size() <= bucket_bytes_)) {
        bucket.push_back(params_[i].grad());
        bytes += params_[i].grad().numel() * static_cast<int64_t>(params_[i].grad().element_size());
        ++i;
      }
      std::vector<at::Tensor> flat;
      for (const auto& gr : bucket) flat.push_back(gr.reshape({-1}));
      auto all = at::cat(flat);
      data_->all_reduce(all, ReduceOp::avg);
      int64_t at = 0;
      for (auto& gr : bucket) {
        gr.copy_(all.narrow(0, at, gr.numel()).view_as(gr));
        at += gr.numel();
      }
    }
  }

  Model full_;
  Model model_{nullptr};
  TP3DOptions options_;
  int64_t bucket_bytes_;
  std::shared_ptr<DeviceMesh> mesh_;
  std::shared_ptr<Communicator> tensor_, data_;
  ParallelContext pc_;
  std::vector<std::string> names_;
  std::vector<std::optional<int64_t>> dims_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<Optimizer> optimizer_;
  LogProbOptions log_prob_options_;
  Optimizer::Result last_;
  int64_t local_elements_ = 0, total_elements_ = 0;
  mutable int64_t last_export_bytes_ = 0;
};
/// The policy's engine.
using TP3DEngine = BasicTP3DEngine<CausalLM>;
/// The critic's engine (PPO's value model).
using TP3DCriticEngine = BasicTP3DEngine<ValueModel>;
static_assert(sharded_model<TP3DEngine>, "hybridrl: TP3DEngine must model sharded_model (sharding/concepts.hpp)");
static_assert(sharded_critic<TP3DCriticEngine>,
              "hybridrl: TP3DCriticEngine must model sharded_critic (sharding/concepts.hpp)");

/// Data × tensor (× pipeline) parallelism. The descriptor of Sharding<TP3D>; `make(model, options,
/// optim, total_steps, comm)` builds its engine over the world's ranks.
template <>
struct Sharding<TP3D> {
  using tag = TP3D;
  using options_type = TP3DOptions;
  using engine_type = TP3DEngine;
  using critic_engine_type = TP3DCriticEngine;
  static constexpr std::string_view name = "TP3D";
  static constexpr bool produces_tensor_parallel_shards = true;

  /// The engine training `model` on one process (tensor_parallel_size 1).
  static engine_type make(CausalLM model, const TP3DOptions& options, const OptimizerOptions& optim,
                          int64_t total_steps, int64_t world_size = 1) {
    return TP3DEngine(std::move(model), options, optim, total_steps, world_size);
  }
  /// The engine training `model` over the ranks of `comm` (the world, laid out as options' mesh).
  static engine_type make(CausalLM model, const TP3DOptions& options, const OptimizerOptions& optim,
                          int64_t total_steps, std::shared_ptr<Communicator> comm) {
    return TP3DEngine(std::move(model), options, optim, total_steps, std::move(comm));
  }
  /// The critic's engine on one process.
  static critic_engine_type make_critic(ValueModel model, const TP3DOptions& options, const OptimizerOptions& optim,
                                        int64_t total_steps, int64_t world_size = 1) {
    return TP3DCriticEngine(std::move(model), options, optim, total_steps, world_size);
  }
  /// The critic's engine over the ranks of `comm`.
  static critic_engine_type make_critic(ValueModel model, const TP3DOptions& options, const OptimizerOptions& optim,
                                        int64_t total_steps, std::shared_ptr<Communicator> comm) {
    return TP3DCriticEngine(std::move(model), options, optim, total_steps, std::move(comm));
  }
};
static_assert(sharding_policy<Sharding<TP3D>>,
              "hybridrl: Sharding<TP3D> must model sharding_policy (sharding/concepts.hpp)");

}  // namespace hybridrl
