#pragma once
/// \file
/// Aggregator for the Rollout axis.

#include "hybridrl/rollout/concepts.hpp"
#include "hybridrl/rollout/generation.hpp"
#include "hybridrl/rollout/naive.hpp"
#include "hybridrl/rollout/paged.hpp"
#include "hybridrl/rollout/paged/block_pool.hpp"
#include "hybridrl/rollout/paged/scheduler.hpp"
#include "hybridrl/rollout/philox.hpp"
#include "hybridrl/rollout/sampler.hpp"
#include "hybridrl/rollout/sampling.hpp"
