// The explicit instantiations of the preset trainers (trainer/presets.hpp), compiled once into the
// optional hybridrl::presets library; its users define HYBRIDRL_EXTERN_PRESETS and skip them.

#include <hybridrl/trainer/presets.hpp>

namespace hybridrl {

template class Trainer<Algorithm<PPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
template class Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
template class Trainer<Algorithm<DPO>, Sharding<FSDP>, Loader<Packed>>;
template class Trainer<Algorithm<KTO>, Sharding<FSDP>, Loader<Packed>>;

}  // namespace hybridrl
