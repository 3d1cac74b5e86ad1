#pragma once
/// \file
/// Aggregator for core/: tags, policy axes, concepts, errors, options, batch geometry,
/// TensorBatch and device reporting.

#include "hybridrl/core/batch_geometry.hpp"
#include "hybridrl/core/concepts.hpp"
#include "hybridrl/core/config.hpp"
#include "hybridrl/core/device.hpp"
#include "hybridrl/core/error.hpp"
#include "hybridrl/core/loss.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/policy.hpp"
#include "hybridrl/core/tags.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/rng.hpp"
