#pragma once
/// \file
/// The pieces every policy descriptor shares (`named_policy`, `declares_engine`) and the Algorithm
/// axis's concepts. Each other axis's concepts live beside the axis: rollout/concepts.hpp,
/// sharding/concepts.hpp, data/concepts.hpp; the cross-axis rules are trainer/rules.hpp.

#include <concepts>
#include <string_view>
#include <type_traits>

#include "hybridrl/core/loss.hpp"
#include "hybridrl/core/policy.hpp"
#include "hybridrl/core/tensor_batch.hpp"

namespace hybridrl {

/// Options types are validated once at construction: `void validate() const` throws hybridrl::Error.
template <class O>
concept validatable_options = std::default_initializable<O> && std::copy_constructible<O> &&
                              requires(const O& o) { o.validate(); };

/// Every policy names its tag, its Options type and a human-readable name.
template <class P>
concept named_policy = requires {
  typename P::tag;
  typename P::options_type;
  { P::name } -> std::convertible_to<std::string_view>;
} && validatable_options<typename P::options_type>;

/// A descriptor that builds a run-time engine names its type: `using engine_type = ...;`, the type
/// `make(...)` returns. The axis concept checks the engine against the axis's engine concept
/// (rollout_engine, sharded_model) whenever it is declared.
template <class P>
concept declares_engine = requires { typename P::engine_type; };

// ---- Algorithm ---------------------------------------------------------------------------------

/// Compile-time traits of an algorithm: `data_kind` (DataKind), `needs_critic`, `needs_reference`.
template <class P>
concept algorithm_traits = named_policy<P> && requires {
  { P::data_kind } -> std::convertible_to<DataKind>;
  { P::needs_critic } -> std::convertible_to<bool>;
  { P::needs_reference } -> std::convertible_to<bool>;
};

/// True for algorithms that generate their own samples (DataKind::prompts) and so need a Rollout.
template <class P>
inline constexpr bool is_online_v = [] {
  if constexpr (algorithm_traits<P>) {
    return P::data_kind == DataKind::prompts;
  } else {
    return false;
  }
}();

/// Hook: `static LossOutput loss(const TensorBatch&, const options_type&, const LossScale&)`,
/// the actor's (or offline model's) loss on one micro-batch.
template <class P>
concept has_loss_hook = requires(const TensorBatch& b, const typename P::options_type& o,
                                 const LossScale& s) {
  { P::loss(b, o, s) } -> std::same_as<LossOutput>;
};

/// Hook (online algorithms): `static void compute_advantages(TensorBatch&, const options_type&)`,
/// which reads rewards/scores (and values) and writes "advantages" (and "returns").
template <class P>
concept has_advantage_hook = requires(TensorBatch& b, const typename P::options_type& o) {
  { P::compute_advantages(b, o) } -> std::same_as<void>;
};

/// Hook (algorithms with a critic): `static LossOutput value_loss(const TensorBatch&,
/// const options_type&, const LossScale&)`.
template <class P>
concept has_value_loss_hook = requires(const TensorBatch& b, const typename P::options_type& o,
                                       const LossScale& s) {
  { P::value_loss(b, o, s) } -> std::same_as<LossOutput>;
};

/// An Algorithm policy provides: `tag`, `options_type`, `name`, `data_kind`, `needs_critic`,
/// `needs_reference`, the `loss` hook; online ones also `compute_advantages`; with a critic also
/// `value_loss`.
template <class P>
concept algorithm_policy = algorithm_traits<P> && has_loss_hook<P> &&
                           (!is_online_v<P> || has_advantage_hook<P>) &&
                           (!P::needs_critic || has_value_loss_hook<P>);

}  // namespace hybridrl
