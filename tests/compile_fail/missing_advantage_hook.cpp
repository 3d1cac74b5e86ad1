// Rule (d): an online Algorithm without compute_advantages gets a message naming that hook.
// EXPECT: missing the hook `static void compute_advantages
#include <hybridrl/hybridrl.hpp>

using namespace hybridrl;

struct MyTag {};
struct MyOptions {
  void validate() const {}
};
template <>
struct hybridrl::Algorithm<MyTag> : algorithm_base<MyTag, MyOptions, DataKind::prompts> {
  static constexpr std::string_view name = "Mine";
#ifndef HYBRIDRL_COMPILE_FAIL
  static void compute_advantages(TensorBatch& b, const options_type&, state_type&) {
    b.set(keys::advantages, b.tensor(keys::scores));
  }
#endif
  static LossOutput loss(const TensorBatch& b, const options_type&, const state_type&,
                         const LossCounts&) {
    return {b.tensor(keys::advantages).mean(), {}};
  }
};
using Probe = Trainer<Algorithm<MyTag>, Sharding<FSDP>, Rollout<Paged>, Loader<Packed>>;
static_assert(sizeof(Probe) > 0);
