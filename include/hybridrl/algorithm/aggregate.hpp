#pragma once
/// \file
/// Loss aggregation: a [batch, T] per-token loss and its mask become one scalar, normalised by the
/// GLOBAL token / sequence counts of the mini-batch (verl `agg_loss`, core_algos.py), so the sum of
/// per-micro-batch losses on every rank equals the loss of the whole mini-batch on one rank.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "hybridrl/algorithm/checks.hpp"
#include "hybridrl/core/error.hpp"
#include "hybridrl/core/loss.hpp"
#include "hybridrl/core/options.hpp"

namespace hybridrl {

/// How a token-level loss becomes a scalar (verl's `loss_agg_mode`).
enum class LossAgg {
  token_mean,              ///< Σ loss·mask / global_tokens            ("token-mean", verl default)
  seq_mean_token_sum,      ///< Σ_seq (Σ_t loss·mask) / global_seqs    ("seq-mean-token-sum")
  seq_mean_token_mean,     ///< Σ_seq (Σ_t loss·mask / n_seq) / global_seqs ("seq-mean-token-mean")
  seq_mean_token_sum_norm, ///< Σ_seq (Σ_t loss·mask) / global_seqs / L  ("seq-mean-token-sum-norm", Dr.GRPO)
};

HYBRIDRL_ENUM_NAMES(LossAgg, token_mean, seq_mean_token_sum, seq_mean_token_mean,
                    seq_mean_token_sum_norm);

/// Aggregates `loss` [batch, T] over `mask` [batch, T] (bool or float) into a scalar:
/// the masked numerator of `agg` divided by the global count (`global_tokens` for token_mean,
/// `global_seqs` — sequences with at least one valid token — otherwise), times `dp_size` (data-
/// parallel ranks whose gradients are AVERAGED afterwards, as FSDP/DDP do). `norm_length` is the
/// constant L of seq_mean_token_sum_norm (0 = mask.size(1)). A zero global count gives a zero loss.
[[nodiscard]] inline at::Tensor aggregate_loss(const at::Tensor& loss, const at::Tensor& mask,
                                               LossAgg agg, int64_t global_tokens,
                                               int64_t global_seqs, int64_t dp_size = 1,
                                               int64_t norm_length = 0) {
  constexpr std::string_view fn = "aggregate_loss";
  detail::check_dims(fn, "loss", loss, 2);
  detail::check_floating(fn, "loss", loss);
  detail::check_same_shape(fn, "loss", loss, "mask", mask);
  HYBRIDRL_CHECK(global_tokens >= 0 && global_seqs >= 0 && dp_size >= 1 && norm_length >= 0,
                 fmt::format("aggregate_loss: global_tokens = {}, global_seqs = {}, dp_size = {}, "
                             "norm_length = {}; counts must be >= 0 and dp_size >= 1",
                             global_tokens, global_seqs, dp_size, norm_length),
                 "pass the counts of the whole mini-batch over all ranks (LossCounts)");
  const auto m = detail::mask_as(mask, loss.scalar_type());
  const auto dp = static_cast<double>(dp_size);
  if (agg == LossAgg::token_mean) {
    auto total = (loss * m).sum();
    return global_tokens == 0 ? total * 0.0 : total * (dp / static_cast<double>(global_tokens));
  }
  auto seq = (loss * m).sum(-1);
  if (agg == LossAgg::seq_mean_token_mean) seq = seq / (m.sum(-1) + 1e-8);
  auto total = seq.sum();
  if (global_seqs == 0) return total * 0.0;
  double scale = dp / static_cast<double>(global_seqs);
  if (agg == LossAgg::seq_mean_token_sum_norm) {
    scale /= static_cast<double>(norm_length > 0 ? norm_length : loss.size(1));
  }
  return total * scale;
}

/// Aggregates with the counts of a LossCounts. Empty counts (both 0) means "this
/// micro-batch is the whole mini-batch": the local counts are used (without a device sync).
[[nodiscard]] inline at::Tensor aggregate_loss(const at::Tensor& loss, const at::Tensor& mask,
                                               LossAgg agg, const LossCounts& counts,
                                               int64_t norm_length = 0) {
  if (!counts.empty()) {
    return aggregate_loss(loss, mask, agg, counts.global_tokens, counts.global_sequences,
                          counts.data_parallel_size, norm_length);
  }
  HYBRIDRL_CHECK(counts.data_parallel_size == 1,
                 fmt::format("LossCounts has no global counts but data_parallel_size = {}",
                             counts.data_parallel_size),
                 "set LossCounts::global_tokens and global_sequences to the counts of the whole "
                 "mini-batch over all ranks");
  detail::check_same_shape("aggregate_loss", "loss", loss, "mask", mask);
  const auto m = detail::mask_as(mask, loss.scalar_type());
  if (agg == LossAgg::token_mean) return (loss * m).sum() / m.sum().clamp_min(1.0);
  auto row_tokens = m.sum(-1);
  auto seq = (loss * m).sum(-1);
  if (agg == LossAgg::seq_mean_token_mean) seq = seq / (row_tokens + 1e-8);
  auto out = seq.sum() / (row_tokens > 0).sum().to(loss.scalar_type()).clamp_min(1.0);
  if (agg == LossAgg::seq_mean_token_sum_norm) {
    out = out / static_cast<double>(norm_length > 0 ? norm_length : loss.size(1));
  }
  return out;
}

namespace detail {

/// Mean of per-sequence losses [batch] normalised by the global sequence count (DPO, KTO):
/// Σ losses / global_sequences · dp_size, or the local mean for an empty LossCounts.
[[nodiscard]] inline at::Tensor sequence_mean(const at::Tensor& losses, const LossCounts& counts) {
  if (counts.empty()) {
    HYBRIDRL_CHECK(counts.data_parallel_size == 1,
                   fmt::format("LossCounts has no global counts but data_parallel_size = {}",
                               counts.data_parallel_size),
                   "set LossCounts::global_sequences to the number of samples of the whole "
                   "mini-batch over all ranks");
    return losses.mean();
  }
  HYBRIDRL_CHECK(counts.global_sequences > 0 && counts.data_parallel_size >= 1,
                 fmt::format("LossCounts: global_sequences = {}, data_parallel_size = {}",
                             counts.global_sequences, counts.data_parallel_size),
                 "a sequence-level loss needs global_sequences >= 1 and data_parallel_size >= 1");
  return losses.sum() * (static_cast<double>(counts.data_parallel_size) /
                         static_cast<double>(counts.global_sequences));
}

}  // namespace detail
}  // namespace hybridrl
