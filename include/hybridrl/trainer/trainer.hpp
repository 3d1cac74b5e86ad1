#pragma once
/// \file
/// `Trainer<Algorithm<..>, Sharding<..>, Rollout<..>, Loader<..>>` (online: PPO, GRPO, yours) and
/// `Trainer<Algorithm<..>, Sharding<..>, Loader<..>>` (offline: DPO, KTO) — one concrete type from
/// four compile-time policies. Every rule (trainer/rules.hpp) is a static_assert with a sentence
/// that says what is wrong and what to write instead, and only the first broken one speaks;
/// `trainer_config<A, S, R, L>` is the same rules as a concept. This header holds the composition,
/// its member types and its Options; the fit loop is added by the trainer issue (docs/architecture.md).

#include <fmt/format.h>

#include <string>
#include <type_traits>

#include "hybridrl/core/batch_geometry.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/policy.hpp"
#include "hybridrl/trainer/rules.hpp"

namespace hybridrl {

namespace detail {

/// Options of nothing: the absent Rollout of an offline trainer, or a slot already reported broken.
struct NoOptions {
  void validate() const {}
};

/// `P::options_type` once every rule holds; NoOptions for the absent Rollout, or while a rule is
/// broken (so a broken slot reports one error, not ten).
template <class P, bool RulesHold>
struct options_of {
  using type = NoOptions;
};
template <class P>
  requires requires { typename P::options_type; }
struct options_of<P, true> {
  using type = typename P::options_type;
};

}  // namespace detail

/// One concrete trainer type composed from policies. See the file comment for the two forms.
template <class... Policies>
class Trainer {
  using slots = detail::trainer_slots<Policies...>;
  using rules = detail::trainer_rules<Policies...>;
  // Instantiates the rules (trainer/rules.hpp): each broken rule is a sentence there, only the first speaks.
  static constexpr bool rules_hold_ = rules::ok;

 public:
  using algorithm_type = typename slots::algorithm;  ///< the Algorithm<..> policy
  using sharding_type = typename slots::sharding;    ///< the Sharding<..> policy
  using rollout_type = typename slots::rollout;      ///< the Rollout<..> policy, or NoRollout
  using loader_type = typename slots::loader;        ///< the Loader<..> policy

  /// True for the online form (a Rollout slot exists).
  static constexpr bool has_rollout = !std::is_same_v<rollout_type, NoRollout>;

  using algorithm_options = typename detail::options_of<algorithm_type, rules_hold_>::type;
  using sharding_options = typename detail::options_of<sharding_type, rules_hold_>::type;
  using rollout_options = typename detail::options_of<rollout_type, rules_hold_>::type;
  using loader_options = typename detail::options_of<loader_type, rules_hold_>::type;

  /// Everything the trainer needs at run time, one Options struct per policy plus the geometry.
  struct Options {
    HYBRIDRL_ARG(algorithm_options, algorithm) = {};
    HYBRIDRL_ARG(sharding_options, sharding) = {};
    HYBRIDRL_ARG(rollout_options, rollout) = {};
    HYBRIDRL_ARG(loader_options, loader) = {};
    HYBRIDRL_ARG(BatchGeometry, geometry) = {};

    /// Validates every part; throws hybridrl::Error naming the first problem.
    void validate() const {
      algorithm_.validate();
      sharding_.validate();
      rollout_.validate();
      loader_.validate();
      geometry_.validate();
      if constexpr (!has_rollout) {
        HYBRIDRL_CHECK(geometry_.rollout_n() == 1,
                       fmt::format("geometry.rollout_n = {} but {} is offline and samples nothing",
                                   geometry_.rollout_n(), Trainer::algorithm_type::name),
                       "leave rollout_n at 1 for DPO/KTO");
      }
    }
  };

  /// Validates `options` before any expensive work; throws hybridrl::Error on the first problem.
  explicit Trainer(Options options) : options_(std::move(options)) { options_.validate(); }

  [[nodiscard]] const Options& options() const noexcept { return options_; }

  /// One line per axis plus the effective batch geometry, as printed at the start of training.
  [[nodiscard]] std::string describe() const {
    std::string out = fmt::format("hybridrl trainer: Algorithm<{}> Sharding<{}> ", algorithm_type::name,
                                  sharding_type::name);
    if constexpr (has_rollout) out += fmt::format("Rollout<{}> ", rollout_type::name);
    out += fmt::format("Loader<{}>\n{}", loader_type::name, options_.geometry().describe());
    return out;
  }

 private:
  Options options_;
};

}  // namespace hybridrl
