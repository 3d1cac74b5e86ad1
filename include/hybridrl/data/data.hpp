#pragma once
/// \file
/// Aggregator for the Loader axis and datasets: JSONL datasets, batch planning (bucketing,
/// row packing), collation, packing at the micro-batch boundary, rollout batches, prefetch and the
/// two Loader policies. (Rank balancing is trainer/balance.hpp.)

#include "hybridrl/data/dataset.hpp"
#include "hybridrl/data/planning.hpp"
#include "hybridrl/data/collate.hpp"
#include "hybridrl/data/packing.hpp"
#include "hybridrl/data/rollout_batch.hpp"
#include "hybridrl/data/prefetch.hpp"
#include "hybridrl/data/loader.hpp"
#include "hybridrl/data/bucketed.hpp"
#include "hybridrl/data/packed.hpp"
