#pragma once
/// \file
/// A frozen model — the reference policy, a reward model — sharded as Sharding<FSDP> shards a
/// trained one: each layer unit and the root stored on this rank as a flat slice, 1/world of the
/// unit, gathered around each use and freed after. Between forwards a rank holds 1/world of the
/// weights; while one runs, one layer's full weights more (and the root's).
///
/// \code
///   ShardedFrozen<RewardModel> rm(load_reward_model(dir), comm, at::kBFloat16);
///   auto s = rm.run([&](RewardModel m) { return m->score_sequences(ids, mask); });
/// \endcode
///
/// run() is collective over the group (every rank calls it as often, with batches of any size).
/// On one process (no Communicator, or one rank) it is the model as given, its weights cast to
/// `param_dtype` once (a frozen model needs no master copy): it computes as the policy's engine
/// does on its param_dtype copies, bit for bit.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/distributed/communicator.hpp"
#include "hybridrl/model/activation_checkpoint.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include "hybridrl/model/decoder.hpp"
#include "hybridrl/sharding/fsdp_units.hpp"

namespace hybridrl {

/// A frozen CausalLM, ValueModel or RewardModel, sharded over a group (see the file comment).
/// Move-only; its model's layer runner points into state the object owns on the heap.
template <class Model>
class ShardedFrozen {
 public:
  /// Shards `model` (its full weights, the same on every rank: a checkpoint or a copy of the
  /// policy) over the ranks of `comm` in consecutive shard groups of `shard_group_size`
  /// (-1: all ranks; smaller: each group holds a whole copy, as hybrid sharding); its parameters
  /// are emptied. Layers run in `param_dtype` (gathered in it). Collective over `comm`.
  ShardedFrozen(Model model, std::shared_ptr<Communicator> comm, at::ScalarType param_dtype,
                int64_t shard_group_size = -1)
      : model_(std::move(model)), param_dtype_(param_dtype) {
    freeze();
    const int64_t world = comm ? comm->size() : 1;
    HYBRIDRL_CHECK(shard_group_size == -1 || (shard_group_size >= 1 && world % shard_group_size == 0),
                   fmt::format("ShardedFrozen: shard_group_size = {} does not divide the group's {} ranks",
                               shard_group_size, world),
                   "use -1 (shard over all ranks) or a divisor of the number of ranks");
    if (world == 1 || shard_group_size == 1) {
      one_process();
      return;
    }
    shard(detail::fsdp::make_groups(comm, shard_group_size));
  }

  /// Shards `model` over `groups` (an FSDP engine's shard groups: no new communicator is made).
  ShardedFrozen(Model model, const detail::fsdp::Groups& groups, at::ScalarType param_dtype)
      : model_(std::move(model)), param_dtype_(param_dtype) {
    freeze();
    if (groups.shards() == 1) {
      one_process();
      return;
    }
    shard(groups);
  }

  /// A frozen copy of an FSDP engine's weights as they stand: `skeleton` (the same architecture,
  /// its parameters uninitialised or empty, on any device) takes copies of this rank's slices of
  /// `trained` — no communication; the skeleton's parameters are emptied and it moves to the
  /// device the units compute on (the slices stay where the engine keeps them: on the CPU when
  /// it offloads).
  ShardedFrozen(Model skeleton, const detail::fsdp::State& trained, at::ScalarType param_dtype)
      : model_(std::move(skeleton)), param_dtype_(param_dtype) {
    freeze();
    c10::NoGradGuard ng;
    sh_ = std::make_unique<detail::fsdp::State>();
    sh_->groups = trained.groups;
    auto named = model_->named_parameters();
    for (const auto& t : trained.units) {
      detail::fsdp::Unit u;
      u.name = t.name;
      u.names = t.names;
      u.shapes = t.shapes;
      u.offsets = t.offsets;
      u.index = t.index;
      u.numel = t.numel;
      u.padded = t.padded;
      u.slice = t.slice.detach().to(t.slice.device(), param_dtype_, /*non_blocking=*/false, /*copy=*/true);  // only ever gathered in it
      u.device = t.device;
      for (const auto& n : u.names) {
        auto* p = named.find(n);
        HYBRIDRL_CHECK(p != nullptr, fmt::format("ShardedFrozen: the model has no parameter '{}'", n),
                       "copy an engine of the same architecture");
        p->set_data(at::empty({0}, p->options()));
        u.params.push_back(*p);
      }
      sh_->units.push_back(std::move(u));
    }
    if (!sh_->units.empty()) model_->to(sh_->units.back().device);  // the empty parameters and the buffers
    model_->model->set_layer_runner(detail::fsdp::sharded_layer_runner(&sh_->units, &sh_->groups, param_dtype_,
                                                                       param_dtype_, /*recompute=*/false));
  }

  ShardedFrozen(ShardedFrozen&&) noexcept = default;
  ShardedFrozen& operator=(ShardedFrozen&&) noexcept = default;
  ShardedFrozen(const ShardedFrozen&) = delete;
  ShardedFrozen& operator=(const ShardedFrozen&) = delete;

  /// `f(model)` with the root gathered (the layers gather themselves), without grad; returns
  /// what `f` returns. Collective when sharded.
  template <class F>
  decltype(auto) run(F&& f) const {
    c10::NoGradGuard ng;
    if (!sh_) return f(model_);
    detail::fsdp::gather(sh_->units.back(), sh_->groups, param_dtype_);
    struct Release {
      detail::fsdp::Unit* root;
      ~Release() { detail::fsdp::release(*root); }
    } release{&sh_->units.back()};
    return f(model_);
  }

  /// True when the weights are sharded over several ranks.
  [[nodiscard]] bool sharded() const noexcept { return sh_ != nullptr; }
  /// Parameter elements this rank stores (its slices; the whole model on one process).
  [[nodiscard]] int64_t local_parameter_elements() const {
    if (sh_) {
      int64_t n = 0;
      for (const auto& u : sh_->units) n += u.slice.numel();
      return n;
    }
    return total_parameter_elements();
  }
  /// Parameter elements of the model.
  [[nodiscard]] int64_t total_parameter_elements() const {
    if (sh_) {
      int64_t n = 0;
      for (const auto& u : sh_->units) n += u.numel;
      return n;
    }
    int64_t n = 0;
    for (const auto& p : model_->parameters()) n += p.numel();
    return n;
  }
  /// The model (sharded: its parameters are empty except while run() runs).
  [[nodiscard]] const Model& model() const noexcept { return model_; }
  /// The dtype its layers run in.
  [[nodiscard]] at::ScalarType param_dtype() const noexcept { return param_dtype_; }

 private:
  void freeze() {
    for (auto& p : model_->parameters()) p.requires_grad_(false);
    model_->eval();
  }
  void one_process() {
    c10::NoGradGuard ng;
    for (auto& p : model_->parameters()) {
      if (p.scalar_type() != param_dtype_) p.set_data(p.to(param_dtype_));
    }
  }
  void shard(const detail::fsdp::Groups& groups) {
    HYBRIDRL_CHECK(model_->model->parallel().tp_size == 1, "ShardedFrozen: the model is tensor-parallel (tp_size > 1)",
                   "shard a full model (a tensor-parallel reference is Sharding<TP3D>'s make_reference)");
    sh_ = std::make_unique<detail::fsdp::State>();
    sh_->groups = groups;
    sh_->units = detail::fsdp::make_units(model_->named_parameters(), model_->model->config().num_hidden_layers,
                                          sh_->groups, /*trainable=*/false, "ShardedFrozen");
    c10::NoGradGuard ng;
    for (auto& u : sh_->units) u.slice = u.slice.to(param_dtype_);  // used only so: half the memory in bf16
    model_->model->set_layer_runner(detail::fsdp::sharded_layer_runner(&sh_->units, &sh_->groups, param_dtype_,
                                                                       param_dtype_, /*recompute=*/false));
  }

  Model model_;
  at::ScalarType param_dtype_;
  std::unique_ptr<detail::fsdp::State> sh_;  // sharded only; behind a pointer: the layer runner holds its address
};

}  // namespace hybridrl
