// `hybridrl train`'s online trainer types (PPO and GRPO, each with Rollout<Paged> or <Naive>): their
// fit() instantiations live in this translation unit, the offline ones in train_offline.cpp.
#include "train.hpp"

namespace hybridrl::app {

int run_train_online(const TrainSources& s, bool print_only) {
  const bool paged = s.rollout == "paged";
  if (s.algorithm == "ppo") {
    return paged ? run_train_as<TrainPPOPaged, PromptDataset>(s, print_only)
                 : run_train_as<TrainPPONaive, PromptDataset>(s, print_only);
  }
  return paged ? run_train_as<TrainGRPOPaged, PromptDataset>(s, print_only)
               : run_train_as<TrainGRPONaive, PromptDataset>(s, print_only);
}

}  // namespace hybridrl::app
