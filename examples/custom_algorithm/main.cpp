// A user's own algorithm trained end to end: RLOO (rloo.hpp: a tag, an Options struct and one
// Algorithm<> specialization — the library's functions do the math) composed into a trainer type,
// and a user's own reward, both registered by name beside the built-in ones. This program is then
// `hybridrl train` plus them: it runs its config.yaml (algorithm.name: rloo, reward.name: digits)
// and every other configuration `hybridrl train` runs.
//   example_custom_algorithm --config examples/custom_algorithm/config.yaml [key=value ...]
//   example_custom_algorithm algorithm.name=rloo --help      # RLOO's keys, with their defaults
#include "rloo.hpp"

#include <hybridrl/trainer/run.hpp>

#include <string_view>

using namespace hybridrl;

/// RLOO with FSDP training, Paged generation and length-bucketed prompts: one concrete type.
using RLOOTrainer = Trainer<Algorithm<RLOO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;

/// A format reward a random model can climb from the first step: the share of the response's
/// characters that are decimal digits (0 for an empty response).
double digit_share(const RewardInput& in) {
  if (in.response.empty()) return 0.0;
  int digits = 0;
  for (char c : in.response) digits += (c >= '0' && c <= '9') ? 1 : 0;
  return static_cast<double>(digits) / static_cast<double>(in.response.size());
}

int main(int argc, char** argv) {
  auto trainers = builtin_trainers();  // grpo, ppo, dpo, kto, sft (the compiled presets)
  trainers.add<RLOOTrainer>("rloo", "paged");
  trainers.add_reward("digits", digit_share);
  return train_main(argc, argv, trainers);
}
