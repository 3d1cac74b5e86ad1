// Rule (b): PPO/GRPO generate their own samples and need a Rollout.
// EXPECT: this Algorithm is online .* needs a Rollout
// REJECT: static assertion failed.*static assertion failed
#include <hybridrl/hybridrl.hpp>

using namespace hybridrl;

#ifdef HYBRIDRL_COMPILE_FAIL
using Probe = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Loader<Packed>>;
#else
using Probe = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Naive>, Loader<Packed>>;
#endif
static_assert(sizeof(Probe) > 0);  // instantiates the type, so its checks run
