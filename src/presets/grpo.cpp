// The explicit instantiations of the GRPO presets (trainer/presets.hpp) and their fit loops (see
// ppo.cpp).
#include <hybridrl/trainer/presets.hpp>

namespace hybridrl {
HYBRIDRL_PRESET_GRPO()
}  // namespace hybridrl
