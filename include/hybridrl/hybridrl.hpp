#pragma once
/// \file
/// The umbrella header: everything a user needs to compose and run a trainer.
///
///     #include <hybridrl/hybridrl.hpp>
///     using namespace hybridrl;
///     using MyTrainer = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
///
/// Optional parts are not included here, so a build without them still compiles this header:
/// the sentencepiece tokenizer (<hybridrl/tokenizer/sentencepiece.hpp>, needs the sentencepiece
/// headers; CMake defines HYBRIDRL_WITH_SENTENCEPIECE=1 when they are found).

#include "hybridrl/version.hpp"
#include "hybridrl/core/core.hpp"
#include "hybridrl/distributed/distributed.hpp"
#include "hybridrl/algorithm/algorithm.hpp"
#include "hybridrl/sharding/sharding.hpp"
#include "hybridrl/rollout/rollout.hpp"
#include "hybridrl/data/data.hpp"
#include "hybridrl/tokenizer/tokenizer.hpp"
#include "hybridrl/io/atomic_file.hpp"
#include "hybridrl/io/fault.hpp"
#include "hybridrl/io/json.hpp"
#include "hybridrl/io/svg_plot.hpp"
#include "hybridrl/io/tensorboard.hpp"
#include "hybridrl/model/model.hpp"
#include "hybridrl/trainer/options.hpp"
#include "hybridrl/trainer/scoring.hpp"
#include "hybridrl/trainer/run_log.hpp"
#include "hybridrl/trainer/checkpoint.hpp"
#include "hybridrl/trainer/micro_batch.hpp"
#include "hybridrl/trainer/trainer.hpp"
#include "hybridrl/trainer/rewards.hpp"
#include "hybridrl/trainer/tasks.hpp"
#include "hybridrl/trainer/balance.hpp"
#include "hybridrl/trainer/presets.hpp"
