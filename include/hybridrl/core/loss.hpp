#pragma once
/// \file
/// The values an Algorithm's loss hooks take and return: the global counts a loss is normalised
/// by (LossCounts), and the loss with its metrics, each metric carrying the rule by which the
/// trainer aggregates it over micro-batches and ranks (Metric, Reduce).

#include <ATen/core/Tensor.h>
#include <ATen/ops/scalar_tensor.h>

#include <cstdint>
#include <map>
#include <string>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"

namespace hybridrl {

/// Global normalisers for loss aggregation: counts over the WHOLE mini-batch on ALL ranks, so a
/// loss does not depend on how the mini-batch is split into micro-batches or ranks. All zero
/// ("empty") means: this micro-batch is the whole mini-batch, use its local counts.
struct LossCounts {
  /// Valid (mask = 1) response tokens in the global mini-batch.
  int64_t global_tokens = 0;
  /// Sequences in the global mini-batch: those with at least one valid token for token-level
  /// losses (PPO, GRPO), all samples for sequence-level ones (DPO, KTO).
  int64_t global_sequences = 0;
  /// Data-parallel ranks. Gradients are AVERAGED over ranks (as FSDP/DDP do), so each rank's loss
  /// is pre-multiplied by this to make the average equal the global-batch loss (verl's convention).
  int64_t data_parallel_size = 1;

  /// True when no global count is set (the local-counts form).
  [[nodiscard]] bool empty() const noexcept { return global_tokens == 0 && global_sequences == 0; }
};

/// How a metric of one micro-batch combines with the others (micro-batches, then ranks).
enum class Reduce {
  sum,            ///< the value is this micro-batch's additive share of a mini-batch quantity
  token_mean,     ///< a mean over the micro-batch's valid tokens; weight = that token count
  sequence_mean,  ///< a mean over the micro-batch's sequences; weight = that sequence count
  max,            ///< the largest value wins (also: a value that is the same in every micro-batch)
};
HYBRIDRL_ENUM_NAMES(Reduce, sum, token_mean, sequence_mean, max);

/// One metric of one micro-batch: a 0-d detached tensor (no device sync when it is made), its
/// reduction and, for the means, the weight (token or sequence count, also a 0-d tensor) that
/// makes the mean of micro-batches of unequal size the mean of the whole.
struct Metric {
  at::Tensor value;
  Reduce reduce = Reduce::sum;
  at::Tensor weight;  ///< defined for token_mean / sequence_mean only

  /// An additive share (e.g. a loss already normalised by the global counts, divided by the
  /// data-parallel size): the aggregate is the sum over micro-batches and ranks.
  [[nodiscard]] static Metric sum(const at::Tensor& v) { return {v.detach(), Reduce::sum, {}}; }
  /// The maximum over micro-batches and ranks.
  [[nodiscard]] static Metric max(const at::Tensor& v) { return {v.detach(), Reduce::max, {}}; }
  /// A mean over `tokens` valid tokens (0-d tensor, e.g. mask.sum()).
  [[nodiscard]] static Metric token_mean(const at::Tensor& v, const at::Tensor& tokens) {
    return {v.detach(), Reduce::token_mean, tokens.detach()};
  }
  /// A mean over `sequences` sequences (0-d tensor, e.g. the count of desirable rows).
  [[nodiscard]] static Metric sequence_mean(const at::Tensor& v, const at::Tensor& sequences) {
    return {v.detach(), Reduce::sequence_mean, sequences.detach()};
  }
  /// A mean over `sequences` sequences (a host count, e.g. batch.size()).
  [[nodiscard]] static Metric sequence_mean(const at::Tensor& v, int64_t sequences) {
    return {v.detach(), Reduce::sequence_mean,
            at::scalar_tensor(static_cast<double>(sequences), v.options().dtype(at::kDouble))};
  }
};

/// What a loss hook returns: the scalar to backpropagate and the micro-batch's metrics.
struct LossOutput {
  at::Tensor loss;
  std::map<std::string, Metric> metrics;
};

}  // namespace hybridrl
