// `hybridrl train`'s offline trainer types (DPO, KTO, SFT): their fit() instantiations live in this
// translation unit, the online ones in train_online.cpp.
#include "train.hpp"

namespace hybridrl::app {

int run_train_offline(const TrainSources& s, bool print_only) {
  if (s.algorithm == "dpo") return run_train_as<TrainDPO, PreferenceDataset>(s, print_only);
  if (s.algorithm == "kto") return run_train_as<TrainKTO, LabelledDataset>(s, print_only);
  return run_train_as<TrainSFT, CompletionDataset>(s, print_only);
}

}  // namespace hybridrl::app
