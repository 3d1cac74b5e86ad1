#pragma once
// `hybridrl train`: one training run from a configuration file, the environment and key=value
// overrides (precedence defaults < file < HYBRIDRL_* environment < command line).
//   hybridrl train [--config run.yaml] [--print-config] [key=value ...]
// `algorithm.name` (grpo | ppo | dpo | kto | sft) and `rollout.name` (paged | naive; online ones)
// choose, once at start, one of the preset trainer types (trainer/presets.hpp, compiled into
// hybridrl::presets); every other key belongs to that trainer's Options or to the run's own tables:
// model.* (a Hugging Face checkpoint, or model.init=tiny for a small random model with the byte
// tokenizer), task.* (a built-in task instead of data.train_files) and reward.* (online). The job
// itself is the library's (trainer/run.hpp): a program with its own algorithm runs the same
// configuration files through hybridrl::train_main. Every key is checked before the model is
// loaded: an unknown one names the nearest valid spelling.

#include <string>
#include <utility>
#include <vector>

#include <hybridrl/trainer/run.hpp>

namespace hybridrl::app {

/// The trainer types this program runs.
inline const TrainerRegistry& trainers() {
  static const TrainerRegistry r = builtin_trainers();
  return r;
}

/// `hybridrl train`: reads the configuration (`config_file`, the HYBRIDRL_* environment,
/// `overrides`), picks the trainer type and runs it. Returns the exit code (errors throw).
inline int run_train(const std::string& config_file, const std::vector<std::string>& overrides, bool print_only) {
  return trainers().run(read_run_sources(config_file, overrides), print_only);
}

/// The `algorithm.name=` and `rollout.name=` arguments of a command line (for --help, which is
/// answered before the subcommand runs); empty where absent (the defaults: grpo, paged).
inline std::pair<std::string, std::string> train_type_of(int argc, char** argv) {
  std::pair<std::string, std::string> out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("algorithm.name=", 0) == 0) out.first = a.substr(15);
    if (a.rfind("rollout.name=", 0) == 0) out.second = a.substr(13);
  }
  return out;
}

}  // namespace hybridrl::app
