// Rule (d): a custom Rollout whose engine_type cannot generate gets a sentence naming the hook.
// EXPECT: engine_type is missing the hook .TensorBatch generate
// REJECT: static assertion failed.*static assertion failed
#ifdef HYBRIDRL_COMPILE_FAIL
#define USER_ROLLOUT_NO_GENERATE
#endif
#include "user_policies.hpp"

using namespace hybridrl;

using Probe = Trainer<Algorithm<GRPO>, Sharding<user::ShardingTag>, Rollout<user::RolloutTag>, Loader<user::LoaderTag>>;
static_assert(sizeof(Probe) > 0);  // instantiates the type, so its checks run
