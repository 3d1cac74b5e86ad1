#pragma once
/// \file
/// The adaptive micro-batch sizer: how many sequences each forward (the scoring passes: old
/// log-probs, the reference, values) and each forward + backward (the update) takes at once —
/// the largest micro-batch whose memory fits, measured rather than guessed.
///
/// A pass's memory grows with its tokens: peak ≈ a + b · tokens above what was allocated when the
/// micro-batch started (activations, logits chunks, the gradients a first backward allocates). The
/// sizer measures the first micro-batch of every pass (the allocator's high-water mark above its
/// start) and fits a and b to the measurements: one point gives b = peak / tokens, a = 0 (an over-
/// estimate, so the first choice is safe); from two sizes on, the slope between the smallest and
/// the largest and the intercept that bounds every point. The next pass takes the largest
/// micro-batch that divides its rows (so every micro-batch of a mini-batch is equal, as gradient
/// accumulation expects) and whose predicted peak is under `memory_fraction` of the memory still
/// available (free on the device plus what the caching allocator holds unused). Each pass type
/// has its own fit: a forward without grad keeps no activations.
///
/// A token cap (`max_tokens_per_micro_batch`, verl's log_prob/ppo_max_token_len_per_gpu) bounds
/// the choice too, and alone decides it where memory is not measured (the CPU). Without either —
/// adaptive sizing off, or a CPU run without a cap — every pass takes the configured
/// `micro_batch_size_per_gpu`. Losses are normalised by the mini-batch's counts (LossCounts), so a
/// different micro-batch size changes the float rounding of the accumulation, not the update.
///
/// Memory-measured choices are for one-process runs: ranks of a group would each measure their
/// own and must agree on the micro-batch count (their collectives pair up), so a multi-rank run
/// takes the token cap or the configured size.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "hybridrl/core/batch_geometry.hpp"
#include "hybridrl/core/options.hpp"

namespace hybridrl {

/// The kinds of micro-batched work in a trainer step; each has its own memory fit.
enum class MicroPass {
  scoring,  ///< a forward without grad (old log-probs, the reference, values, prepare hooks)
  update,   ///< a forward and backward whose gradients accumulate (the policy's and the critic's update)
};

/// The largest divisor of `rows` not above `limit` (1 when `limit` < 1).
constexpr int64_t largest_divisor_at_most(int64_t rows, int64_t limit) {
  if (rows < 1) return 1;
  for (int64_t d = std::min(rows, limit); d > 1; --d) {
    if (rows % d == 0) return d;
  }
  return 1;
}

/// How the sizer chooses: geometry.adaptive_micro_batch, micro_batch_memory_fraction and
/// max_tokens_per_micro_batch (micro_batch_options(geometry)).
struct MicroBatchOptions {
  /// Choose each pass's micro-batch as the largest that fits (true), or take
  /// `micro_batch_size_per_gpu` always (false).
  HYBRIDRL_ARG(bool, adaptive) = true;
  /// The share of the available device memory a micro-batch's predicted peak may take.
  HYBRIDRL_ARG(double, memory_fraction) = 0.8;
  /// At most this many tokens (rows × padded length) per micro-batch; 0 = no cap.
  HYBRIDRL_ARG(int64_t, max_tokens) = 0;
};

/// The sizer's options from a batch geometry's keys.
inline MicroBatchOptions micro_batch_options(const BatchGeometry& g) {
  return MicroBatchOptions{}
      .adaptive(g.adaptive_micro_batch())
      .memory_fraction(g.micro_batch_memory_fraction())
      .max_tokens(g.max_tokens_per_micro_batch());
}

/// Chooses micro-batch sizes from measured memory (see the file comment).
class MicroBatchSizer {
 public:
  /// `configured`: geometry.micro_batch_size_per_gpu — the size when nothing is measured or
  /// capped, and the size of the first measured pass. `measure_memory`: the run may size from
  /// memory (one process on a CUDA device).
  MicroBatchSizer(MicroBatchOptions options, int64_t configured, bool measure_memory)
      : options_(options), configured_(std::max<int64_t>(configured, 1)), measure_(measure_memory) {}

  /// Sequences per micro-batch for `rows` rows of `row_tokens` tokens each in `pass`, when
  /// `available` bytes can still be allocated (nullopt: unknown). Divides `rows` when adaptive.
  [[nodiscard]] int64_t choose(MicroPass pass, int64_t rows, int64_t row_tokens,
                               std::optional<int64_t> available) const {
    if (!options_.adaptive() || rows < 1) return configured_;
    row_tokens = std::max<int64_t>(row_tokens, 1);
    constexpr auto none = std::numeric_limits<int64_t>::max();
    int64_t limit = none;  // rows that fit
    if (options_.max_tokens() > 0) limit = std::max<int64_t>(options_.max_tokens() / row_tokens, 1);
    const auto fit = this->fit(pass);
    if (measure_ && fit && available) {
      const double budget = options_.memory_fraction() * static_cast<double>(*available) - fit->first;
      const double tokens = budget > 0 ? budget / fit->second : 0.0;
      limit = std::min(limit, std::max<int64_t>(static_cast<int64_t>(tokens) / row_tokens, 1));
    }
    if (limit == none) return std::min(configured_, rows);  // nothing measured or capped yet
    return largest_divisor_at_most(rows, limit);
  }

  /// Whether `pass`'s next micro-batch should be measured (memory-measured sizing is on).
  [[nodiscard]] bool measures() const noexcept { return options_.adaptive() && measure_; }

  /// Records a measured micro-batch of `pass`: its tokens and the allocator's peak above the
  /// bytes allocated when it started.
  void observe(MicroPass pass, int64_t tokens, int64_t peak_above_start) {
    if (tokens < 1 || peak_above_start < 0) return;
    auto& points = points_[pass];
    auto& y = points[tokens];
    y = std::max(y, static_cast<double>(peak_above_start));
  }

  /// The fitted (intercept bytes, bytes per token) of `pass`; nullopt before a measurement.
  [[nodiscard]] std::optional<std::pair<double, double>> fit(MicroPass pass) const {
    const auto it = points_.find(pass);
    if (it == points_.end() || it->second.empty()) return std::nullopt;
    const auto& p = it->second;
    const auto& [t0, y0] = *p.begin();
    const auto& [t1, y1] = *p.rbegin();
    double b = 0;
    if (t1 > t0) b = (y1 - y0) / static_cast<double>(t1 - t0);
    if (b <= 0) b = y1 / static_cast<double>(t1);  // one size, or noise: all of it per token
    b = std::max(b, 1.0);
    double a = 0;
    for (const auto& [t, y] : p) a = std::max(a, y - b * static_cast<double>(t));
    return std::make_pair(a, b);
  }

  [[nodiscard]] const MicroBatchOptions& options() const noexcept { return options_; }
  [[nodiscard]] int64_t configured() const noexcept { return configured_; }

 private:
  MicroBatchOptions options_;
  int64_t configured_;
  bool measure_;
  std::map<MicroPass, std::map<int64_t, double>> points_;  // tokens → largest peak above start
};

}  // namespace hybridrl
