// Rule (d): a custom Sharding whose engine_type cannot export weights gets a sentence naming the hook.
// EXPECT: engine_type is missing the hook .void export_weights
// REJECT: static assertion failed.*static assertion failed
#ifdef HYBRIDRL_COMPILE_FAIL
#define USER_SHARDING_NO_EXPORT
#endif
#include "user_policies.hpp"

using namespace hybridrl;

using Probe = Trainer<Algorithm<GRPO>, Sharding<user::ShardingTag>, Rollout<user::RolloutTag>, Loader<user::LoaderTag>>;
static_assert(sizeof(Probe) > 0);  // instantiates the type, so its checks run
