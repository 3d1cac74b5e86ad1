#pragma once
/// \file
/// The optimizer every Sharding engine steps with: AdamW (LibTorch's, decoupled weight decay; on
/// CUDA with LibTorch 2.x the multi-tensor fused kernel, torch.optim.AdamW(fused=True)) under
/// a learning-rate schedule with warm-up (constant, linear or cosine, as transformers'
/// get_*_schedule_with_warmup and verl's), gradient clipping by global norm, and a step that is
/// skipped, not taken, when the gradients are not finite. Its state (AdamW moments and step
/// counts, the schedule position, the skipped-step count) round-trips through a StateDict, so a
/// resumed run continues bit for bit.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <type_traits>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/cuda/fused.hpp"
#include "hybridrl/detail/compat.hpp"
#include "hybridrl/distributed/communicator.hpp"

namespace hybridrl {

/// A low-precision copy of one parameter that the optimizer keeps current where it can: the
/// fused AdamW kernel writes it in the pass that steps the parameter. `version` is the
/// parameter's version counter the copy matches (-1: none); any other writer of the parameter (an
/// ATen in-place op, LibTorch's AdamW, a loaded state) bumps the counter, so a reader that finds
/// the two apart casts the parameter again (detail::fsdp::gather_flat does).
struct ParamCopy {
  at::Tensor data;
  int64_t version = -1;
};

namespace detail {
/// `t`'s version counter (bumped by every in-place write through ATen).
[[nodiscard]] inline int64_t version_of(const at::Tensor& t) {
  return static_cast<int64_t>(t.unsafeGetTensorImpl()->version_counter().current_version());
}
}  // namespace detail

/// How the learning rate moves after warm-up.
enum class LRSchedule { constant, linear, cosine };
HYBRIDRL_ENUM_NAMES(LRSchedule, constant, linear, cosine);

/// AdamW, its learning-rate schedule and gradient clipping.
struct OptimizerOptions {
  /// Peak learning rate (after warm-up).
  HYBRIDRL_ARG(double, lr) = 1e-6;
  HYBRIDRL_ARG(double, beta1) = 0.9;
  HYBRIDRL_ARG(double, beta2) = 0.999;
  HYBRIDRL_ARG(double, eps) = 1e-8;
  /// Decoupled weight decay (AdamW): each step multiplies the parameters by 1 - lr * weight_decay.
  HYBRIDRL_ARG(double, weight_decay) = 0.01;
  /// Clip the gradients to this global L2 norm; 0 = no clipping (the norm is still reported).
  HYBRIDRL_ARG(double, max_grad_norm) = 1.0;
  /// constant, linear (to min_lr_ratio at the last step) or cosine (half a period to min_lr_ratio).
  HYBRIDRL_ARG(LRSchedule, schedule) = LRSchedule::constant;
  /// Steps of linear warm-up from 0 to lr.
  HYBRIDRL_ARG(int64_t, warmup_steps) = 0;
  /// Floor of the linear and cosine schedules, as a fraction of lr.
  HYBRIDRL_ARG(double, min_lr_ratio) = 0.0;

  HYBRIDRL_FIELDS(lr, beta1, beta2, eps, weight_decay, max_grad_norm, schedule, warmup_steps, min_lr_ratio)

  /// Throws hybridrl::Error for an impossible value (problem starts with the field name).
  void validate() const {
    HYBRIDRL_CHECK(std::isfinite(lr_) && lr_ > 0.0, fmt::format("lr = {} is not a positive number", lr_),
                   "use a learning rate such as 1e-6 (RL) or 1e-5 (SFT)");
    HYBRIDRL_CHECK(beta1_ >= 0.0 && beta1_ < 1.0, fmt::format("beta1 = {} is outside [0, 1)", beta1_), "use 0.9");
    HYBRIDRL_CHECK(beta2_ >= 0.0 && beta2_ < 1.0, fmt::format("beta2 = {} is outside [0, 1)", beta2_),
                   "use 0.999 (or 0.95 for long runs)");
    HYBRIDRL_CHECK(eps_ > 0.0, fmt::format("eps = {} is not positive", eps_), "use 1e-8");
    HYBRIDRL_CHECK(weight_decay_ >= 0.0, fmt::format("weight_decay = {} is negative", weight_decay_),
                   "use 0 (none) or a small decay such as 0.01");
    HYBRIDRL_CHECK(max_grad_norm_ >= 0.0, fmt::format("max_grad_norm = {} is negative", max_grad_norm_),
                   "use 0 (no clipping) or a norm such as 1.0");
    HYBRIDRL_CHECK(warmup_steps_ >= 0, fmt::format("warmup_steps = {} is negative", warmup_steps_),
                   "use 0 (no warm-up) or a step count");
    HYBRIDRL_CHECK(min_lr_ratio_ >= 0.0 && min_lr_ratio_ <= 1.0,
                   fmt::format("min_lr_ratio = {} is outside [0, 1]", min_lr_ratio_),
                   "use 0 (decay to zero) or a fraction such as 0.1");
  }
};

/// The learning-rate multiplier for optimizer step `step` (0-based) of `total_steps`: `step /
/// warmup_steps` during warm-up, then 1 (constant), or a linear or half-cosine decay from 1 at the
/// end of warm-up to min_lr_ratio at `total_steps` (held there after).
inline double lr_factor(const OptimizerOptions& o, int64_t step, int64_t total_steps) {
  const auto w = o.warmup_steps();
  if (step < w) return static_cast<double>(step) / static_cast<double>(w);
  if (o.schedule() == LRSchedule::constant) return 1.0;
  const auto span = std::max<int64_t>(1, total_steps - w);
  const double progress = std::min(1.0, static_cast<double>(step - w) / static_cast<double>(span));
  const double shape = o.schedule() == LRSchedule::linear ? 1.0 - progress
                                                          : 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return o.min_lr_ratio() + (1.0 - o.min_lr_ratio()) * shape;
}

/// The factor clip_grad_norm scales the gradients by for a global norm `norm` (0-d): min(1,
/// max_norm / (norm + 1e-6)) when the norm is finite, 1 when not (the step is skipped anyway).
inline at::Tensor clip_coefficient(const at::Tensor& norm, double max_norm) {
  auto coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  return at::where(norm.isfinite(), coef, at::ones_like(coef));
}

/// The global L2 norm of the gradients of `params` (0-d float32, float64 for float64 gradients, on their device; parameters
/// without a gradient are skipped), and, when `max_norm` > 0, the gradients scaled in place by
/// min(1, max_norm / (norm + 1e-6)) as torch.nn.utils.clip_grad_norm_ does. No host
/// synchronisation. A non-finite norm leaves the gradients as they are. With `group`, `params`
/// are this rank's part of a model sharded over the group (disjoint slices that together tile
/// it): the norm is the global one, the square sums all-reduced (collective: every rank calls).
/// `square_weights` (one per parameter, or empty for all 1) scales each parameter's square sum
/// before the reduction: 1 / group size for a parameter every rank of the group holds whole (a
/// tensor-parallel model's norms), so it counts once.
inline at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm,
                                 Communicator* group = nullptr, const std::vector<double>& square_weights = {},
                                 std::optional<at::Device> collective_device = std::nullopt) {
  c10::NoGradGuard no_grad;
  HYBRIDRL_CHECK(square_weights.empty() || square_weights.size() == params.size(),
                 fmt::format("clip_grad_norm: {} square weights for {} parameters", square_weights.size(), params.size()),
                 "give one weight per parameter, or none");
  std::vector<at::Tensor> grads;
  std::vector<double> weights;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].grad().defined()) continue;
    grads.push_back(params[i].grad());
    weights.push_back(square_weights.empty() ? 1.0 : square_weights[i]);
  }
  const bool global = group != nullptr && group->size() > 1;
  if (grads.empty() && !global) return at::zeros({}, at::kFloat);
  // accumulate in float32, or in float64 when a gradient is (half and bf16 gradients: float32)
  auto acc = at::kFloat;
  for (const auto& g : grads) {
    if (g.scalar_type() == at::kDouble) acc = at::kDouble;
  }
  at::Tensor sq;
#if HYBRIDRL_HAS_FUSED_ADAMW
  // on CUDA with float32 gradients: one multi-tensor norm kernel instead of three ops per tensor
  const bool foreach = !grads.empty() && std::all_of(grads.begin(), grads.end(), [&](const at::Tensor& g) {
    return g.is_cuda() && g.scalar_type() == at::kFloat && g.device() == grads.front().device();
  });
  if (foreach) {
    auto norms = at::stack(at::_foreach_norm(grads, 2));
    auto squares = norms * norms;
    if (std::any_of(weights.begin(), weights.end(), [](double w) { return w != 1.0; })) {
      squares = squares * at::tensor(weights, at::kDouble).to(squares.device(), at::kFloat, /*non_blocking=*/true);
    }
    sq = squares.sum();
  }
#endif
  if (!sq.defined()) {
    std::vector<at::Tensor> squares;
    squares.reserve(grads.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      auto s = grads[i].to(acc).pow(2).sum();
      squares.push_back(weights[i] == 1.0 ? s : s * weights[i]);
    }
    sq = squares.empty() ? at::zeros({}, params.empty() ? at::TensorOptions(acc) : params.front().options().dtype(acc))
                         : at::stack(squares).sum();
  }
  if (global) {  // on `collective_device` when given (NCCL wants CUDA tensors; offloaded gradients are on the CPU)
    auto all = collective_device ? sq.reshape({1}).to(*collective_device) : sq.reshape({1});
    group->all_reduce(all, ReduceOp::sum);
    sq = all.to(sq.device()).reshape({});
  }
  auto norm = sq.sqrt();
  if (max_norm > 0.0) {
    auto coef = clip_coefficient(norm, max_norm);
#if HYBRIDRL_HAS_FUSED_ADAMW
    if (foreach) {
      at::_foreach_mul_(grads, coef);
      return norm;
    }
#endif
    for (auto& g : grads) g.mul_(coef.to(g.scalar_type()));
  }
  return norm;
}

/// AdamW over a fixed list of parameters, with the schedule, clipping and non-finite skip of
/// OptimizerOptions. `step()` is called once per optimizer step, after the micro-batches'
/// backward passes have accumulated their gradients.
class Optimizer {
 public:
  /// An optimizer for `params` (in order: their position names them in the state) over a run of
  /// `total_steps` optimizer steps (the schedule's length).
  Optimizer(std::vector<at::Tensor> params, OptimizerOptions options, int64_t total_steps)
      : params_(std::move(params)), options_(options), total_steps_(total_steps) {
    options_.validate();
    HYBRIDRL_CHECK(total_steps_ >= 1, fmt::format("Optimizer: total_steps = {} is below 1", total_steps_),
                   "give the run's number of optimizer steps (trainer.total_steps x updates per step)");
    adam_ = std::make_unique<torch::optim::AdamW>(
        params_, torch::optim::AdamWOptions(options_.lr() * lr_factor(options_, 0, total_steps_))
                     .betas({options_.beta1(), options_.beta2()})
                     .eps(options_.eps())
                     .weight_decay(options_.weight_decay()));
  }

  /// What one step did.
  struct Result {
    at::Tensor grad_norm;  ///< 0-d, before clipping
    double lr = 0.0;       ///< the learning rate it applied (or would have)
    bool skipped = false;  ///< the gradients were not finite: nothing was applied
  };

  /// Clips, then applies AdamW at the schedule's learning rate for this step, and zeroes the
  /// gradients. When the gradient norm is not finite (NaN or inf, e.g. from NaN rewards or an
  /// overflow) the parameters and the AdamW state are left untouched and the step is counted as
  /// skipped; the schedule still advances (it counts optimizer steps of the run). One host
  /// synchronisation: reading whether the norm is finite.
  Result step() {
    Result r;
    r.lr = options_.lr() * lr_factor(options_, step_, total_steps_);
    // the fused AdamW kernel divides each gradient by a device scalar as it reads it: the clipping
    // is folded in there (one pass over the gradients fewer) and applied here only when it cannot be
    const double max_norm = options_.max_grad_norm();
    const bool fold = fusable();
    r.grad_norm = clip_grad_norm(params_, fold ? 0.0 : max_norm, norm_group_, square_weights_, collective_device_);
    r.skipped = !r.grad_norm.isfinite().item<bool>();
    if (!r.skipped) {
      // every copy is stale until its parameter's kernel writes it below (whatever path steps a
      // parameter, and whether or not that path moves its version counter)
      for (auto& c : copies_) {
        if (c) c->version = -1;
      }
      const auto coef = fold && max_norm > 0.0 ? clip_coefficient(r.grad_norm, max_norm) : at::Tensor();
      if (!fused_step(r.lr, coef)) {
        if (coef.defined()) {
          c10::NoGradGuard no_grad;
          for (auto& p : params_) {
            if (p.grad().defined()) p.grad().mul_(coef.to(p.grad().device(), p.grad().scalar_type()));
          }
        }
        for (auto& group : adam_->param_groups()) group.options().set_lr(r.lr);
        adam_->step();
      }
    } else {
      ++skipped_;
    }
    adam_->zero_grad();
    ++step_;
    return r;
  }

  /// The group over which `params` tile the model (a sharded engine's shard group): the gradient
  /// norm, and so clipping and the non-finite skip, are global over it. nullptr: this rank alone.
  /// `square_weights` as clip_grad_norm takes them (one per parameter; empty: all 1).
  /// `collective_device`: where the norm's all-reduce runs when the parameters live elsewhere
  /// (offloaded to the CPU beside an NCCL group).
  void set_norm_group(Communicator* group, std::vector<double> square_weights = {},
                      std::optional<at::Device> collective_device = std::nullopt) {
    HYBRIDRL_CHECK(square_weights.empty() || square_weights.size() == params_.size(),
                   fmt::format("Optimizer::set_norm_group: {} square weights for {} parameters", square_weights.size(),
                               params_.size()),
                   "give one weight per parameter, or none");
    norm_group_ = group;
    square_weights_ = std::move(square_weights);
    collective_device_ = collective_device;
  }

  /// Whether AdamW may run as fused kernels where they apply (LibTorch >= 2.1, parameters and
  /// gradients on CUDA, contiguous, of one dtype): hybridrl's (fused::adamw_step, one launch per
  /// tensor, each read and written once) for up to 64 float32 tensors — a sharding engine's flat
  /// slices —, else one multi-tensor kernel per device and dtype (at::_fused_adamw_,
  /// torch.optim.AdamW(fused=True)). On by default; the result equals LibTorch's per-parameter AdamW
  /// to rounding (the same formula; the state keeps its layout, so state_dict is the same either way).
  void set_fused(bool on) noexcept { fused_ = on; }

  /// Low-precision copies of the parameters (one per parameter in order, null for none) that
  /// step() writes beside them when its fused kernel steps the parameter (see ParamCopy); a step
  /// taken another way leaves them behind the parameters' version, for the reader to cast again.
  void set_param_copies(std::vector<std::shared_ptr<ParamCopy>> copies) {
    HYBRIDRL_CHECK(copies.empty() || copies.size() == params_.size(),
                   fmt::format("Optimizer::set_param_copies: {} copies for {} parameters", copies.size(), params_.size()),
                   "give one copy (or null) per parameter, or none");
    copies_ = std::move(copies);
  }

  /// Optimizer steps taken (skipped ones included).
  [[nodiscard]] int64_t steps() const noexcept { return step_; }
  /// Steps skipped because the gradients were not finite.
  [[nodiscard]] int64_t skipped() const noexcept { return skipped_; }
  /// The learning rate the next step will apply.
  [[nodiscard]] double next_lr() const { return options_.lr() * lr_factor(options_, step_, total_steps_); }
  [[nodiscard]] const OptimizerOptions& options() const noexcept { return options_; }

  /// The state under `prefix`: `<prefix>step`, `<prefix>skipped`, and per parameter i
  /// `<prefix><i>.exp_avg`, `.exp_avg_sq`, `.step` (parameters never stepped have none).
  [[nodiscard]] std::map<std::string, at::Tensor> state_dict(const std::string& prefix = "optimizer.") const {
    std::map<std::string, at::Tensor> out;
    out[prefix + "step"] = at::scalar_tensor(step_, at::kLong);
    out[prefix + "skipped"] = at::scalar_tensor(skipped_, at::kLong);
    const auto& state = adam_->state();
    using Map = std::decay_t<decltype(state)>;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto it = state.find(detail::compat::optimizer_state_key<Map>(params_[i]));
      if (it == state.end()) continue;
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      const auto key = prefix + std::to_string(i) + ".";
      out[key + "exp_avg"] = s.exp_avg().detach().clone();
      out[key + "exp_avg_sq"] = s.exp_avg_sq().detach().clone();
      out[key + "step"] = at::scalar_tensor(static_cast<int64_t>(s.step()), at::kLong);
    }
    return out;
  }

  /// Restores what state_dict wrote (the same parameters, in the same order).
  void load_state_dict(const std::map<std::string, at::Tensor>& in, const std::string& prefix = "optimizer.") {
    auto get = [&](const std::string& k) -> const at::Tensor& {
      auto it = in.find(k);
      HYBRIDRL_CHECK(it != in.end(), fmt::format("Optimizer.load_state_dict: the state has no '{}'", k),
                     "load a state written by Optimizer::state_dict for the same parameters");
      return it->second;
    };
    const auto step = get(prefix + "step").item<int64_t>(), skipped = get(prefix + "skipped").item<int64_t>();
    auto& state = adam_->state();
    using Map = std::decay_t<decltype(state)>;
    std::vector<std::pair<typename Map::key_type, std::unique_ptr<torch::optim::AdamWParamState>>> fresh;
    for (size_t i = 0; i < params_.size(); ++i) {  // everything read and checked before anything changes
      const auto key = prefix + std::to_string(i) + ".";
      if (in.count(key + "exp_avg") == 0) continue;
      const auto& m = get(key + "exp_avg");
      HYBRIDRL_CHECK(m.sizes() == params_[i].sizes(),
                     fmt::format("Optimizer.load_state_dict: '{}exp_avg' has shape [{}], parameter {} [{}]", key,
                                 fmt::join(m.sizes(), ", "), i, fmt::join(params_[i].sizes(), ", ")),
                     "load a state written for the same model");
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(get(key + "step").item<int64_t>());
      s->exp_avg(m.to(params_[i].options()).clone());
      s->exp_avg_sq(get(key + "exp_avg_sq").to(params_[i].options()).clone());
      fresh.emplace_back(detail::compat::optimizer_state_key<Map>(params_[i]), std::move(s));
    }
    state.clear();
    for (auto& [k, s] : fresh) state[k] = std::move(s);
    step_ = step;
    skipped_ = skipped;
  }

 private:
  /// Whether fused_step will take this step's gradients (every parameter with one qualifies).
  [[nodiscard]] bool fusable() const {
#if HYBRIDRL_HAS_FUSED_ADAMW
    if (!fused_) return false;
    for (const auto& p : params_) {
      const auto& g = p.grad();
      if (!g.defined()) continue;
      if (!p.is_cuda() || g.is_sparse() || g.scalar_type() != p.scalar_type() || !p.is_contiguous() ||
          !g.is_contiguous() || !at::isFloatingType(p.scalar_type())) {
        return false;
      }
    }
    return true;
#else
    return false;
#endif
  }

  /// AdamW through hybridrl's kernel (fused::adamw_step: float32, up to 64 tensors) or
  /// compat::fused_adamw when it applies (see set_fused): false, having done nothing, when neither
  /// does. The AdamW state lives in adam_'s map as LibTorch's step creates it;
  /// the float32 step counts the kernel reads stay on the device beside a host copy of what they
  /// hold, refreshed from the state when the two disagree (a loaded state), so no step synchronises.
  /// `clip` (0-d, or undefined: none): the factor to scale the gradients by, which the kernel
  /// applies as it reads them (AMP's grad_scale: it divides by 1 / clip; the gradients are zeroed
  /// after the step either way).
  bool fused_step([[maybe_unused]] double lr, [[maybe_unused]] const at::Tensor& clip = {}) {
#if HYBRIDRL_HAS_FUSED_ADAMW
    if (!fusable()) return false;
    std::vector<size_t> live;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].grad().defined()) live.push_back(i);
    }
    if (live.empty()) return true;  // nothing has a gradient: LibTorch's step would do nothing too
    auto& state = adam_->state();
    using Map = std::decay_t<decltype(state)>;
    device_steps_.resize(params_.size());
    device_step_values_.resize(params_.size(), -1);
    // float32 parameters, a few tensors (a sharding engine's flat slices: one per layer): hybridrl's
    // kernel, one launch per tensor, each read once and written once — torch's multi-tensor kernel
    // also writes the scaled gradients back (a fifth pass); the step counts stay on the host. Many
    // small tensors (a model's own parameters) keep torch's one launch for all.
    constexpr size_t own_max_tensors = 64;
    const bool own = live.size() <= own_max_tensors && std::all_of(live.begin(), live.end(), [&](size_t i) {
                       return fused::adamw_applies(params_[i], params_[i].grad());
                     });
    at::Tensor inv_clip;
    if (clip.defined()) {
      c10::NoGradGuard no_grad;
      inv_clip = 1.0 / clip.to(at::kFloat);
    }
    struct Lists {
      std::vector<at::Tensor> p, g, m, v, s;
    };
    std::map<std::pair<std::string, at::ScalarType>, Lists> groups;  // one kernel per device and dtype
    for (auto i : live) {
      const auto& p = params_[i];
      const auto key = detail::compat::optimizer_state_key<Map>(p);
      auto it = state.find(key);
      if (it == state.end()) {  // first step: the state LibTorch's AdamW creates
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        state[key] = std::move(fresh);
        it = state.find(key);
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
      if (own) {
        st.step(st.step() + 1);
        device_step_values_[i] = -1;  // the device count, if torch's kernel runs later, is made again
        c10::NoGradGuard no_grad;
        auto& param = params_[i];
        auto m = st.exp_avg(), v = st.exp_avg_sq();
        ParamCopy* copy = i < copies_.size() ? copies_[i].get() : nullptr;
        if (copy != nullptr && !fused::adamw_copy_applies(param, copy->data)) copy = nullptr;
        fused::adamw_step(param, param.grad(), m, v, lr, options_.beta1(), options_.beta2(), options_.weight_decay(),
                          options_.eps(), st.step(), inv_clip.defined() ? inv_clip.to(param.device()) : at::Tensor(),
                          copy != nullptr ? copy->data : at::Tensor());
        if (copy != nullptr) copy->version = detail::version_of(param);  // written beside it
        continue;
      }
      if (!device_steps_[i].defined() || device_step_values_[i] != st.step() || device_steps_[i].device() != p.device()) {
        device_steps_[i] = at::full({}, static_cast<double>(st.step()), p.options().dtype(at::kFloat));
      }
      st.step(st.step() + 1);  // the kernel reads the incremented count (added on the device below)
      device_step_values_[i] = st.step();
      auto& l = groups[{p.device().str(), p.scalar_type()}];
      l.p.push_back(p);
      l.g.push_back(p.grad());
      l.m.push_back(st.exp_avg());
      l.v.push_back(st.exp_avg_sq());
      l.s.push_back(device_steps_[i]);
    }
    c10::NoGradGuard no_grad;
    for (auto& [where, l] : groups) {
      at::_foreach_add_(l.s, 1.0);
      std::optional<at::Tensor> scale;
      if (inv_clip.defined()) scale = inv_clip.to(l.p.front().device());
      detail::compat::fused_adamw(l.p, l.g, l.m, l.v, l.s, lr, options_.beta1(), options_.beta2(),
                                  options_.weight_decay(), options_.eps(), scale);
    }
    return true;
#else
    return false;
#endif
  }

  std::vector<at::Tensor> params_;
  std::vector<std::shared_ptr<ParamCopy>> copies_;  // set_param_copies (empty: none)
  OptimizerOptions options_;
  int64_t total_steps_;
  std::unique_ptr<torch::optim::AdamW> adam_;
  Communicator* norm_group_ = nullptr;
  std::vector<double> square_weights_;
  std::optional<at::Device> collective_device_;
  int64_t step_ = 0, skipped_ = 0;
  bool fused_ = true;
  std::vector<at::Tensor> device_steps_;     // fused path: float32 step count per parameter, on its device
  std::vector<int64_t> device_step_values_;  // what each of them holds (-1: nothing yet)
};

}  // namespace hybridrl
