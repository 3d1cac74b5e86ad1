// User-written Rollout, Sharding and Loader policies for the compile-fail cases, complete unless a
// case defines one of the USER_* macros below to leave out a trait or hook. They only need to compile.
#pragma once
#include <hybridrl/hybridrl.hpp>

namespace user {

struct Options {
  uint64_t seed() const { return 0; }
  int64_t epochs() const { return 1; }
  int64_t prefetch_factor() const { return 0; }
  void validate() const {}
};

struct RolloutEngine {
#ifndef USER_ROLLOUT_NO_GENERATE
  hybridrl::TensorBatch generate(const hybridrl::TensorBatch& p) { return p; }
  hybridrl::TensorBatch generate(const hybridrl::TensorBatch& p, const hybridrl::SamplingOptions&) { return p; }
#endif
  hybridrl::WeightSpec weight_spec() const { return {}; }
  void load_weights(const hybridrl::WeightBucket&) {}
  void release_memory() {}
  void resume_memory() {}
  hybridrl::RolloutStats stats() const { return {}; }
};

struct ShardedModel {
  hybridrl::TensorBatch forward(const hybridrl::TensorBatch& b) { return b; }
  void backward(const at::Tensor&) {}
  at::Tensor step() { return {}; }
  hybridrl::StateDict state_dict() const { return {}; }
  void load_state_dict(const hybridrl::StateDict&) {}
#ifndef USER_SHARDING_NO_EXPORT
  void export_weights(const hybridrl::WeightSpec&, const hybridrl::WeightSink&) const {}
#endif
};

struct RolloutTag {};
struct ShardingTag {};
struct LoaderTag {};

}  // namespace user

template <>
struct hybridrl::Rollout<user::RolloutTag> {
  using tag = user::RolloutTag;
  using options_type = user::Options;
  using engine_type = user::RolloutEngine;
  static constexpr std::string_view name = "UserRollout";
#ifndef USER_ROLLOUT_NO_TRAIT
  static constexpr bool accepts_tensor_parallel_weights = true;
#endif
};

template <>
struct hybridrl::Sharding<user::ShardingTag> {
  using tag = user::ShardingTag;
  using options_type = user::Options;
  using engine_type = user::ShardedModel;
  static constexpr std::string_view name = "UserSharding";
#ifndef USER_SHARDING_NO_TRAIT
  static constexpr bool produces_tensor_parallel_shards = false;
#endif
};

template <>
struct hybridrl::Loader<user::LoaderTag> {
  using tag = user::LoaderTag;
  using options_type = user::Options;
  static constexpr std::string_view name = "UserLoader";
  static constexpr bool packs_sequences = false;
#ifndef USER_LOADER_NO_PLAN_EPOCH
  static std::vector<std::vector<int64_t>> plan_epoch(const std::vector<int64_t>&, int64_t, const options_type&, int64_t) {
    return {};
  }
#endif
  static void check_data(int64_t, int64_t, hybridrl::DataKind, const options_type&) {}
};
