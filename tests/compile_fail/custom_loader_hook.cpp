// Rule (d): a custom Loader without plan_epoch gets a sentence naming the hook.
// EXPECT: Loader policy is missing the hook .static std::vector<std::vector<int64_t>> plan_epoch
// REJECT: static assertion failed.*static assertion failed
#ifdef HYBRIDRL_COMPILE_FAIL
#define USER_LOADER_NO_PLAN_EPOCH
#endif
#include "user_policies.hpp"

using namespace hybridrl;

using Probe = Trainer<Algorithm<GRPO>, Sharding<user::ShardingTag>, Rollout<user::RolloutTag>, Loader<user::LoaderTag>>;
static_assert(sizeof(Probe) > 0);  // instantiates the type, so its checks run
