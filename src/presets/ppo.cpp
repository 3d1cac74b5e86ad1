// The explicit instantiations of the PPO presets (trainer/presets.hpp) and their fit loops,
// compiled once into the optional hybridrl::presets library; its users define
// HYBRIDRL_EXTERN_PRESETS and skip them. One file per algorithm family: they build side by side.
#include <hybridrl/trainer/presets.hpp>

namespace hybridrl {
HYBRIDRL_PRESET_PPO()
}  // namespace hybridrl
