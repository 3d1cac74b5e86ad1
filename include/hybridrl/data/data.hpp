#pragma once
/// \file
/// Aggregator for the Loader axis and datasets.

#include "hybridrl/data/bucketed.hpp"
#include "hybridrl/data/packed.hpp"
