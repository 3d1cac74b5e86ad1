// Rule (e): compile-time geometry; Train x N must split over World.
// EXPECT: sequences must be divisible by World
#include <hybridrl/hybridrl.hpp>

using namespace hybridrl;

#ifdef HYBRIDRL_COMPILE_FAIL
using Probe = StaticBatch<60, 12, 7, 60, 4>;
#else
using Probe = StaticBatch<60, 12, 6, 60, 4>;
#endif
static_assert(sizeof(Probe) > 0);  // instantiates the type, so its checks run
