#pragma once
/// \file
/// Aggregator for the Sharding axis.

#include "hybridrl/sharding/concepts.hpp"
#include "hybridrl/sharding/fsdp.hpp"
#include "hybridrl/sharding/optimizer.hpp"
#include "hybridrl/sharding/tp3d.hpp"
#include "hybridrl/sharding/weight_spec.hpp"
#include "hybridrl/sharding/weights.hpp"
