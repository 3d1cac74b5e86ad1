#pragma once
// `hybridrl train`: one training run from a configuration file, the environment and key=value
// overrides (precedence defaults < file < HYBRIDRL_* environment < command line).
//   hybridrl train [--config run.yaml] [--print-config] [key=value ...]
// `algorithm.name` (grpo | ppo | dpo | kto | sft), `rollout.name` (paged | naive; online ones) and
// `sharding.name` (fsdp | tp3d; tp3d: grpo and ppo with paged) choose, once at start, one of the
// preset trainer types (trainer/presets.hpp, compiled into hybridrl::presets); every other key belongs to that trainer's Options or to the run's own tables:
// model.* (a Hugging Face checkpoint, or model.init=tiny for a small random model with the byte
// tokenizer), task.* (a built-in task instead of data.train_files) and reward.* (online). The job
// itself is the library's (trainer/run.hpp): a program with its own algorithm runs the same
// configuration files through hybridrl::train_main. Every key is checked before the model is
// loaded: an unknown one names the nearest valid spelling.

#include <string>
#include <string_view>
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

/// The trainer type a command line names: its `algorithm.name=`, `rollout.name=` and
/// `sharding.name=` arguments (for --help, which is answered before the subcommand runs); empty
/// where absent (the defaults: grpo, paged, fsdp).
struct TrainType {
  std::string algorithm, rollout, sharding;
};
inline TrainType train_type_of(int argc, char** argv) {
  TrainType out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    for (auto [key, value] : {std::pair{"algorithm.name=", &out.algorithm}, std::pair{"rollout.name=", &out.rollout},
                              std::pair{"sharding.name=", &out.sharding}}) {
      if (a.rfind(key, 0) == 0) *value = a.substr(std::string_view(key).size());
    }
  }
  return out;
}

}  // namespace hybridrl::app
