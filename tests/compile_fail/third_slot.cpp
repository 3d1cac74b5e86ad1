// Rule (a): the third slot of the online form takes a Rollout.
// EXPECT: the third slot of a 4-policy Trainer takes a Rollout
// REJECT: static assertion failed.*static assertion failed
#include <hybridrl/hybridrl.hpp>

using namespace hybridrl;

#ifdef HYBRIDRL_COMPILE_FAIL
using Probe = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Loader<Packed>, Loader<Bucketed>>;
#else
using Probe = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>;
#endif
static_assert(sizeof(Probe) > 0);  // instantiates the type, so its checks run
