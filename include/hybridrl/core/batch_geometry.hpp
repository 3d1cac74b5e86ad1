#pragma once
/// \file
/// Batch geometry, normalised as verl does: `train_batch_size` and `ppo_mini_batch_size` count
/// PROMPTS globally; each prompt yields `rollout_n` sequences; micro-batches count sequences per GPU.
/// Given at run time (BatchGeometry) the rules are checked at construction with an error that shows
/// the arithmetic; given at compile time (StaticBatch<...>) they are static_asserts.

#include <fmt/format.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <utility>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"

namespace hybridrl {

/// Which divisibility rule a geometry breaks first (ok when none).
enum class GeometryRule {
  ok,
  positive,             ///< every count must be >= 1
  sp_divides_world,     ///< sequence_parallel_size must divide world_size
  tp_divides_world,     ///< rollout_tensor_parallel_size must divide world_size
  world_divides_train,  ///< train_batch_size × n divisible by world_size
  mini_le_train,        ///< ppo_mini_batch_size <= train_batch_size
  train_divides_mini,   ///< train_batch_size divisible by ppo_mini_batch_size
  dp_divides_mini,      ///< ppo_mini_batch_size × n divisible by the data-parallel size
  micro_divides_mini,   ///< per-rank mini-batch (sequences) divisible by micro_batch_size_per_gpu
};

/// The first rule broken by this geometry (constexpr, so StaticBatch and tests can use it).
constexpr GeometryRule check_geometry(int64_t train, int64_t n, int64_t world, int64_t mini,
                                      int64_t micro, int64_t sp = 1, int64_t rollout_tp = 1) {
  if (train < 1 || n < 1 || world < 1 || mini < 1 || micro < 1 || sp < 1 || rollout_tp < 1)
    return GeometryRule::positive;
  if (world % sp != 0) return GeometryRule::sp_divides_world;
  if (world % rollout_tp != 0) return GeometryRule::tp_divides_world;
  if ((train * n) % world != 0) return GeometryRule::world_divides_train;
  if (mini > train) return GeometryRule::mini_le_train;
  if (train % mini != 0) return GeometryRule::train_divides_mini;
  const int64_t dp = world / sp;
  if ((mini * n) % dp != 0) return GeometryRule::dp_divides_mini;
  if (((mini * n) / dp) % micro != 0) return GeometryRule::micro_divides_mini;
  return GeometryRule::ok;
}

/// Run-time batch geometry. Counts: prompts for train/mini, sequences for micro. The geometry owns
/// every batch count and the epochs over each step's batch (ppo_epochs). Two values are not
/// configuration keys because other parts own them: `world_size` comes from the process group
/// (the Trainer sets it) and `rollout_tensor_parallel_size` from the rollout's
/// `tensor_parallel_size` (the Trainer copies it here before validating).
struct BatchGeometry {
  /// Prompts per training step, over all ranks. Not a configuration key: `data.train_batch_size`
  /// owns it (the Trainer copies it here).
  HYBRIDRL_ARG(int64_t, train_batch_size) = 1;
  /// Sequences sampled per prompt (GRPO's group size); 1 for PPO as usually run. Not a
  /// configuration key: `rollout.n` owns it (1 for an offline trainer; the Trainer copies it).
  HYBRIDRL_ARG(int64_t, rollout_n) = 1;
  /// Prompts per optimizer step (mini-batch), over all ranks.
  HYBRIDRL_ARG(int64_t, ppo_mini_batch_size) = 1;
  /// Sequences per forward/backward on one GPU: always, when adaptive_micro_batch is off; else the
  /// first pass's size, the sizer choosing the later ones (trainer/micro_batch.hpp).
  HYBRIDRL_ARG(int64_t, micro_batch_size_per_gpu) = 1;
  /// Each scoring and update pass takes the largest micro-batch that fits: measured memory in a
  /// one-process CUDA run, max_tokens_per_micro_batch where set (docs/training.md).
  HYBRIDRL_ARG(bool, adaptive_micro_batch) = true;
  /// The share of the available device memory a micro-batch's predicted peak may take.
  HYBRIDRL_ARG(double, micro_batch_memory_fraction) = 0.8;
  /// At most this many tokens (sequences × padded length) per micro-batch when adaptive; 0 = no
  /// cap (verl's log_prob/ppo_max_token_len_per_gpu).
  HYBRIDRL_ARG(int64_t, max_tokens_per_micro_batch) = 0;
  /// Ulysses sequence-parallel group size (ranks sharing one sequence); divides world_size.
  HYBRIDRL_ARG(int64_t, sequence_parallel_size) = 1;
  /// Passes over each step's batch (verl's ppo_epochs): a loop count of the fit loop.
  HYBRIDRL_ARG(int64_t, ppo_epochs) = 1;
  /// On-policy steps (one epoch of one mini-batch) take the old log-probs from the update's own
  /// forward, detached, instead of a separate no-grad pass over the batch (docs/training.md);
  /// false: always the separate pass (verl's behaviour).
  HYBRIDRL_ARG(bool, old_log_probs_from_update) = true;
  /// Training ranks (GPUs). Not a configuration key: read from the process group.
  HYBRIDRL_ARG(int64_t, world_size) = 1;
  /// Tensor-parallel size of the generation engine; divides world_size. Not a configuration key:
  /// the rollout owns it (rollout.tensor_parallel_size).
  HYBRIDRL_ARG(int64_t, rollout_tensor_parallel_size) = 1;
  /// Training model-parallel size: ranks that hold the shards of one model replica and so see the
  /// same data (Sharding<TP3D>'s tensor × pipeline sizes). Not a configuration key: the sharding
  /// owns it (sharding.tensor_parallel_size; the Trainer copies it here).
  HYBRIDRL_ARG(int64_t, model_parallel_size) = 1;

  HYBRIDRL_FIELDS(ppo_mini_batch_size, micro_batch_size_per_gpu, sequence_parallel_size, ppo_epochs,
                  adaptive_micro_batch, micro_batch_memory_fraction, max_tokens_per_micro_batch,
                  old_log_probs_from_update)

  /// Ranks that see different data during training.
  [[nodiscard]] int64_t data_parallel_size() const {
    return world_size_ / (sequence_parallel_size_ * model_parallel_size_);
  }
  /// Sequences generated per step, over all ranks.
  [[nodiscard]] int64_t sequences_per_step() const { return train_batch_size_ * rollout_n_; }
  /// Optimizer steps per PPO epoch.
  [[nodiscard]] int64_t mini_batches_per_step() const { return train_batch_size_ / ppo_mini_batch_size_; }
  /// Sequences one training rank holds in one mini-batch.
  [[nodiscard]] int64_t mini_batch_sequences_per_rank() const {
    return ppo_mini_batch_size_ * rollout_n_ / data_parallel_size();
  }
  /// Gradient-accumulation steps per mini-batch on one rank.
  [[nodiscard]] int64_t micro_batches_per_mini_batch() const {
    return mini_batch_sequences_per_rank() / micro_batch_size_per_gpu_;
  }
  /// Generation groups (one tensor-parallel engine each).
  [[nodiscard]] int64_t rollout_groups() const { return world_size_ / rollout_tensor_parallel_size_; }
  /// Sequences each generation group produces per step.
  [[nodiscard]] int64_t sequences_per_rollout_group() const {
    return sequences_per_step() / rollout_groups();
  }

  /// Throws hybridrl::Error naming the first broken rule, with the arithmetic and a fix.
  void validate() const {
    const auto t = train_batch_size_, n = rollout_n_, w = world_size_, m = ppo_mini_batch_size_,
               u = micro_batch_size_per_gpu_, mp = model_parallel_size_, tp = rollout_tensor_parallel_size_;
    // ranks that see the same data: a sequence-parallel group, times the training model-parallel size
    const auto sp = sequence_parallel_size_ * mp;
    const std::string replica = mp == 1 ? fmt::format("sequence_parallel_size {}", sp)
                                        : fmt::format("sequence_parallel_size {} × model_parallel_size {}",
                                                      sequence_parallel_size_, mp);
    const std::pair<const char*, int64_t> counts[] = {
        {"train_batch_size", t}, {"rollout_n", n}, {"ppo_mini_batch_size", m},
        {"micro_batch_size_per_gpu", u}, {"sequence_parallel_size", sp},
        {"ppo_epochs", ppo_epochs_}, {"world_size", w}, {"rollout_tensor_parallel_size", tp},
        {"model_parallel_size", mp}};
    for (const auto& [name, v] : counts) {
      HYBRIDRL_CHECK(v >= 1, fmt::format("{} = {} is below 1", name, v),
                     "set every batch count to 1 or more");
    }
    HYBRIDRL_CHECK(micro_batch_memory_fraction_ > 0.0 && micro_batch_memory_fraction_ <= 1.0,
                   fmt::format("micro_batch_memory_fraction = {} is outside (0, 1]", micro_batch_memory_fraction_),
                   "use a fraction such as 0.8");
    HYBRIDRL_CHECK(max_tokens_per_micro_batch_ >= 0,
                   fmt::format("max_tokens_per_micro_batch = {} is negative", max_tokens_per_micro_batch_),
                   "use 0 (no cap) or a token count such as 16384");
    switch (check_geometry(t, n, w, m, u, sp, tp)) {
      case GeometryRule::ok:
        return;
      case GeometryRule::positive:
        break;  // reported below, naming the field
      case GeometryRule::sp_divides_world:
        throw Error(fmt::format("world_size {} is not divisible by {} ({} % {} = {})", w, replica, w, sp, w % sp),
                    mp == 1 ? "choose a sequence_parallel_size that divides the number of GPUs"
                            : "choose sequence-parallel and tensor-parallel sizes whose product divides the number of GPUs");
      case GeometryRule::tp_divides_world:
        throw Error(fmt::format("world_size {} is not divisible by rollout_tensor_parallel_size {} "
                                "({} % {} = {})",
                                w, tp, w, tp, w % tp),
                    "choose a rollout tensor-parallel size that divides the number of GPUs");
      case GeometryRule::world_divides_train:
        throw Error(fmt::format("train_batch_size × rollout_n = {} × {} = {} sequences do not split "
                                "evenly over world_size {} ({} % {} = {})",
                                t, n, t * n, w, t * n, w, (t * n) % w),
                    fmt::format("make train_batch_size × rollout_n a multiple of {} (e.g. "
                                "train_batch_size = {})",
                                w, round_up(t, w / std::gcd(w, n))));
      case GeometryRule::mini_le_train:
        throw Error(fmt::format("ppo_mini_batch_size {} is larger than train_batch_size {}", m, t),
                    "use ppo_mini_batch_size <= train_batch_size (both count prompts)");
      case GeometryRule::train_divides_mini:  // starts with the key to change (a Trainer prefixes "geometry.")
        throw Error(fmt::format("ppo_mini_batch_size {} does not divide train_batch_size {} "
                                "({} % {} = {}); the last mini-batch would be ragged",
                                m, t, t, m, t % m),
                    "choose a ppo_mini_batch_size that divides train_batch_size");
      case GeometryRule::dp_divides_mini:
        throw Error(fmt::format("ppo_mini_batch_size × rollout_n = {} × {} = {} sequences do not "
                                "split over {} data-parallel ranks (world_size {} ÷ {}; {} % {} = {})",
                                m, n, m * n, w / sp, w, replica, m * n, w / sp, (m * n) % (w / sp)),
                    fmt::format("make ppo_mini_batch_size × rollout_n a multiple of {}", w / sp));
      case GeometryRule::micro_divides_mini: {
        const int64_t per_rank = m * n / (w / sp);
        if (u > per_rank) {  // verl: micro-batch larger than mini-batch
          throw Error(fmt::format("micro_batch_size_per_gpu {} is larger than a rank's mini-batch of "
                                  "ppo_mini_batch_size × rollout_n ÷ data-parallel ranks = {} × {} ÷ {} = {} sequences",
                                  u, m, n, w / sp, per_rank),
                      fmt::format("use micro_batch_size_per_gpu <= {} (a divisor of it), or a larger "
                                  "ppo_mini_batch_size",
                                  per_rank));
        }
        throw Error(fmt::format("micro_batch_size_per_gpu {} does not divide a rank's mini-batch of "
                                "{} × {} ÷ {} = {} sequences ({} % {} = {})",
                                u, m, n, w / sp, per_rank, per_rank, u, per_rank % u),
                    "choose a micro_batch_size_per_gpu that divides the per-rank mini-batch");
      }
    }
  }

  /// The effective geometry as the trainer prints it at start.
  [[nodiscard]] std::string describe() const {
    return fmt::format(
        "batch geometry: {} prompts × {} samples = {} sequences per step on {} ranks "
        "(data-parallel {}, sequence-parallel {}, model-parallel {}); generation: {} groups (TP={}) of {} sequences; "
        "training: {} mini-batches of {} prompts, {} sequences per rank each, {} micro-batches of {}; "
        "{} epoch(s) per step",
        train_batch_size_, rollout_n_, sequences_per_step(), world_size_, data_parallel_size(),
        sequence_parallel_size_, model_parallel_size_, rollout_groups(), rollout_tensor_parallel_size_,
        sequences_per_rollout_group(), mini_batches_per_step(), ppo_mini_batch_size_,
        mini_batch_sequences_per_rank(), micro_batches_per_mini_batch(), micro_batch_size_per_gpu_,
        ppo_epochs_);
  }

 private:
  static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
};

/// Compile-time geometry: the same rules as BatchGeometry::validate(), as static_asserts.
/// `StaticBatch<60, 12, 6, 20, 4>::geometry()` gives the matching run-time BatchGeometry.
template <int64_t Train, int64_t N, int64_t World, int64_t Mini, int64_t Micro>
struct StaticBatch {
  static constexpr GeometryRule rule = check_geometry(Train, N, World, Mini, Micro);
  static_assert(rule != GeometryRule::positive,
                "hybridrl: StaticBatch counts must all be >= 1.");
  static_assert(rule != GeometryRule::world_divides_train,
                "hybridrl: StaticBatch: Train × N sequences must be divisible by World. Choose a "
                "train batch size (in prompts) so that Train × N is a multiple of the GPU count.");
  static_assert(rule != GeometryRule::mini_le_train,
                "hybridrl: StaticBatch: Mini must not exceed Train (both count prompts).");
  static_assert(rule != GeometryRule::train_divides_mini,
                "hybridrl: StaticBatch: Train must be a multiple of Mini, or the last mini-batch "
                "would be ragged. Choose a Mini that divides Train.");
  static_assert(rule != GeometryRule::dp_divides_mini,
                "hybridrl: StaticBatch: Mini × N must be divisible by World so every rank gets the "
                "same number of sequences per mini-batch.");
  static_assert(rule != GeometryRule::micro_divides_mini,
                "hybridrl: StaticBatch: the per-rank mini-batch Mini × N / World must be divisible "
                "by Micro. Choose a Micro that divides it.");

  static constexpr int64_t train_batch_size = Train;
  static constexpr int64_t rollout_n = N;
  static constexpr int64_t world_size = World;
  static constexpr int64_t ppo_mini_batch_size = Mini;
  static constexpr int64_t micro_batch_size_per_gpu = Micro;
  static constexpr int64_t mini_batch_sequences_per_rank = Mini * N / World;

  /// The same geometry as a run-time value (already valid).
  static BatchGeometry geometry() {
    return BatchGeometry{}
        .train_batch_size(Train)
        .rollout_n(N)
        .world_size(World)
        .ppo_mini_batch_size(Mini)
        .micro_batch_size_per_gpu(Micro);
  }
};

}  // namespace hybridrl
