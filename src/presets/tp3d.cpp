// The explicit instantiations of the Sharding<TP3D> presets (trainer/presets.hpp) and their fit
// loops (see ppo.cpp).
#include <hybridrl/trainer/presets.hpp>

namespace hybridrl {
HYBRIDRL_PRESET_TP3D()
}  // namespace hybridrl
