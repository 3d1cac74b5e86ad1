#pragma once
/// \file
/// The values an Algorithm's loss hooks take and return.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

namespace hybridrl {

/// Global normalisers for loss aggregation: counts over the WHOLE mini-batch on ALL ranks, so a
/// loss does not depend on how the mini-batch is split into micro-batches or ranks.
struct LossScale {
  int64_t global_tokens = 0;     ///< valid (mask = 1) response tokens in the global mini-batch
  int64_t global_sequences = 0;  ///< sequences in the global mini-batch
  int64_t data_parallel_size = 1;  ///< ranks that sum gradients (the loss is pre-multiplied by it)
};

/// What a loss hook returns: the scalar to backpropagate and detached metrics (0-d tensors, so
/// reading them does not force a device sync until the trainer logs).
struct LossOutput {
  at::Tensor loss;
  std::map<std::string, at::Tensor> metrics;
};

}  // namespace hybridrl
