#pragma once
/// \file
/// Tensor parallelism inside the model (Megatron-LM's layout): a ParallelContext names this rank's
/// place in its tensor-parallel group, and the layers built with it hold only their shard.
/// - ColumnParallelLinear: output features split (q/k/v/gate/up, lm_head): weight [out/tp, in].
/// - RowParallelLinear: input features split (o_proj, down_proj): weight [out, in/tp]; partial
///   sums all-reduced, bias added once after the reduction.
/// - VocabParallelEmbedding: vocabulary rows split: weight [V/tp, hidden]; ids outside the shard
///   give zeros, then all-reduced.
/// At tp_size 1 each is exactly a plain Linear / Embedding (same parameter names `weight` and
/// `bias`, same initialisation, same kernels, no communication), so HF loading and logits are
/// unchanged. Shard layout rule (agrees with the sharding engines' weight export): column-parallel
/// weights and their biases split on dim 0, row-parallel weights on dim 1 (their bias replicated),
/// embed_tokens and lm_head on dim 0 (vocabulary), norms and the critic's score replicated.
/// Parameters are created with the innermost ParameterInit scope's device and dtype, and drawn
/// only when it asks for random initialisation (model/parameter_init.hpp; loading skips the draw).

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>

#include "hybridrl/core/error.hpp"
#include "hybridrl/distributed/communicator.hpp"
#include "hybridrl/model/parameter_init.hpp"
#include "hybridrl/sharding/weights.hpp"

namespace hybridrl {

/// This rank's place in its tensor-parallel group. Default: no tensor parallelism. `tp` is not
/// owned: the communicator must outlive every module built with the context.
struct ParallelContext {
  int64_t tp_rank = 0;        ///< rank in the tensor-parallel group, in [0, tp_size)
  int64_t tp_size = 1;        ///< tensor-parallel degree
  Communicator* tp = nullptr;  ///< the tensor-parallel group (required when tp_size > 1)

  /// Whether layers built with this context hold shards (tp_size > 1).
  [[nodiscard]] bool sharded() const noexcept { return tp_size > 1; }

  /// Throws hybridrl::Error for an inconsistent context.
  void validate() const {
    HYBRIDRL_CHECK(tp_size >= 1, fmt::format("tp_size = {} must be >= 1", tp_size),
                   "use 1 for no tensor parallelism");
    HYBRIDRL_CHECK(tp_rank >= 0 && tp_rank < tp_size,
                   fmt::format("tp_rank = {} must lie in [0, tp_size = {})", tp_rank, tp_size),
                   "pass this rank's index in its tensor-parallel group");
    HYBRIDRL_CHECK(tp_size == 1 || tp != nullptr,
                   fmt::format("tp = nullptr but tp_size = {} needs a communicator", tp_size),
                   "pass the tensor-parallel group's Communicator");
    HYBRIDRL_CHECK(tp == nullptr || (tp->size() == tp_size && tp->rank() == tp_rank),
                   fmt::format("tp is a group of {} ranks with this rank at {}, but the context says "
                               "tp_size = {}, tp_rank = {}",
                               tp ? tp->size() : 0, tp ? tp->rank() : 0, tp_size, tp_rank),
                   "build the context from the communicator: {comm.rank(), comm.size(), &comm}");
  }
  friend bool operator==(const ParallelContext&, const ParallelContext&) = default;
};

namespace detail {

/// Megatron's "f": identity forward, all-reduce (sum) of the gradient backward. Applied to the
/// replicated input of a column-parallel layer, whose gradient every shard contributes to.
struct CopyToTensorParallel : torch::autograd::Function<CopyToTensorParallel> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, Communicator* comm) {
    ctx->saved_data["comm"] = reinterpret_cast<int64_t>(comm);
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* comm = reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
    auto g = grads[0].contiguous().clone();
    comm->all_reduce(g, ReduceOp::sum);
    return {g, at::Tensor()};
  }
};

/// Megatron's "g": all-reduce (sum) forward, identity backward. Applied to the partial sums of a
/// row-parallel layer (and the vocab-parallel embedding), whose downstream is replicated.
struct ReduceFromTensorParallel : torch::autograd::Function<ReduceFromTensorParallel> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x, Communicator* comm) {
    auto y = x.contiguous().clone();
    comm->all_reduce(y, ReduceOp::sum);
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

/// "f" of `x` when `pc` is sharded, else `x`.
inline at::Tensor copy_to_tp(const at::Tensor& x, const ParallelContext& pc) {
  return pc.sharded() ? CopyToTensorParallel::apply(x, pc.tp) : x;
}
/// "g" of `x` when `pc` is sharded, else `x`.
inline at::Tensor reduce_from_tp(const at::Tensor& x, const ParallelContext& pc) {
  return pc.sharded() ? ReduceFromTensorParallel::apply(x, pc.tp) : x;
}

/// `n / pc.tp_size`, or an Error naming `what` when it does not divide.
inline int64_t tp_local_size(int64_t n, const ParallelContext& pc, std::string_view what) {
  HYBRIDRL_CHECK(n % pc.tp_size == 0,
                 fmt::format("{} = {} is not divisible by tp_size = {}", what, n, pc.tp_size),
                 "choose a tensor-parallel degree that divides the head counts, intermediate_size and vocab_size");
  return n / pc.tp_size;
}

/// This rank's shard of the full tensor `full` of parameter `name` (a view when contiguous slicing
/// allows; copy it before keeping it). The split follows tensor_parallel_dim (sharding/weights.hpp),
/// the one rule weight export uses too.
inline at::Tensor tp_shard(const at::Tensor& full, std::string_view name, const ParallelContext& pc) {
  const auto dim = tensor_parallel_dim(name);
  if (!pc.sharded() || !dim) return full;
  const auto n = tp_local_size(full.size(*dim), pc, fmt::format("{} size({})", name, *dim));
  return full.narrow(*dim, pc.tp_rank * n, n);
}

}  // namespace detail

/// `y = x W^T + b` with W's output rows split across the tensor-parallel group: each rank returns
/// its slice of the output features ([..., out/tp]). Plain Linear at tp_size 1.
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  /// A layer from `in` to `out` features (global sizes), this rank's shard of them.
  ColumnParallelLinearImpl(int64_t in, int64_t out, bool bias, const ParallelContext& pc = {})
      : pc_(pc), in_(in), out_(out) {
    pc.validate();
    const auto local = detail::tp_local_size(out, pc, "output features");
    weight = register_parameter("weight", torch::empty({local, in}, ParameterInit::options()));
    if (bias) this->bias = register_parameter("bias", torch::empty({local}, ParameterInit::options()));
    if (ParameterInit::random()) reset_parameters();
  }
  /// torch::nn::Linear's initialisation (kaiming-uniform weight, uniform bias by fan-in).
  void reset_parameters() {
    torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
    if (bias.defined()) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
      torch::nn::init::uniform_(bias, -bound, bound);
    }
  }
  /// This rank's output features of `x` [..., in] (replicated across the group).
  at::Tensor forward(const at::Tensor& x) { return at::linear(detail::copy_to_tp(x, pc_), weight, bias); }

  [[nodiscard]] int64_t in_features() const noexcept { return in_; }    ///< global input features
  [[nodiscard]] int64_t out_features() const noexcept { return out_; }  ///< global output features
  [[nodiscard]] const ParallelContext& parallel() const noexcept { return pc_; }  ///< the context

  at::Tensor weight;  ///< [out/tp, in]
  at::Tensor bias;    ///< [out/tp], or undefined

 private:
  ParallelContext pc_;
  int64_t in_, out_;
};
/// Module holder of ColumnParallelLinearImpl.
TORCH_MODULE(ColumnParallelLinear);

/// `y = x W^T + b` with W's input columns split: each rank multiplies its slice of the input
/// features ([..., in/tp], a column-parallel layer's output) and the partial sums are all-reduced.
/// Plain Linear at tp_size 1.
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  /// A layer from `in` to `out` features (global sizes), this rank's shard of the inputs.
  RowParallelLinearImpl(int64_t in, int64_t out, bool bias, const ParallelContext& pc = {})
      : pc_(pc), in_(in), out_(out) {
    pc.validate();
    const auto local = detail::tp_local_size(in, pc, "input features");
    weight = register_parameter("weight", torch::empty({out, local}, ParameterInit::options()));
    if (bias) this->bias = register_parameter("bias", torch::empty({out}, ParameterInit::options()));
    if (ParameterInit::random()) reset_parameters();
  }
  /// torch::nn::Linear's initialisation (kaiming-uniform weight, uniform bias by fan-in).
  void reset_parameters() {
    torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
    if (bias.defined()) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(weight.size(1)));
      torch::nn::init::uniform_(bias, -bound, bound);
    }
  }
  /// The full output [..., out] (replicated) of this rank's input slice `x` [..., in/tp].
  at::Tensor forward(const at::Tensor& x) {
    if (!pc_.sharded()) return at::linear(x, weight, bias);
    auto y = detail::reduce_from_tp(at::linear(x, weight), pc_);
    return bias.defined() ? y + bias : y;
  }

  [[nodiscard]] int64_t in_features() const noexcept { return in_; }    ///< global input features
  [[nodiscard]] int64_t out_features() const noexcept { return out_; }  ///< global output features
  [[nodiscard]] const ParallelContext& parallel() const noexcept { return pc_; }  ///< the context

  at::Tensor weight;  ///< [out, in/tp]
  at::Tensor bias;    ///< [out] (replicated), or undefined

 private:
  ParallelContext pc_;
  int64_t in_, out_;
};
/// Module holder of RowParallelLinearImpl.
TORCH_MODULE(RowParallelLinear);

/// Token embedding with the vocabulary rows split: rank r holds ids [r·V/tp, (r+1)·V/tp). Ids of
/// other shards give zeros before the all-reduce. Plain Embedding at tp_size 1.
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  /// `vocab` × `dim` embedding (global vocabulary), this rank's rows of it.
  VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, const ParallelContext& pc = {}) : pc_(pc), vocab_(vocab) {
    pc.validate();
    local_ = detail::tp_local_size(vocab, pc, "vocab_size");
    weight = register_parameter("weight", torch::empty({local_, dim}, ParameterInit::options()));
    if (ParameterInit::random()) reset_parameters();
  }
  /// torch::nn::Embedding's initialisation (standard normal).
  void reset_parameters() { torch::nn::init::normal_(weight); }
  /// Embeddings [..., dim] (replicated) of `ids` [...].
  at::Tensor forward(const at::Tensor& ids) {
    if (!pc_.sharded()) return at::embedding(weight, ids);
    const auto start = vocab_start();
    auto mine = ids.ge(start).logical_and(ids.lt(start + local_));
    auto local = (ids - start) * mine;
    auto e = at::embedding(weight, local) * mine.unsqueeze(-1).to(weight.scalar_type());
    return detail::reduce_from_tp(e, pc_);
  }
  /// First vocabulary id of this rank's shard.
  [[nodiscard]] int64_t vocab_start() const noexcept { return pc_.tp_rank * local_; }
  [[nodiscard]] int64_t vocab_size() const noexcept { return vocab_; }  ///< global vocabulary
  [[nodiscard]] const ParallelContext& parallel() const noexcept { return pc_; }  ///< the context

  at::Tensor weight;  ///< [vocab/tp, dim]

 private:
  ParallelContext pc_;
  int64_t vocab_, local_ = 0;
};
/// Module holder of VocabParallelEmbeddingImpl.
TORCH_MODULE(VocabParallelEmbedding);

}  // namespace hybridrl
