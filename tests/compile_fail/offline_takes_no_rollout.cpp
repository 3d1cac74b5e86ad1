// Rule (b): DPO/KTO train on a fixed dataset and take no Rollout.
// EXPECT: this Algorithm is offline .* takes no Rollout
// REJECT: static assertion failed.*static assertion failed
#include <hybridrl/hybridrl.hpp>

using namespace hybridrl;

#ifdef HYBRIDRL_COMPILE_FAIL
using Probe = Trainer<Algorithm<KTO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
#else
using Probe = Trainer<Algorithm<KTO>, Sharding<FSDP>, Loader<Bucketed>>;
#endif
static_assert(sizeof(Probe) > 0);  // instantiates the type, so its checks run
