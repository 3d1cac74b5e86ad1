#pragma once
/// \file
/// Where a model's parameters are created, and whether they are drawn at random.
///
/// LibTorch's C++ modules allocate their parameters in the constructor; 1.13 has no meta device
/// or skip-init for them. Left alone, loading a 7B checkpoint in bf16 on a GPU would first build
/// 28 GB of fp32 parameters on the host, draw them at random, and then convert. Our layers
/// (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, RMSNorm) instead ask the
/// innermost ParameterInit scope of the thread for their tensor options and whether to initialise:
///
/// \code
///   {
///     hybridrl::ParameterInit scope(at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16),
///                                   /*random=*/false);
///     CausalLM m(config);  // bf16 on the GPU, uninitialised: fill every parameter before use
///   }
/// \endcode
///
/// load_causal_lm and friends build this way and then copy every parameter from the checkpoint
/// (load_weights refuses a checkpoint that misses one), so the peak memory is the model in its
/// final dtype on its final device. Outside any scope parameters are fp32 on the CPU and drawn
/// as torch::nn::Linear / Embedding do. Scopes nest and restore the outer one on destruction;
/// they are per thread.

#include <ATen/ATen.h>

namespace hybridrl {

/// RAII scope: parameters our layers create on this thread while it lives use `options` (device
/// and dtype) and are initialised at random only when `random`. Not copyable or movable.
class ParameterInit {
 public:
  /// Enters a scope with these tensor options and initialisation.
  ParameterInit(at::TensorOptions options, bool random) : options_(options), random_(random), outer_(current()) {
    current() = this;
  }
  ~ParameterInit() { current() = outer_; }
  ParameterInit(const ParameterInit&) = delete;
  ParameterInit& operator=(const ParameterInit&) = delete;
  ParameterInit(ParameterInit&&) = delete;
  ParameterInit& operator=(ParameterInit&&) = delete;

  /// Options for a new parameter: the innermost scope's, else fp32 on the CPU.
  static at::TensorOptions options() {
    const auto* s = current();
    return s != nullptr ? s->options_ : at::TensorOptions().dtype(at::kFloat).device(at::kCPU);
  }
  /// Whether a new parameter is drawn at random: the innermost scope's choice, else true.
  static bool random() {
    const auto* s = current();
    return s == nullptr || s->random_;
  }

 private:
  static ParameterInit*& current() {
    thread_local ParameterInit* scope = nullptr;
    return scope;
  }
  at::TensorOptions options_;
  bool random_;
  ParameterInit* outer_;
};

}  // namespace hybridrl
