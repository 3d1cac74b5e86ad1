#pragma once
/// \file
/// The machinery of Sharding<FSDP> over several ranks (FSDPEngine uses it when its Communicator
/// has more than one rank): a model's parameters cut into units — one per decoder layer, and the
/// root (embedding, final norm, lm_head, a critic's score head) — each stored on this rank as one
/// flat fp32 slice, 1/world of the unit (padded to a multiple of world). The slices are the leaves
/// the optimizer steps; the model's own parameter tensors hold the gathered weights only while a
/// unit runs, and are empty ([0]) otherwise.
///
/// A layer unit runs inside an autograd node of its own (FSDPLayerBackward): forward all-gathers
/// the unit into the model's parameters (in param_dtype), runs the layer and, with recompute,
/// frees them at once (the layer keeps no activations: activation checkpointing); backward gathers
/// again, recomputes, differentiates, reduce-scatters the unit's gradient straight into this rank's
/// slice (the slice's .grad accumulates over micro-batches) and frees. Without recompute the
/// gathered weights and the layer's graph stay until its backward (until the last one, when
/// several forwards — DPO's chosen and rejected — feed one loss). The root unit is gathered at
/// the first forward after a step and stays until the next step; its gradient is reduce-scattered
/// when backward() returns. So between steps a rank holds 1/world of the parameters (fp32), of the
/// gradients and of the AdamW state; while a step runs, one layer's full weights and gradients more
/// (plus the root's).
///
/// Gradients are averaged over the ranks (reduce-scatter of the sum, divided by world, in
/// reduce_dtype): each rank's loss is the mean of its share of the batch, as with DDP. Hybrid
/// sharding (shard_group_size < world) reduce-scatters within the shard group, then averages the
/// slice over the replicas (the ranks holding the same slice).

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/cuda/fused.hpp"
#include "hybridrl/distributed/communicator.hpp"
#include "hybridrl/model/decoder.hpp"
#include "hybridrl/sharding/optimizer.hpp"

namespace hybridrl::detail::fsdp {

/// numel of a shape.
inline int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

/// The groups a rank shards and replicates over: `shard` (the ranks a unit is cut across) and,
/// for hybrid sharding, `replicate` (the ranks holding the same slice; nullptr without).
struct Groups {
  std::shared_ptr<Communicator> shard;
  std::shared_ptr<Communicator> replicate;
  [[nodiscard]] int shards() const { return shard ? shard->size() : 1; }
};

/// Splits `world` into consecutive shard groups of `shard_group_size` ranks (-1: all ranks) and
/// replicate groups across them. Collective over `world`.
inline Groups make_groups(const std::shared_ptr<Communicator>& world, int64_t shard_group_size) {
  Groups g;
  const int W = world->size();
  const int S = shard_group_size < 0 ? W : static_cast<int>(shard_group_size);
  if (S == W) {
    g.shard = world;
    return g;
  }
  for (int first = 0; first < W; first += S) {  // every rank takes part in every split, in order
    std::vector<int> ranks;
    for (int r = first; r < first + S; ++r) ranks.push_back(r);
    if (auto c = world->split(ranks)) g.shard = c;
  }
  for (int i = 0; i < S; ++i) {
    std::vector<int> ranks;
    for (int r = i; r < W; r += S) ranks.push_back(r);
    if (auto c = world->split(ranks)) g.replicate = c;
  }
  return g;
}

/// One unit: the model's parameters it owns and this rank's flat slice of them.
struct Unit {
  std::string name;                                ///< "model.layers.3" or "root"
  std::vector<std::string> names;                  ///< Hugging Face names of its parameters
  std::vector<at::Tensor> params;                  ///< the model's parameter tensors
  std::vector<std::vector<int64_t>> shapes;        ///< their full shapes
  std::vector<int64_t> offsets;                    ///< their offsets in the flat unit
  std::vector<int64_t> index;                      ///< their positions in the model's trainable parameters
  int64_t numel = 0;                               ///< elements of the unit
  int64_t padded = 0;                              ///< numel rounded up to a multiple of the shard count
  at::Tensor slice;                                ///< [padded / shards] master dtype, a leaf with grad
  at::Device device = at::kCPU;                    ///< where the unit computes: gathers and gradients live there
  /// this rank's slice in param_dtype, kept between uses and written by the optimizer's step
  /// (FSDPOptions::keep_param_copy; null: cast at every gather)
  std::shared_ptr<ParamCopy> copy;
  bool gathered = false;
  int pending = 0;  ///< kept graphs (no recompute) still to run backward through the gathered weights
};

/// A sharded engine's state: its groups and units (layers 0..L-1, then the root).
struct State {
  Groups groups;
  std::vector<Unit> units;
};

/// Builds `unit`'s slice from the full parameters (every rank holds the same model at the start)
/// and empties the parameters. `trainable`: the slice is a leaf with grad (an engine's), else a
/// frozen copy (a reference's, a reward model's).
inline void init_unit(Unit& u, const Groups& g, bool trainable = true) {
  const int S = g.shards(), r = g.shard ? g.shard->rank() : 0;
  for (size_t i = 0; i < u.params.size(); ++i) {
    u.shapes.push_back(u.params[i].sizes().vec());
    u.offsets.push_back(u.numel);
    u.numel += u.params[i].numel();
  }
  u.padded = (u.numel + S - 1) / S * S;
  const auto opts = u.params.front().options();
  at::Tensor flat = at::zeros({u.padded}, opts.requires_grad(false));
  {
    c10::NoGradGuard ng;
    for (size_t i = 0; i < u.params.size(); ++i) {
      flat.narrow(0, u.offsets[i], u.params[i].numel()).copy_(u.params[i].detach().reshape({-1}));
    }
  }
  const auto part = u.padded / S;
  u.slice = flat.narrow(0, r * part, part).clone().requires_grad_(trainable);
  u.device = opts.device();
  for (auto& p : u.params) p.set_data(at::empty({0}, opts));
  u.gathered = false;
}

/// A model's parameters (`named`: Hugging Face names) cut into units — model.layers.N.* into layer
/// N's, the rest (embedding, final norm, lm_head, a score head) into the root, last — each unit's
/// slice built (init_unit) and its parameters emptied. `trainable`: an engine's units (every
/// parameter must train), else a frozen model's. `what` names the caller in errors.
template <class Named>
std::vector<Unit> make_units(const Named& named, int64_t num_layers, const Groups& g, bool trainable,
                             const char* what) {
  std::vector<Unit> units(static_cast<size_t>(num_layers) + 1);  // layers 0..L-1, then the root
  for (int64_t i = 0; i < num_layers; ++i) units[static_cast<size_t>(i)].name = fmt::format("model.layers.{}", i);
  units.back().name = "root";
  int64_t index = 0;  // the position of each parameter in the one-process engine's optimizer
  for (const auto& item : named) {
    const auto& name = item.key();
    HYBRIDRL_CHECK(!trainable || item.value().requires_grad(), fmt::format("{}: parameter '{}' is frozen", what, name),
                   "train every parameter under sharding (or shard a model without frozen parameters)");
    size_t u = units.size() - 1;
    if (name.rfind("model.layers.", 0) == 0) u = std::stoul(name.substr(13, name.find('.', 13) - 13));
    HYBRIDRL_CHECK(u < units.size(), fmt::format("{}: parameter '{}' names a layer past num_hidden_layers = {}", what,
                                                 name, num_layers),
                   "shard a model whose config matches its parameters");
    units[u].names.push_back(name);
    units[u].params.push_back(item.value());
    units[u].index.push_back(index++);
  }
  for (auto& u : units) {
    HYBRIDRL_CHECK(!u.params.empty(), fmt::format("{}: unit '{}' has no parameters", what, u.name),
                   "shard a Llama-family model (model.layers.N.* and the root parameters)");
    // the weights first, then the biases (each in the model's order): q|k|v's and gate|up's
    // weights, and their biases, lie back to back in the flat unit, so a gathered layer runs one
    // GEMM for each (stacked_rows) with biases too (Qwen2's q/k/v)
    std::vector<size_t> order(u.params.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    auto is_bias = [&](size_t i) { return u.names[i].size() >= 5 && u.names[i].compare(u.names[i].size() - 5, 5, ".bias") == 0; };
    std::stable_partition(order.begin(), order.end(), [&](size_t i) { return !is_bias(i); });
    Unit sorted;
    sorted.name = u.name;
    for (const auto i : order) {
      sorted.names.push_back(u.names[i]);
      sorted.params.push_back(u.params[i]);
      sorted.index.push_back(u.index[i]);
    }
    u = std::move(sorted);
    init_unit(u, g, trainable);
  }
  return units;
}

/// The whole flat unit [padded] of which `local` is this rank's slice (the parameters, or a
/// slice-shaped optimizer moment), all-gathered over the shard group, in `dtype`, on `device`
/// (where the unit computes: a slice offloaded to the CPU comes back for the gather).
inline at::Tensor gather_slices(const at::Tensor& local_slice, int64_t padded, const Groups& g, at::ScalarType dtype,
                                at::Device device) {
  c10::NoGradGuard ng;
  const auto local = local_slice.detach().to(device, dtype);
  // one shard: the slice is the unit. The cast (or the move) made a copy already; a frozen slice
  // in `dtype` is read in place; a trainable one is copied (its weights must not alias the master)
  if (g.shards() == 1 && (!local.is_alias_of(local_slice) || !local_slice.requires_grad())) return local;
  at::Tensor full = at::empty({padded}, local.options());
  if (g.shards() > 1) {
    g.shard->all_gather_into(full, local);
  } else {
    full.copy_(local);
  }
  return full;
}

/// The whole flat unit `u` [padded], all-gathered from the ranks' slices, in `dtype`.
/// A unit of one shard with its kept copy in `dtype` (Unit::copy) is not cast: the gathered
/// weights are the copy itself (nothing but the optimizer writes it), cast again first if the
/// slice changed since it was written (its version moved).
inline at::Tensor gather_flat(const Unit& u, const Groups& g, at::ScalarType dtype) {
  if (u.copy && g.shards() == 1 && u.copy->data.scalar_type() == dtype) {
    auto& c = *u.copy;
    const auto v = hybridrl::detail::version_of(u.slice);
    if (c.version != v) {
      c10::NoGradGuard ng;
      c.data.copy_(u.slice.detach());
      c.version = v;
    }
    return c.data;
  }
  return gather_slices(u.slice, u.padded, g, dtype, u.device);
}

/// Gives each trainable unit whose slice lives on its compute device a kept copy in `dtype`
/// (Unit::copy), when `dtype` is not the slice's; returns one per unit (null where none) for
/// Optimizer::set_param_copies, in the units' order. For units of one shard (gather_flat reads
/// the copy only there).
inline std::vector<std::shared_ptr<ParamCopy>> keep_param_copies(std::vector<Unit>& units, at::ScalarType dtype) {
  std::vector<std::shared_ptr<ParamCopy>> out;
  for (auto& u : units) {
    if (u.slice.device() == u.device && u.slice.scalar_type() != dtype) {
      u.copy = std::make_shared<ParamCopy>();
      u.copy->data = at::empty({u.slice.numel()}, u.slice.options().dtype(dtype).requires_grad(false));
    }
    out.push_back(u.copy);
  }
  return out;
}

/// This rank's slice of a unit given as one tensor per parameter (full shapes): [padded / shards].
inline at::Tensor slice_of(const Unit& u, const Groups& g, const std::vector<at::Tensor>& full) {
  c10::NoGradGuard ng;
  at::Tensor flat = at::zeros({u.padded}, u.slice.options().requires_grad(false));
  for (size_t i = 0; i < full.size(); ++i) flat.narrow(0, u.offsets[i], full[i].numel()).copy_(full[i].reshape({-1}));
  const auto part = u.padded / g.shards();
  return flat.narrow(0, (g.shard ? g.shard->rank() : 0) * part, part).clone();
}

/// All-gathers `u` into its parameters, in `dtype`.
inline void gather(Unit& u, const Groups& g, at::ScalarType dtype) {
  if (u.gathered) return;
  const auto full = gather_flat(u, g, dtype);
  for (size_t i = 0; i < u.params.size(); ++i) {
    u.params[i].set_data(full.narrow(0, u.offsets[i], numel_of(u.shapes[i])).view(u.shapes[i]));
  }
  u.gathered = true;
}

/// Empties `u`'s parameters (their gathered storage is freed once nothing else holds it); the
/// empty tensors keep the slice's dtype, so a model's parameters say its master dtype between uses.
inline void release(Unit& u) {
  if (!u.gathered) return;
  for (auto& p : u.params) p.set_data(at::empty({0}, p.options().dtype(u.slice.scalar_type())));
  u.gathered = false;
}

/// `flat` [u.padded] = the unit's gradients `grads` (one per parameter, undefined = zero) cast into
/// their places, the padding zeroed: one copy per parameter (what fused::pack_flat does in one
/// kernel on CUDA).
inline void pack_flat_eager(at::Tensor& flat, const Unit& u, const std::vector<at::Tensor>& grads) {
  // each gradient cast into its place; only what no gradient covers (an undefined one, the
  // padding) is zeroed — no fill of the whole unit before the copies (1.1 B floats a step on 1b)
  for (size_t i = 0; i < u.offsets.size(); ++i) {
    const auto n = numel_of(u.shapes[i]);
    if (i < grads.size() && grads[i].defined()) {
      flat.narrow(0, u.offsets[i], n).copy_(grads[i].reshape({-1}));
    } else {
      flat.narrow(0, u.offsets[i], n).zero_();
    }
  }
  if (u.padded > u.numel) flat.narrow(0, u.numel, u.padded - u.numel).zero_();
}

/// The gradient of the whole unit `grads` (one per parameter, undefined = zero) reduced over the
/// ranks into this rank's slice: [padded / shards], the average over all ranks, in `reduce_dtype`
/// on the wire (on the unit's device), returned in the slice's dtype on the slice's device.
inline at::Tensor reduce_unit_grad(const Unit& u, const Groups& g, const std::vector<at::Tensor>& grads,
                                   at::ScalarType reduce_dtype) {
  c10::NoGradGuard ng;
  at::Tensor flat = at::empty({u.padded}, at::TensorOptions().dtype(reduce_dtype).device(u.device));
  std::vector<int64_t> numels;
  for (const auto& shape : u.shapes) numels.push_back(numel_of(shape));
  // on CUDA one kernel casts every gradient into place and zeroes the rest (198 copy kernels a
  // step on 1b before, at ~1.75 TB/s)
  if (!fused::pack_flat(flat, grads, u.offsets, numels, u.numel)) {
    pack_flat_eager(flat, u, grads);
  }
  const int S = g.shards();
  if (S == 1 && !(g.replicate && g.replicate->size() > 1)) return flat.to(u.slice.device(), u.slice.scalar_type());
  at::Tensor part = at::empty({u.padded / S}, flat.options());
  if (S > 1) {
    g.shard->reduce_scatter(part, flat, ReduceOp::sum);
  } else {
    part.copy_(flat);
  }
  int world = S;
  if (g.replicate && g.replicate->size() > 1) {
    g.replicate->all_reduce(part, ReduceOp::sum);
    world *= g.replicate->size();
  }
  part.div_(world);
  return part.to(u.slice.device(), u.slice.scalar_type());
}

/// What a layer unit's node needs to gather, run and reduce.
struct LayerState {
  Unit* unit = nullptr;
  const Groups* groups = nullptr;
  at::ScalarType param_dtype = at::kFloat;
  at::ScalarType reduce_dtype = at::kFloat;
};

/// The backward node of one layer unit: edges to the layer's input and to the unit's slice.
struct FSDPLayerBackward : torch::autograd::Node {
  std::function<at::Tensor(const at::Tensor&)> fn;  // the layer (inner runner), captured by value
  LayerState state;
  at::Tensor input;        // detached input (recompute), or the input leaf of the kept graph
  bool input_requires_grad = false;
  bool recompute = true;
  at::Tensor kept_output;  // without recompute: the layer's output, graph attached
  bool counted = false;    // without recompute: this node holds one of the unit's `pending`

  // frees the unit's weights unless another kept graph still needs them
  void done() {
    auto& u = *state.unit;
    if (counted) {
      counted = false;
      if (--u.pending > 0) return;
    }
    release(u);
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    HYBRIDRL_CHECK(input.defined(), "Sharding<FSDP>: backward ran twice through one layer unit",
                   "call backward once per forward (no retain_graph) under Sharding<FSDP>");
    auto& u = *state.unit;
    torch::autograd::variable_list out(2);
    at::Tensor x, y;
    if (recompute) {
      gather(u, *state.groups, state.param_dtype);
      at::AutoGradMode enable(true);
      x = input.detach().requires_grad_(input_requires_grad);
      y = fn(x);
    } else {
      x = input;
      y = kept_output;
    }
    std::vector<at::Tensor> wrt;
    if (input_requires_grad) wrt.push_back(x);
    for (auto& p : u.params) wrt.push_back(p);
    std::vector<at::Tensor> g;
    if (grads[0].defined()) {
      g = torch::autograd::grad({y}, wrt, {grads[0].to(y.scalar_type())}, /*retain_graph=*/false,
                                /*create_graph=*/false, /*allow_unused=*/true);
    }
    const size_t k = input_requires_grad ? 1 : 0;  // g = [grad of x,] grads of the parameters
    if (input_requires_grad && !g.empty()) out[0] = g[0];
    std::vector<at::Tensor> pg(u.params.size());
    for (size_t i = 0; i < pg.size() && !g.empty(); ++i) pg[i] = g[k + i];
    // every rank reduces, whether or not its gradient arrived (collectives must match)
    out[1] = reduce_unit_grad(u, *state.groups, pg, state.reduce_dtype);
    y = at::Tensor();
    kept_output.reset();
    done();
    input.reset();
    return out;
  }
  void release_variables() override {
    input.reset();
    kept_output.reset();
    fn = nullptr;
  }
  ~FSDPLayerBackward() override {
    if (counted && state.unit != nullptr) done();  // a kept graph dropped without its backward
  }
  std::string name() const override { return "hybridrl::FSDPLayerBackward"; }
};

/// The LayerRunner of a sharded model: each layer gathered around `inner` as the file comment
/// says. With grad (training) the layer runs inside an FSDPLayerBackward node; without grad (log
/// probs, the reference pass) it is gathered, run and freed.
inline LayerRunner sharded_layer_runner(std::vector<Unit>* units, const Groups* groups, at::ScalarType param_dtype,
                                        at::ScalarType reduce_dtype, bool recompute,
                                        LayerRunner inner = default_layer_runner()) {
  return [=](int64_t layer, DecoderLayerImpl& module, const at::Tensor& h, const LayerContext& ctx) -> at::Tensor {
    auto& u = (*units)[static_cast<size_t>(layer)];
    const bool grad = torch::autograd::GradMode::is_enabled() && module.is_training() && u.slice.requires_grad();
    if (!grad || ctx.attention) {
      gather(u, *groups, param_dtype);
      auto y = inner(layer, module, h, ctx);
      if (u.pending == 0) release(u);
      return y;
    }
    auto self = std::dynamic_pointer_cast<DecoderLayerImpl>(module.shared_from_this());
    std::function<at::Tensor(const at::Tensor&)> fn = [inner, self, layer, ctx](const at::Tensor& x) {
      return inner(layer, *self, x, ctx);
    };
    auto node = std::shared_ptr<FSDPLayerBackward>(new FSDPLayerBackward(), torch::autograd::deleteNode);
    node->state = LayerState{&u, groups, param_dtype, reduce_dtype};
    node->recompute = recompute;
    node->input_requires_grad = h.requires_grad();
    gather(u, *groups, param_dtype);
    at::Tensor y;
    if (recompute) {
      {
        c10::NoGradGuard ng;
        y = fn(h.detach());
      }
      release(u);
      node->input = h.detach();
    } else {
      auto x = h.detach().requires_grad_(h.requires_grad());
      auto kept = fn(x);
      node->input = x;
      node->kept_output = kept;
      node->counted = true;
      ++u.pending;  // freed when the last kept graph through these weights has run backward
      y = kept.detach();
    }
    node->fn = std::move(fn);
    node->set_next_edges(torch::autograd::collect_next_edges(std::vector<at::Tensor>{h, u.slice}));
    torch::autograd::set_history(y, node);
    return y;
  };
}

}  // namespace hybridrl::detail::fsdp
