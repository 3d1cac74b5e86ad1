#pragma once
/// \file
/// Aggregator for the Algorithm axis: the math (advantages, KL, loss aggregation, losses) and the
/// built-in policies Algorithm<PPO>, Algorithm<GRPO>, Algorithm<DPO>, Algorithm<KTO>.

#include "hybridrl/core/concepts.hpp"
