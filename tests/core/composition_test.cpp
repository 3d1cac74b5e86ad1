// Policy axes, the cross-axis rules, batch geometry, options and device reporting.
// (What must NOT compile is in tests/compile_fail/; here: what must compile and what must be false.)

#include <hybridrl/hybridrl.hpp>

#include <sstream>
#include <string>
#include <doctest/doctest.h>  // last: c10 defines a CHECK macro of its own

using namespace hybridrl;

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
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}
bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }
}  // namespace

TEST_SUITE("core/composition") {
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
                   "60 × 12 ÷ 6 = 120 sequences is not a multiple of micro_batch_size_per_gpu 7 (120 % 7 = 1)"));
    CHECK(contains(error_of([&] { base().ppo_mini_batch_size(25).validate(); }), "60 % 25 = 10"));
    CHECK(contains(error_of([&] { base().ppo_mini_batch_size(61).validate(); }), "larger than train_batch_size"));
    CHECK(contains(error_of([&] { base().rollout_n(1).world_size(8).train_batch_size(64).ppo_mini_batch_size(4).micro_batch_size_per_gpu(1).validate(); }),
                   "4 × 1 = 4 sequences do not split over 8 data-parallel ranks"));
    CHECK(contains(error_of([&] { base().rollout_n(0).validate(); }), "count below 1"));
    CHECK(contains(error_of([&] { base().sequence_parallel_size(4).validate(); }), "6 % 4 = 2"));
    CHECK(error_of([&] { StaticBatch<60, 12, 6, 60, 4>::geometry().validate(); }) == "no error");
  }

  TEST_CASE("a composed trainer exposes its policies, validates options and describes itself") {
    using T = Trainer<On, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
    static_assert(std::is_same_v<T::algorithm, On>);
    static_assert(std::is_same_v<T::rollout, Rollout<Paged>>);
    static_assert(T::has_rollout);
    T::Options opts;
    opts.geometry(StaticBatch<8, 4, 2, 4, 2>::geometry());
    opts.rollout().block_size(32);
    T trainer(opts);
    CHECK(trainer.options().rollout().block_size() == 32);
    const auto d = trainer.describe();
    CHECK(contains(d, "Algorithm<Online> Sharding<FSDP> Rollout<Paged> Loader<Bucketed>"));
    CHECK(contains(d, "8 prompts × 4 samples = 32 sequences per step on 2 ranks"));

    // every part's validate() runs before anything else happens
    CHECK(contains(error_of([&] { T{T::Options{opts}.algorithm(TinyOptions{}.scale(-1))}; }), "scale must be positive"));
    CHECK(contains(error_of([&] { T{T::Options{opts}.rollout(PagedOptions{}.block_size(12))}; }), "paged.block_size = 12"));
    CHECK(contains(error_of([&] { auto o = opts; o.rollout().sampling().top_p(0); T{o}; }), "sampling.top_p = 0"));
    CHECK(contains(error_of([&] { auto o = opts; o.loader().batch_size(0); T{o}; }), "loader.batch_size = 0"));
    CHECK(contains(error_of([&] { auto o = opts; o.geometry().world_size(3); T{o}; }), "world_size 3"));
  }

  TEST_CASE("offline form: three policies, no rollout, rollout_n must stay 1") {
    using T = Trainer<Off, Sharding<FSDP>, Loader<Packed>>;
    static_assert(!T::has_rollout);
    static_assert(std::is_same_v<T::loader, Loader<Packed>>);
    T trainer(T::Options{});
    CHECK(contains(trainer.describe(), "Algorithm<Offline> Sharding<FSDP> Loader<Packed>"));
    T::Options bad;
    bad.geometry().rollout_n(4);
    CHECK(contains(error_of([&] { T{bad}; }), "Offline is offline"));
  }

  TEST_CASE("a user algorithm's hooks run through the trainer's types") {
    using T = Trainer<On, Sharding<FSDP>, Rollout<Naive>, Loader<Packed>>;
    TensorBatch b({{"scores", at::tensor(std::vector<float>{1.f, 2.f, 3.f})}});
    auto state = T::algorithm::make_state(TinyOptions{});
    T::algorithm::compute_advantages(b, TinyOptions{}.scale(2.0), state);
    auto out = T::algorithm::loss(b, TinyOptions{}, state, LossCounts{0, 3, 1});
    CHECK(out.loss.item<float>() == doctest::Approx((2.f + 4.f + 6.f) / 3.f));
  }

  TEST_CASE("options: chainable setters, validation names the field") {
    CHECK(contains(error_of([] { (void)TP3DOptions{}.tensor_parallel_size(3).resolve_data_parallel(8); }),
                   "3 × 1 = 3 does not divide world_size 8"));
    CHECK(TP3DOptions{}.tensor_parallel_size(2).pipeline_parallel_size(2).resolve_data_parallel(8) == 2);
    CHECK(contains(error_of([] { (void)TP3DOptions{}.data_parallel_size(3).tensor_parallel_size(2).resolve_data_parallel(8); }),
                   "set data_parallel_size to 4"));
    CHECK(contains(error_of([] { FSDPOptions{}.shard_group_size(0).validate(); }), "fsdp.shard_group_size = 0"));
    CHECK(contains(error_of([] { FSDPOptions{}.param_dtype(at::kInt).validate(); }), "floating-point"));
    CHECK(contains(error_of([] { NaiveOptions{}.max_batch_size(0).validate(); }), "naive.max_batch_size = 0"));
    CHECK(contains(error_of([] { SamplingOptions{}.temperature(-1).validate(); }), "sampling.temperature = -1"));
    CHECK(contains(error_of([] { PackedOptions{}.row_length(0).validate(); }), "loader.row_length = 0"));
    CHECK(error_of([] { PagedOptions{}.validate(); }) == "no error");
  }

  TEST_CASE("Error carries problem and fix separately") {
    Error e("the problem", "the fix");
    CHECK(std::string(e.what()) == "hybridrl: the problem\n  fix: the fix");
    CHECK(e.problem() == "the problem");
    CHECK(e.fix() == "the fix");
  }
}

TEST_SUITE("core/device") {
  TEST_CASE("device_info reports versions and agrees with LibTorch") {
    auto info = device_info();
    CHECK(info.hybridrl_version == std::string(HYBRIDRL_VERSION_STRING));
    CHECK(info.torch_version == std::string(TORCH_VERSION));
    CHECK(info.cuda_device_count == static_cast<int>(torch::cuda::device_count()));
    CHECK(static_cast<int>(info.devices.size()) <= info.cuda_device_count);
    if (info.cuda_device_count == 0) {
      CHECK_FALSE(info.fused_attention_available);
      CHECK_FALSE(info.flash_attention_available);
    }
#if !defined(HYBRIDRL_WITH_NCCL)
    CHECK_FALSE(info.nccl_available);
#endif
    CHECK(info.to_json()["torch_version"] == info.torch_version);
    CHECK(contains(info.to_string(), "LibTorch " + info.torch_version));
  }

  TEST_CASE("version matches CMake's project version") {
    CHECK(std::string(version()) == HYBRIDRL_CMAKE_PROJECT_VERSION);
  }

  TEST_CASE("log_memory sees an allocation grow the resident set") {
    std::ostringstream line;
    auto before = log_memory("before", &line);
    CHECK(contains(line.str(), "[memory] before |"));
    // 256 MiB touched page by page must show up in RSS (CPU) or allocated bytes (CUDA).
    const bool cuda = before.device != "cpu";
    auto big = at::ones({64 * 1024 * 1024}, at::TensorOptions(at::kFloat).device(cuda ? at::kCUDA : at::kCPU));
    auto after = log_memory("after", nullptr);
    if (cuda) {
      CHECK(after.allocated - before.allocated >= 256LL * 1024 * 1024);
      CHECK(after.peak_allocated >= after.allocated);
    } else {
      CHECK(before.rss > 0);
      CHECK(after.rss - before.rss >= 200LL * 1024 * 1024);
      CHECK(after.peak_rss >= after.rss);
    }
    CHECK(big.sum().item<double>() == doctest::Approx(64.0 * 1024 * 1024));
  }
}
