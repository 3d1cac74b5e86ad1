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
  /// Valid (mask = 1) response tokens in the global mini-batch.
  int64_t global_tokens = 0;
  /// Sequences in the global mini-batch: those with at least one valid token for token-level
  /// losses (PPO, GRPO), all samples for sequence-level ones (DPO, KTO).
  int64_t global_sequences = 0;
  /// Data-parallel ranks. Gradients are AVERAGED over ranks (as FSDP/DDP do), so each rank's loss
  /// is pre-multiplied by this to make the average equal the global-batch loss (verl's convention).
  int64_t data_parallel_size = 1;
};

/// What a loss hook returns: the scalar to backpropagate and detached metrics (0-d tensors, so
/// reading them does not force a device sync until the trainer logs).
struct LossOutput {
  at::Tensor loss;
  std::map<std::string, at::Tensor> metrics;
};

}  // namespace hybridrl
