// Rule (d): a user's Algorithm missing a hook gets a message naming the hook.
// EXPECT: missing the hook `static LossOutput loss
#include <hybridrl/hybridrl.hpp>

using namespace hybridrl;

struct MyTag {};
struct MyOptions {
  void validate() const {}
};
template <>
struct hybridrl::Algorithm<MyTag> : algorithm_base<MyTag, MyOptions, DataKind::preference_pairs> {
  static constexpr std::string_view name = "Mine";
  static constexpr bool needs_reference = true;
#ifndef HYBRIDRL_COMPILE_FAIL
  static LossOutput loss(const TensorBatch& b, const options_type&, const state_type&,
                         const LossCounts&) {
    return {b.tensor(keys::chosen_log_probs_sum).mean(), {}};
  }
#endif
};
using Probe = Trainer<Algorithm<MyTag>, Sharding<FSDP>, Loader<Packed>>;
static_assert(sizeof(Probe) > 0);
