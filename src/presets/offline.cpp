// The explicit instantiations of the offline presets (DPO, KTO, SFT; trainer/presets.hpp) and their
// fit loops (see ppo.cpp).
#include <hybridrl/trainer/presets.hpp>

namespace hybridrl {
HYBRIDRL_PRESET_OFFLINE()
}  // namespace hybridrl
