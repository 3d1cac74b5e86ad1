#pragma once
/// \file
/// The pieces every policy descriptor shares (`validatable_options`, `named_policy`,
/// `declares_engine`). Each axis's concepts live beside the axis: algorithm/concepts.hpp,
/// rollout/concepts.hpp, sharding/concepts.hpp, data/concepts.hpp; the cross-axis rules are
/// trainer/rules.hpp.

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


}  // namespace hybridrl
