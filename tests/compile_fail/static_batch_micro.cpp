// Rule (e): compile-time geometry; the per-rank mini-batch must split into micro-batches.
// EXPECT: must be divisible by Micro
#include <hybridrl/hybridrl.hpp>

using namespace hybridrl;

#ifdef HYBRIDRL_COMPILE_FAIL
using Probe = StaticBatch<60, 12, 6, 60, 7>;
#else
using Probe = StaticBatch<60, 12, 6, 60, 4>;
#endif
static_assert(sizeof(Probe) > 0);  // instantiates the type, so its checks run
