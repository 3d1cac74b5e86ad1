#pragma once
/// \file
/// `Trainer<Algorithm<..>, Sharding<..>, Rollout<..>, Loader<..>>` (online: PPO, GRPO, yours) and
/// `Trainer<Algorithm<..>, Sharding<..>, Loader<..>>` (offline: DPO, KTO) — one concrete type from
/// four compile-time policies. Every rule (trainer/rules.hpp) is a static_assert with a sentence
/// that says what is wrong and what to write instead, and only the first broken one speaks;
/// `trainer_config<A, S, R, L>` is the same rules as a concept. This header holds the composition,
/// its member types and its Options; the fit loop is added by the trainer issue (docs/architecture.md).

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "hybridrl/core/batch_geometry.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/policy.hpp"
#include "hybridrl/distributed/communicator.hpp"
#include "hybridrl/trainer/rules.hpp"

namespace hybridrl {

namespace detail {

/// Options of nothing: the absent Rollout of an offline trainer, or a slot already reported broken.
struct NoOptions {
  HYBRIDRL_FIELDS()
  void validate() const {}
};

/// Rollout options that name a generation tensor-parallel size.
template <class O>
concept has_tensor_parallel_size = requires(const O& o) {
  { o.tensor_parallel_size() } -> std::convertible_to<int64_t>;
};

/// Rollout options with sampling options (whose seed the trainer derives).
template <class O>
concept has_sampling = requires(O& o) { o.sampling().seed(uint64_t{0}); };

/// Loader options with a token budget per batch.
template <class O>
concept has_token_budget = requires(const O& o) {
  { o.max_tokens_per_batch() } -> std::convertible_to<int64_t>;
};

/// Sharding options that check themselves against the world size.
template <class O>
concept checks_world = requires(const O& o) { o.check_world(int64_t{1}); };

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

  /// Everything the trainer needs at run time, one Options struct per policy plus the geometry
  /// and the run's one seed. Configuration keys: algorithm.*, sharding.*, rollout.* (online
  /// only), loader.*, geometry.*, seed (core/config.hpp reads and writes them).
  struct Options {
    HYBRIDRL_ARG(algorithm_options, algorithm) = {};
    HYBRIDRL_ARG(sharding_options, sharding) = {};
    HYBRIDRL_ARG(rollout_options, rollout) = {};
    HYBRIDRL_ARG(loader_options, loader) = {};
    HYBRIDRL_ARG(BatchGeometry, geometry) = {};
    /// The run's one seed; the loader's and the sampler's seeds are derived from it.
    HYBRIDRL_ARG(uint64_t, seed) = 0;

    /// The field visitor (HYBRIDRL_FIELDS, except that an offline trainer has no rollout key).
    template <class Self, class F>
    static void visit_fields(Self& self, F&& f) {
      f("algorithm", self.algorithm_);
      f("sharding", self.sharding_);
      if constexpr (has_rollout) f("rollout", self.rollout_);
      f("loader", self.loader_);
      f("geometry", self.geometry_);
      f("seed", self.seed_);
    }

    /// The geometry as the run uses it: the rollout's tensor-parallel size copied in.
    [[nodiscard]] BatchGeometry effective_geometry() const {
      BatchGeometry g = geometry_;
      if constexpr (has_rollout && detail::has_tensor_parallel_size<rollout_options>) {
        g.rollout_tensor_parallel_size(rollout_.tensor_parallel_size());
      }
      return g;
    }

    /// A copy with every derived value written in: the world size of the process group, the
    /// loader's batch size from the geometry, and the loader and sampling seeds from `seed`.
    /// A geometry world_size set by hand (not 1, e.g. by StaticBatch) must agree with
    /// `world_size`; without one, the geometry's is kept (a single process describing a run).
    [[nodiscard]] Options resolved(std::optional<int64_t> world_size = std::nullopt) const {
      HYBRIDRL_CHECK(!world_size || geometry_.world_size() == 1 ||
                         geometry_.world_size() == *world_size,
                     fmt::format("geometry.world_size = {} but the process group has {} rank(s)",
                                 geometry_.world_size(), world_size.value_or(1)),
                     "leave geometry.world_size unset: the trainer reads it from the process "
                     "group (launch with as many ranks as you meant)");
      Options o = *this;
      if (world_size) o.geometry_.world_size(*world_size);
      o.geometry_ = o.effective_geometry();
      if constexpr (requires { o.loader_.batch_size(int64_t{1}); }) {
        o.loader_.batch_size(o.geometry_.train_batch_size());
      }
      if constexpr (requires { o.loader_.seed(uint64_t{1}); }) {
        o.loader_.seed(derive_seed(seed_, "loader"));
      }
      if constexpr (has_rollout && detail::has_sampling<rollout_options>) {
        o.rollout_.sampling().seed(derive_seed(seed_, "sampling"));
      }
      return o;
    }

    /// Validates every part and the rules across axes; throws hybridrl::Error whose problem
    /// starts with the full dotted key ("rollout.block_size = 0 ..."). The geometry is checked
    /// with its world_size (the Trainer sets it from the process group) and the rollout's
    /// tensor-parallel size.
    void validate() const {
      detail::validate_member(algorithm_, "algorithm");
      detail::validate_member(sharding_, "sharding");
      if constexpr (has_rollout) detail::validate_member(rollout_, "rollout");
      detail::validate_member(loader_, "loader");
      const BatchGeometry g = effective_geometry();
      detail::validate_member(g, "geometry");
      if constexpr (!has_rollout) {
        HYBRIDRL_CHECK(geometry_.rollout_n() == 1,
                       fmt::format("geometry.rollout_n = {} but {} is offline and samples nothing",
                                   geometry_.rollout_n(), Trainer::algorithm_type::name),
                       "leave rollout_n at 1 for DPO/KTO");
      }
      if constexpr (has_rollout && detail::has_tensor_parallel_size<rollout_options> &&
                    rollout_policy<typename Trainer::rollout_type>) {
        if constexpr (!Trainer::rollout_type::accepts_tensor_parallel_weights) {
          HYBRIDRL_CHECK(rollout_.tensor_parallel_size() == 1,
                         fmt::format("rollout.tensor_parallel_size = {} but Rollout<{}> runs one "
                                     "full copy of the model per rank",
                                     rollout_.tensor_parallel_size(), Trainer::rollout_type::name),
                         "set rollout.tensor_parallel_size = 1, or use Rollout<Paged> for "
                         "tensor-parallel generation");
        }
      }
      if constexpr (has_rollout && detail::has_token_budget<loader_options>) {
        HYBRIDRL_CHECK(loader_.max_tokens_per_batch() == 0,
                       fmt::format("loader.max_tokens_per_batch = {} makes the number of prompts "
                                   "per batch vary, but an online step generates from exactly "
                                   "geometry.train_batch_size = {} prompts",
                                   loader_.max_tokens_per_batch(), geometry_.train_batch_size()),
                       "set loader.max_tokens_per_batch = 0 (token budgets apply to offline "
                       "batches; the update's micro-batches are set by the geometry)");
      }
      if constexpr (detail::checks_world<sharding_options>) {
        try {
          sharding_.check_world(g.world_size());
        } catch (const Error& e) {
          throw Error("sharding." + e.problem(), e.fix());
        }
      }
    }
  };

  /// Validates `options` before any expensive work; throws hybridrl::Error on the first problem.
  /// `world_size` is the process group's size (default: the geometry's); derived values (loader
  /// batch size and seed, sampling seed, the geometry's world and rollout TP) are written in.
  explicit Trainer(Options options, std::optional<int64_t> world_size = std::nullopt)
      : options_(options.resolved(world_size)) {
    options_.validate();
  }

  /// As above, with the world size read from the process group the trainer runs on.
  Trainer(Options options, const Communicator& group)
      : Trainer(std::move(options), static_cast<int64_t>(group.size())) {}

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
