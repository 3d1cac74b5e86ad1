// A Trainer slot with a tag its axis has no specialization for: the axis template's own sentence,
// and nothing from the Trainer after it (only the first broken rule speaks).
// EXPECT: Rollout<Tag> is not specialized for this tag
// REJECT: static assertion failed.*static assertion failed
#include <hybridrl/hybridrl.hpp>

using namespace hybridrl;

#ifdef HYBRIDRL_COMPILE_FAIL
using Probe = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<struct NotARollout>, Loader<Bucketed>>;
#else
using Probe = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
#endif
static_assert(sizeof(Probe) > 0);  // instantiates the type, so its checks run
