#pragma once
/// \file
/// Aggregator for the Loader axis and datasets: JSONL datasets, batch planning (bucketing,
/// packing, rank balancing), collation, prefetch and the two Loader policies.

#include "hybridrl/data/dataset.hpp"
#include "hybridrl/data/planning.hpp"
#include "hybridrl/data/collate.hpp"
#include "hybridrl/data/prefetch.hpp"
#include "hybridrl/data/loader.hpp"
#include "hybridrl/data/bucketed.hpp"
#include "hybridrl/data/packed.hpp"
