#pragma once
/// \file
/// The umbrella header: everything a user needs to compose and run a trainer.
///
///     #include <hybridrl/hybridrl.hpp>
///     using namespace hybridrl;
///     using MyTrainer = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;

#include "hybridrl/version.hpp"
#include "hybridrl/core/core.hpp"
#include "hybridrl/algorithm/algorithm.hpp"
#include "hybridrl/sharding/sharding.hpp"
#include "hybridrl/rollout/rollout.hpp"
#include "hybridrl/data/data.hpp"
#include "hybridrl/model/model.hpp"
#include "hybridrl/trainer/trainer.hpp"
#include "hybridrl/trainer/balance.hpp"
