#pragma once
/// \file
/// Activation checkpointing (recompute in backward) for LibTorch C++ (which has no torch.utils.checkpoint): run a block
/// without recording its graph, keep only its input, and recompute it with grad in backward.
/// Gradients equal those of the plain run (the blocks here have no dropout, so no RNG replay); a
/// block run under autocast is recomputed under the same autocast (as torch.utils.checkpoint does).
/// "Checkpoint" elsewhere in hybridrl means a training checkpoint (save and resume); this is not one.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "hybridrl/core/error.hpp"
#include "hybridrl/detail/compat.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hybridrl {

/// A block to checkpoint: one tensor in, one tensor out; it may use `params` and captured tensors
/// that need no gradient (masks, rotary tables).
using ActivationCheckpointFn = std::function<at::Tensor(const at::Tensor&)>;

namespace detail {

/// The backward node of activation_checkpoint(): recomputes the block and differentiates it.
struct ActivationCheckpointBackward : torch::autograd::Node {
  ActivationCheckpointFn fn;
  at::Tensor input;                 // detached copy of the block's input
  bool input_requires_grad = false;
  std::vector<at::Tensor> params;   // the block's parameters, in edge order after the input
  std::optional<at::ScalarType> autocast;  // the forward ran under autocast to this dtype (on input's device type)

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    HYBRIDRL_CHECK(input.defined(), "activation_checkpoint: backward ran twice through one checkpointed block",
                   "call backward with retain_graph only on graphs without activation checkpointing");
    at::AutoGradMode enable(true);
    auto x = input.detach().requires_grad_(input_requires_grad);
    std::optional<detail::compat::AutocastGuard> cast;
    if (autocast) cast.emplace(x.device().type(), *autocast);
    auto y = fn(x);
    cast.reset();
    std::vector<at::Tensor> wrt;
    std::vector<size_t> slot;  // which output edge each `wrt` entry feeds
    if (input_requires_grad) {
      wrt.push_back(x);
      slot.push_back(0);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].requires_grad()) {
        wrt.push_back(params[i]);
        slot.push_back(i + 1);
      }
    }
    torch::autograd::variable_list out(1 + params.size());
    if (!wrt.empty() && grads[0].defined()) {
      auto g = torch::autograd::grad({y}, wrt, {grads[0]}, /*retain_graph=*/false,
                                     /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t i = 0; i < g.size(); ++i) out[slot[i]] = g[i];
    }
    return out;
  }
  void release_variables() override {
    input.reset();
    fn = nullptr;
  }
  std::string name() const override { return "hybridrl::ActivationCheckpointBackward"; }
};

}  // namespace detail

/// Runs `fn(x)` without keeping its activations and returns its output wired into autograd, so
/// backward recomputes `fn` and produces gradients for `x` and `params` equal to a plain run.
/// Without grad mode (or when nothing requires grad) it is just `fn(x)`. Captured tensors in `fn`
/// must be captured by value: backward runs after the caller's frame is gone.
inline at::Tensor activation_checkpoint(const ActivationCheckpointFn& fn, const at::Tensor& x,
                             const std::vector<at::Tensor>& params) {
  bool needs = torch::autograd::GradMode::is_enabled() && x.requires_grad();
  if (torch::autograd::GradMode::is_enabled()) {
    for (const auto& p : params) needs = needs || p.requires_grad();
  }
  if (!needs) return fn(x);
  at::Tensor y;
  {
    c10::NoGradGuard no_grad;
    y = fn(x.detach());
  }
  auto node = std::shared_ptr<detail::ActivationCheckpointBackward>(new detail::ActivationCheckpointBackward(),
                                                          torch::autograd::deleteNode);
  node->fn = fn;
  node->input = x.detach();
  node->input_requires_grad = x.requires_grad();
  node->params = params;
  const auto type = x.device().type();
  if ((type == at::kCUDA || type == at::kCPU) && detail::compat::AutocastGuard::enabled(type)) {
    node->autocast = detail::compat::AutocastGuard::get_dtype(type);
  }
  std::vector<at::Tensor> inputs;
  inputs.reserve(1 + params.size());
  inputs.push_back(x);
  for (const auto& p : params) inputs.push_back(p);
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace hybridrl
