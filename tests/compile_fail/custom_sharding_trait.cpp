// Rule (d): a custom Sharding without its trait gets a sentence naming the trait.
// EXPECT: must declare .static constexpr bool produces_tensor_parallel_shards
// REJECT: static assertion failed.*static assertion failed
#ifdef HYBRIDRL_COMPILE_FAIL
#define USER_SHARDING_NO_TRAIT
#endif
#include "user_policies.hpp"

using namespace hybridrl;

using Probe = Trainer<Algorithm<GRPO>, Sharding<user::ShardingTag>, Rollout<user::RolloutTag>, Loader<user::LoaderTag>>;
static_assert(sizeof(Probe) > 0);  // instantiates the type, so its checks run
