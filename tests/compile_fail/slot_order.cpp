// Rule (a): each Trainer slot takes its own axis.
// EXPECT: the first Trainer slot takes an Algorithm
// REJECT: static assertion failed.*static assertion failed
#include <hybridrl/hybridrl.hpp>

using namespace hybridrl;

#ifdef HYBRIDRL_COMPILE_FAIL
using Probe = Trainer<Sharding<FSDP>, Algorithm<GRPO>, Rollout<Paged>, Loader<Bucketed>>;
#else
using Probe = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
#endif
static_assert(sizeof(Probe) > 0);  // instantiates the type, so its checks run
