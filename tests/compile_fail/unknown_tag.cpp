// An axis used with a tag that has no specialization says which tags exist.
// EXPECT: Algorithm<Tag> is not specialized for this tag
#include <hybridrl/hybridrl.hpp>

using namespace hybridrl;

#ifdef HYBRIDRL_COMPILE_FAIL
using Probe = Algorithm<struct NotAnAlgorithm>;
#else
using Probe = Algorithm<PPO>;
#endif
static_assert(sizeof(Probe) > 0);  // instantiates the type, so its checks run
