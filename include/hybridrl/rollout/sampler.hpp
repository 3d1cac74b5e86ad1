#pragma once
/// \file
/// Token sampling shared by every rollout engine: temperature, top-k, top-p, min-p, and the
/// min-new-tokens ban on stop tokens, over a batch of logits in one pass of tensor ops (any
/// device, no host synchronisation).
///
/// A draw is Gumbel-max: token = argmax over the kept tokens of (logits / T + g), with
/// g = -log(-log(u)) and u uniform from Philox-4x32-10 at counter (token / 4, position, sample, 0)
/// under the request's 64-bit seed. That samples exactly from the tempered distribution restricted
/// to the kept tokens and renormalised, and makes the noise a pure function of (seed, sample,
/// position, token): a request's tokens do not depend on the rest of the batch or on the engine.
///
/// The log-prob returned with each token is log_softmax(logits / T) at that token, T = 1 when
/// greedy, before top-k / top-p / min-p: the quantity the trainer recomputes
/// (LogProbOptions::temperature), so rollout and training log-probs can be compared directly.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/rng.hpp"
#include "hybridrl/cuda/fused.hpp"
#include "hybridrl/rollout/philox.hpp"
#include "hybridrl/rollout/sampling.hpp"

namespace hybridrl {

/// Per-row inputs of one sampling step (all [B], int64, on the logits' device).
struct SamplingRows {
  at::Tensor seeds;      ///< the request's 64-bit seed (bit pattern in int64)
  at::Tensor samples;    ///< which of the request's samples this row is (0..n-1)
  at::Tensor positions;  ///< index of the token being drawn within the response (0, 1, ...)
  at::Tensor banned;     ///< optional bool [B, V]: tokens this row may not draw (min_new_tokens)
};

/// What one step drew: tokens [B] int64 and their log-probs [B] float32 (see the file comment).
struct SampledTokens {
  at::Tensor tokens;
  at::Tensor log_probs;
};

namespace detail {

/// Uniforms [B, V] in (0, 1) for rows (seed, sample, position): lane v % 4 of Philox block
/// (v / 4, position, sample, 0) under key (seed low, seed high).
inline at::Tensor sampling_uniforms(const SamplingRows& r, int64_t vocab) {
  constexpr int64_t kMask32 = 0xFFFFFFFF;
  const auto dev = r.seeds.device();
  const auto blocks = (vocab + 3) / 4;
  auto opts = at::TensorOptions().dtype(at::kLong).device(dev);
  auto c0 = at::arange(blocks, opts).view({1, blocks});
  auto c1 = r.positions.to(at::kLong).view({-1, 1}).bitwise_and(kMask32);
  auto c2 = r.samples.to(at::kLong).view({-1, 1}).bitwise_and(kMask32);
  auto c3 = at::zeros({1, 1}, opts);
  auto seeds = r.seeds.to(at::kLong).view({-1, 1});  // one key per row: [B, 1] columns
  auto k0 = seeds.bitwise_and(kMask32);
  auto k1 = seeds.__rshift__(32).bitwise_and(kMask32);  // arithmetic shift, then the low half
  const auto lanes = philox4x32_10(c0.expand({seeds.size(0), blocks}), c1, c2, c3, k0, k1);
  // [B, blocks, 4] -> [B, 4 * blocks], token v = 4 * block + lane
  auto bits = at::stack(lanes, -1).reshape({seeds.size(0), 4 * blocks}).narrow(1, 0, vocab);
  return uniform_from_bits(bits);
}

}  // namespace detail

/// The tokens kept by top-k, top-p and min-p for tempered logits `z` [B, V] (bool [B, V]); top-k
/// keeps ties with the k-th value (as Hugging Face's TopKLogitsWarper), top-p keeps the smallest
/// most-likely set whose mass reaches p among the top-k survivors (renormalised), min-p keeps
/// tokens with p >= min_p * max p. The most likely token is always kept.
inline at::Tensor sampling_keep_mask(const at::Tensor& z, const SamplingOptions& o) {
  const auto V = z.size(-1);
  auto keep = at::ones_like(z, z.options().dtype(at::kBool));
  if (o.top_k() > 0 && o.top_k() < V) {
    auto kth = std::get<0>(z.topk(o.top_k(), -1)).narrow(-1, o.top_k() - 1, 1);
    keep = z.ge(kth);
  }
  if (o.top_p() < 1.0) {
    auto masked = z.masked_fill(keep.logical_not(), -std::numeric_limits<float>::infinity());
    auto [sorted, order] = masked.sort(-1, /*descending=*/true);
    auto p = at::softmax(sorted, -1);
    auto before = p.cumsum(-1) - p;  // mass of the more likely tokens
    auto keep_sorted = before.lt(o.top_p());
    keep = keep.logical_and(at::zeros_like(keep).scatter(-1, order, keep_sorted));
  }
  if (o.min_p() > 0.0) {
    auto logp = at::log_softmax(z, -1);
    auto max_logp = std::get<0>(logp.max(-1, /*keepdim=*/true));
    keep = keep.logical_and(logp.ge(max_logp + std::log(o.min_p())));
  }
  return keep;
}

/// Draws one token per row of `logits` [B, V] (any float dtype; computed in fp32) under `o`.
/// Greedy (temperature 0) is argmax (the first of ties, as torch.argmax), banned tokens excluded.
inline SampledTokens sample_tokens(const at::Tensor& logits, const SamplingOptions& o, const SamplingRows& rows) {
  HYBRIDRL_CHECK(logits.dim() == 2, fmt::format("sample_tokens: logits have {} dims", logits.dim()),
                 "pass logits [B, vocab] of the positions being sampled");
  const auto V = logits.size(1);
  if (!rows.banned.defined() && (o.temperature() == 0.0 || ((o.top_k() == 0 || o.top_k() >= V) && o.top_p() >= 1.0 &&
                                                             o.min_p() == 0.0))) {
    // one kernel on CUDA (the same draws): Philox, Gumbel, argmax and the log-softmax in one pass
    auto [tokens, log_probs] = fused::sample(logits, o.temperature(), rows.seeds, rows.samples, rows.positions);
    if (tokens.defined()) return {tokens, log_probs};
  }
  auto x = logits.to(at::kFloat);
  const bool greedy = o.temperature() == 0.0;
  auto z = greedy ? x : x / o.temperature();
  auto logp = at::log_softmax(z, -1);
  const auto neg_inf = -std::numeric_limits<float>::infinity();
  at::Tensor tokens;
  if (greedy) {
    auto scores = rows.banned.defined() ? z.masked_fill(rows.banned, neg_inf) : z;
    tokens = scores.argmax(-1);
  } else {
    auto keep = sampling_keep_mask(z, o);
    if (rows.banned.defined()) {
      auto allowed = keep.logical_and(rows.banned.logical_not());
      // a row whose whole kept set is banned falls back to the unbanned vocabulary
      auto empty = allowed.any(-1, /*keepdim=*/true).logical_not();
      keep = at::where(empty, rows.banned.logical_not(), allowed);
    }
    auto u = detail::sampling_uniforms(rows, V);
    auto gumbel = -at::log(-at::log(u));
    tokens = (z + gumbel).masked_fill(keep.logical_not(), neg_inf).argmax(-1);
  }
  return {tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)};
}

/// The seed of request `group` (its n samples share it): SplitMix64 of the base seed and the group
/// id, so requests draw unrelated streams.
constexpr uint64_t request_seed(uint64_t base, int64_t group) noexcept {
  return detail::SplitMix64(base ^ detail::SplitMix64(static_cast<uint64_t>(group)).next()).next();
}

}  // namespace hybridrl
