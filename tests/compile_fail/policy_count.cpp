// Rule (a): a Trainer takes 3 (offline) or 4 (online) policies.
// EXPECT: Trainer takes 4 policies for online algorithms
// REJECT: static assertion failed.*static assertion failed
#include <hybridrl/hybridrl.hpp>

using namespace hybridrl;

#ifdef HYBRIDRL_COMPILE_FAIL
using Probe = Trainer<Algorithm<GRPO>, Sharding<FSDP>>;
#else
using Probe = Trainer<Algorithm<DPO>, Sharding<FSDP>, Loader<Packed>>;
#endif
static_assert(sizeof(Probe) > 0);  // instantiates the type, so its checks run
