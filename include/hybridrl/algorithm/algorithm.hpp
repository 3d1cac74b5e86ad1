#pragma once
/// \file
/// Aggregator for the Algorithm axis: the contract (concepts, algorithm_base, metrics), the math
/// (advantages, KL, loss aggregation, the actor loss, losses) and the built-in policies
/// Algorithm<PPO>, Algorithm<GRPO>, Algorithm<DPO>, Algorithm<KTO>.
/// Every formula and its source in verl / TRL: docs/algorithms.md.

#include "hybridrl/algorithm/concepts.hpp"
#include "hybridrl/algorithm/base.hpp"
#include "hybridrl/algorithm/metrics.hpp"

#include "hybridrl/algorithm/actor_loss.hpp"
#include "hybridrl/algorithm/advantages.hpp"
#include "hybridrl/algorithm/aggregate.hpp"
#include "hybridrl/algorithm/dpo.hpp"
#include "hybridrl/algorithm/grpo.hpp"
#include "hybridrl/algorithm/kl.hpp"
#include "hybridrl/algorithm/kto.hpp"
#include "hybridrl/algorithm/ppo.hpp"
#include "hybridrl/algorithm/sft.hpp"
