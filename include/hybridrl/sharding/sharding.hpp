#pragma once
/// \file
/// Aggregator for the Sharding axis.

#include "hybridrl/sharding/fsdp.hpp"
#include "hybridrl/sharding/tp3d.hpp"
