#pragma once
/// \file
/// Supervised fine-tuning on (prompt, completion) pairs — `Algorithm<SFT>`: the negative
/// log-likelihood of the completion tokens (the prompt is context, not target: TRL's
/// `completion_only_loss`, verl's SFT trainer), aggregated over the mini-batch's completion tokens
/// (or per sequence, LossAgg). RL runs usually start from such a model.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <string_view>
#include <vector>

#include "hybridrl/algorithm/aggregate.hpp"
#include "hybridrl/algorithm/base.hpp"
#include "hybridrl/algorithm/concepts.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/loss.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/policy.hpp"
#include "hybridrl/core/tags.hpp"
#include "hybridrl/core/tensor_batch.hpp"

namespace hybridrl {

/// Run-time options of SFT.
struct SFTOptions {
  /// How the per-token losses become one number: token_mean (every completion token counts the
  /// same, TRL's default) or a per-sequence mean.
  HYBRIDRL_ARG(LossAgg, loss_agg) = LossAgg::token_mean;
  HYBRIDRL_FIELDS(loss_agg)
  void validate() const {}
};

/// SFT: reads the policy's per-token log-probs and the completion mask.
template <>
struct Algorithm<SFT> : algorithm_base<SFT, SFTOptions, DataKind::completions> {
  static constexpr std::string_view name = "SFT";

  /// log_probs (policy, with grad) and response_mask (1 on completion tokens), both [B, T].
  static std::vector<Key> loss_reads(const options_type& /*o*/) { return {keys::log_probs, keys::response_mask}; }

  /// −log p of the completion tokens of one micro-batch, normalised by the global counts.
  /// Metrics: sft/loss (share, sum), sft/tokens (completion tokens, sum).
  static LossOutput loss(const TensorBatch& batch, const options_type& o, const state_type& /*s*/,
                         const LossCounts& counts) {
    const auto& logp = batch.tensor(keys::log_probs);
    const auto& mask = batch.tensor(keys::response_mask);
    const auto tokens = mask.sum();
    const int64_t global_tokens = counts.empty() ? tokens.item<int64_t>() : counts.global_tokens;
    const int64_t global_seqs = counts.empty() ? batch.size() : counts.global_sequences;
    LossOutput out;
    out.loss = aggregate_loss(-logp, mask, o.loss_agg(), global_tokens, global_seqs, counts.data_parallel_size);
    out.metrics["sft/loss"] = Metric::sum(out.loss.detach() / static_cast<double>(counts.data_parallel_size));
    out.metrics["sft/tokens"] = Metric::sum(tokens.to(at::kDouble));
    return out;
  }
};
static_assert(algorithm_policy<Algorithm<SFT>>);

}  // namespace hybridrl
