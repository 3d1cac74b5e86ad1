// The explicit instantiations of trainer/run.hpp's entry points for every preset trainer type
// (run_trainer, configure_run, the help of its RunConfig) and of read_run_data for every dataset
// kind, compiled once into hybridrl::presets beside the fit loops (ppo.cpp, grpo.cpp, ...): the
// `hybridrl` program and the examples that link it skip them.
#include <hybridrl/trainer/run.hpp>

namespace hybridrl {
HYBRIDRL_RUN_PRESETS()
}  // namespace hybridrl
