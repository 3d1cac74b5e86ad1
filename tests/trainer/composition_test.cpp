// trainer/trainer.hpp and trainer/rules.hpp: policy axes, the cross-axis rules, batch geometry and options.
// (What must NOT compile is in tests/compile_fail/; here: what must compile and what must be false.)

#include <hybridrl/hybridrl.hpp>
#include <hybridrl/trainer/run.hpp>

#include <string>
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using namespace hybridrl::testing;

// ---- user-defined policies, as a user would write them (no hybridrl internals) ----
struct OnlineTag {};
struct OfflineTag {};
struct NoLossTag {};
struct NoAdvantageTag {};
struct CriticNoValueLossTag {};

struct TinyOptions {
  HYBRIDRL_ARG(double, scale) = 1.0;
  void validate() const {
    HYBRIDRL_CHECK(scale_ > 0, "scale must be positive", "use scale > 0");
  }
};

template <>
struct hybridrl::Algorithm<OnlineTag> : algorithm_base<OnlineTag, TinyOptions, DataKind::prompts> {
  static constexpr std::string_view name = "Online";
  static void compute_advantages(TensorBatch& b, const options_type& o, state_type&) {
    b.set("advantages", b.tensor("scores") * o.scale());
  }
  static LossOutput loss(const TensorBatch& b, const options_type&, const state_type&,
                         const LossCounts& s) {
    return {b.tensor("advantages").sum() / static_cast<double>(s.global_sequences), {}};
  }
};
template <>
struct hybridrl::Algorithm<OfflineTag>
    : algorithm_base<OfflineTag, TinyOptions, DataKind::preference_pairs> {
  static constexpr std::string_view name = "Offline";
  static constexpr bool needs_reference = true;
  static LossOutput loss(const TensorBatch& b, const options_type&, const state_type&,
                         const LossCounts&) {
    return {b.tensor("x").mean(), {}};
  }
};
template <>
struct hybridrl::Algorithm<NoLossTag>
    : algorithm_base<NoLossTag, TinyOptions, DataKind::preference_pairs> {
  static constexpr std::string_view name = "NoLoss";
};
template <>
struct hybridrl::Algorithm<NoAdvantageTag> : hybridrl::Algorithm<OfflineTag> {
  using tag = NoAdvantageTag;
  static constexpr DataKind data_kind = DataKind::prompts;
};
template <>
struct hybridrl::Algorithm<CriticNoValueLossTag> : hybridrl::Algorithm<OnlineTag> {
  using tag = CriticNoValueLossTag;
  static constexpr bool needs_critic = true;
};

static_assert(algorithm_policy<Algorithm<OnlineTag>>);
static_assert(algorithm_policy<Algorithm<OfflineTag>>);
static_assert(!algorithm_policy<Algorithm<NoLossTag>>);
static_assert(!has_loss_hook<Algorithm<NoLossTag>>);
static_assert(!algorithm_policy<Algorithm<NoAdvantageTag>>);
static_assert(!algorithm_policy<Algorithm<CriticNoValueLossTag>>);
static_assert(is_online_v<Algorithm<OnlineTag>> && !is_online_v<Algorithm<OfflineTag>>);

// ---- the built-in policies satisfy their axis concepts ----
static_assert(sharding_policy<Sharding<FSDP>> && sharding_policy<Sharding<TP3D>>);
static_assert(rollout_policy<Rollout<Paged>> && rollout_policy<Rollout<Naive>>);
static_assert(loader_policy<Loader<Packed>> && loader_policy<Loader<Bucketed>>);
static_assert(!sharding_policy<Rollout<Paged>> && !loader_policy<Sharding<FSDP>>);
static_assert(Sharding<TP3D>::produces_tensor_parallel_shards && !Sharding<FSDP>::produces_tensor_parallel_shards);
static_assert(Rollout<Paged>::accepts_tensor_parallel_weights && !Rollout<Naive>::accepts_tensor_parallel_weights);

// ---- trainer_config: the cross-axis rules as a concept ----
using On = Algorithm<OnlineTag>;
using Off = Algorithm<OfflineTag>;
static_assert(trainer_config<On, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>);
static_assert(trainer_config<On, Sharding<FSDP>, Rollout<Naive>, Loader<Packed>>);
static_assert(trainer_config<On, Sharding<TP3D>, Rollout<Paged>, Loader<Packed>>);
static_assert(trainer_config<Off, Sharding<FSDP>, NoRollout, Loader<Packed>>);
// (a) slots hold their own axis
static_assert(!trainer_config<Sharding<FSDP>, On, Rollout<Paged>, Loader<Bucketed>>);
static_assert(!trainer_config<On, Sharding<FSDP>, Loader<Bucketed>, Rollout<Paged>>);
// (b) online needs a rollout; offline takes none
static_assert(!trainer_config<On, Sharding<FSDP>, NoRollout, Loader<Bucketed>>);
static_assert(!trainer_config<Off, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>);
// (c) TP3D needs a rollout that accepts tensor-parallel weights
static_assert(!trainer_config<On, Sharding<TP3D>, Rollout<Naive>, Loader<Bucketed>>);
// (d) a policy missing a hook
static_assert(!trainer_config<Algorithm<NoLossTag>, Sharding<FSDP>, NoRollout, Loader<Packed>>);
static_assert(!trainer_config<Algorithm<NoAdvantageTag>, Sharding<FSDP>, Rollout<Paged>, Loader<Packed>>);

// the sentence-carrying rules (first_broken_rule) and the concept agree on every case above
template <class A, class S, class R, class L>
constexpr bool rules_agree() {
  constexpr auto broken = [] {
    if constexpr (std::is_same_v<R, NoRollout>) return hybridrl::detail::first_broken_rule<A, S, L>();
    else return hybridrl::detail::first_broken_rule<A, S, R, L>();
  }();
  return (broken == hybridrl::detail::TrainerRule::ok) == trainer_config<A, S, R, L>;
}
static_assert(rules_agree<On, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>());
static_assert(rules_agree<On, Sharding<TP3D>, Rollout<Paged>, Loader<Packed>>());
static_assert(rules_agree<Off, Sharding<FSDP>, NoRollout, Loader<Packed>>());
static_assert(rules_agree<Sharding<FSDP>, On, Rollout<Paged>, Loader<Bucketed>>());
static_assert(rules_agree<On, Sharding<FSDP>, NoRollout, Loader<Bucketed>>());
static_assert(rules_agree<Off, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>());
static_assert(rules_agree<On, Sharding<TP3D>, Rollout<Naive>, Loader<Bucketed>>());
static_assert(rules_agree<Algorithm<NoLossTag>, Sharding<FSDP>, NoRollout, Loader<Packed>>());
static_assert(rules_agree<Algorithm<NoAdvantageTag>, Sharding<FSDP>, Rollout<Paged>, Loader<Packed>>());
static_assert(rules_agree<Algorithm<CriticNoValueLossTag>, Sharding<FSDP>, Rollout<Paged>, Loader<Packed>>());
// and name the rule that is broken
static_assert(hybridrl::detail::first_broken_rule<On, Sharding<TP3D>, Rollout<Naive>, Loader<Bucketed>>() ==
              hybridrl::detail::TrainerRule::tensor_parallel_weights);
static_assert(hybridrl::detail::first_broken_rule<Algorithm<CriticNoValueLossTag>, Sharding<FSDP>, Rollout<Paged>, Loader<Packed>>() ==
              hybridrl::detail::TrainerRule::algorithm_value_loss);
static_assert(hybridrl::detail::first_broken_rule<On, Sharding<FSDP>>() == hybridrl::detail::TrainerRule::policy_count);

// ---- geometry rules at compile time ----
static_assert(check_geometry(60, 12, 6, 60, 4) == GeometryRule::ok);
static_assert(check_geometry(60, 12, 7, 60, 4) == GeometryRule::world_divides_train);
static_assert(check_geometry(60, 1, 8, 60, 1) == GeometryRule::world_divides_train);
static_assert(check_geometry(8, 1, 8, 16, 1) == GeometryRule::mini_le_train);
static_assert(check_geometry(60, 12, 6, 25, 1) == GeometryRule::train_divides_mini);
static_assert(check_geometry(16, 1, 8, 4, 1) == GeometryRule::dp_divides_mini);
static_assert(check_geometry(60, 12, 6, 60, 7) == GeometryRule::micro_divides_mini);
static_assert(check_geometry(0, 1, 1, 1, 1) == GeometryRule::positive);
static_assert(check_geometry(60, 12, 6, 60, 4, 4) == GeometryRule::sp_divides_world);
static_assert(check_geometry(60, 12, 6, 60, 4, 1, 4) == GeometryRule::tp_divides_world);
static_assert(StaticBatch<60, 12, 6, 60, 4>::mini_batch_sequences_per_rank == 120);

namespace {
}  // namespace

TEST_SUITE("trainer/composition") {
  TEST_CASE("verl's field example: 60 prompts x 12 samples on 6 GPUs, generation TP=2") {
    auto g = BatchGeometry{}
                 .train_batch_size(60)
                 .rollout_n(12)
                 .world_size(6)
                 .ppo_mini_batch_size(60)
                 .micro_batch_size_per_gpu(4)
                 .rollout_tensor_parallel_size(2);
    g.validate();
    CHECK(g.sequences_per_step() == 720);
    CHECK(g.rollout_groups() == 3);
    CHECK(g.sequences_per_rollout_group() == 240);
    CHECK(g.mini_batch_sequences_per_rank() == 120);
    CHECK(g.micro_batches_per_mini_batch() == 30);
    CHECK(contains(g.describe(), "3 groups (TP=2) of 240 sequences"));
    CHECK(contains(g.describe(), "120 sequences per rank"));
  }

  TEST_CASE("run-time geometry errors show the arithmetic") {
    auto base = [] {
      return BatchGeometry{}.train_batch_size(60).rollout_n(12).world_size(6).ppo_mini_batch_size(60).micro_batch_size_per_gpu(4);
    };
    CHECK(contains(error_of([&] { base().world_size(7).validate(); }),
                   "60 × 12 = 720 sequences do not split evenly over world_size 7 (720 % 7 = 6)"));
    CHECK(contains(error_of([&] { base().world_size(7).validate(); }), "train_batch_size = 63"));
    CHECK(contains(error_of([&] { base().micro_batch_size_per_gpu(7).validate(); }),
                   "micro_batch_size_per_gpu 7 does not divide a rank's mini-batch of 60 × 12 ÷ 6 = 120 sequences (120 % 7 = 1)"));
    // verl's "micro-batch larger than mini-batch", named as such
    const auto larger = error_of([&] { base().micro_batch_size_per_gpu(240).validate(); });
    CHECK(contains(larger, "micro_batch_size_per_gpu 240 is larger than a rank's mini-batch of ppo_mini_batch_size × "
                           "rollout_n ÷ data-parallel ranks = 60 × 12 ÷ 6 = 120 sequences"));
    CHECK(contains(larger, "use micro_batch_size_per_gpu <= 120"));
    CHECK(contains(error_of([&] { base().ppo_mini_batch_size(25).validate(); }),
                   "ppo_mini_batch_size 25 does not divide train_batch_size 60 (60 % 25 = 10)"));
    CHECK(contains(error_of([&] { base().ppo_mini_batch_size(61).validate(); }), "larger than train_batch_size"));
    CHECK(contains(error_of([&] { base().rollout_n(1).world_size(8).train_batch_size(64).ppo_mini_batch_size(4).micro_batch_size_per_gpu(1).validate(); }),
                   "4 × 1 = 4 sequences do not split over 8 data-parallel ranks"));
    CHECK(contains(error_of([&] { base().rollout_n(0).validate(); }), "rollout_n = 0 is below 1"));
    CHECK(contains(error_of([&] { base().sequence_parallel_size(4).validate(); }), "6 % 4 = 2"));
    CHECK(error_of([&] { StaticBatch<60, 12, 6, 60, 4>::geometry().validate(); }) == "(no error)");
  }

  TEST_CASE("a composed trainer exposes its policies, validates options and describes itself") {
    using T = Trainer<On, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
    static_assert(std::is_same_v<T::algorithm_type, On>);
    static_assert(std::is_same_v<T::rollout_type, Rollout<Paged>>);
    static_assert(T::has_rollout);
    T::Options opts;
    opts.static_batch(StaticBatch<8, 4, 2, 4, 2>::geometry());
    opts.rollout().block_size(32);
    T trainer(opts, 2);
    CHECK(trainer.options().rollout().block_size() == 32);
    const auto d = trainer.describe();
    CHECK(contains(d, "Algorithm<Online> Sharding<FSDP> Rollout<Paged> Loader<Bucketed>"));
    CHECK(contains(d, "8 prompts × 4 samples = 32 sequences per step on 2 ranks"));

    // every part's validate() runs before anything else happens
    CHECK(contains(error_of([&] { T(T::Options{opts}.algorithm(TinyOptions{}.scale(-1)), 2); }), "algorithm.scale must be positive"));
    CHECK(contains(error_of([&] { T(T::Options{opts}.rollout(PagedOptions{}.block_size(12)), 2); }), "rollout.block_size = 12"));
    CHECK(contains(error_of([&] { auto o = opts; o.rollout().sampling().top_p(0); T(o, 2); }), "rollout.top_p = 0"));
    CHECK(contains(error_of([&] { auto o = opts; o.loader().epochs(-1); T(o, 2); }), "loader.epochs = -1"));
    CHECK(contains(error_of([&] { auto o = opts; o.geometry().world_size(1); T(o, 3); }), "world_size 3"));
  }

  TEST_CASE("offline form: three policies, no rollout, one sample per prompt") {
    using T = Trainer<Off, Sharding<FSDP>, Loader<Packed>>;
    static_assert(!T::has_rollout);
    static_assert(std::is_same_v<T::loader_type, Loader<Packed>>);
    T trainer(T::Options{});
    CHECK(contains(trainer.describe(), "Algorithm<Offline> Sharding<FSDP> Loader<Packed>"));
    // rollout_n is not a key of an offline trainer: whatever the geometry held, the run uses 1
    T::Options o;
    o.geometry().rollout_n(4);
    CHECK(T{o}.options().geometry().rollout_n() == 1);
  }

  TEST_CASE("a user algorithm's hooks run through the trainer's types") {
    using T = Trainer<On, Sharding<FSDP>, Rollout<Naive>, Loader<Packed>>;
    TensorBatch b({{"scores", at::tensor(std::vector<float>{1.f, 2.f, 3.f})}});
    auto state = T::algorithm_type::make_state(TinyOptions{});
    T::algorithm_type::compute_advantages(b, TinyOptions{}.scale(2.0), state);
    auto out = T::algorithm_type::loss(b, TinyOptions{}, state, LossCounts{0, 3, 1});
    CHECK(out.loss.item<float>() == doctest::Approx((2.f + 4.f + 6.f) / 3.f));
  }

  TEST_CASE("options: chainable setters, validation names the field") {
    CHECK(contains(error_of([] { (void)TP3DOptions{}.tensor_parallel_size(3).resolve_data_parallel(8); }),
                   "3 × 1 = 3 does not divide world_size 8"));
    CHECK(TP3DOptions{}.tensor_parallel_size(2).pipeline_parallel_size(2).resolve_data_parallel(8) == 2);
    CHECK(contains(error_of([] { (void)TP3DOptions{}.data_parallel_size(3).tensor_parallel_size(2).resolve_data_parallel(8); }),
                   "set data_parallel_size to 4"));
    CHECK(contains(error_of([] { FSDPOptions{}.shard_group_size(0).validate(); }), "shard_group_size = 0"));
    CHECK(contains(error_of([] { FSDPOptions{}.param_dtype(at::kInt).validate(); }), "floating-point"));
    CHECK(contains(error_of([] { NaiveOptions{}.max_batch_size(0).validate(); }), "max_batch_size = 0"));
    CHECK(contains(error_of([] { SamplingOptions{}.temperature(-1).validate(); }), "temperature = -1"));
    CHECK(contains(error_of([] { PackedOptions{}.row_length(0).validate(); }), "row_length = 0"));
    CHECK(error_of([] { PagedOptions{}.validate(); }) == "(no error)");
  }

  TEST_CASE("one owner per knob: the trainer derives world size, rollout TP, loader batch and seeds") {
    using T = Trainer<On, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
    T::Options opts;
    opts.data().train_batch_size(8);
    opts.rollout().n(4);
    opts.geometry().ppo_mini_batch_size(4).micro_batch_size_per_gpu(2);
    opts.rollout().tensor_parallel_size(2);
    opts.trainer().seed(7);
    const T trainer(opts, 4);
    const auto& o = trainer.options();
    CHECK(o.geometry().world_size() == 4);                    // from the process group
    CHECK(o.geometry().rollout_tensor_parallel_size() == 2);  // read from the rollout
    CHECK(o.geometry().rollout_groups() == 2);                // 4 ranks / TP 2
    CHECK(o.loader().batch_size() == 8);                      // = data.train_batch_size
    CHECK(o.geometry().train_batch_size() == 8);              // from data.train_batch_size
    CHECK(o.geometry().rollout_n() == 4);                     // from rollout.n
    CHECK(o.loader().seed() == derive_seed(7, "loader"));
    CHECK(o.rollout().sampling().seed() == derive_seed(7, "sampling"));
    // derived seeds differ per consumer and per run seed
    CHECK(derive_seed(7, "loader") != derive_seed(7, "sampling"));
    CHECK(derive_seed(7, "loader") != derive_seed(8, "loader"));
    // ... or read from a Communicator
    struct FourRanks : Communicator {
      int rank() const override { return 0; }
      int size() const override { return 4; }
      std::string backend() const override { return "test"; }
      void all_reduce(at::Tensor&, ReduceOp) override {}
      void all_gather_into(at::Tensor&, const at::Tensor&) override {}
      void reduce_scatter(at::Tensor&, const at::Tensor&, ReduceOp) override {}
      void broadcast(at::Tensor&, int) override {}
      void barrier() override {}
      void send(const at::Tensor&, int, int) override {}
      void recv(at::Tensor&, int, int) override {}
      std::shared_ptr<Communicator> split(const std::vector<int>&) override { return nullptr; }
    };
    CHECK(T(opts, FourRanks{}).options().geometry().world_size() == 4);
    // a hand-set world size must agree with the process group
    auto bad = opts;
    bad.geometry().world_size(8);
    CHECK(contains(error_of([&] { T(bad, 4); }), "geometry.world_size = 8 but the process group has 4 rank(s)"));
    // the rollout's TP must divide the world the process group gives
    CHECK(contains(error_of([&] { T(opts, 3); }), "the world size 3 is not divisible by rollout_tensor_parallel_size 2"));
  }

  TEST_CASE("Trainer::Options::validate checks across axes with the full key path") {
    using TN = Trainer<On, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>;
    TN::Options n;
    n.data().train_batch_size(4);
    n.geometry().ppo_mini_batch_size(4);
    CHECK(error_of([&] { TN(n, 2); }) == "(no error)");
    n.rollout().tensor_parallel_size(2);
    const auto naive_tp = error_of([&] { TN(n, 2); });
    CHECK(contains(naive_tp, "rollout.tensor_parallel_size = 2 but Rollout<Naive> runs one full copy"));
    CHECK(contains(naive_tp, "use Rollout<Paged>"));

    // a token budget makes an online step's prompt count vary
    TN::Options budget;
    budget.loader().max_tokens_per_batch(512);
    CHECK(contains(error_of([&] { TN{budget}; }),
                   "loader.max_tokens_per_batch = 512 makes the number of prompts per batch vary"));
    // ... which offline algorithms may use
    using TO = Trainer<Off, Sharding<FSDP>, Loader<Bucketed>>;
    TO::Options off;
    off.loader().max_tokens_per_batch(512);
    CHECK(error_of([&] { TO{off}; }) == "(no error)");

    // sharding checked against the world size
    TN::Options fsdp;
    fsdp.data().train_batch_size(24);
    fsdp.geometry().ppo_mini_batch_size(24);
    fsdp.sharding().shard_group_size(4);
    CHECK(error_of([&] { TN(fsdp, 8); }) == "(no error)");
    CHECK(contains(error_of([&] { TN(fsdp, 6); }), "sharding.shard_group_size = 4 does not divide world_size 6 (6 % 4 = 2)"));
    using T3 = Trainer<On, Sharding<TP3D>, Rollout<Paged>, Loader<Packed>>;
    T3::Options mesh;
    mesh.sharding().tensor_parallel_size(4);
    mesh.data().train_batch_size(6);
    mesh.geometry().ppo_mini_batch_size(6);
    CHECK(contains(error_of([&] { T3(mesh, 6); }),
                   "sharding.tensor_parallel_size × pipeline_parallel_size = 4 × 1 = 4 does not divide world_size 6"));
    // nested members get their parent's path; geometry counts name their field
    CHECK(contains(error_of([&] { auto o = mesh; o.rollout().sampling().max_new_tokens(0); T3(o, 4); }),
                   "rollout.max_new_tokens = 0 is below 1"));
    CHECK(contains(error_of([&] { auto o = mesh; o.geometry().ppo_epochs(0); T3(o, 4); }),
                   "geometry.ppo_epochs = 0 is below 1"));
    CHECK(contains(error_of([&] { auto o = mesh; o.sharding().pipeline_parallel_size(0); T3(o, 4); }),
                   "sharding.pipeline_parallel_size = 0 is below 1"));
  }

  TEST_CASE("Error carries problem and fix separately") {
    Error e("the problem", "the fix");
    CHECK(std::string(e.what()) == "hybridrl: the problem\n  fix: the fix");
    CHECK(e.problem() == "the problem");
    CHECK(e.fix() == "the fix");
  }
}

// ---- the named presets (trainer/presets.hpp) are the combinations their names say ----
static_assert(std::is_same_v<PPOTrainer, Trainer<Algorithm<PPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>>);
static_assert(std::is_same_v<GRPOTrainer::algorithm_type, Algorithm<GRPO>> && GRPOTrainer::has_rollout);
static_assert(std::is_same_v<DPOTrainer::algorithm_type, Algorithm<DPO>> && !DPOTrainer::has_rollout);
static_assert(std::is_same_v<KTOTrainer::loader_type, Loader<Packed>> && !KTOTrainer::has_rollout);

TEST_CASE("trainer/presets: a preset constructs and describes itself") {
  GRPOTrainer t(GRPOTrainer::Options{});
  CHECK(contains(t.describe(), "Algorithm<GRPO> Sharding<FSDP> Rollout<Paged> Loader<Bucketed>"));
}

TEST_SUITE("trainer/presets") {
  TEST_CASE("the trainer suite links hybridrl::presets: the preset trainers are extern templates here") {
#if defined(HYBRIDRL_EXTERN_PRESETS)
    // Constructed here, instantiated in src/presets/presets.cpp (the library this suite links).
    GRPOTrainer::Options o;
    o.static_batch(StaticBatch<8, 4, 2, 4, 2>::geometry());
    GRPOTrainer t(o);
    CHECK(t.describe().find("Algorithm<GRPO>") != std::string::npos);
#else
    FAIL("HYBRIDRL_EXTERN_PRESETS is not defined: tests/CMakeLists.txt links hybridrl::presets");
#endif
  }
}

// ---- configuration mistakes (docs/reliability.md, "Bad configuration") ----
TEST_SUITE("trainer/configuration") {
  TEST_CASE("verl's keys: an unknown key names the key that holds its value here") {
    RunConfig<GRPOTrainer> cfg;
    auto hint = [&](const std::string& key) { return error_of([&] { apply_override(cfg, key, "4"); }); };
    CHECK(contains(hint("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
                   "unknown configuration key actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (from override); "
                   "did you mean geometry.micro_batch_size_per_gpu? (verl's actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu)"));
    // the global micro-batch: by edit distance it was ppo_mini_batch_size, the other knob
    const auto global = hint("geometry.ppo_micro_batch_size");
    CHECK(contains(global, "did you mean geometry.micro_batch_size_per_gpu? (verl's ppo_micro_batch_size: it counts "
                           "sequences over all GPUs, this key per GPU: divide it by the number of GPUs)"));
    CHECK(!contains(global, "ppo_mini_batch_size?"));
    CHECK(contains(hint("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"),
                   "did you mean geometry.micro_batch_size_per_gpu? (verl's actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu: "
                   "one micro-batch size serves the scoring and the update passes)"));
    CHECK(contains(hint("actor_rollout_ref.actor.ppo_mini_batch_size"), "did you mean geometry.ppo_mini_batch_size?"));
    CHECK(contains(hint("actor_rollout_ref.rollout.n"), "did you mean rollout.n?"));
    CHECK(contains(hint("actor_rollout_ref.rollout.tensor_model_parallel_size"), "did you mean rollout.tensor_parallel_size?"));
    CHECK(contains(hint("data.max_response_length"), "did you mean rollout.max_new_tokens?"));  // was data.max_prompt_length
    CHECK(contains(hint("trainer.total_epochs"), "did you mean loader.epochs?"));              // was trainer.total_steps
    CHECK(contains(hint("actor_rollout_ref.model.path"), "did you mean model.path?"));
    // a verl file's table: its first key is named
    const auto file = error_of([&] {
      from_json(nlohmann::json{{"actor_rollout_ref", {{"rollout", {{"n", 4}, {"temperature", 1.0}}}}}}, cfg, "verl.json");
    });
    CHECK(contains(file, "unknown configuration key actor_rollout_ref.rollout.n (from verl.json); did you mean rollout.n?"));
    // a key this trainer type lacks is not suggested: Sharding<FSDP> has no tensor_parallel_size, DPO no rollout
    CHECK(!contains(hint("actor_rollout_ref.actor.megatron.tensor_model_parallel_size"), "sharding.tensor_parallel_size"));
    RunConfig<TP3DGRPOTrainer> tp;
    CHECK(contains(error_of([&] { apply_override(tp, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size", "2"); }),
                   "did you mean sharding.tensor_parallel_size?"));
    RunConfig<DPOTrainer> dpo;
    CHECK(!contains(error_of([&] { apply_override(dpo, "actor_rollout_ref.rollout.n", "4"); }), "rollout.n?"));
    // typos still get the nearest key
    CHECK(contains(hint("trainer.totl_steps"), "did you mean trainer.total_steps?"));
  }

  TEST_CASE("geometry through a Trainer: each message starts with the key to change") {
    using T = Trainer<On, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>;
    T::Options o;
    o.data().train_batch_size(2);
    o.rollout().n(2);
    o.geometry().ppo_mini_batch_size(2).micro_batch_size_per_gpu(8);
    const auto larger = error_of([&] { T(o, 1); });
    CHECK(contains(larger, "geometry.micro_batch_size_per_gpu 8 is larger than a rank's mini-batch of"));
    CHECK(contains(larger, "= 2 × 2 ÷ 1 = 4 sequences"));
    o.data().train_batch_size(3);
    o.geometry().micro_batch_size_per_gpu(1);
    CHECK(contains(error_of([&] { T(o, 1); }), "geometry.ppo_mini_batch_size 2 does not divide train_batch_size 3 (3 % 2 = 1)"));
    // the two counts the geometry does not own: data.train_batch_size and the launch's world size
    o.data().train_batch_size(4);
    const auto split = error_of([&] { T(o, 3); });
    CHECK(split.rfind("hybridrl: data.train_batch_size × rollout_n = 4 × 2 = 8 sequences do not split evenly over world_size 3", 0) == 0);
    o.geometry().sequence_parallel_size(4);
    CHECK(contains(error_of([&] { T(o, 6); }), "hybridrl: the world size 6 is not divisible by sequence_parallel_size 4"));
  }

  TEST_CASE("hybridrl train's checks before anything loads: dtype, device, backend, reward") {
    auto refused = [](std::vector<std::string> overrides) {
      overrides.insert(overrides.begin(), {"task.name=reverse", "model.init=tiny"});
      ConfigSources s;
      s.overrides = overrides;
      return error_of([&] { (void)configure_run<GRPOTrainer>(s); });
    };
    CHECK(refused({}) == "(no error)");
    CHECK(contains(refused({"model.dtype=int64"}), "model.dtype = int64 is not a floating-point type"));
    CHECK(contains(refused({"model.device=mps"}), "model.device = \"mps\" is neither cpu nor cuda"));
    CHECK(contains(refused({"distributed.backend=nccl"}),
                   "distributed.backend = nccl but model.device = cpu: NCCL carries CUDA tensors only"));
    // a device this process does not see (was: c10::Error at the first copy, exit 3)
    const auto gpus = static_cast<int64_t>(torch::cuda::device_count());
    const auto missing = error_of([] { check_device_available("cuda:99", at::kFloat); });
    CHECK(contains(missing, gpus == 0 ? "model.device = cuda:99 but this process sees no CUDA device"
                                      : "model.device = cuda:99 but this process sees"));
    if (gpus == 0) CHECK(contains(error_of([] { check_device_available("cuda", at::kFloat); }), "sees no CUDA device"));
    CHECK(error_of([] { check_device_available("cpu", at::kFloat); }) == "(no error)");
    CHECK(error_of([] { check_device_available("cpu", at::kBFloat16); }) == "(no error)");
    // float16 on a CPU whose LibTorch has no half matmul (1.13: was a c10::Error at the first forward)
    bool half_mm = true;
    try {
      const auto x = at::ones({2, 2}, at::kHalf);
      (void)at::mm(x, x);
    } catch (const c10::Error&) {
      half_mm = false;
    }
    const auto half = error_of([] { check_device_available("cpu", at::kHalf); });
    if (half_mm) {
      CHECK(half == "(no error)");
    } else {
      CHECK(contains(half, "model.dtype = float16 has no matrix multiply on cpu in this LibTorch"));
      CHECK(contains(half, "use model.dtype=float32 or bfloat16 on the CPU"));
    }
    // reward.name: a rule, task, model or the program's own
    CHECK(contains(error_of([] { check_reward_option(RunRewardOptions{}.name("nonsense")); }),
                   "reward \"nonsense\" is not a built-in reward"));
    for (const char* ok : {"", "task", "model", "gsm8k", "exact_match"}) {
      CAPTURE(ok);
      CHECK(error_of([&] { check_reward_option(RunRewardOptions{}.name(ok)); }) == "(no error)");
    }
    const std::map<std::string, BatchRewardFn> mine{{"mine", batched([](const RewardInput&) { return 0.0; })}};
    CHECK(error_of([&] { check_reward_option(RunRewardOptions{}.name("mine"), mine); }) == "(no error)");
  }

  TEST_CASE("what the model cannot hold, from its config.json before the weights load: context, KV pool, heads") {
    RunConfig<GRPOTrainer> cfg;
    const auto tiny = tiny_llama_config();  // 256 positions
    CHECK(error_of([&] { check_run_fits_model(cfg, tiny); }) == "(no error)");  // no prompt limit, pool from memory
    cfg.run().data().dataset().max_prompt_length(200);
    cfg.run().rollout().sampling().max_new_tokens(100);
    const auto context = error_of([&] { check_run_fits_model(cfg, tiny); });
    CHECK(contains(context, "data.max_prompt_length + rollout.max_new_tokens = 200 + 100 = 300 exceeds the model's "
                            "max_position_embeddings = 256: the responses of the longest prompts would stop after 56 tokens"));
    CHECK(contains(context, "add up to at most 256"));
    cfg.run().rollout().sampling().max_new_tokens(56);
    CHECK(error_of([&] { check_run_fits_model(cfg, tiny); }) == "(no error)");
    // the KV pool counts blocks as Rollout<Paged> does (prompt and response, one more for a fork)
    cfg.run().data().dataset().max_prompt_length(0);
    cfg.run().rollout().sampling().max_new_tokens(4);
    cfg.run().rollout().kv_cache_tokens(8);
    const auto kv = error_of([&] { check_run_fits_model(cfg, tiny); });
    CHECK(contains(kv, "rollout.kv_cache_tokens = 8 holds 1 KV block(s) of 16 tokens, but one sequence (1 prompt token(s), "
                       "up to 4 new) needs 2"));
    CHECK(contains(kv, "raise rollout.kv_cache_tokens to at least 32"));
    cfg.run().rollout().kv_cache_tokens(32);
    CHECK(error_of([&] { check_run_fits_model(cfg, tiny); }) == "(no error)");
    cfg.run().data().dataset().max_prompt_length(14);  // 14 + 4 - 1 = 17 tokens: 2 blocks and a fork's
    CHECK(contains(error_of([&] { check_run_fits_model(cfg, tiny); }), "(14 prompt token(s), up to 4 new) needs 3"));
    // tensor parallelism that does not split the heads (was: found by the engine, after the load)
    RunConfig<TP3DGRPOTrainer> tp;
    tp.run().sharding().tensor_parallel_size(4);
    const auto llama = load_config(std::string(HYBRIDRL_FIXTURES_DIR) + "/models/llama");  // 4 heads, 2 KV heads
    CHECK(contains(error_of([&] { check_run_fits_model(tp, llama); }),
                   "the model's num_key_value_heads = 2 is not divisible by tensor_parallel_size = 4"));
    tp.run().sharding().tensor_parallel_size(2);
    CHECK(error_of([&] { check_run_fits_model(tp, llama); }) == "(no error)");
    CHECK(contains(error_of([&] { check_run_fits_model(tp, tiny); }), "vocab_size = 259 is not divisible by tensor_parallel_size = 2"));
  }

  TEST_CASE("option values that no run can use name the key and the fix") {
    using T = Trainer<On, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>;
    CHECK(contains(error_of([] { T(T::Options{}.optim(OptimizerOptions{}.lr(-1e-6))); }), "optim.lr = -1e-06 is not a positive number"));
    CHECK(contains(error_of([] { T(T::Options{}.trainer(TrainerOptions{}.keep_last(0))); }),
                   "trainer.keep_last = 0 keeps no checkpoint"));
    CHECK(contains(error_of([] { T(T::Options{}.rollout(NaiveOptions{}.n(0))); }), "rollout.n = 0 is below 1"));
    // the dtype as the configuration spells it (was LibTorch's "Char")
    CHECK(contains(error_of([] { T(T::Options{}.sharding(FSDPOptions{}.param_dtype(at::kChar))); }),
                   "sharding.param_dtype = int8 is not a floating-point type"));
    CHECK(contains(error_of([] { T(T::Options{}.data(DataOptions{}.train_batch_size(0))); }),
                   "data.train_batch_size = 0 is below 1"));
    CHECK(contains(error_of([] { GRPOOptions{}.epsilon(0).validate(); }), "epsilon = 0 must be > 0 when norm_adv_by_std is on"));
    CHECK(error_of([] { GRPOOptions{}.dr_grpo(true).epsilon(0).validate(); }) == "(no error)");
  }

  TEST_CASE("GRPO's KL coefficient without use_kl_loss: no reference model, nothing read (verl's rule)") {
    const auto o = GRPOOptions{}.actor(ActorLossOptions{}.use_kl_loss(false).kl_loss_coef(0.5));
    CHECK(!Algorithm<GRPO>::uses_reference(o));
    const auto reads = Algorithm<GRPO>::loss_reads(o);
    CHECK(std::none_of(reads.begin(), reads.end(), [](const Key& k) { return k.name == keys::ref_log_probs.name; }));
    CHECK(Algorithm<GRPO>::uses_reference(GRPOOptions{}));  // on by default
  }
}
