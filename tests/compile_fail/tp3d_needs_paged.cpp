// Rule (c): Sharding<TP3D> hands over tensor-parallel weights; Rollout<Naive> cannot take them.
// EXPECT: Use Rollout<Paged> with Sharding<TP3D>
// REJECT: static assertion failed.*static assertion failed
#include <hybridrl/hybridrl.hpp>

using namespace hybridrl;

#ifdef HYBRIDRL_COMPILE_FAIL
using Probe = Trainer<Algorithm<PPO>, Sharding<TP3D>, Rollout<Naive>, Loader<Packed>>;
#else
using Probe = Trainer<Algorithm<PPO>, Sharding<TP3D>, Rollout<Paged>, Loader<Packed>>;
#endif
static_assert(sizeof(Probe) > 0);  // instantiates the type, so its checks run
