#pragma once
/// \file
/// The run's own keys: `trainer.*` (steps, output directory, checkpoints, resume, the one seed,
/// logging), `data.*` (the training files and the prompts per step) and `critic.*` (the value
/// model's optimizer, for algorithms with a critic). Key names fixed by the
/// trainer issue: `trainer.total_steps`, `trainer.output_dir`, `trainer.save_every`,
/// `trainer.keep_last`, `trainer.resume`, `trainer.seed`, `data.train_files`,
/// `data.train_batch_size`.

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/data/dataset.hpp"
#include "hybridrl/sharding/optimizer.hpp"

namespace hybridrl {

/// `critic.*` (algorithms with a critic: PPO): the value model's optimizer and warm-up. The critic
/// trains on the same batches and geometry as the policy (geometry.ppo_epochs, mini- and
/// micro-batches), under the same sharding options.
struct CriticOptions {
  /// The critic's optimizer (verl's critic.optim: lr 1e-5, ten times the actor's).
  HYBRIDRL_ARG(OptimizerOptions, optim) = OptimizerOptions{}.lr(1e-5);
  /// Steps at the start that train only the critic (verl's trainer.critic_warmup): the policy
  /// is not updated until the critic has seen this many batches.
  HYBRIDRL_ARG(int64_t, warmup_steps) = 0;
  HYBRIDRL_FIELDS(optim, warmup_steps)

  /// Throws hybridrl::Error naming the first impossible field ("optim.lr = ...").
  void validate() const {
    detail::validate_member(optim_, "optim");
    HYBRIDRL_CHECK(warmup_steps_ >= 0, fmt::format("warmup_steps = {} is negative", warmup_steps_),
                   "give the number of critic-only steps at the start (0: none)");
  }
};

/// `trainer.*`: how long a run is, where it writes, how it checkpoints and resumes.
struct TrainerOptions {
  /// Training steps (one step = one batch of data.train_batch_size prompts or samples). 0: as
  /// many as the loader's epochs hold (offline algorithms; an online run needs a number).
  HYBRIDRL_ARG(int64_t, total_steps) = 0;
  /// Directory of metrics.jsonl, TensorBoard events, the plot, the effective configuration,
  /// checkpoints/ and model/ (the final Hugging Face directory). Empty: nothing is written.
  HYBRIDRL_ARG(std::string, output_dir) = "";
  /// A checkpoint every this many steps (and always after the last); 0: only after the last.
  HYBRIDRL_ARG(int64_t, save_every) = 0;
  /// Checkpoints kept; older ones are removed once a newer one is complete.
  HYBRIDRL_ARG(int64_t, keep_last) = 2;
  /// `auto`: continue from the newest complete checkpoint in output_dir when there is one;
  /// `never`: start fresh (an output_dir holding checkpoints is then an error); or the path of a
  /// checkpoint directory to continue from.
  HYBRIDRL_ARG(std::string, resume) = "auto";
  /// The run's one seed: the loader's shuffle and the sampler's noise are derived from it.
  HYBRIDRL_ARG(uint64_t, seed) = 0;
  /// A progress line every this many steps (0: none).
  HYBRIDRL_ARG(int64_t, log_every) = 1;
  /// Also write TensorBoard event files (scalars) under output_dir/tensorboard.
  HYBRIDRL_ARG(bool, tensorboard) = true;
  /// Rewrite the plot (output_dir/metrics.svg) every this many steps; 0: at the end only.
  HYBRIDRL_ARG(int64_t, plot_every) = 0;
  /// Write the final model as a Hugging Face directory (output_dir/model).
  HYBRIDRL_ARG(bool, save_model) = true;
  HYBRIDRL_FIELDS(total_steps, output_dir, save_every, keep_last, resume, seed, log_every, tensorboard,
                  plot_every, save_model)

  /// Throws hybridrl::Error for a negative count or keep_last below 1.
  void validate() const {
    HYBRIDRL_CHECK(total_steps_ >= 0, fmt::format("total_steps = {} is negative", total_steps_),
                   "give a number of steps, or 0 for the loader's epochs (offline algorithms)");
    HYBRIDRL_CHECK(save_every_ >= 0, fmt::format("save_every = {} is negative", save_every_),
                   "give a step interval, or 0 to save after the last step only");
    HYBRIDRL_CHECK(keep_last_ >= 1, fmt::format("keep_last = {} keeps no checkpoint", keep_last_),
                   "keep at least the newest checkpoint (keep_last = 1 or more)");
    HYBRIDRL_CHECK(log_every_ >= 0, fmt::format("log_every = {} is negative", log_every_),
                   "give a step interval, or 0 for no progress line");
    HYBRIDRL_CHECK(plot_every_ >= 0, fmt::format("plot_every = {} is negative", plot_every_),
                   "give a step interval, or 0 to plot at the end only");
    HYBRIDRL_CHECK(!resume_.empty(), "resume is empty", "use auto, never, or a checkpoint directory");
  }
};

/// `data.*`: the training data and how many prompts (or pairs, or samples) make one step.
struct DataOptions {
  /// JSONL files of the training data (read by `hybridrl train`; a program that builds its own
  /// dataset leaves it empty).
  HYBRIDRL_ARG(std::vector<std::string>, train_files) = {};
  /// Prompts per training step over all ranks (offline algorithms: pairs or samples per step);
  /// the loader's batch size and the geometry's train_batch_size are set from it.
  HYBRIDRL_ARG(int64_t, train_batch_size) = 1;
  /// How the files are read (`data.max_prompt_length`, `data.prompt_key`, ...: inline fields).
  HYBRIDRL_ARG(DatasetOptions, dataset) = {};
  HYBRIDRL_FIELDS(train_files, train_batch_size, dataset)

  void validate() const {
    HYBRIDRL_CHECK(train_batch_size_ >= 1, fmt::format("train_batch_size = {} is below 1", train_batch_size_),
                   "give the number of prompts per step (1 or more)");
    dataset_.validate();  // inline fields: data.max_prompt_length
  }
};

}  // namespace hybridrl
