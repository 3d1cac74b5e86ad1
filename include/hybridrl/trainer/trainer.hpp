#pragma once
/// \file
/// `Trainer<Algorithm<..>, Sharding<..>, Rollout<..>, Loader<..>>` (online: PPO, GRPO, yours) and
/// `Trainer<Algorithm<..>, Sharding<..>, Loader<..>>` (offline: DPO, KTO) — one concrete type from
/// four compile-time policies. Every cross-axis rule is a static_assert with a sentence that says
/// what is wrong and what to write instead; `trainer_config<A, S, R, L>` is the same rules as a
/// concept. This header holds the composition, its traits and its Options; the fit loop is added
/// by the trainer issue (see docs/architecture.md, "Road").

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "hybridrl/core/batch_geometry.hpp"
#include "hybridrl/core/concepts.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/policy.hpp"
#include "hybridrl/distributed/communicator.hpp"

namespace hybridrl {

namespace detail {

/// The four slots of a Trainer, whichever form (3 or 4 policies) was written.
template <class... Ps>
struct trainer_slots {
  using algorithm = void;
  using sharding = void;
  using rollout = NoRollout;
  using loader = void;
  static constexpr bool offline_form = false;
};
template <class A, class S, class L>
struct trainer_slots<A, S, L> {
  using algorithm = A;
  using sharding = S;
  using rollout = NoRollout;
  using loader = L;
  static constexpr bool offline_form = true;
};
template <class A, class S, class R, class L>
struct trainer_slots<A, S, R, L> {
  using algorithm = A;
  using sharding = S;
  using rollout = R;
  using loader = L;
  static constexpr bool offline_form = false;
};

// Each check below is true when its precondition fails, so that only the FIRST broken rule
// produces a message instead of a cascade of unrelated errors.
template <class A>
consteval bool algo_named() {
  if constexpr (is_algorithm_v<A>) return named_policy<A>; else return true;
}
template <class A>
consteval bool algo_traits_ok() {
  if constexpr (is_algorithm_v<A> && named_policy<A>) return algorithm_traits<A>; else return true;
}
template <class A>
consteval bool algo_loss_ok() {
  if constexpr (is_algorithm_v<A> && algorithm_traits<A>) return has_loss_hook<A>; else return true;
}
template <class A>
consteval bool algo_advantage_ok() {
  if constexpr (is_algorithm_v<A> && algorithm_traits<A>) {
    return !is_online_v<A> || has_advantage_hook<A>;
  } else {
    return true;
  }
}
template <class A>
consteval bool algo_value_loss_ok() {
  if constexpr (is_algorithm_v<A> && algorithm_traits<A>) {
    return !A::needs_critic || has_value_loss_hook<A>;
  } else {
    return true;
  }
}
template <class P, bool IsAxis, bool Policy>
consteval bool axis_ok() { if constexpr (IsAxis) return Policy; else return true; }

template <class A, class R>
consteval bool online_has_rollout() {
  if constexpr (is_algorithm_v<A> && algorithm_traits<A>) {
    return !is_online_v<A> || !std::is_same_v<R, NoRollout>;
  } else {
    return true;
  }
}
template <class A, class R>
consteval bool offline_has_no_rollout() {
  if constexpr (is_algorithm_v<A> && algorithm_traits<A>) {
    return is_online_v<A> || std::is_same_v<R, NoRollout>;
  } else {
    return true;
  }
}
template <class S, class R>
consteval bool rollout_accepts_weights() {
  if constexpr (is_sharding_v<S> && is_rollout_v<R>) {
    if constexpr (sharding_policy<S> && rollout_policy<R>) {
      return S::rollout_layout != WeightLayout::tensor_parallel || R::accepts_tensor_parallel_weights;
    } else {
      return true;
    }
  } else {
    return true;
  }
}

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

/// `P::options_type`, or NoOptions when P has none (so a broken slot reports one error, not ten).
template <class P>
struct options_of {
  using type = NoOptions;
};
template <class P>
  requires requires { typename P::options_type; }
struct options_of<P> {
  using type = typename P::options_type;
};

}  // namespace detail

/// One concrete trainer type composed from policies. See the file comment for the two forms.
template <class... Policies>
class Trainer {
  static_assert(sizeof...(Policies) == 3 || sizeof...(Policies) == 4,
                "hybridrl: Trainer takes 4 policies for online algorithms, "
                "Trainer<Algorithm<..>, Sharding<..>, Rollout<..>, Loader<..>>, or 3 for offline "
                "ones, Trainer<Algorithm<..>, Sharding<..>, Loader<..>>.");
  using slots = detail::trainer_slots<Policies...>;

 public:
  using algorithm = typename slots::algorithm;  ///< the Algorithm<..> policy
  using sharding = typename slots::sharding;    ///< the Sharding<..> policy
  using rollout = typename slots::rollout;      ///< the Rollout<..> policy, or NoRollout
  using loader = typename slots::loader;        ///< the Loader<..> policy

 private:
  // ---- rule (a): each slot takes its own axis ----
  static_assert(sizeof...(Policies) < 3 || is_algorithm_v<algorithm>,
                "hybridrl: the first Trainer slot takes an Algorithm<..> (PPO, GRPO, DPO, KTO or "
                "your own tag). Write the policies in the order Algorithm, Sharding, Rollout, "
                "Loader.");
  static_assert(sizeof...(Policies) < 3 || is_sharding_v<sharding>,
                "hybridrl: the second Trainer slot takes a Sharding<..> (FSDP or TP3D). Write the "
                "policies in the order Algorithm, Sharding, Rollout, Loader.");
  static_assert(!slots::offline_form || !is_rollout_v<loader>,
                "hybridrl: the last Trainer slot takes a Loader<..> (Packed or Bucketed), not a "
                "Rollout. Online algorithms take four policies: "
                "Trainer<Algorithm<..>, Sharding<..>, Rollout<..>, Loader<..>>.");
  static_assert(slots::offline_form || sizeof...(Policies) != 4 || is_rollout_v<rollout>,
                "hybridrl: the third slot of a 4-policy Trainer takes a Rollout<..> (Paged or "
                "Naive). Write the policies in the order Algorithm, Sharding, Rollout, Loader.");
  static_assert(sizeof...(Policies) < 3 || is_loader_v<loader> || is_rollout_v<loader>,
                "hybridrl: the last Trainer slot takes a Loader<..> (Packed or Bucketed). Write the "
                "policies in the order Algorithm, Sharding, Rollout, Loader.");

  // ---- rule (d): a policy missing a requirement names it ----
  static_assert(detail::algo_named<algorithm>(),
                "hybridrl: the Algorithm policy must declare `using tag = YourTag;`, "
                "`using options_type = YourOptions;` (with `void validate() const`) and "
                "`static constexpr std::string_view name`. See docs/extending.md.");
  static_assert(detail::algo_traits_ok<algorithm>(),
                "hybridrl: the Algorithm policy must declare `static constexpr DataKind data_kind`, "
                "`static constexpr bool needs_critic` and `static constexpr bool needs_reference`. "
                "See docs/extending.md.");
  static_assert(detail::algo_loss_ok<algorithm>(),
                "hybridrl: the Algorithm policy is missing the hook `static LossOutput loss(const "
                "TensorBatch&, const options_type&, const LossScale&)`. Add it to your "
                "Algorithm<YourTag> specialization (docs/extending.md).");
  static_assert(detail::algo_advantage_ok<algorithm>(),
                "hybridrl: an online Algorithm (data_kind = DataKind::prompts) is missing the hook "
                "`static void compute_advantages(TensorBatch&, const options_type&)`. Add it, or "
                "declare a different data_kind for an offline algorithm (docs/extending.md).");
  static_assert(detail::algo_value_loss_ok<algorithm>(),
                "hybridrl: an Algorithm with needs_critic = true is missing the hook `static "
                "LossOutput value_loss(const TensorBatch&, const options_type&, const LossScale&)`. "
                "Add it, or set needs_critic = false (docs/extending.md).");
  static_assert(detail::axis_ok<sharding, is_sharding_v<sharding>, sharding_policy<sharding>>(),
                "hybridrl: the Sharding policy must provide `tag`, `options_type`, `name` and "
                "`static constexpr WeightLayout rollout_layout`.");
  static_assert(detail::axis_ok<loader, is_loader_v<loader>, loader_policy<loader>>(),
                "hybridrl: the Loader policy must provide `tag`, `options_type` (with seed(), "
                "epochs(), prefetch_factor()), `name`, `static constexpr bool packs_sequences`, "
                "`static std::vector<std::vector<int64_t>> plan_epoch(const std::vector<int64_t>&, "
                "int64_t, const options_type&, int64_t)` and `static void check_data(int64_t, "
                "int64_t, DataKind, const options_type&)`. See docs/data.md.");

  // ---- rule (b): online algorithms need a Rollout, offline ones take none ----
  static_assert(detail::online_has_rollout<algorithm, rollout>(),
                "hybridrl: this Algorithm is online (PPO, GRPO: it generates its own samples) and "
                "needs a Rollout. Write Trainer<Algorithm<..>, Sharding<..>, Rollout<Paged>, "
                "Loader<..>> (or Rollout<Naive>).");
  static_assert(detail::offline_has_no_rollout<algorithm, rollout>(),
                "hybridrl: this Algorithm is offline (DPO, KTO: it trains on a fixed dataset) and "
                "takes no Rollout. Remove the Rollout slot: Trainer<Algorithm<..>, Sharding<..>, "
                "Loader<..>>.");

  // ---- rule (c): tensor-parallel weights need a Rollout that accepts them ----
  static_assert(detail::rollout_accepts_weights<sharding, rollout>(),
                "hybridrl: Sharding<TP3D> hands the rollout weights split over the tensor-parallel "
                "group, and this Rollout needs full weights. Use Rollout<Paged> with Sharding<TP3D>, "
                "or use Sharding<FSDP> with Rollout<Naive>.");

 public:
  /// True for the online form (a Rollout slot exists).
  static constexpr bool has_rollout = !std::is_same_v<rollout, NoRollout>;

  using algorithm_options = typename detail::options_of<algorithm>::type;
  using sharding_options = typename detail::options_of<sharding>::type;
  using rollout_options = typename detail::options_of<rollout>::type;
  using loader_options = typename detail::options_of<loader>::type;

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
                                   geometry_.rollout_n(), Trainer::algorithm::name),
                       "leave rollout_n at 1 for DPO/KTO");
      }
      if constexpr (has_rollout && detail::has_tensor_parallel_size<rollout_options> &&
                    rollout_policy<typename Trainer::rollout>) {
        if constexpr (!Trainer::rollout::accepts_tensor_parallel_weights) {
          HYBRIDRL_CHECK(rollout_.tensor_parallel_size() == 1,
                         fmt::format("rollout.tensor_parallel_size = {} but Rollout<{}> runs one "
                                     "full copy of the model per rank",
                                     rollout_.tensor_parallel_size(), Trainer::rollout::name),
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
    std::string out = fmt::format("hybridrl trainer: Algorithm<{}> Sharding<{}> ", algorithm::name,
                                  sharding::name);
    if constexpr (has_rollout) out += fmt::format("Rollout<{}> ", rollout::name);
    out += fmt::format("Loader<{}>\n{}", loader::name, options_.geometry().describe());
    return out;
  }

 private:
  Options options_;
};

}  // namespace hybridrl
