// Rule (a): the last slot of the offline form takes a Loader, not a Rollout.
// EXPECT: the last Trainer slot takes a Loader.*, not a Rollout
// REJECT: static assertion failed.*static assertion failed
#include <hybridrl/hybridrl.hpp>

using namespace hybridrl;

#ifdef HYBRIDRL_COMPILE_FAIL
using Probe = Trainer<Algorithm<DPO>, Sharding<FSDP>, Rollout<Paged>>;
#else
using Probe = Trainer<Algorithm<DPO>, Sharding<FSDP>, Loader<Packed>>;
#endif
static_assert(sizeof(Probe) > 0);  // instantiates the type, so its checks run
