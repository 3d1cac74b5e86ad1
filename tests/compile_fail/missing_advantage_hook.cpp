// Rule (d): an online Algorithm without compute_advantages gets a message naming that hook.
// EXPECT: missing the hook `static void compute_advantages
#include <hybridrl/hybridrl.hpp>

using namespace hybridrl;

struct MyTag {};
struct MyOptions {
  void validate() const {}
};
template <>
struct hybridrl::Algorithm<MyTag> {
  using tag = MyTag;
  using options_type = MyOptions;
  static constexpr std::string_view name = "Mine";
  static constexpr DataKind data_kind = DataKind::prompts;
  static constexpr bool needs_critic = false;
  static constexpr bool needs_reference = false;
#ifndef HYBRIDRL_COMPILE_FAIL
  static void compute_advantages(TensorBatch& b, const options_type&) { b.set("advantages", b.tensor("scores")); }
#endif
  static LossOutput loss(const TensorBatch& b, const options_type&, const LossScale&) {
    return {b.tensor("advantages").mean(), {}};
  }
};
using Probe = Trainer<Algorithm<MyTag>, Sharding<FSDP>, Rollout<Paged>, Loader<Packed>>;
static_assert(sizeof(Probe) > 0);
