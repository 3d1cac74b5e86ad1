#pragma once
/// \file
/// Named trainer types for the common combinations (ensmallen's `using StandardSGD = SGD<...>`):
/// `PPOTrainer`, `GRPOTrainer` (online: FSDP training, Paged generation, length-bucketed prompts),
/// `DPOTrainer`, `KTOTrainer` (offline: FSDP training, packed rows).
///
/// With `HYBRIDRL_EXTERN_PRESETS` defined (the optional `hybridrl::presets` CMake target defines it
/// for its users), each preset is declared `extern template`: a user's translation units do not
/// instantiate it again, and src/presets/presets.cpp, compiled once into `hybridrl::presets`,
/// holds the explicit instantiations.

#include "hybridrl/algorithm/algorithm.hpp"
#include "hybridrl/data/bucketed.hpp"
#include "hybridrl/data/packed.hpp"
#include "hybridrl/rollout/paged.hpp"
#include "hybridrl/sharding/fsdp.hpp"
#include "hybridrl/trainer/trainer.hpp"

namespace hybridrl {

/// PPO with a critic and GAE: FSDP training, Paged generation, length-bucketed prompts.
using PPOTrainer = Trainer<Algorithm<PPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
/// GRPO (group-relative advantages, no critic): FSDP training, Paged generation, bucketed prompts.
using GRPOTrainer = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
/// DPO on preference pairs: FSDP training on packed rows.
using DPOTrainer = Trainer<Algorithm<DPO>, Sharding<FSDP>, Loader<Packed>>;
/// KTO on labelled completions: FSDP training on packed rows.
using KTOTrainer = Trainer<Algorithm<KTO>, Sharding<FSDP>, Loader<Packed>>;

#if defined(HYBRIDRL_EXTERN_PRESETS)
extern template class Trainer<Algorithm<PPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
extern template class Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
extern template class Trainer<Algorithm<DPO>, Sharding<FSDP>, Loader<Packed>>;
extern template class Trainer<Algorithm<KTO>, Sharding<FSDP>, Loader<Packed>>;
#endif

}  // namespace hybridrl
