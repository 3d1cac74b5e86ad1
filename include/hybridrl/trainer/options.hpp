#pragma once
/// \file
/// The run's own keys: `trainer.*` (steps, output directory, checkpoints, resume, the one seed,
/// logging), `data.*` (the training files and the prompts per step) and `critic.*` (the value
/// model's optimizer, for algorithms with a critic). Key names fixed by the
/// trainer issue: `trainer.total_steps`, `trainer.output_dir`, `trainer.save_every`,
/// `trainer.keep_last`, `trainer.resume`, `trainer.seed`, `data.train_files`,
/// `data.train_batch_size`.

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <set>
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
  /// How a checkpoint holds the state. `full`: the whole state, gathered (every rank holds it
  /// while it is saved) and written by rank 0, the weights as model.safetensors under Hugging
  /// Face names. `sharded`: every rank writes the part it holds (one file per rank, nothing
  /// gathered: for models whose full state does not fit one rank). Either loads at any world
  /// size; a sharded one needs an output_dir every rank sees.
  HYBRIDRL_ARG(std::string, checkpoint_format) = "full";
  /// Sharded checkpoints also hold model.safetensors, the full weights under Hugging Face names
  /// (gathered a layer at a time; rank 0 writes them).
  HYBRIDRL_ARG(bool, checkpoint_hf_weights) = false;
  /// A step with a NaN or infinite reward, or with non-finite gradients (from NaN logits, a
  /// diverged loss): `skip` reports it (reward_nonfinite, skipped_updates, skipped_step) and
  /// trains on without it; `stop` ends the run with an Error naming the step, after its metrics
  /// are written and without a checkpoint of it (the last checkpoint is the one to resume from).
  HYBRIDRL_ARG(std::string, on_nonfinite) = "skip";
  /// Online: write every this many steps the step's rollout batch after scoring (prompts,
  /// responses, masks, the engine's log-probs, rewards; the sampling seed and the weights'
  /// fingerprint in its metadata) to output_dir/rollouts/step_<step>_rank_<rank>.safetensors, to
  /// look at or to replay (FitParts::replay_dir); 0: none.
  HYBRIDRL_ARG(int64_t, record_rollouts_every) = 0;
  HYBRIDRL_FIELDS(total_steps, output_dir, save_every, keep_last, resume, seed, log_every, tensorboard,
                  plot_every, save_model, checkpoint_format, checkpoint_hf_weights, on_nonfinite,
                  record_rollouts_every)

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
    HYBRIDRL_CHECK(record_rollouts_every_ >= 0, fmt::format("record_rollouts_every = {} is negative", record_rollouts_every_),
                   "give a step interval, or 0 to record no rollouts");
    HYBRIDRL_CHECK(record_rollouts_every_ == 0 || !output_dir_.empty(),
                   fmt::format("record_rollouts_every = {} but output_dir is empty: the rollouts have nowhere to go",
                               record_rollouts_every_),
                   "set trainer.output_dir, or trainer.record_rollouts_every=0");
    HYBRIDRL_CHECK(on_nonfinite_ == "skip" || on_nonfinite_ == "stop",
                   fmt::format("on_nonfinite = '{}' is not a choice", on_nonfinite_),
                   "use skip (report the step and train on) or stop (end the run at the first such step)");
    HYBRIDRL_CHECK(checkpoint_format_ == "full" || checkpoint_format_ == "sharded",
                   fmt::format("checkpoint_format = '{}' is not a format", checkpoint_format_),
                   "use full (rank 0 writes the gathered state) or sharded (every rank writes its part)");
    HYBRIDRL_CHECK(!checkpoint_hf_weights_ || checkpoint_format_ == "sharded",
                   "checkpoint_hf_weights = true with checkpoint_format = full, whose checkpoints hold "
                   "model.safetensors already",
                   "set checkpoint_hf_weights=false, or checkpoint_format=sharded");
  }
};

/// `placement.*` (verl's resource pools; a `device_map` in other tools): which ranks hold which
/// model. Each key is a list of ranks of the process group — "" (every model's default: the
/// actor's ranks; the actor's own default: every rank), "0-3", "0,2,4-5". The actor (the policy,
/// its optimizer and the rollout engine that generates with its weights) shards over its ranks,
/// which include rank 0 (it writes the run's files); the critic trains with it. The reference and
/// the reward ranks hold the frozen models, each sharded over its own ranks (1/ranks of the
/// weights per rank); where they are not the actor's, each step's rollout batch travels to them
/// and their scores come back. A rank outside the actor only scores. Checked against the world
/// size when the Trainer is built, before any work (check_world).
struct PlacementOptions {
  /// Ranks of the policy and its rollout engine ("": every rank).
  HYBRIDRL_ARG(std::string, actor) = "";
  /// Ranks of the critic (PPO): the actor's ("" or the same list).
  HYBRIDRL_ARG(std::string, critic) = "";
  /// Ranks that hold the frozen reference ("": the actor's).
  HYBRIDRL_ARG(std::string, reference) = "";
  /// Ranks that score the rewards: a reward model is sharded over them, a reward function runs
  /// there ("": the actor's).
  HYBRIDRL_ARG(std::string, reward) = "";
  HYBRIDRL_FIELDS(actor, critic, reference, reward)

  /// Throws hybridrl::Error for a list that does not parse (the problem starts with its key).
  void validate() const {
    for (const auto* key : {"actor", "critic", "reference", "reward"}) (void)parse(key);
  }

  /// True when every key is unset (every model on every rank).
  [[nodiscard]] bool colocated() const {
    return actor_.empty() && critic_.empty() && reference_.empty() && reward_.empty();
  }

  /// The ranks of a list, ascending and without repeats ("" → {}). Throws hybridrl::Error for bad
  /// syntax; the problem starts with `= "<text>"`.
  static std::vector<int64_t> parse_ranks(const std::string& text) {
    std::vector<int64_t> out;
    if (text.empty()) return out;
    auto bad = [&](const std::string& why) {
      return Error(fmt::format("= \"{}\" is not a list of ranks: {}", text.size() > 64 ? text.substr(0, 64) + "..." : text,
                               why),
                   "write ranks from 0 as \"0-3\" or \"0,2,4-5\" (\"\" for the default)");
    };
    size_t i = 0;
    auto number = [&]() -> int64_t {
      if (i >= text.size() || text[i] < '0' || text[i] > '9') throw bad("a rank number is missing");
      int64_t v = 0;
      while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
        v = v * 10 + (text[i++] - '0');
        if (v > (int64_t{1} << 20)) throw bad("a rank number is too large");
      }
      return v;
    };
    while (true) {
      const auto a = number();
      auto b = a;
      if (i < text.size() && text[i] == '-') {
        ++i;
        b = number();
        if (b < a) throw bad(fmt::format("the range {}-{} runs backwards", a, b));
      }
      for (auto r = a; r <= b; ++r) out.push_back(r);
      if (i == text.size()) break;
      if (text[i] != ',') throw bad(fmt::format("'{}' is neither a digit, '-' nor ','", text[i]));
      ++i;
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  /// The ranks each key names in a group of `world` ranks, defaults filled in (the actor: all;
  /// the others: the actor's).
  [[nodiscard]] std::vector<int64_t> actor_ranks(int64_t world) const {
    auto r = parse("actor");
    if (r.empty()) {
      for (int64_t k = 0; k < world; ++k) r.push_back(k);
    }
    return r;
  }
  [[nodiscard]] std::vector<int64_t> critic_ranks(int64_t world) const { return or_actor("critic", world); }
  [[nodiscard]] std::vector<int64_t> reference_ranks(int64_t world) const { return or_actor("reference", world); }
  [[nodiscard]] std::vector<int64_t> reward_ranks(int64_t world) const { return or_actor("reward", world); }

  /// Throws hybridrl::Error (problem starting with the key: "reference = ...") when the map does not fit a
  /// group of `world` ranks: a rank at or past `world`, an actor without rank 0, a critic apart
  /// from the actor, a rank that holds no model; `online` false (DPO, KTO, SFT): the reference
  /// must stay with the actor and there is no reward to place.
  void check_world(int64_t world, bool online) const {
    for (const auto* key : {"actor", "critic", "reference", "reward"}) {
      for (const auto r : parse(key)) {
        HYBRIDRL_CHECK(r < world,
                       fmt::format("{} = \"{}\" names rank {}, but the process group has {} rank(s) (0-{})",
                                   key, text(key), r, world, world - 1),
                       fmt::format("name ranks below {} (launch more ranks, or shorten the list)", world));
      }
    }
    const auto actor = actor_ranks(world);
    HYBRIDRL_CHECK(actor.front() == 0,
                   fmt::format("actor = \"{}\" leaves out rank 0, which writes the run's files", actor_),
                   "put rank 0 in the actor's ranks (e.g. placement.actor = \"0-" + std::to_string(actor.size() - 1) + "\")");
    HYBRIDRL_CHECK(critic_ranks(world) == actor,
                   fmt::format("critic = \"{}\" is not the actor's ranks (\"{}\"): the critic trains on the "
                               "actor's batches, on its ranks", critic_, actor_),
                   "leave placement.critic unset (it follows placement.actor)");
    std::set<int64_t> used(actor.begin(), actor.end());
    const auto reference = reference_ranks(world), reward = reward_ranks(world);
    if (!online) {
      HYBRIDRL_CHECK(reward_.empty(), fmt::format("reward = \"{}\" but an offline algorithm has no reward", reward_),
                     "leave placement.reward unset");
    }
    used.insert(reference.begin(), reference.end());
    used.insert(reward.begin(), reward.end());
    for (int64_t r = 0; r < world; ++r) {
      HYBRIDRL_CHECK(used.count(r) != 0,
                     fmt::format("actor = \"{}\", reference = \"{}\", reward = \"{}\" leave rank {} of {} without a model",
                                 actor_, reference_, reward_, r, world),
                     "give every rank a model (add it to placement.actor, .reference or .reward), or launch fewer ranks");
    }
  }

 private:
  [[nodiscard]] const std::string& text(const char* key) const {
    const std::string k = key;
    return k == "actor" ? actor_ : k == "critic" ? critic_ : k == "reference" ? reference_ : reward_;
  }
  [[nodiscard]] std::vector<int64_t> parse(const char* key) const {
    try {
      return parse_ranks(text(key));
    } catch (const Error& e) {
      throw Error(std::string(key) + " " + e.problem(), e.fix());
    }
  }
  [[nodiscard]] std::vector<int64_t> or_actor(const char* key, int64_t world) const {
    auto r = parse(key);
    return r.empty() ? actor_ranks(world) : r;
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
