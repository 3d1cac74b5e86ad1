#pragma once
/// \file
/// What `hybridrl_use_torch_pch()` precompiles: every header of <hybridrl/hybridrl.hpp> (with the
/// LibTorch, nlohmann-json and fmt headers they include) except trainer/presets.hpp. That one's
/// `extern template` lines depend on HYBRIDRL_EXTERN_PRESETS, which only some of a build's targets
/// define, and a precompiled header must not depend on a macro its users may set differently
/// (GCC refuses it then). Keep this list equal to the umbrella's, less presets.hpp.

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
