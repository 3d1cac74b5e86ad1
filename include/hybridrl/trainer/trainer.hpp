#pragma once
/// \file
/// `Trainer<Algorithm<..>, Sharding<..>, Rollout<..>, Loader<..>>` (online: PPO, GRPO, yours) and
/// `Trainer<Algorithm<..>, Sharding<..>, Loader<..>>` (offline: DPO, KTO) — one concrete type from
/// four compile-time policies. Every rule (trainer/rules.hpp) is a static_assert with a sentence
/// that says what is wrong and what to write instead, and only the first broken one speaks;
/// `trainer_config<A, S, R, L>` is the same rules as a concept. This header holds the composition,
/// its member types, its Options and the fit loop (docs/training.md): `fit(policy, data)` trains an
/// offline algorithm (DPO, KTO, yours) over its loader.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridrl/algorithm/advantages.hpp"
#include "hybridrl/algorithm/metrics.hpp"
#include "hybridrl/core/batch_geometry.hpp"
#include "hybridrl/core/config.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/policy.hpp"
#include "hybridrl/data/loader.hpp"
#include "hybridrl/data/rollout_batch.hpp"
#include "hybridrl/distributed/batch_collectives.hpp"
#include "hybridrl/distributed/communicator.hpp"
#include "hybridrl/io/atomic_file.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include "hybridrl/model/fingerprint.hpp"
#include "hybridrl/trainer/recorded_step.hpp"
#include "hybridrl/model/pretrained.hpp"
#include "hybridrl/rollout/generation.hpp"
#include "hybridrl/sharding/optimizer.hpp"
#include "hybridrl/trainer/checkpoint.hpp"
#include "hybridrl/trainer/micro_batch.hpp"
#include "hybridrl/trainer/options.hpp"
#include "hybridrl/trainer/placement.hpp"
#include "hybridrl/trainer/rules.hpp"
#include "hybridrl/trainer/run_log.hpp"
#include "hybridrl/trainer/scoring.hpp"

namespace hybridrl {

namespace detail {

/// A step's metrics over the ranks of `comm` (collective; every rank has the same keys): times,
/// memory, geometry/ and keys ending in `_max` or `_fingerprint` the largest over ranks, keys ending in `_min` the smallest,
/// tokens_per_s the sum, the rest the mean.
inline void reduce_metrics(std::map<std::string, double>& m, Communicator& comm) {
  auto ends_with = [](const std::string& k, std::string_view tail) {
    return k.size() >= tail.size() && k.compare(k.size() - tail.size(), tail.size(), tail) == 0;
  };
  auto kind = [&](const std::string& k) {
    if (k.rfind("time/", 0) == 0 || k.rfind("memory/", 0) == 0 || k.rfind("geometry/", 0) == 0 || ends_with(k, "_max") ||
        ends_with(k, "_fingerprint")) {
      return 1;
    }
    if (ends_with(k, "_min")) return 3;  // the smallest: the largest of the negated values
    return k == "tokens_per_s" ? 2 : 0;
  };
  std::vector<double> mean, largest;
  for (const auto& [k, v] : m) {
    const auto c = kind(k);
    (c == 1 || c == 3 ? largest : mean).push_back(c == 3 ? -v : v);
  }
  auto reduce = [&](std::vector<double>& v, ReduceOp op) {
    if (v.empty()) return;
    auto t = at::tensor(v, at::kDouble);
    comm.all_reduce(t, op);
    for (size_t i = 0; i < v.size(); ++i) v[i] = t[static_cast<int64_t>(i)].item<double>();
  };
  reduce(mean, ReduceOp::sum);
  reduce(largest, ReduceOp::max);
  size_t a = 0, b = 0;
  for (auto& [k, v] : m) {
    const auto c = kind(k);
    if (c == 1 || c == 3) {
      v = c == 3 ? -largest[b++] : largest[b++];
    } else {
      v = c == 2 ? mean[a++] : mean[a++] / comm.size();
    }
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

/// Rollout options with a sample count per prompt (rollout.n, which the geometry reads).
template <class O>
concept has_samples_per_prompt = requires(const O& o) {
  { o.n() } -> std::convertible_to<int64_t>;
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

/// The entries of `s` whose names start with `prefix`, with the prefix removed (the critic's part
/// of a checkpoint, saved under "critic.").
inline std::map<std::string, at::Tensor> with_prefix_removed(const std::map<std::string, at::Tensor>& s,
                                                             const std::string& prefix) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [k, v] : s) {
    if (k.rfind(prefix, 0) == 0) out.emplace(k.substr(prefix.size()), v);
  }
  return out;
}

/// The default critic of fit(): the policy's trunk and a score head drawn from `seed` (a generator
/// of its own, so a run's critic is the same however often it is made: a resumed run, a rerun).
inline ValueModel seeded_value_model(const CausalLM& policy, uint64_t seed) {
  auto v = make_value_model(policy);
  c10::NoGradGuard g;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto w = at::empty(v->score->weight.sizes(), at::kFloat).normal_(0.0, v->config().initializer_range, gen);
  v->score->weight.copy_(w);
  v->score->bias.zero_();
  return v;
}

/// Algorithms that train a critic (PPO): `needs_critic` declared and true.
template <class A>
inline constexpr bool needs_critic_v = [] {
  if constexpr (requires { A::needs_critic; }) {
    return static_cast<bool>(A::needs_critic);
  } else {
    return false;
  }
}();

/// Sharding descriptors that also train a critic: `make_critic(value_model, options, optim, steps, world)`.
template <class S, class O>
concept makes_critic_engine = requires(ValueModel v, const O& o, const OptimizerOptions& opt) {
  S::make_critic(v, o, opt, int64_t{1}, int64_t{1});
};

/// The critic engine of a Sharding policy that has one (int otherwise: no critic is trained).
template <class S, bool Critic>
struct critic_engine_of {
  using type = int;
};
template <class S>
  requires requires { typename S::critic_engine_type; }
struct critic_engine_of<S, true> {
  using type = typename S::critic_engine_type;
};

/// Algorithms that keep run state in checkpoints: `save_state(state) -> map<string, double>` and
/// `load_state(state&, map)` (PPO's adaptive KL coefficient).
template <class A>
concept saves_algorithm_state = requires(const typename A::state_type& cs, typename A::state_type& s,
                                         const std::map<std::string, double>& m) {
  { A::save_state(cs) } -> std::convertible_to<std::map<std::string, double>>;
  A::load_state(s, m);
};

/// Sharding descriptors whose engine trains a CausalLM: `make(model, options, optim, steps, world)`.
template <class S, class O>
concept makes_training_engine = requires(CausalLM m, const O& o, const OptimizerOptions& opt) {
  S::make(m, o, opt, int64_t{1}, int64_t{1});
};

/// Sharding descriptors whose engine builds the frozen reference in its own layout
/// (`engine.make_reference()`: Sharding<FSDP>'s, sharded over the ranks as the policy is;
/// Sharding<TP3D>'s, a tensor-parallel shard like the policy).
template <class S>
concept engine_makes_reference = requires { typename S::engine_type; } && requires(const typename S::engine_type& e) {
  e.make_reference();
};

/// The frozen reference's type under a Sharding policy: what its engine's make_reference()
/// returns (ShardedFrozen<CausalLM> under Sharding<FSDP>, CausalLM under Sharding<TP3D>), else a
/// CausalLM (a copy of the policy, run on each rank).
template <class S>
struct reference_of {
  using type = CausalLM;
};
template <class S>
  requires engine_makes_reference<S>
struct reference_of<S> {
  using type = std::remove_cvref_t<decltype(std::declval<const typename S::engine_type&>().make_reference())>;
};

/// Sharding descriptors that can place the frozen models on ranks of their own (placement.*):
/// their reference is a ShardedFrozen<CausalLM>, which shards over any group of ranks.
template <class S>
concept places_models = std::is_same_v<typename reference_of<S>::type, ShardedFrozen<CausalLM>>;

/// Sharding descriptors whose engines write sharded checkpoints (trainer.checkpoint_format=
/// sharded): `engine.sharded_state()` (Sharding<FSDP>).
template <class S>
concept writes_sharded_state = requires(const typename S::engine_type& e) {
  { e.sharded_state() } -> std::same_as<ShardedState>;
};

/// Loads a checkpoint's state into an engine: by flat ranges where it reads them
/// (`load_state(StateSource)`: each rank only what it holds), else every tensor whole.
template <class E>
void load_engine_state(E& engine, const StateSource& src) {
  if constexpr (requires { engine.load_state(src); }) {
    engine.load_state(src);
  } else {
    engine.load_state_dict(src.materialize());
  }
}

/// Engines that lay out a reference given to fit() (FitParts::reference) as their own:
/// `engine.adopt_reference(CausalLM)` (Sharding<FSDP>: sharded over its shard groups).
template <class E>
concept adopts_reference = requires(const E& e, CausalLM m) { e.adopt_reference(std::move(m)); };

/// The engine type of a Rollout policy (int for NoRollout: an offline trainer has none).
template <class R>
struct rollout_engine_of {
  using type = int;
};
template <class R>
  requires requires { typename R::engine_type; }
struct rollout_engine_of<R> {
  using type = typename R::engine_type;
};

}  // namespace detail

/// What fit() did.
struct FitResult {
  int64_t steps = 0;               ///< the last step done (resumed steps included)
  int64_t resumed_from = 0;        ///< the step a checkpoint gave (0: a fresh run)
  std::map<std::string, double> last_metrics;  ///< the last step's metrics
  std::string last_checkpoint;     ///< the newest checkpoint written ("" without output_dir)
};

/// Extras of fit() that are not configuration.
struct FitParts {
  /// The frozen reference of algorithms that read one; default: a copy of the policy as fit()
  /// receives it (before a checkpoint's weights are loaded), so a resumed run has the same one.
  /// Under Sharding<FSDP> on several ranks either is sharded over the ranks as the policy is
  /// (each rank stores 1/world of it; metric sharding/reference_elements_per_rank).
  std::optional<CausalLM> reference;
  /// Where the progress line goes (nullptr: nowhere).
  std::FILE* progress = stderr;
  /// Tokenizer files to copy next to the final model (tokenizer.model, tokenizer.json, ...).
  std::vector<std::string> tokenizer_files;
  /// Decodes response ids to text for the reward (online; a tokenizer's decode). Without it the
  /// reward sees the response ids only.
  DecodeFn decode;
  /// The configuration saved as run_config.json; default: the trainer's Options (a program with
  /// more keys, as `hybridrl train`, passes its whole configuration).
  std::optional<nlohmann::json> run_config;
  /// dtype of the rollout engine's copy of the weights (online); default: the policy's.
  std::optional<at::ScalarType> rollout_dtype;
  /// The critic of algorithms that train one (PPO); default: the policy's trunk with a freshly
  /// initialised score head (verl's critic init; drawn from trainer.seed), made when fit() starts
  /// from the policy as fit() receives it.
  std::optional<ValueModel> critic;
  /// Called after each step is logged (and checkpointed when due) with its number and metrics;
  /// what it throws ends fit() as a crash would (the tests' interruption).
  std::function<void(int64_t step, const std::map<std::string, double>& metrics)> on_step;
  /// The data-parallel group when fit() runs on several ranks (torchrun, Slurm: every rank calls
  /// fit with the same arguments; the Trainer is built with world_size = comm->size()). Each rank
  /// takes its share of every batch, the policy (and critic) are sharded over the group, the loss
  /// counts and metrics are global, and rank 0 alone writes files. nullptr: one process.
  std::shared_ptr<Communicator> comm;
  /// Online: a directory of recorded rollouts (a run's output_dir/rollouts, written with
  /// trainer.record_rollouts_every). Every step of this run takes its batch — tokens, masks, the
  /// engine's log-probs, rewards — from the recording of its step number instead of generating
  /// and scoring; resumed from the checkpoint before the first recorded step, the steps replay to
  /// the recorded run's losses bit for bit (trainer/recorded_step.hpp). Metric
  /// replay/weights_fingerprint: the recording's rollout/weights_fingerprint.
  std::string replay_dir;
};

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
  /// True when the algorithm trains a critic (PPO): the Options have critic.* keys and fit() a
  /// value model.
  static constexpr bool has_critic = rules_hold_ && detail::needs_critic_v<algorithm_type>;

  using algorithm_options = typename detail::options_of<algorithm_type, rules_hold_>::type;
  using sharding_options = typename detail::options_of<sharding_type, rules_hold_>::type;
  using rollout_options = typename detail::options_of<rollout_type, rules_hold_>::type;
  using loader_options = typename detail::options_of<loader_type, rules_hold_>::type;

  /// Everything the trainer needs at run time: the run (trainer.*, with the one seed), the data
  /// (data.*), one Options struct per policy, the optimizer and the geometry. Configuration keys:
  /// trainer.*, data.*, algorithm.*, optim.*, critic.* (algorithms with a critic), sharding.*,
  /// rollout.* (online only), loader.*, geometry.* (core/config.hpp reads and writes them).
  struct Options {
    HYBRIDRL_ARG(TrainerOptions, trainer) = {};
    HYBRIDRL_ARG(DataOptions, data) = {};
    HYBRIDRL_ARG(algorithm_options, algorithm) = {};
    HYBRIDRL_ARG(OptimizerOptions, optim) = {};
    HYBRIDRL_ARG(CriticOptions, critic) = {};
    HYBRIDRL_ARG(sharding_options, sharding) = {};
    HYBRIDRL_ARG(rollout_options, rollout) = {};
    HYBRIDRL_ARG(loader_options, loader) = {};
    HYBRIDRL_ARG(BatchGeometry, geometry) = {};
    HYBRIDRL_ARG(PlacementOptions, placement) = {};

    /// The field visitor (HYBRIDRL_FIELDS, except that an offline trainer has no rollout key and
    /// an algorithm without a critic no critic key).
    template <class Self, class F>
    static void visit_fields(Self& self, F&& f) {
      f("trainer", self.trainer_);
      f("data", self.data_);
      f("algorithm", self.algorithm_);
      f("optim", self.optim_);
      if constexpr (has_critic) f("critic", self.critic_);
      f("sharding", self.sharding_);
      if constexpr (has_rollout) f("rollout", self.rollout_);
      f("loader", self.loader_);
      f("geometry", self.geometry_);
      f("placement", self.placement_);
    }

    /// Takes a whole geometry, e.g. `StaticBatch<64, 8, 8, 16, 4>::geometry()` (checked at compile
    /// time): its prompts per step go to data.train_batch_size, its samples per prompt to
    /// rollout.n (online), the rest to the geometry.
    Options& static_batch(const BatchGeometry& g) {
      geometry_ = g;
      data_.train_batch_size(g.train_batch_size());
      if constexpr (has_rollout && requires { rollout_.n(int64_t{1}); }) rollout_.n(g.rollout_n());
      return *this;
    }

    /// The geometry as the run uses it, with the values other keys own copied in: prompts per
    /// step (data.train_batch_size), samples per prompt (rollout.n; 1 offline), the rollout's
    /// tensor-parallel size and the training's model-parallel size (Sharding<TP3D>).
    [[nodiscard]] BatchGeometry effective_geometry() const {
      BatchGeometry g = geometry_;
      g.train_batch_size(data_.train_batch_size());
      g.rollout_n(1);
      if constexpr (has_rollout && detail::has_samples_per_prompt<rollout_options>) g.rollout_n(rollout_.n());
      if constexpr (has_rollout && detail::has_tensor_parallel_size<rollout_options>) {
        g.rollout_tensor_parallel_size(rollout_.tensor_parallel_size());
      }
      if constexpr (requires { sharding_.tensor_parallel_size(); sharding_.pipeline_parallel_size(); }) {
        g.model_parallel_size(sharding_.tensor_parallel_size() * sharding_.pipeline_parallel_size());
      }
      return g;
    }

    /// A copy with every derived value written in: the world size of the process group, the
    /// geometry's owned values, the loader's batch size from data.train_batch_size, and the loader
    /// and sampling seeds from trainer.seed.
    /// A geometry world_size set by hand (not 1, e.g. by StaticBatch) must agree with
    /// `world_size`; without one, the geometry's is kept (a single process describing a run).
    /// With a placement (placement.actor), the geometry's world is the actor's ranks: they
    /// share each batch; the map is checked against `world_size` here, before any work.
    [[nodiscard]] Options resolved(std::optional<int64_t> world_size = std::nullopt) const {
      const int64_t world = world_size.value_or(1);
      int64_t actors = world;
      if (world_size) {
        check_placement(world);
        actors = static_cast<int64_t>(placement_.actor_ranks(world).size());
      }
      HYBRIDRL_CHECK(!world_size || geometry_.world_size() == 1 || geometry_.world_size() == actors,
                     fmt::format("geometry.world_size = {} but the process group has {} rank(s){}",
                                 geometry_.world_size(), world,
                                 actors != world ? fmt::format(", {} of them the actor's", actors) : std::string()),
                     "leave geometry.world_size unset: the trainer reads it from the process "
                     "group (launch with as many ranks as you meant)");
      Options o = *this;
      if (world_size) o.geometry_.world_size(actors);
      o.geometry_ = o.effective_geometry();
      if constexpr (requires { o.loader_.batch_size(int64_t{1}); }) {
        o.loader_.batch_size(o.geometry_.train_batch_size());
      }
      if constexpr (requires { o.loader_.seed(uint64_t{1}); }) {
        o.loader_.seed(derive_seed(trainer_.seed(), "loader"));
      }
      if constexpr (has_rollout && detail::has_sampling<rollout_options>) {
        o.rollout_.sampling().seed(derive_seed(trainer_.seed(), "sampling"));
      }
      return o;
    }

    /// Throws hybridrl::Error (problem starting with "placement.") when placement.* does not fit
    /// a process group of `world` ranks (PlacementOptions::check_world), or places models apart
    /// under a Sharding policy that cannot (only Sharding<FSDP> shards frozen models over any
    /// group of ranks).
    void check_placement(int64_t world) const {
      try {
        placement_.validate();
        placement_.check_world(world, has_rollout);
      } catch (const Error& e) {
        throw Error("placement." + e.problem(), e.fix());
      }
      if constexpr (!detail::places_models<sharding_type>) {
        const auto actor = placement_.actor_ranks(world);
        HYBRIDRL_CHECK(static_cast<int64_t>(actor.size()) == world && placement_.reference_ranks(world) == actor &&
                           placement_.reward_ranks(world) == actor,
                       fmt::format("placement.* puts models on different ranks, but Sharding<{}> keeps every model "
                                   "on the ranks of its own mesh", sharding_type::name),
                       "use Sharding<FSDP> to place the reference or the reward on their own ranks, or leave "
                       "placement.* unset");
      }
    }

    /// Validates every part and the rules across axes; throws hybridrl::Error whose problem
    /// starts with the full dotted key ("rollout.block_size = 0 ..."). The geometry is checked
    /// with its world_size (the Trainer sets it from the process group) and the rollout's
    /// tensor-parallel size.
    void validate() const {
      detail::validate_member(trainer_, "trainer");
      detail::validate_member(data_, "data");
      detail::validate_member(algorithm_, "algorithm");
      detail::validate_member(optim_, "optim");
      if constexpr (has_critic) detail::validate_member(critic_, "critic");
      detail::validate_member(sharding_, "sharding");
      if constexpr (!detail::writes_sharded_state<sharding_type>) {
        HYBRIDRL_CHECK(trainer_.checkpoint_format() != "sharded",
                       fmt::format("trainer.checkpoint_format = sharded, but Sharding<{}> writes full checkpoints only",
                                   sharding_type::name),
                       "set trainer.checkpoint_format=full (it loads at any world size too), or use Sharding<FSDP>");
      }
      if constexpr (has_rollout) detail::validate_member(rollout_, "rollout");
      if constexpr (!has_rollout) {
        HYBRIDRL_CHECK(trainer_.record_rollouts_every() == 0,
                       fmt::format("trainer.record_rollouts_every = {} but an offline algorithm generates no rollouts",
                                   trainer_.record_rollouts_every()),
                       "set trainer.record_rollouts_every=0 (the dataset is the record of an offline run)");
      }
      detail::validate_member(loader_, "loader");
      detail::validate_member(placement_, "placement");
      const BatchGeometry g = effective_geometry();
      // the mesh first: a tensor-parallel size that does not tile the world breaks the geometry too
      if constexpr (detail::checks_world<sharding_options>) {
        try {
          sharding_.check_world(g.world_size());
        } catch (const Error& e) {
          throw Error("sharding." + e.problem(), e.fix());
        }
      }
      try {
        detail::validate_member(g, "geometry");
      } catch (const Error& e) {  // two of the geometry's counts have other keys in a Trainer
        std::string problem = e.problem();
        constexpr std::string_view train = "geometry.train_batch_size", world = "geometry.world_size";
        if (problem.rfind(train, 0) == 0) {
          problem = "data.train_batch_size" + problem.substr(train.size());
        } else if (problem.rfind(world, 0) == 0) {  // the launch's rank count, not a key
          problem = "the world size" + problem.substr(world.size());
        }
        throw Error(problem, e.fix() + " (prompts per step: data.train_batch_size; samples per prompt: rollout.n)");
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
                                   "data.train_batch_size = {} prompts",
                                   loader_.max_tokens_per_batch(), data_.train_batch_size()),
                       "set loader.max_tokens_per_batch = 0 (token budgets apply to offline "
                       "batches; the update's micro-batches are set by the geometry)");
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

  /// Trains `policy` in place on `data` (a dataset of the algorithm's kind) — offline algorithms
  /// (DPO, KTO, yours). Each step: a batch of data.train_batch_size units from the loader; the
  /// reference's scores of the whole batch; then geometry.ppo_epochs passes of mini-batches
  /// (geometry.ppo_mini_batch_size units, one optimizer step each) of micro-batches
  /// (geometry.micro_batch_size_per_gpu, gradients accumulated). Writes metrics, checkpoints and
  /// the final model under trainer.output_dir; resumes by trainer.resume. Bad input (an empty
  /// dataset, a geometry the data cannot fill, a checkpoint of another run) is an Error before the
  /// first step.
  template <class D>
    requires(!has_rollout)
  FitResult fit(CausalLM policy, std::shared_ptr<const D> data, FitParts parts = {}) {
    return fit_impl(std::move(policy), std::move(data), BatchRewardFn{}, std::move(parts));
  }

  /// As above, with the dataset taken by value.
  template <class D>
    requires(!has_rollout && !std::is_pointer_v<D>)
  FitResult fit(CausalLM policy, D data, FitParts parts = {}) {
    return fit(std::move(policy), std::shared_ptr<const D>(std::make_shared<D>(std::move(data))), std::move(parts));
  }

  /// Trains `policy` in place on the prompts of `data` — online algorithms (PPO, GRPO, yours).
  /// Each step: data.train_batch_size prompts, each repeated rollout.n times with one group id;
  /// the rollout engine (its own copy of the weights, in the rollout's dtype) samples the
  /// responses (with rollout.free_cache_engine its KV pool is then freed until the next step);
  /// `reward` scores them (a step with a NaN or infinite score is reported and not trained on),
  /// each score placed on its response's last token where the algorithm reads
  /// token_level_scores; the reference's and the policy's per-token log-probs (old log-probs);
  /// with a critic (PPO) its values (old_values); the algorithm's advantages; the update as for
  /// offline algorithms — with a critic, each mini-batch also steps the critic on the value loss
  /// (from the first step; the policy from step critic.warmup_steps + 1); the new weights to the
  /// rollout engine, bucket by bucket. `parts.decode` gives the reward the response text;
  /// `parts.critic` the critic (default: the policy's trunk, a fresh score head).
  template <class D>
    requires(has_rollout)
  FitResult fit(CausalLM policy, std::shared_ptr<const D> data, BatchRewardFn reward, FitParts parts = {}) {
    HYBRIDRL_CHECK(static_cast<bool>(reward), "fit: no reward function given",
                   "pass a RewardFn or BatchRewardFn, e.g. builtin_reward(\"exact_match\")");
    return fit_impl(std::move(policy), std::move(data), std::move(reward), std::move(parts));
  }

  /// As above, with a per-sample reward and the dataset taken by value.
  template <class D>
    requires(has_rollout && !std::is_pointer_v<D>)
  FitResult fit(CausalLM policy, D data, RewardFn reward, FitParts parts = {}) {
    return fit(std::move(policy), std::shared_ptr<const D>(std::make_shared<D>(std::move(data))),
               batched(std::move(reward)), std::move(parts));
  }

  /// The checkpoint trainer.resume names: for `auto` the newest complete one under
  /// output_dir/checkpoints (none: a fresh run); for `never` none (checkpoints already there are
  /// an Error: they would be mixed with the new run's); else the path given, which must be one.
  [[nodiscard]] std::optional<std::string> find_resume_checkpoint() const {
    const auto& t = options_.trainer();
    const auto dir = std::filesystem::path(t.output_dir()) / "checkpoints";
    const bool has_dir = !t.output_dir().empty() && std::filesystem::is_directory(dir);
    if (t.resume() == "auto") {
      if (!has_dir) return std::nullopt;
      return CheckpointManager(dir.string(), t.keep_last()).latest();
    }
    if (t.resume() == "never") {
      HYBRIDRL_CHECK(!has_dir || CheckpointManager(dir.string(), t.keep_last()).list().empty(),
                     fmt::format("trainer.resume = never but '{}' holds checkpoints of an earlier run", dir.string()),
                     "choose another trainer.output_dir, remove its checkpoints, or set trainer.resume=auto");
      return std::nullopt;
    }
    HYBRIDRL_CHECK(std::filesystem::is_directory(t.resume()),
                   fmt::format("trainer.resume = {} is not a directory", t.resume()),
                   "use auto, never, or a checkpoint directory (…/checkpoints/step_00000100)");
    return t.resume();
  }

  /// One line per axis plus the effective batch geometry, as printed at the start of training.
  [[nodiscard]] std::string describe() const {
    std::string out = fmt::format("hybridrl trainer: Algorithm<{}> Sharding<{}> ", algorithm_type::name,
                                  sharding_type::name);
    if constexpr (has_rollout) out += fmt::format("Rollout<{}> ", rollout_type::name);
    out += fmt::format("Loader<{}>\n{}", loader_type::name, options_.geometry().describe());
    return out;
  }

 private:
  /// The fit loop of both forms (see fit()). Defined out of the class: not inline, so an
  /// `extern template` declaration of it (trainer/presets.hpp) keeps it out of users' objects.
  template <class D>
  FitResult fit_impl(CausalLM policy, std::shared_ptr<const D> data, BatchRewardFn reward, FitParts parts);

  /// The keys of `lists` that `source` produces, each once.
  static std::vector<ScoredKey> scored_keys(KeySource source, std::initializer_list<std::vector<Key>> lists) {
    std::vector<ScoredKey> out;
    std::set<std::string> seen;
    for (const auto& l : lists) {
      for (const auto& key : l) {
        auto k = scored_key(key.name);
        if (k.source == source && seen.insert(k.key).second) out.push_back(std::move(k));
      }
    }
    return out;
  }

  /// score_keys with the loader's packing when it packs (Loader<Packed>).
  template <class Forward>
  std::map<std::string, at::Tensor> score_micro(const TensorBatch& micro, const std::vector<ScoredKey>& keys,
                                                Forward&& forward) const {
    if constexpr (requires(const TensorBatch& b) { loader_type::pack(b, options_.loader()); }) {
      const auto& lo = options_.loader();
      auto pack = [&lo](const TensorBatch& b) { return loader_type::pack(b, lo); };
      return detail::score_keys(micro, keys, forward, &pack);
    } else {
      return detail::score_keys(micro, keys, forward, static_cast<const std::nullptr_t*>(nullptr));
    }
  }

  /// The CPU generator's state under "rng.cpu" (the fit loop draws nothing itself; a user's hook
  /// may).
  static void save_rng(std::map<std::string, at::Tensor>& tensors) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    tensors["rng.cpu"] = gen.get_state();
  }
  static void restore_rng(const std::map<std::string, at::Tensor>& tensors) {
    auto it = tensors.find("rng.cpu");
    if (it == tensors.end()) return;
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(it->second);
  }

  Options options_;
};

template <class... Policies>
template <class D>
FitResult Trainer<Policies...>::fit_impl(CausalLM policy, std::shared_ptr<const D> data, BatchRewardFn reward,
                                        FitParts parts) {
  static_assert(detail::makes_training_engine<sharding_type, sharding_options>,
                "hybridrl: fit() needs a Sharding policy whose make(model, options, optim, total_steps, "
                "world_size) builds a training engine (Sharding<FSDP>). Use Sharding<FSDP> for now.");
  using clock = std::chrono::steady_clock;
  const auto& o = options_;
  const auto& t = o.trainer();
  const auto& g = o.geometry();
  HYBRIDRL_CHECK(data != nullptr, "fit: no dataset given", "pass the training dataset");
  // placement (placement.*): the actor's ranks train and generate; the reference's and the
  // reward's ranks score. The sub-groups are split here, on every rank alike.
  const auto pl = detail::make_placement(parts.comm, o.placement(), has_rollout);
  // the data, from the checkpoint's position when resuming (a rank outside the actor needs no state)
  const auto resume = find_resume_checkpoint();
  std::optional<CheckpointData> ckpt;
  if (resume && pl.in_actor()) ckpt = CheckpointManager::load(*resume);
  std::optional<LoaderState> loader_state;
  if (ckpt) {
    HYBRIDRL_CHECK(ckpt->meta.contains("loader"), fmt::format("checkpoint '{}' has no loader position", *resume),
                   "resume from a checkpoint written by fit()");
    loader_state = ckpt->meta["loader"].template get<LoaderState>();
  }
  auto loader = loader_type::make(data, o.loader(), loader_state);
  const int64_t epochs = o.loader().epochs();
  int64_t total = t.total_steps();
  int64_t available = 0;  // batches the loader's epochs hold (0: endless)
  for (int64_t e = 0; e < epochs; ++e) available += loader.batches_in_epoch(e);
  if (total == 0) {
    HYBRIDRL_CHECK(epochs > 0, "trainer.total_steps = 0 with loader.epochs = 0 (endless) gives no end",
                   "set trainer.total_steps, or a number of loader.epochs");
    total = available;
  }
  HYBRIDRL_CHECK(epochs == 0 || total <= available,
                 fmt::format("trainer.total_steps = {} but loader.epochs = {} hold {} batches of data.train_batch_size "
                             "= {}", total, epochs, available, g.train_batch_size()),
                 "set loader.epochs=0 (endless), more epochs, or trainer.total_steps=0 (as many steps as the epochs hold)");
  if constexpr (has_rollout && requires { o.loader().drop_last(); }) {
    // an epoch's last batch, short of data.train_batch_size (loader.drop_last=false), must split
    // over the generating ranks too: refused now, not when the run reaches it (every rank alike)
    const auto generating = static_cast<int64_t>(pl.actor.size());
    const int64_t rest = data->size() % g.train_batch_size();
    HYBRIDRL_CHECK(o.loader().drop_last() || rest % generating == 0 || total < loader.batches_in_epoch(0),
                   fmt::format("data.train_batch_size = {} leaves a last batch of {} prompt(s) in each epoch of {}, "
                               "which does not split over {} generating ranks",
                               g.train_batch_size(), rest, data->size(), generating),
                   fmt::format("set loader.drop_last=true (the short batch is skipped), or give a dataset whose size "
                               "leaves a multiple of {} prompts", generating));
  }
  const int64_t minis = std::max<int64_t>(1, g.train_batch_size() / g.ppo_mini_batch_size());
  const int64_t optimizer_steps = total * g.ppo_epochs() * minis;
  // the reference before the policy changes (a resumed run gets the same one): the engine's,
  // laid out as the policy is (Sharding<FSDP>: 1/world of it per rank), made before a checkpoint
  // loads; otherwise a copy of the policy as given, made here
  using Reference = typename detail::reference_of<sharding_type>::type;
  constexpr bool engine_reference = detail::engine_makes_reference<sharding_type>;
  const bool wants_reference = algorithm_type::uses_reference(o.algorithm());
  std::optional<CausalLM> given_reference = std::move(parts.reference);
  parts.reference.reset();
  // the reference computes at the policy's precision (mixed precision: under the same autocast),
  // so both agree while the policy has not moved
  auto at_policy_precision = [&](CausalLM& ref) {
    if constexpr (requires { o.sharding().param_dtype(); }) {
      if (o.sharding().param_dtype() != ref->parameters().front().scalar_type()) {
        ref->model->set_layer_runner(autocast_runner(o.sharding().param_dtype(), default_layer_runner()));
      }
    }
  };
  std::optional<Reference> reference;
  if constexpr (!engine_reference) {
    if (given_reference || wants_reference) {
      reference = given_reference ? std::move(*given_reference) : make_reference(policy);
      given_reference.reset();
      at_policy_precision(*reference);
    }
  }
  const auto device = policy->parameters().front().device();
  // the keys each model scores, and how the reference and the reward score a batch of rows
  const auto reads = algorithm_type::loss_reads(o.algorithm());
  const auto prepares = algorithm_type::prepare_reads(o.algorithm());
  std::vector<Key> advantage_reads;
  if constexpr (has_rollout) advantage_reads = algorithm_type::advantage_reads(o.algorithm());
  LogProbOptions lp;
  // micro-batch sizes: the largest that fits (trainer/micro_batch.hpp); measured from memory in a
  // one-process CUDA run, where each pass's first micro-batch is measured (the high-water mark
  // above its start; the phase's own peak carried past the reset in `probe_peak`)
  MicroBatchSizer sizer(micro_batch_options(g), g.micro_batch_size_per_gpu(),
                        device.is_cuda() && !pl.world && g.world_size() == 1);
  const int cuda_index = device.index() < 0 ? 0 : device.index();
  int64_t probe_peak = 0;
  std::map<std::string, double> micro_sizes;  // the step's chosen sizes (geometry/micro_batch_<pass>)
  // the micro-batches of `rows` for `pass`; `measured(pass, i, micro, work)` runs micro-batch i's
  // work, recording its memory for the sizer when it is the pass's first
  auto micro_batches = [&](const TensorBatch& rows, MicroPass pass) {
    std::optional<int64_t> available_bytes;
    if (sizer.measures()) {
      const auto mem = detail::compat::cuda_memory(cuda_index);
      if (const auto free = available_memory(device)) available_bytes = *free + (mem.reserved - mem.allocated);
    }
    const int64_t row_tokens = rows.has_tensor(keys::input_ids.str()) ? rows.tensor(keys::input_ids).size(1) : 1;
    const auto n = sizer.choose(pass, rows.size(), row_tokens, available_bytes);
    auto& seen = micro_sizes[pass == MicroPass::update ? "geometry/micro_batch_update" : "geometry/micro_batch_scoring"];
    seen = std::max(seen, static_cast<double>(n));
    return rows.split(n);
  };
  auto measured = [&](MicroPass pass, size_t index, const TensorBatch& micro, const auto& work) {
    if (index != 0 || !sizer.measures()) return work();
    const auto before = detail::compat::cuda_memory(cuda_index);
    probe_peak = std::max(probe_peak, before.peak_allocated);
    detail::compat::reset_cuda_peak(cuda_index);
    const auto start = detail::compat::cuda_memory(cuda_index).allocated;
    auto out = work();
    const auto after = detail::compat::cuda_memory(cuda_index);
    probe_peak = std::max(probe_peak, after.peak_allocated);
    const int64_t row_tokens = micro.has_tensor(keys::input_ids.str()) ? micro.tensor(keys::input_ids).size(1) : 1;
    sizer.observe(pass, static_cast<int64_t>(micro.size()) * row_tokens, after.peak_allocated - start);
    return out;
  };
  // one gradient-accumulation pass over a mini-batch's micro-batches: score `keys` with `forward`,
  // check the loss's `needs`, the loss, its backward; `each` takes every micro-batch's LossOutput
  // (`scored` sees each micro-batch once its keys are scored, before the loss reads them)
  auto accumulate = [&](const TensorBatch& mini, const std::vector<ScoredKey>& keys, const auto& forward,
                        const std::vector<Key>& needs, const char* what, const auto& loss_of, const auto& backward,
                        const auto& each, const auto& scored) {
    auto micros = micro_batches(mini, MicroPass::update);
    for (size_t i = 0; i < micros.size(); ++i) {
      auto& micro = micros[i];
      each(measured(MicroPass::update, i, micro, [&] {
        for (auto& [k, x] : score_micro(micro, keys, forward)) micro.set(k, x);
        scored(micro);
        micro.require(needs, what);
        auto out = loss_of(micro);
        backward(out.loss);
        return out;
      }));
    }
  };
  const auto ref_keys = scored_keys(KeySource::reference, {reads, prepares, advantage_reads});
  auto score_reference = [&](const TensorBatch& rows) {  // by micro-batches (a sharded reference: collective)
    std::map<std::string, std::vector<at::Tensor>> got;
    const auto micros = micro_batches(rows, MicroPass::scoring);
    for (size_t i = 0; i < micros.size(); ++i) {
      auto scored = measured(MicroPass::scoring, i, micros[i], [&] {
        return score_micro(micros[i], ref_keys, detail::frozen_forward(*reference, lp));
      });
      for (auto& [k, v] : scored) got[k].push_back(v);
    }
    TensorBatch out;
    for (auto& [k, v] : got) out.set(k, at::cat(v));
    return out;
  };
  auto score_reward = [&](const TensorBatch& rows) {
    TensorBatch out;
    out.set(keys::scores.str(), detail::score_rollout(rows, reward, parts.decode));
    return out;
  };
  const bool placed_reference = pl.reference_apart && (given_reference.has_value() || wants_reference);
  const int64_t pad_id = policy->config().pad_token_id.value_or(0);
  if constexpr (detail::places_models<sharding_type>) {
    if (placed_reference) {  // sharded over its own ranks, from the policy as given (before the engine empties it)
      if (pl.in_reference()) {
        // the policy computes on param_dtype copies of its weights; the reference stores its
        // weights in param_dtype (cast once, or gathered in it), so the two agree bit for bit
        // while the policy has not moved
        auto copy = given_reference ? std::move(*given_reference) : make_reference(policy);
        reference.emplace(std::move(copy), pl.reference_comm, o.sharding().param_dtype());
      }
      given_reference.reset();
    }
  }
  if (!pl.in_actor()) {  // a rank outside the actor scores what rank 0 sends until it says done
    while (true) {
      const auto sig = detail::placed_signal(*pl.world, device);
      const auto op = static_cast<detail::PlacedOp>(sig[0]);
      if (op == detail::PlacedOp::done) {
        FitResult served;
        served.steps = sig[1];
        served.resumed_from = sig[2];
        return served;
      }
      HYBRIDRL_CHECK(op != detail::PlacedOp::abort,
                     fmt::format("placement: rank {} scores for the actor's ranks, which stopped with an error",
                                 pl.rank),
                     "read rank 0's message: it names the problem");
      if (op == detail::PlacedOp::reward) {
        (void)detail::placed_exchange(nullptr, pl, pl.reward, score_reward, pad_id, true, device);
      } else {
        (void)detail::placed_exchange(nullptr, pl, pl.reference, score_reference, pad_id, false, device);
      }
    }
  }
  // several ranks: this rank's place in the actor, its share of each batch, the sharded engines
  const auto& comm = pl.actor_comm;
  const int64_t world = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  HYBRIDRL_CHECK(g.world_size() == world,
                 fmt::format("fit: the process group has {} rank(s) but the Trainer was built for world_size {}", world,
                             g.world_size()),
                 "construct the Trainer with the group's size: Trainer(options, comm->size())");
  const bool lead = rank == 0;  // writes the files, prints the progress
  auto make_engine = [&] {
    if constexpr (requires { sharding_type::make(policy, o.sharding(), o.optim(), optimizer_steps, comm); }) {
      if (world > 1) return sharding_type::make(policy, o.sharding(), o.optim(), optimizer_steps, comm);
    } else {
      HYBRIDRL_CHECK(world == 1, fmt::format("fit: {} runs one process; the group has {} ranks", sharding_type::name, world),
                     "use Sharding<FSDP> on several ranks");
    }
    return sharding_type::make(policy, o.sharding(), o.optim(), optimizer_steps, g.world_size());
  };
  // the critic's model from the policy's trunk, before a sharded engine empties the policy
  std::optional<ValueModel> critic_model;
  if constexpr (has_critic) {
    critic_model = parts.critic ? *parts.critic : detail::seeded_value_model(policy, derive_seed(t.seed(), "critic"));
    parts.critic.reset();
    (*critic_model)->to(device);
  }
  auto engine = make_engine();
  if constexpr (engine_reference) {  // laid out like the policy, before its first step
    if (given_reference) {
      if constexpr (detail::adopts_reference<decltype(engine)>) {
        reference.emplace(engine.adopt_reference(std::move(*given_reference)));
      } else {
        static_assert(std::is_same_v<Reference, CausalLM>,
                      "hybridrl: this Sharding policy's make_reference() returns its own type but its engine has no "
                      "adopt_reference(CausalLM) for a reference given in FitParts. Give the engine one.");
        reference.emplace(std::move(*given_reference));
        at_policy_precision(*reference);
      }
      given_reference.reset();
    } else if (wants_reference && !placed_reference) {
      reference.emplace(engine.make_reference());
    }
  }
  // the ranks that see different data: the engine's data-parallel group under Sharding<TP3D>
  // (the ranks of one tensor-parallel group share every batch), the whole group otherwise
  std::shared_ptr<Communicator> dp_comm = comm, tp_comm;
  if constexpr (requires { engine.data_parallel_group(); engine.tensor_parallel_group(); }) {
    if (world > 1) {
      dp_comm = engine.data_parallel_group();
      tp_comm = engine.tensor_parallel_group();
    }
  }
  const int64_t dp = dp_comm ? dp_comm->size() : 1, dp_rank = dp_comm ? dp_comm->rank() : 0;
  const bool shared_batches = tp_comm && tp_comm->size() > 1;
  // the critic (PPO): its own engine and optimizer; from the policy's trunk unless one is given
  using CriticEngine = typename detail::critic_engine_of<sharding_type, has_critic>::type;
  std::optional<CriticEngine> critic;
  if constexpr (has_critic) {
    static_assert(detail::makes_critic_engine<sharding_type, sharding_options>,
                  "hybridrl: this Algorithm trains a critic (needs_critic = true), but its Sharding policy has no "
                  "make_critic(ValueModel, options, optim, total_steps, world_size). Use Sharding<FSDP>, or give "
                  "your Sharding policy a make_critic and a critic_engine_type.");
    ValueModel value_model = std::move(*critic_model);
    critic_model.reset();
    if constexpr (requires { sharding_type::make_critic(value_model, o.sharding(), o.critic().optim(), optimizer_steps, comm); }) {
      if (world > 1) {
        critic.emplace(sharding_type::make_critic(value_model, o.sharding(), o.critic().optim(), optimizer_steps, comm));
      }
    }
    if (!critic) {
      critic.emplace(sharding_type::make_critic(value_model, o.sharding(), o.critic().optim(), optimizer_steps,
                                                g.world_size()));
    }
  }
  auto state = algorithm_type::make_state(o.algorithm());
  int64_t step = 0;
  if (ckpt) {
    const auto src = ckpt->source();  // a sharded checkpoint: each rank reads the ranges it holds
    detail::load_engine_state(engine, *src);
    if constexpr (has_critic) detail::load_engine_state(*critic, PrefixedSource(*src, "critic."));
    if constexpr (detail::saves_algorithm_state<algorithm_type>) {
      if (ckpt->meta.contains("algorithm_state")) {
        algorithm_type::load_state(state, ckpt->algorithm_state());
      }
    }
    step = ckpt->step;
    restore_rng(ckpt->tensors);
    ckpt.reset();  // the state is in the engines now: do not hold a second copy through the run
  }
  // online: the rollout engine holds its own copy of the weights, in the rollout's dtype
  using RolloutEngine = typename detail::rollout_engine_of<rollout_type>::type;
  std::optional<RolloutEngine> rollout;
  auto sync_weights = [&] {
    if constexpr (has_rollout) {
      engine.export_weights(rollout->weight_spec(), [&](const WeightBucket& b) { rollout->load_weights(b); });
    }
  };
  if constexpr (has_rollout) {
    const auto dtype = parts.rollout_dtype.value_or(policy->parameters().front().scalar_type());
    rollout.emplace(rollout_type::make(policy->config(), o.rollout(), device, dtype));
    sync_weights();
  }
  FitResult result;
  result.resumed_from = step;
  std::optional<CheckpointManager> saver;
  if (!t.output_dir().empty() && lead) {
    saver.emplace((std::filesystem::path(t.output_dir()) / "checkpoints").string(), t.keep_last());
    io::write_file_atomic((std::filesystem::path(t.output_dir()) / "run_config.json").string(),
                          parts.run_config.value_or(to_json(o)).dump(2) + "\n");
  }
  std::FILE* progress = lead ? parts.progress : nullptr;
  RunLog log(RunLog::Options{lead ? t.output_dir() : std::string(), total, step, t.log_every(), t.plot_every(),
                             t.tensorboard(), progress});
  if (progress != nullptr) std::fprintf(progress, "%s\n", describe().c_str());
  if (progress != nullptr && (pl.has_servers() || pl.reference_apart || pl.reward_apart)) {
    std::fprintf(progress, "placement: %s (ranks)\n", pl.describe(has_rollout).c_str());
  }
  // ranks outside the actor wait for rank 0's signals: when this rank leaves the loop with an error
  // that is not an exchange's (which every rank throws together), tell them, so none waits forever
  struct TellServers {
    const detail::Placement& pl;
    at::Device device;
    bool told = false;
    int exceptions = std::uncaught_exceptions();
    ~TellServers() {
      if (told || !pl.has_servers() || std::uncaught_exceptions() <= exceptions) return;
      try {
        detail::placed_signal(*pl.world, device, detail::PlacedOp::abort);
      } catch (...) {  // the error on its way out says what went wrong
      }
    }
  } tell_servers{pl, device};
  auto exchange = [&](detail::PlacedOp op, const TensorBatch& mine, const std::vector<int64_t>& scorers,
                      const std::function<TensorBatch(const TensorBatch&)>& score, bool columns) {
    try {
      if (pl.has_servers()) detail::placed_signal(*pl.world, device, op);
      return detail::placed_exchange(&mine, pl, scorers, score, pad_id, columns, device);
    } catch (const detail::PlacedError&) {
      tell_servers.told = true;  // every rank, servers included, throws this one
      throw;
    }
  };
  auto save = [&] {
    if (t.output_dir().empty()) return;
    if constexpr (detail::writes_sharded_state<sharding_type>) {
      if (t.checkpoint_format() == "sharded") {  // every rank writes its part, nothing gathered
        auto mine = engine.sharded_state();
        if constexpr (has_critic) {
          auto c = critic->sharded_state();
          c.prefix("critic.");
          mine.merge(std::move(c));
        }
        StateDict whole, hf;
        nlohmann::json meta;
        if (t.checkpoint_hf_weights()) {  // full weights, a layer at a time (every rank takes part)
          engine.export_weights(WeightSpec{}, [&](const WeightBucket& b) {
            if (!lead) return;
            for (const auto& w : b) hf[w.name] = w.tensor.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
          });
        }
        if (lead) {
          whole = mine.whole;
          save_rng(whole);
          meta["loader"] = loader.state();
          meta["config"] = to_json(o);
          if constexpr (detail::saves_algorithm_state<algorithm_type>) meta["algorithm_state"] = algorithm_type::save_state(state);
        }
        result.last_checkpoint = CheckpointManager::save_sharded(saver ? &*saver : nullptr, comm.get(), device, step,
                                                                 mine, whole, meta, config_to_json(policy->config()), hf);
        return;
      }
    }
    // full: every rank gathers the state (collective), rank 0 writes it
    auto tensors = engine.state_dict();
    if constexpr (has_critic) {
      for (auto& [k, v] : critic->state_dict()) tensors["critic." + k] = std::move(v);
    }
    if (!saver) return;
    nlohmann::json meta;
    meta["loader"] = loader.state();
    meta["config"] = to_json(o);
    if constexpr (detail::saves_algorithm_state<algorithm_type>) meta["algorithm_state"] = algorithm_type::save_state(state);
    save_rng(tensors);
    result.last_checkpoint = saver->save(step, tensors, meta, config_to_json(policy->config()));
  };
  const int64_t mini_rows = std::max<int64_t>(1, g.mini_batch_sequences_per_rank());
  // On-policy steps (one epoch of one mini-batch) take the old log-probs from the update's own
  // forward, detached: the policy has not moved when it runs, so a separate no-grad pass would
  // compute the same values (bf16 noise aside) for another forward over the batch — as TRL's
  // GRPO does with num_iterations = 1. Only where the loss reads them and nothing before the
  // update does (PPO's KL-in-reward reads them in the advantages: the pass runs there).
  auto reads_old = [](const std::vector<Key>& ks) {
    return std::any_of(ks.begin(), ks.end(), [](const Key& k) { return k.name == keys::old_log_probs.name; });
  };
  const bool old_from_update_here = has_rollout && g.old_log_probs_from_update() && g.ppo_epochs() == 1 &&
                                    reads_old(reads) && !reads_old(advantage_reads) && !reads_old(prepares);
  const auto loss_keys = scored_keys(
      KeySource::policy, {reads, old_from_update_here ? std::vector<Key>{keys::log_probs, keys::entropy} : std::vector<Key>{}});
  const auto prepare_keys = scored_keys(KeySource::policy, {prepares});
  auto engine_forward = [&engine](const TensorBatch& rows) { return engine.forward(rows); };
  // the update's forward; on-policy it is also asked for the entropy (the step's `entropy`
  // metric), which an engine that does not compute it leaves out of the metrics
  bool no_entropy = false;
  auto update_forward = [&engine, &no_entropy, old_from_update_here](const TensorBatch& rows) {
    auto out = engine.forward(rows);
    if (old_from_update_here && !out.has_tensor(keys::entropy.str())) {
      no_entropy = true;
      out.set(keys::entropy, at::zeros_like(out.tensor(keys::log_probs)));
    }
    return out;
  };
  std::vector<Key> value_reads;
  std::vector<ScoredKey> value_keys;
  if constexpr (has_critic) {
    value_reads = algorithm_type::value_loss_reads(o.algorithm());
    value_keys = scored_keys(KeySource::critic, {value_reads});
  }
  const bool token_scores =
      std::any_of(advantage_reads.begin(), advantage_reads.end(),
                  [](const Key& k) { return k.name == keys::token_level_scores.name; });
  bool released = false;  // the rollout's KV pool is freed between generations (free_cache_engine)
  while (step < total) {
    const auto t0 = clock::now();
    auto got = loader.next();
    if (!got) break;
    const auto info = loader.info();
    ++step;
    std::map<std::string, double> m;  // the step's metrics
    // CUDA: the peak of allocated memory in each phase (memory/peak_<phase>_gb), each phase's
    // high-water mark started afresh; the step's peak is the largest
    double step_peak = 0;
    micro_sizes.clear();
    probe_peak = 0;
    if (device.is_cuda()) detail::compat::reset_cuda_peak(cuda_index);
    auto phase_peak = [&](const char* phase) {
      if (!device.is_cuda()) return;
      // the phase's high-water mark: the allocator's since the last reset, and what a measured
      // micro-batch's reset carried over
      const auto peak = std::max(detail::memory_use(device).peak_gb, static_cast<double>(probe_peak) / (1024.0 * 1024.0 * 1024.0));
      probe_peak = 0;
      m[fmt::format("memory/peak_{}_gb", phase)] = peak;
      step_peak = std::max(step_peak, peak);
      detail::compat::reset_cuda_peak(cuda_index);
    };
    TensorBatch batch;
    bool train = true;
    int64_t step_tokens = info.real_tokens;
    if constexpr (has_rollout) {
      // generate: n samples per prompt, noise from (run seed, step, group, sample)
      const auto g0 = clock::now();
      if constexpr (requires { rollout->model(); }) {  // the weights this step generates with
        const auto f0 = clock::now();
        m["rollout/weights_fingerprint"] = static_cast<double>(weights_fingerprint(*rollout->model()));
        m["time/fingerprint"] = std::chrono::duration<double>(clock::now() - f0).count();  // part of time/generate
      }
      const bool replaying = !parts.replay_dir.empty();
      if (replaying) {  // the step's batch as a run recorded it: no generation, no reward call
        RecordedStepInfo recorded;
        batch = read_recorded_step(parts.replay_dir, step, rank, world, device, &recorded);
        step_tokens = batch.tensor(keys::attention_mask).sum().template item<int64_t>();
        m["replay/weights_fingerprint"] = recorded.weights_fingerprint;  // the recording's weights
      } else {
        auto prompts = repeat_for_rollout(*got, g.rollout_n());  // group ids of the whole batch
        // this rank's prompts, whole groups (their advantages are computed here). A tensor-parallel
        // group trains on one share but generates it split over its ranks (each a TP = 1 engine with
        // the full weights): generation shares go by world rank, training shares by data rank, and
        // with the tensor axis innermost a group's generation shares tile its training share.
        const int64_t gen_parts = shared_batches ? world : dp, gen_index = shared_batches ? rank : dp_rank;
        if (gen_parts > 1) {
          HYBRIDRL_CHECK(got->size() % gen_parts == 0,
                         fmt::format("step {}: {} prompts do not split over {} generating ranks", step, got->size(),
                                     gen_parts),
                         "make data.train_batch_size a multiple of the number of ranks (and loader.drop_last=true)");
          const auto share = prompts.size() / gen_parts;
          prompts = prompts.slice(gen_index * share, (gen_index + 1) * share);
        }
        auto sampling = o.rollout().sampling();
        sampling.seed(request_seed(sampling.seed(), step));
        if (released) rollout->resume_memory();
        batch = rollout->generate(prompts, sampling).to(device);
        const auto rs = rollout->stats();
        step_tokens = rs.prompt_tokens + rs.generated_tokens;
        m["memory/kv_cache_gb"] = static_cast<double>(rs.kv_cache_bytes) / (1024.0 * 1024.0 * 1024.0);
        m["rollout/kv_peak_utilization"] = rs.kv_peak_utilization;
        m["rollout/preemptions"] = static_cast<double>(rs.preemptions);  // sequences recomputed for want of KV blocks
        m["rollout/tokens_per_s"] = rs.seconds > 0 ? static_cast<double>(rs.generated_tokens) / rs.seconds : 0.0;
        if (shared_batches) {  // the group's shares, padded to their longest prompt and response, in rank order
          auto tokens = at::tensor(std::vector<int64_t>{step_tokens}, at::kLong).to(device);
          tp_comm->all_reduce(tokens, ReduceOp::sum);
          step_tokens = tokens.to(at::kCPU).item<int64_t>();
          batch = detail::gather_rollout_rows(batch, *tp_comm, pad_id, device);
        }
        if constexpr (requires { o.rollout().free_cache_engine(); }) {
          if (o.rollout().free_cache_engine()) {
            rollout->release_memory();  // the KV pool's memory goes to the scoring and update phases
            released = true;
          }
        }
      }
      m["time/generate"] = std::chrono::duration<double>(clock::now() - g0).count();
      phase_peak("generate");
      // reward
      const auto w0 = clock::now();
      const auto scores = replaying ? batch.tensor(keys::scores)
                          : pl.reward_apart
                              ? exchange(detail::PlacedOp::reward, batch, pl.reward, score_reward, true).tensor(keys::scores)
                              : detail::score_rollout(batch, reward, parts.decode);
      const auto finite = at::isfinite(scores);
      int64_t bad = (~finite).sum().template item<int64_t>();
      if (dp > 1) {  // every rank skips the step when any rank has a bad reward
        auto b = at::scalar_tensor(static_cast<double>(bad), at::kDouble).reshape({1});
        dp_comm->all_reduce(b, ReduceOp::sum);
        bad = static_cast<int64_t>(b.item<double>());
      }
      const auto ok = scores.masked_select(finite).to(at::kDouble);
      m["reward_mean"] = ok.numel() > 0 ? ok.mean().template item<double>() : NAN;
      m["reward_std"] = ok.numel() > 1 ? ok.std(/*unbiased=*/false).template item<double>() : 0.0;
      m["reward_nonfinite"] = static_cast<double>(bad);
      if (bad > 0) {
        train = false;  // reported, not trained on
        if (progress != nullptr) {
          std::fprintf(progress, "step %lld: %lld of %lld rewards are NaN or infinite; the step is not trained on\n",
                       static_cast<long long>(step), static_cast<long long>(bad),
                       static_cast<long long>(scores.numel() * dp));
        }
      }
      batch.set(keys::scores, scores);
      if (token_scores) batch.set(keys::token_level_scores, scores_on_last_token(scores, batch.tensor(keys::response_mask)));
      if (!replaying && t.record_rollouts_every() > 0 && step % t.record_rollouts_every() == 0) {
        RecordedStepInfo record;
        record.step = step;
        record.rank = rank;
        record.world = world;
        record.sampling_seed = request_seed(o.rollout().sampling().seed(), step);
        record.weights_fingerprint = m.count("rollout/weights_fingerprint") != 0 ? m["rollout/weights_fingerprint"] : 0.0;
        record_step((std::filesystem::path(t.output_dir()) / "rollouts").string(), batch, record);
      }
      const auto lens = batch.tensor(keys::response_mask).to(at::kDouble).sum(1);
      m["response_length_mean"] = lens.mean().template item<double>();
      m["time/reward"] = std::chrono::duration<double>(clock::now() - w0).count();
    } else {
      batch = got->to(device);
      if (dp > 1) {
        // this rank's rows, equal shares: the ranks' forwards are collective (a sharded policy
        // and reference), so every rank must run as many mini- and micro-batches. A batch that
        // does not split (an epoch's short last batch, a token budget's) is padded with copies of
        // its first rows, as PyTorch's DistributedSampler and verl pad; `data/repeated_rows`.
        const auto padded = batch.pad_to_divisor(dp);
        m["data/repeated_rows"] = static_cast<double>(padded.pad_size);
        const auto share = padded.batch.size() / dp;
        batch = padded.batch.slice(dp_rank * share, (dp_rank + 1) * share);
      }
    }
    // the reference's scores of the whole batch, once per step
    double t_ref = 0;
    if ((reference || placed_reference) && train) {
      const auto r0 = clock::now();
      const auto reference_scores =
          placed_reference ? exchange(detail::PlacedOp::reference, batch, pl.reference, score_reference, false)
                           : score_reference(batch);
      for (const auto& [k, v] : reference_scores.tensors()) batch.set(k, v);
      // its kernels in its own time, not the next pass's (one micro-batch launches in milliseconds)
      if (device.is_cuda()) torch::cuda::synchronize(device.index());
      t_ref = std::chrono::duration<double>(clock::now() - r0).count();
    }
    const bool update_policy = !has_critic || step > o.critic().warmup_steps();  // the critic's warm-up first
    const bool old_from_update = train && update_policy && old_from_update_here && batch.size() <= mini_rows;
    // the metrics of the old log-probs (and entropies, when scored) of `batch`'s rows
    auto old_log_prob_metrics = [&](const std::vector<at::Tensor>& lps, const std::vector<at::Tensor>& ents) {
      batch.set(keys::old_log_probs, at::cat(lps));
      const auto mask = batch.tensor(keys::response_mask).to(at::kFloat);
      const auto n = mask.sum().clamp_min(1.0);
      if (!ents.empty()) m["entropy"] = (at::cat(ents) * mask).sum().div(n).template item<double>();
      // how far the engine's log-probs are from the trainer's under the same weights
      for (const auto& [k, v] : rollout_agreement_metrics(batch.tensor(keys::rollout_log_probs),
                                                          batch.tensor(keys::old_log_probs), mask)) {
        m[k] = v;
      }
      if (batch.has_tensor(keys::ref_log_probs.str())) {
        m["kl"] = ((batch.tensor(keys::old_log_probs) - batch.tensor(keys::ref_log_probs)) * mask)
                      .sum().div(n).template item<double>();
      }
    };
    std::vector<at::Tensor> update_lps, update_ents;  // on-policy: the update forward's, detached
    if constexpr (has_rollout) {
      if (train) {
        // old log-probs: the policy before this step's updates, without grad (on-policy: from the update)
        const auto l0 = clock::now();
        if (!old_from_update) {
          c10::NoGradGuard ng;
          std::vector<at::Tensor> lps, ents;
          const auto micros = micro_batches(batch, MicroPass::scoring);
          for (size_t i = 0; i < micros.size(); ++i) {
            auto scored = measured(MicroPass::scoring, i, micros[i],
                                   [&] { return engine.forward(detail::part_of(micros[i], "")); });
            lps.push_back(scored.tensor(keys::log_probs).to(at::kFloat));
            if (scored.has_tensor(keys::entropy.str())) ents.push_back(scored.tensor(keys::entropy).to(at::kFloat));
          }
          old_log_prob_metrics(lps, ents);
        }
        m["time/old_log_prob"] = std::chrono::duration<double>(clock::now() - l0).count();
        m["old_log_probs_from_update"] = old_from_update ? 1.0 : 0.0;
        if constexpr (has_critic) {  // the critic's values before this step's updates
          const auto v0 = clock::now();
          c10::NoGradGuard ng;
          std::vector<at::Tensor> vs;
          const auto micros = micro_batches(batch, MicroPass::scoring);
          for (size_t i = 0; i < micros.size(); ++i) {
            auto scored = measured(MicroPass::scoring, i, micros[i],
                                   [&] { return critic->forward(detail::part_of(micros[i], "")); });
            vs.push_back(scored.tensor(keys::values).to(at::kFloat));
          }
          batch.set(keys::old_values, at::cat(vs));
          m["time/values"] = std::chrono::duration<double>(clock::now() - v0).count();
        }
        // advantages
        const auto a0 = clock::now();
        if constexpr (requires { state.kl_ctrl.value(); }) m["kl_coef"] = state.kl_ctrl.value();
        batch.require(advantage_reads, "the algorithm's compute_advantages");
        algorithm_type::compute_advantages(batch, o.algorithm(), state);
        m["time/advantage"] = std::chrono::duration<double>(clock::now() - a0).count();
        if constexpr (has_critic) {
          const auto mask = batch.tensor(keys::response_mask).to(at::kFloat);
          const auto n = mask.sum().clamp_min(1.0);
          const auto v = batch.tensor(keys::old_values).to(at::kFloat), ret = batch.tensor(keys::returns).to(at::kFloat);
          auto masked_var = [&](const at::Tensor& x) {
            const auto mean = (x * mask).sum() / n;
            return ((x - mean).square() * mask).sum() / n;
          };
          m["critic/values_mean"] = ((v * mask).sum() / n).template item<double>();
          m["critic/returns_mean"] = ((ret * mask).sum() / n).template item<double>();
          // verl's vf_explained_var: 1 - Var(returns - values) / Var(returns)
          m["critic/vf_explained_var"] =
              (1.0 - masked_var(ret - v) / masked_var(ret).clamp_min(1e-8)).template item<double>();
        }
      }
    }
    if constexpr (has_rollout) phase_peak("scoring");  // reward, reference, old log-probs, values, advantages
    // the update: ppo_epochs passes of mini-batches of micro-batches
    const auto u0 = clock::now();
    std::map<std::string, double> sums, critic_sums;  // each mini-batch's metrics, averaged over the updates
    double loss_sum = 0, grad_sum = 0, lr = 0, critic_grad_sum = 0, critic_lr = 0;
    int64_t updates = 0, skipped = 0, critic_updates = 0;
    for (int64_t epoch = 0; epoch < g.ppo_epochs() && train; ++epoch) {
      for (auto& mini : batch.split(mini_rows)) {
        LossCounts counts;
        counts.global_sequences = mini.size();
        counts.global_tokens = mini.has_tensor("response_mask")
                                   ? mini.tensor("response_mask").sum().template item<int64_t>()
                                   : 0;
        counts.data_parallel_size = g.data_parallel_size();
        if (dp > 1) {  // the mini-batch's sequences and tokens over all data-parallel ranks
          auto c = at::tensor(std::vector<double>{static_cast<double>(counts.global_sequences),
                                                  static_cast<double>(counts.global_tokens)}, at::kDouble);
          dp_comm->all_reduce(c, ReduceOp::sum);
          counts.global_sequences = static_cast<int64_t>(c[0].item<double>());
          counts.global_tokens = static_cast<int64_t>(c[1].item<double>());
        }
        if constexpr (has_critic) {  // the critic's update on this mini-batch (clipped value loss)
          MetricAggregator agg;
          auto critic_forward = [&critic](const TensorBatch& rows) { return critic->forward(rows); };
          accumulate(
              mini, value_keys, critic_forward, value_reads, "the algorithm's value_loss",
              [&](const TensorBatch& micro) { return algorithm_type::value_loss(micro, o.algorithm(), state, counts); },
              [&](const at::Tensor& loss) { critic->backward(loss); }, [&](const LossOutput& out) { agg.add(out); },
              [](TensorBatch&) {});
          critic_grad_sum += critic->step().template item<double>();
          critic_lr = critic->last_step().lr;
          for (const auto& [name, v] : agg.result(dp_comm.get())) critic_sums[name] += v;
          ++critic_updates;
        }
        if (!update_policy) continue;
        {  // keys the algorithm's prepare hook reads (KTO's z0): the policy without grad
          c10::NoGradGuard ng;
          std::map<std::string, std::vector<at::Tensor>> v;
          if (!prepare_keys.empty()) {
            const auto micros = micro_batches(mini, MicroPass::scoring);
            for (size_t i = 0; i < micros.size(); ++i) {
              auto scored = measured(MicroPass::scoring, i, micros[i],
                                     [&] { return score_micro(micros[i], prepare_keys, engine_forward); });
              for (auto& [k, x] : scored) v[k].push_back(x);
            }
          }
          for (auto& [k, x] : v) mini.set(k, at::cat(x).to(at::kFloat));
        }
        mini.require(prepares, "the algorithm's prepare_mini_batch");
        algorithm_type::prepare_mini_batch(mini, o.algorithm(), state, dp_comm.get());
        at::Tensor mini_loss = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
        MetricAggregator agg;
        accumulate(
            mini, loss_keys, update_forward, reads, "the algorithm's loss",
            [&](const TensorBatch& micro) { return algorithm_type::loss(micro, o.algorithm(), state, counts); },
            [&](const at::Tensor& loss) { engine.backward(loss); },
            [&](const LossOutput& out) {
              mini_loss = mini_loss + out.loss.detach().to(at::kDouble);
              agg.add(out);
            },
            [&](TensorBatch& micro) {
              if (!old_from_update) return;
              auto update_lp = micro.tensor(keys::log_probs).detach().to(at::kFloat);
              micro.set(keys::old_log_probs, update_lp);
              update_lps.push_back(update_lp);
              if (!no_entropy) update_ents.push_back(micro.tensor(keys::entropy).detach().to(at::kFloat));
            });
        const auto norm = engine.step();
        const auto& last = engine.last_step();
        lr = last.lr;
        skipped += last.skipped ? 1 : 0;
        loss_sum += mini_loss.template item<double>();
        for (const auto& [name, v] : agg.result(dp_comm.get())) sums[name] += v;
        grad_sum += norm.template item<double>();
        ++updates;
      }
    }
    if (old_from_update && !update_lps.empty()) {
      c10::NoGradGuard ng;
      old_log_prob_metrics(update_lps, no_entropy ? std::vector<at::Tensor>{} : update_ents);
    }
    if (train) algorithm_type::after_step(batch, o.algorithm(), state, dp_comm.get());
    const double t_update = std::chrono::duration<double>(clock::now() - u0).count();
    phase_peak("update");
    if constexpr (has_rollout) {  // the new weights to the rollout engine
      const auto s0 = clock::now();
      if (train && update_policy) sync_weights();  // a critic warm-up step left the policy as it was
      m["time/weight_sync"] = std::chrono::duration<double>(clock::now() - s0).count();
      phase_peak("weight_sync");
      if constexpr (requires { engine.last_export_bytes(); }) {  // received from the other ranks (sharded)
        m["weight_sync/bytes"] = train && update_policy ? static_cast<double>(engine.last_export_bytes()) : 0.0;
      }
    }
    const double t_step = std::chrono::duration<double>(clock::now() - t0).count();
    if (updates > 0) {
      for (const auto& [name, v] : sums) m[name] = v / static_cast<double>(updates);
      m["loss"] = loss_sum / static_cast<double>(updates);
      m["grad_norm"] = grad_sum / static_cast<double>(updates);
      m["lr"] = lr;
    }
    if (critic_updates > 0) {
      for (const auto& [name, v] : critic_sums) m[name] = v / static_cast<double>(critic_updates);
      m["critic/grad_norm"] = critic_grad_sum / static_cast<double>(critic_updates);
      m["critic/lr"] = critic_lr;
    }
    if (m.count("actor/pg_clipfrac") != 0) m["clip_frac"] = m["actor/pg_clipfrac"];
    m["skipped_updates"] = static_cast<double>(skipped);
    m["skipped_step"] = train ? 0.0 : 1.0;
    m["epoch"] = static_cast<double>(info.epoch);
    m["time/ref"] = t_ref;
    m["time/update"] = t_update;
    m["time/step"] = t_step;
    m["tokens_per_s"] = t_step > 0 ? static_cast<double>(step_tokens) / t_step : 0.0;
    const auto mem = detail::memory_use(device);
    m["memory/allocated_gb"] = mem.allocated_gb;
    m["memory/reserved_gb"] = mem.reserved_gb;
    // both keys on every rank (0: no such pass this step — an on-policy step on a rank that scores
    // nothing for others), so the ranks' metrics line up for their reduction
    for (const char* k : {"geometry/micro_batch_scoring", "geometry/micro_batch_update"}) m[k] = micro_sizes[k];
    m["memory/peak_gb"] = device.is_cuda() ? std::max(step_peak, mem.peak_gb) : mem.peak_gb;
    if constexpr (requires { engine.local_parameter_elements(); }) {
      // what a rank stores of the policy (its parameters, gradients and AdamW moments are each
      // this many elements): the model's size / the shard count, under Sharding<FSDP> over ranks
      m["sharding/param_elements_per_rank"] = static_cast<double>(engine.local_parameter_elements());
      m["sharding/param_elements"] = static_cast<double>(engine.total_parameter_elements());
    }
    if constexpr (requires { reference->local_parameter_elements(); }) {
      // the frozen reference's share on this rank (Sharding<FSDP>: its size / the shard count)
      // (placed on ranks of its own: 0 on an actor rank outside them, so every rank has the key)
      if (reference || placed_reference) {
        m["sharding/reference_elements_per_rank"] = reference ? static_cast<double>(reference->local_parameter_elements()) : 0.0;
      }
    }
    // over the ranks: the loss hooks' metrics came reduced by their own rule (MetricAggregator); the
    // rest is the mean, times and memory the largest, tokens_per_s the sum
    if (dp > 1) detail::reduce_metrics(m, *dp_comm);  // a tensor-parallel group's ranks agree already
    log.log(step, m);
    if (t.on_nonfinite() == "stop") {  // the metrics are reduced: every rank stops alike
      const double bad_rewards = m.count("reward_nonfinite") != 0 ? m["reward_nonfinite"] : 0.0;
      const double bad_updates = m["skipped_updates"];
      HYBRIDRL_CHECK(bad_rewards == 0 && bad_updates == 0,
                     fmt::format("step {}: {} (trainer.on_nonfinite = stop); metrics.jsonl holds the step", step,
                                 bad_rewards > 0 ? fmt::format("{} rewards are NaN or infinite", bad_rewards)
                                                 : fmt::format("the gradients of {} update(s) are NaN or infinite "
                                                               "(a NaN in the logits or the loss)", bad_updates)),
                     fmt::format("resume from the last checkpoint ({}) after fixing the reward function, the data or "
                                 "the learning rate; or set trainer.on_nonfinite=skip to train on past such steps",
                                 t.output_dir().empty() ? std::string("none: trainer.output_dir is empty")
                                                        : t.output_dir() + "/checkpoints"));
    }
    result.last_metrics = std::move(m);
    if (t.save_every() > 0 && step % t.save_every() == 0 && step < total) save();
    if (parts.on_step) parts.on_step(step, result.last_metrics);
  }
  result.steps = step;
  if (pl.has_servers()) {  // the ranks outside the actor are done
    detail::placed_signal(*pl.world, device, detail::PlacedOp::done, step, result.resumed_from);
    tell_servers.told = true;
  }
  save();
  log.write_plot();
  // sharded (over ranks, or one process offloading to the CPU): the trained weights into the
  // policy (and critic) on every rank, as the one-process engine leaves them
  if constexpr (requires { engine.materialize(); }) engine.materialize();
  if constexpr (has_critic) {
    if constexpr (requires { critic->materialize(); }) critic->materialize();
  }
  if (!t.output_dir().empty() && t.save_model() && lead) {
    const auto dir = (std::filesystem::path(t.output_dir()) / "model").string();
    save_pretrained(policy, dir);
    for (const auto& f : parts.tokenizer_files) {
      std::filesystem::copy_file(f, std::filesystem::path(dir) / std::filesystem::path(f).filename(),
                                 std::filesystem::copy_options::overwrite_existing);
    }
    if constexpr (has_critic) {  // the critic too, as <Arch>ForTokenClassification
      save_pretrained(critic->model(), (std::filesystem::path(t.output_dir()) / "critic").string());
    }
  }
  return result;
}

}  // namespace hybridrl
