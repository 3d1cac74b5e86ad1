#pragma once
/// \file
/// Aggregator for the Rollout axis.

#include "hybridrl/rollout/concepts.hpp"
#include "hybridrl/rollout/naive.hpp"
#include "hybridrl/rollout/paged.hpp"
#include "hybridrl/rollout/sampling.hpp"
