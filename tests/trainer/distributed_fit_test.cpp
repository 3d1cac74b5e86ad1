// fit() on several ranks (threads of this process, each a rank of hybridrl's thread group or of
// c10d Gloo): Sharding<FSDP> data-parallel training of GRPO (Rollout<Naive>) and DPO on 2 and 4
// ranks gives the weights and metrics one process gives on the same data (fp32); rank 0 alone
// writes the run's files; a checkpoint written by 2 ranks resumes on one process and on 4 as the
// uninterrupted run; the frozen reference is sharded as the policy is; a batch that does not
// split over the ranks is refused with the fix; placement.* puts the reference and the reward on
// ranks of their own (inside the actor's or beside them) and trains as the colocated run does;
// Sharding<TP3D> trains GRPO and PPO (policy and critic split over the tensor group) as one
// process does.

#include <hybridrl/hybridrl.hpp>

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "../support/fit.hpp"
#include "../support/gloo.hpp"
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

#include <filesystem>
#include <fstream>

namespace hybridrl::testing {
using DistGRPO = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>;

inline DistGRPO::Options dist_grpo_options(int64_t steps) {
  auto o = online_fit_options<DistGRPO>(steps, 3);
  o.geometry().micro_batch_size_per_gpu(8);  // 32 sequences a step: 8 per micro-batch on up to 4 ranks
  return o;
}
// The text a FILE* holds from its start.
inline std::string file_text(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string out;
  for (int c = std::fgetc(f); c != EOF; c = std::fgetc(f)) out.push_back(static_cast<char>(c));
  return out;
}
inline std::vector<double> dist_reward(std::span<const RewardInput> in) {
  std::vector<double> out;
  for (const auto& x : in) out.push_back(share_in_band(x, 100));
  return out;
}
inline std::shared_ptr<Communicator> dist_borrowed(Communicator& c) {
  return std::shared_ptr<Communicator>(&c, [](Communicator*) {});
}
// The largest ||a - b|| / ||b|| over the parameters of two models.
inline double dist_weights_rel(const CausalLM& a, const CausalLM& b) {
  double worst = 0;
  auto pb = b->named_parameters();
  for (const auto& p : a->named_parameters()) {
    const auto& q = pb[p.key()];
    worst = std::max(worst, ((p.value() - q).norm() / q.norm().clamp_min(1e-12)).item<double>());
  }
  return worst;
}
// One process's run of `steps` GRPO steps on the fixture: the trained model and each step's metrics.
struct OneProcessRun {
  CausalLM model;
  std::vector<std::map<std::string, double>> steps;
};
inline OneProcessRun one_process_grpo(int64_t steps, std::shared_ptr<const PromptDataset> prompts,
                                      BatchRewardFn reward = dist_reward) {
  OneProcessRun run{fit_fixture_model(), {}};
  FitParts p;
  p.progress = nullptr;
  p.on_step = [&](int64_t, const std::map<std::string, double>& m) { run.steps.push_back(m); };
  DistGRPO(dist_grpo_options(steps)).fit(run.model, std::move(prompts), std::move(reward), p);
  REQUIRE(static_cast<int64_t>(run.steps.size()) == steps);
  return run;
}
// `fit(policy, parts)` on `world` ranks of the thread group, each rank its own fixture policy and
// `quiet` with its Communicator: rank 0's step metrics, and every rank's trained weights against
// `ref` (dist_weights_rel; the policy holds the full weights after fit on every rank).
struct RanksRun {
  std::vector<std::map<std::string, double>> steps;
  std::vector<double> rel;
};
template <class Fit>
RanksRun fit_on_ranks(int world, const CausalLM& ref, const FitParts& quiet, Fit&& fit) {
  RanksRun out;
  out.rel.assign(static_cast<size_t>(world), 1.0);
  std::mutex m;
  run_on("thread", world, [&](Communicator& comm) {
    FitParts p = quiet;
    p.comm = dist_borrowed(comm);
    if (comm.rank() == 0) p.on_step = [&](int64_t, const std::map<std::string, double>& x) { out.steps.push_back(x); };
    auto policy = fit_fixture_model();
    fit(policy, p);
    const auto r = dist_weights_rel(policy, ref);
    std::lock_guard<std::mutex> lock(m);
    out.rel[static_cast<size_t>(comm.rank())] = r;
  });
  return out;
}
// Three steps of a multi-rank run against one process's: the same samples (seeds of the global
// group ids), rewards, loss, gradient norm and KL.
inline void check_steps_like(std::vector<std::map<std::string, double>>& steps,
                             std::vector<std::map<std::string, double>>& ref_steps) {
  REQUIRE(steps.size() == ref_steps.size());
  for (size_t s = 0; s < steps.size(); ++s) {
    CAPTURE(s);
    CHECK(steps[s]["reward_mean"] == doctest::Approx(ref_steps[s]["reward_mean"]).epsilon(1e-9));
    CHECK(steps[s]["response_length_mean"] == doctest::Approx(ref_steps[s]["response_length_mean"]));
    CHECK(steps[s]["loss"] == doctest::Approx(ref_steps[s]["loss"]).epsilon(1e-5));
    CHECK(steps[s]["grad_norm"] == doctest::Approx(ref_steps[s]["grad_norm"]).epsilon(1e-5));
    CHECK(steps[s]["kl"] == doctest::Approx(ref_steps[s]["kl"]).epsilon(1e-4));
  }
}
}  // namespace hybridrl::testing

using namespace hybridrl;
using namespace hybridrl::testing;
using hybridrl::testing::contains;
using hybridrl::testing::error_of;

TEST_SUITE("trainer/distributed") {
  TEST_CASE("a step's metrics over ranks: times, memory and *_max the largest, *_min the smallest, tokens_per_s summed, the rest averaged") {
    std::vector<std::map<std::string, double>> got(3);
    hybridrl::run_ranks(3, [&](hybridrl::Communicator& comm) {
      const double r = comm.rank();
      std::map<std::string, double> m{{"loss", r},
                                      {"time/step", 10 - r},
                                      {"memory/peak_gb", r * r},
                                      {"rollout/ratio_max", 1 + r},
                                      {"rollout/ratio_min", 0.5 + r},
                                      {"tokens_per_s", 100 * (r + 1)}};
      hybridrl::detail::reduce_metrics(m, comm);
      got[static_cast<size_t>(comm.rank())] = m;
    });
    for (const auto& m : got) {
      CHECK(m.at("loss") == doctest::Approx(1.0));  // (0 + 1 + 2) / 3
      CHECK(m.at("time/step") == 10.0);
      CHECK(m.at("memory/peak_gb") == 4.0);
      CHECK(m.at("rollout/ratio_max") == 3.0);
      CHECK(m.at("rollout/ratio_min") == 0.5);
      CHECK(m.at("tokens_per_s") == 600.0);
    }
  }

  TEST_CASE("GRPO with Sharding<FSDP> on 2 and 4 ranks fits as one process does; rank 0 writes; 2 ranks resume on 1 and on 4") {
    FitTempDir tmp("dist_grpo");
    auto prompts = fixture_prompts(tmp.path);
    FitParts quiet;
    quiet.progress = nullptr;
    auto run = one_process_grpo(3, prompts);
    auto& one = run.model;
    auto& ref_steps = run.steps;
    CHECK(dist_weights_rel(one, fit_fixture_model()) > 1e-3);  // training moved the weights

    for (const auto& backend : backends()) {
      for (const int world : {2, 4}) {
        CAPTURE(backend);
        CAPTURE(world);
        std::mutex m;
        std::vector<std::map<std::string, double>> steps;
        std::vector<double> rel(static_cast<size_t>(world), 1.0);
        run_on(backend, world, [&](Communicator& comm) {
          FitParts p = quiet;
          p.comm = dist_borrowed(comm);
          if (comm.rank() == 0) p.on_step = [&](int64_t, const std::map<std::string, double>& x) { steps.push_back(x); };
          auto policy = fit_fixture_model();
          DistGRPO(dist_grpo_options(3), world).fit(policy, prompts, dist_reward, p);
          const auto r = dist_weights_rel(policy, one);  // fit leaves the trained weights in the policy on every rank
          std::lock_guard<std::mutex> lock(m);
          rel[static_cast<size_t>(comm.rank())] = r;
        });
        for (const auto r : rel) CHECK(r <= 1e-5);
        REQUIRE(steps.size() == 3);
        // the memory report: a rank stores 1/world of the parameters (3 units, each padded to a
        // multiple of the world)
        CHECK(steps[0]["sharding/param_elements"] == ref_steps[0]["sharding/param_elements"]);
        CHECK(ref_steps[0]["sharding/param_elements_per_rank"] == ref_steps[0]["sharding/param_elements"]);
        CHECK(steps[0]["sharding/param_elements_per_rank"] * world >= steps[0]["sharding/param_elements"]);
        CHECK(steps[0]["sharding/param_elements_per_rank"] * world <= steps[0]["sharding/param_elements"] + 3 * world);
        // the frozen reference (GRPO's KL) is sharded as the policy is: the same share per rank
        CHECK(ref_steps[0]["sharding/reference_elements_per_rank"] == ref_steps[0]["sharding/param_elements"]);
        CHECK(steps[0]["sharding/reference_elements_per_rank"] == steps[0]["sharding/param_elements_per_rank"]);
        check_steps_like(steps, ref_steps);
      }
    }

    // 2 ranks write a checkpoint at step 2 (rank 0 alone writes files); one process resumes it
    const auto out = tmp.path + "/two";
    run_on("thread", 2, [&](Communicator& comm) {
      FitParts p = quiet;
      p.comm = dist_borrowed(comm);
      auto o = dist_grpo_options(2);
      o.trainer().output_dir(out).save_every(1);
      DistGRPO(o, 2).fit(fit_fixture_model(), prompts, dist_reward, p);
    });
    CHECK(std::filesystem::exists(out + "/checkpoints/step_00000002/trainer_state.json"));
    CHECK(std::filesystem::exists(out + "/model/model.safetensors"));
    CHECK(reproducible_metrics(out).size() == 2);  // one writer: two lines, not four
    // ... and 4 ranks resume it too (a checkpoint holds full tensors: any world size reads it)
    const auto out4 = tmp.path + "/four";
    std::filesystem::copy(out, out4, std::filesystem::copy_options::recursive);
    std::vector<double> rel4(4, 1.0);
    std::vector<int64_t> from4(4, -1);
    std::mutex m4;
    run_on("thread", 4, [&](Communicator& comm) {
      FitParts p = quiet;
      p.comm = dist_borrowed(comm);
      auto o = dist_grpo_options(3);
      o.trainer().output_dir(out4);
      auto policy = fit_fixture_model();
      const auto r = DistGRPO(o, 4).fit(policy, prompts, dist_reward, p);
      const auto w = dist_weights_rel(policy, one);
      std::lock_guard<std::mutex> lock(m4);
      rel4[static_cast<size_t>(comm.rank())] = w;
      from4[static_cast<size_t>(comm.rank())] = r.resumed_from;
    });
    for (size_t k = 0; k < 4; ++k) {
      CAPTURE(k);
      CHECK(from4[k] == 2);
      CHECK(rel4[k] <= 1e-5);
    }
    auto resumed = fit_fixture_model();
    auto o = dist_grpo_options(3);
    o.trainer().output_dir(out);
    const auto r = DistGRPO(o).fit(resumed, prompts, dist_reward, quiet);
    CHECK(r.resumed_from == 2);
    CHECK(dist_weights_rel(resumed, one) <= 1e-5);
  }

  TEST_CASE("sharding.cpu_offload: GRPO on one process and on 2 ranks trains as without it") {
    FitTempDir tmp("dist_offload");
    auto prompts = fixture_prompts(tmp.path);
    FitParts quiet;
    quiet.progress = nullptr;
    auto run = one_process_grpo(3, prompts);
    auto o = dist_grpo_options(3);
    o.sharding().cpu_offload(true);
    std::vector<std::map<std::string, double>> steps;
    FitParts p1 = quiet;
    p1.on_step = [&](int64_t, const std::map<std::string, double>& x) { steps.push_back(x); };
    auto alone = fit_fixture_model();
    DistGRPO(o).fit(alone, prompts, dist_reward, p1);
    CHECK(dist_weights_rel(alone, run.model) <= 1e-5);
    check_steps_like(steps, run.steps);
    const auto two = fit_on_ranks(2, run.model, quiet, [&](CausalLM& policy, const FitParts& p) {
      DistGRPO(o, 2).fit(policy, prompts, dist_reward, p);
    });
    for (const auto r : two.rel) CHECK(r <= 1e-5);
  }

  TEST_CASE("GRPO on 2 ranks, trainer.checkpoint_format=sharded: a file per rank, HF weights on request; resumed on 1 and on 4 as the uninterrupted run") {
    namespace fs = std::filesystem;
    FitTempDir tmp("dist_shards");
    auto prompts = fixture_prompts(tmp.path);
    FitParts quiet;
    quiet.progress = nullptr;
    auto run = one_process_grpo(3, prompts);
    const auto out = tmp.path + "/two";
    run_on("thread", 2, [&](Communicator& comm) {
      FitParts p = quiet;
      p.comm = dist_borrowed(comm);
      auto o = dist_grpo_options(2);
      o.trainer().output_dir(out).save_every(1).checkpoint_format("sharded").checkpoint_hf_weights(true);
      DistGRPO(o, 2).fit(fit_fixture_model(), prompts, dist_reward, p);
    });
    const auto step2 = out + "/checkpoints/step_00000002";
    for (const char* f : {"shard_00000-of-00002.safetensors", "shard_00001-of-00002.safetensors", "model.safetensors",
                          "config.json", "trainer_state.json", "trainer_state.safetensors"}) {
      CAPTURE(f);
      CHECK(fs::exists(step2 + "/" + f));
    }
    CHECK(fs::exists(out + "/checkpoints/step_00000001/shard_00001-of-00002.safetensors"));  // keep_last = 2
    // the HF weights are the full weights the shards hold, bit for bit, and load as a model
    const auto d = CheckpointManager::load(step2);
    REQUIRE(d.sharded != nullptr);
    const auto hf = load_safetensors(step2 + "/model.safetensors");
    CHECK(hf.size() == fit_fixture_model()->named_parameters().size());
    for (const auto& [k, v] : hf) {
      CAPTURE(k);
      CHECK(at::equal(d.source()->full("model." + k), v));
    }
    CHECK(dist_weights_rel(load_causal_lm(step2), load_causal_lm(out + "/model")) == 0);  // the run's last step
    // resumed on 4 ranks sharded in pairs (the first pair writes step 3) and on one process
    // (checkpoint_format=full reads it too): both end where the uninterrupted run does
    const auto out4 = tmp.path + "/four";
    fs::copy(out, out4, fs::copy_options::recursive);
    std::vector<double> rel4(4, 1.0);
    std::vector<int64_t> from4(4, -1);
    std::mutex m4;
    run_on("thread", 4, [&](Communicator& comm) {
      FitParts p = quiet;
      p.comm = dist_borrowed(comm);
      auto o = dist_grpo_options(3);
      o.trainer().output_dir(out4).checkpoint_format("sharded");
      o.sharding().shard_group_size(2);
      auto policy = fit_fixture_model();
      const auto r = DistGRPO(o, 4).fit(policy, prompts, dist_reward, p);
      const auto w = dist_weights_rel(policy, run.model);
      std::lock_guard<std::mutex> lock(m4);
      rel4[static_cast<size_t>(comm.rank())] = w;
      from4[static_cast<size_t>(comm.rank())] = r.resumed_from;
    });
    for (size_t k = 0; k < 4; ++k) {
      CAPTURE(k);
      CHECK(from4[k] == 2);
      CHECK(rel4[k] <= 1e-5);
    }
    CHECK(CheckpointManager::load(out4 + "/checkpoints/step_00000003").sharded->files() == 2);
    CHECK_FALSE(fs::exists(out4 + "/checkpoints/step_00000003/model.safetensors"));
    auto resumed = fit_fixture_model();
    auto o = dist_grpo_options(3);
    o.trainer().output_dir(out);
    const auto r = DistGRPO(o).fit(resumed, prompts, dist_reward, quiet);
    CHECK(r.resumed_from == 2);
    CHECK(dist_weights_rel(resumed, run.model) <= 1e-5);
    CHECK(fs::exists(out + "/checkpoints/step_00000003/model.safetensors"));  // written full, as asked
    // refused: a format that does not exist, HF weights a full checkpoint has anyway, and a
    // Sharding policy that writes full checkpoints only
    auto bad = dist_grpo_options(3);
    bad.trainer().checkpoint_format("dcp");
    CHECK(contains(error_of([&] { DistGRPO(bad, 2); }), "trainer.checkpoint_format = 'dcp' is not a format"));
    bad.trainer().checkpoint_format("full").checkpoint_hf_weights(true);
    CHECK(contains(error_of([&] { DistGRPO(bad, 2); }), "checkpoint_hf_weights = true with checkpoint_format = full"));
    using TPGRPO = Trainer<Algorithm<GRPO>, Sharding<TP3D>, Rollout<Paged>, Loader<Bucketed>>;
    auto tp = online_fit_options<TPGRPO>(3, 3);
    tp.trainer().checkpoint_format("sharded");
    CHECK(contains(error_of([&] { TPGRPO(tp, 2); }),
                   "trainer.checkpoint_format = sharded, but Sharding<TP3D> writes full checkpoints only"));
  }

  TEST_CASE("GRPO on 2 ranks scored by a reward model sharded over them fits as one process with the whole reward model") {
    FitTempDir tmp("dist_rm");
    auto prompts = fixture_prompts(tmp.path);
    const auto rm_dir = std::string(HYBRIDRL_FIXTURES_DIR) + "/models/llama_rm";
    FitParts quiet;
    quiet.progress = nullptr;
    std::vector<std::map<std::string, double>> steps;
    auto run = one_process_grpo(2, prompts, reward_model_reward(load_reward_model(rm_dir), 4));
    auto& one = run.model;
    auto& ref_steps = run.steps;
    std::mutex m;
    std::vector<double> rel(2, 1.0);
    std::vector<int64_t> rm_local(2), rm_total(2);
    run_on("thread", 2, [&](Communicator& comm) {
      FitParts p = quiet;
      p.comm = dist_borrowed(comm);
      if (comm.rank() == 0) p.on_step = [&](int64_t, const std::map<std::string, double>& x) { steps.push_back(x); };
      auto rm = std::make_shared<ShardedFrozen<RewardModel>>(load_reward_model(rm_dir), p.comm, at::kFloat);
      auto policy = fit_fixture_model();
      DistGRPO(dist_grpo_options(2), 2).fit(policy, prompts, reward_model_reward(rm, 4, p.comm), p);
      const auto r = dist_weights_rel(policy, one);
      std::lock_guard<std::mutex> lock(m);
      rel[static_cast<size_t>(comm.rank())] = r;
      rm_local[static_cast<size_t>(comm.rank())] = rm->local_parameter_elements();
      rm_total[static_cast<size_t>(comm.rank())] = rm->total_parameter_elements();
    });
    REQUIRE(steps.size() == 2);
    check_steps_like(steps, ref_steps);
    CHECK(ref_steps[0]["reward_std"] > 0);  // the reward model tells the samples apart
    for (size_t r = 0; r < 2; ++r) {
      CHECK(rel[r] <= 1e-5);
      CHECK(rm_local[r] * 2 < rm_total[r] + 64);  // each rank stores half of the reward model
    }

    // placement.actor = "0", placement.reward = "1-2": the policy trains on rank 0 alone, the
    // reward model is sharded over ranks 1 and 2, which only score; the same run
    std::vector<std::map<std::string, double>> placed_steps;
    std::vector<int64_t> done(3, -1);
    std::vector<int64_t> rm_share(3, 0);
    double rel0 = 1.0;
    run_on(backends().back(), 3, [&](Communicator& comm) {
      FitParts p = quiet;
      p.comm = dist_borrowed(comm);
      if (comm.rank() == 0) p.on_step = [&](int64_t, const std::map<std::string, double>& x) { placed_steps.push_back(x); };
      auto o = dist_grpo_options(2);
      o.placement().actor("0").reward("1-2");
      auto group = placement_group(p.comm, {1, 2});  // collective: every rank splits
      BatchRewardFn reward = [](std::span<const RewardInput>) -> std::vector<double> {
        throw Error("rank 0 scored", "");  // never called: the actor's rank does not score
      };
      std::shared_ptr<ShardedFrozen<RewardModel>> rm;
      if (group) {
        rm = std::make_shared<ShardedFrozen<RewardModel>>(load_reward_model(rm_dir), group, at::kFloat);
        reward = reward_model_reward(rm, 4, group);
      }
      auto policy = fit_fixture_model();
      const auto r = DistGRPO(o, 3).fit(policy, prompts, reward, p);
      std::lock_guard<std::mutex> lock(m);
      done[static_cast<size_t>(comm.rank())] = r.steps;
      if (comm.rank() == 0) rel0 = dist_weights_rel(policy, one);
      if (rm) rm_share[static_cast<size_t>(comm.rank())] = rm->local_parameter_elements();
    });
    CHECK(rel0 <= 1e-5);
    CHECK(done == std::vector<int64_t>{2, 2, 2});  // the scoring ranks learn when the run ends
    CHECK(rm_share[0] == 0);
    CHECK(rm_share[1] * 2 < rm_total[0] + 64);
    CHECK(rm_share[2] * 2 < rm_total[0] + 64);
    check_steps_like(placed_steps, ref_steps);
  }

  TEST_CASE("placement: the reference and the reward on ranks of their own train as the colocated run does") {
    FitTempDir tmp("dist_place");
    auto prompts = fixture_prompts(tmp.path);
    FitParts quiet;
    quiet.progress = nullptr;
    auto run = one_process_grpo(2, prompts);
    auto& one = run.model;
    auto& ref_steps = run.steps;

    struct Case {
      std::string backend;
      int world;
      std::string actor, reference, reward, layout;
    };
    for (const auto& c : std::vector<Case>{
             // inside the actor: 4 ranks generate and train; ranks 2-3 hold the reference (half each),
             // rank 1 alone scores the rewards of all 32 samples
             {"thread", 4, "", "2-3", "1", "actor 0-3, reference 2-3, reward 1"},
             // beside it: ranks 0-1 generate and train; rank 2 holds the reference and scores
             {backends().back(), 3, "0-1", "2", "2", "actor 0-1, reference 2, reward 2"}}) {
      CAPTURE(c.backend);
      CAPTURE(c.layout);
      std::mutex m;
      std::vector<std::map<std::string, double>> steps;
      std::vector<double> rel(static_cast<size_t>(c.world), 1.0), untouched(static_cast<size_t>(c.world), 1.0);
      std::vector<int64_t> done(static_cast<size_t>(c.world), -1);
      std::string progress;
      run_on(c.backend, c.world, [&](Communicator& comm) {
        FitParts p = quiet;
        p.comm = dist_borrowed(comm);
        std::FILE* f = comm.rank() == 0 ? std::tmpfile() : nullptr;
        if (comm.rank() == 0) {
          p.progress = f;
          p.on_step = [&](int64_t, const std::map<std::string, double>& x) { steps.push_back(x); };
        }
        auto o = dist_grpo_options(2);
        o.placement().actor(c.actor).reference(c.reference).reward(c.reward);
        auto policy = fit_fixture_model();
        const auto r = DistGRPO(o, c.world).fit(policy, prompts, dist_reward, p);
        const auto w = dist_weights_rel(policy, one), w0 = dist_weights_rel(policy, fit_fixture_model());
        std::lock_guard<std::mutex> lock(m);
        rel[static_cast<size_t>(comm.rank())] = w;
        untouched[static_cast<size_t>(comm.rank())] = w0;
        done[static_cast<size_t>(comm.rank())] = r.steps;
        if (f != nullptr) {
          progress = file_text(f);
          std::fclose(f);
        }
      });
      CHECK(contains(progress, "placement: " + c.layout + " (ranks)"));
      const auto actors = static_cast<size_t>(c.actor.empty() ? c.world : 2);
      for (size_t r = 0; r < static_cast<size_t>(c.world); ++r) {
        CAPTURE(r);
        CHECK(done[r] == 2);
        if (r < actors) CHECK(rel[r] <= 1e-5);  // the actor's ranks hold the trained policy
      }
      if (actors < static_cast<size_t>(c.world)) CHECK(untouched[2] == 0.0);  // a scoring rank's policy is as given
      check_steps_like(steps, ref_steps);
      // the reference's share, averaged over the actor's ranks: 4 ranks, 2 of them holding half
      // each (1/4 on average); 2 ranks beside it: none
      const double total = steps[0]["sharding/param_elements"];
      if (c.world == 4) CHECK(steps[0]["sharding/reference_elements_per_rank"] == doctest::Approx(total / 4).epsilon(0.01));
      if (c.world == 3) CHECK(steps[0]["sharding/reference_elements_per_rank"] == 0.0);
    }

    // bf16: before its first update the policy equals the reference bit for bit (KL 0), with the
    // reference on one rank beside a 2-rank actor and on 2 ranks beside it, as when colocated, and
    // sharded over 2 ranks beside a 1-rank actor (whose one-shard units compute on bf16 copies)
    for (const std::string reference : {"", "2", "2-3", "1-2"}) {
      CAPTURE(reference);
      double kl = -1;
      const int world = reference == "2-3" ? 4 : reference.empty() ? 2 : 3;
      const std::string actor = reference == "1-2" ? "0" : "0-1";
      run_on("thread", world, [&](Communicator& comm) {
        FitParts p = quiet;
        p.comm = dist_borrowed(comm);
        if (comm.rank() == 0) p.on_step = [&](int64_t, const std::map<std::string, double>& x) { kl = x.at("kl"); };
        auto o = dist_grpo_options(1);
        o.sharding().param_dtype(at::kBFloat16);
        if (!reference.empty()) o.placement().actor(actor).reference(reference).reward(actor);
        DistGRPO(o, world).fit(fit_fixture_model(), prompts, dist_reward, p);
      });
      CHECK(kl == 0.0);
    }

    // a reward that fails on its scoring rank fails on every rank, with its message
    std::vector<std::string> errors(3);
    std::mutex em;
    run_on("thread", 3, [&](Communicator& comm) {
      FitParts p = quiet;
      p.comm = dist_borrowed(comm);
      auto o = dist_grpo_options(2);
      o.placement().actor("0-1").reward("2");
      BatchRewardFn bad = [](std::span<const RewardInput>) -> std::vector<double> {
        throw Error("the grader is down", "start the grader");
      };
      const auto e = error_of([&] { DistGRPO(o, 3).fit(fit_fixture_model(), prompts, bad, p); });
      std::lock_guard<std::mutex> lock(em);
      errors[static_cast<size_t>(comm.rank())] = e;
    });
    for (const auto& e : errors) {
      CHECK(contains(e, "rank 2 (scoring for ranks 2): the grader is down"));
      CHECK(contains(e, "start the grader"));
    }
  }

  TEST_CASE("GRPO on 2 ranks: an epoch's short last batch that does not split over the ranks is refused before the first step") {
    FitTempDir tmp("dist_short");
    auto prompts = fixture_prompts(tmp.path, 9);  // batches of 4, 4 and 1 prompts
    std::vector<std::string> errors(2);
    std::vector<int> stepped(2, 0);
    std::mutex m;
    run_on("thread", 2, [&](Communicator& comm) {
      FitParts p;
      p.progress = nullptr;
      p.comm = dist_borrowed(comm);
      p.on_step = [&](int64_t, const std::map<std::string, double>&) { ++stepped[static_cast<size_t>(comm.rank())]; };
      auto o = dist_grpo_options(3);
      o.loader().epochs(1).drop_last(false);
      const auto e = error_of([&] { DistGRPO(o, 2).fit(fit_fixture_model(), prompts, dist_reward, p); });
      std::lock_guard<std::mutex> lock(m);
      errors[static_cast<size_t>(comm.rank())] = e;
    });
    for (size_t r = 0; r < 2; ++r) {
      CHECK(contains(errors[r], "data.train_batch_size = 4 leaves a last batch of 1 prompt(s) in each epoch of 9, "
                                "which does not split over 2 generating ranks"));
      CHECK(contains(errors[r], "loader.drop_last=true"));
      CHECK(stepped[r] == 0);
    }
    // 2 steps end before the short batch: the run goes
    run_on("thread", 2, [&](Communicator& comm) {
      FitParts p;
      p.progress = nullptr;
      p.comm = dist_borrowed(comm);
      auto o = dist_grpo_options(2);
      o.loader().epochs(1).drop_last(false);
      CHECK(DistGRPO(o, 2).fit(fit_fixture_model(), prompts, dist_reward, p).steps == 2);
    });
  }

  TEST_CASE("placement: a map that does not fit the world is refused when the Trainer is built") {
    auto o = dist_grpo_options(2);
    auto refused = [&](auto set, int world) {
      auto x = o;
      set(x.placement());
      return error_of([&] { DistGRPO(x, world); });
    };
    CHECK(contains(refused([](auto& p) { p.reference("2-4"); }, 4),
                   "placement.reference = \"2-4\" names rank 4, but the process group has 4 rank(s) (0-3)"));
    CHECK(contains(refused([](auto& p) { p.reference("1"); }, 1), "names rank 1, but the process group has 1 rank(s)"));
    CHECK(contains(refused([](auto& p) { p.actor("1-3"); }, 4), "placement.actor = \"1-3\" leaves out rank 0"));
    CHECK(contains(refused([](auto& p) { p.critic("0"); }, 2), "placement.critic = \"0\" is not the actor's ranks"));
    CHECK(contains(refused([](auto& p) { p.actor("0-1").reference("2"); }, 4),
                   "leave rank 3 of 4 without a model"));
    CHECK(contains(refused([](auto& p) { p.reward("0-"); }, 2),
                   "placement.reward = \"0-\" is not a list of ranks: a rank number is missing"));
    CHECK(contains(refused([](auto& p) { p.reward("3-1"); }, 4), "the range 3-1 runs backwards"));
    CHECK(contains(refused([](auto& p) { p.reward("0;1"); }, 4), "';' is neither a digit"));
    CHECK(contains(refused([](auto& p) { p.actor("0-1").reference("2"); }, 4), "launch fewer ranks"));
    // the geometry's world is the actor's ranks
    auto x = o;
    x.placement().actor("0-1").reference("2-3").reward("2-3");
    CHECK(DistGRPO(x, 4).options().geometry().world_size() == 2);
    CHECK(DistGRPO(o, 4).options().geometry().world_size() == 4);
    CHECK((PlacementOptions::parse_ranks("4-5,0,2,2") == std::vector<int64_t>{0, 2, 4, 5}));
    CHECK(PlacementOptions::parse_ranks("").empty());
    // ... a TP3D trainer keeps every model on its mesh; an offline algorithm keeps its reference
    using TPGRPO = Trainer<Algorithm<GRPO>, Sharding<TP3D>, Rollout<Paged>, Loader<Bucketed>>;
    auto tp = online_fit_options<TPGRPO>(2, 3);
    tp.placement().reward("1");
    CHECK(contains(error_of([&] { TPGRPO(tp, 2); }), "Sharding<TP3D> keeps every model on the ranks of its own mesh"));
    using DistDPO = Trainer<Algorithm<DPO>, Sharding<FSDP>, Loader<Bucketed>>;
    DistDPO::Options d;
    d.data().train_batch_size(4);
    d.geometry().ppo_mini_batch_size(4).micro_batch_size_per_gpu(1);
    d.placement().reward("1");
    CHECK(contains(error_of([&] { DistDPO(d, 2); }), "placement.reward = \"1\" but an offline algorithm has no reward"));
  }

  TEST_CASE("placement, offline: DPO and KTO with the reference on ranks of their own train as one process does") {
    // The actor's two ranks hold rows of different widths (lengths vary): each token tensor is
    // padded to its widest before the rows travel to the reference's ranks, whose per-row sums
    // come back to the rank that owns the row.
    FitTempDir tmp("placed_offline");
    const ByteTokenizer tok;
    const auto pairs_path = tmp.path + "/pairs.jsonl", labelled_path = tmp.path + "/labelled.jsonl";
    {
      std::ofstream pairs(pairs_path), labelled(labelled_path);
      for (int i = 0; i < 8; ++i) {
        const char c = static_cast<char>('a' + i);
        const auto len = static_cast<size_t>(1 + (i * 5) % 7);
        pairs << nlohmann::json{{"prompt", std::string("say ") + std::string(len, c)}, {"chosen", std::string(len + 1, c)},
                                {"rejected", std::string(8 - len, 'z')}}.dump() << "\n";
        labelled << nlohmann::json{{"prompt", std::string(len, c)}, {"completion", i % 2 == 0 ? std::string(len, c) : "zq"},
                                   {"label", i % 2 == 0}}.dump() << "\n";
      }
    }
    auto run = [&](auto tag, auto data, const char* reference, int world, const char* metric) {
      using T = typename decltype(tag)::type;
      typename T::Options o;
      o.trainer().seed(9).total_steps(2);
      o.data().train_batch_size(4);
      o.geometry().ppo_mini_batch_size(4).micro_batch_size_per_gpu(1);
      o.optim().lr(2e-3).weight_decay(0.0);
      o.sharding().param_dtype(at::kFloat);
      o.loader().row_length(64).epochs(1).prefetch_factor(0);
      FitParts quiet;
      quiet.progress = nullptr;
      std::vector<std::map<std::string, double>> ref_steps, steps;
      FitParts rp = quiet;
      rp.on_step = [&](int64_t, const std::map<std::string, double>& m) { ref_steps.push_back(m); };
      auto one = fit_fixture_model();
      T(o).fit(one, data, rp);
      REQUIRE(ref_steps.size() == 2);
      auto placed = o;
      placed.placement().actor("0-1").reference(reference);
      std::mutex m;
      std::vector<double> rel(static_cast<size_t>(world), 1.0);
      std::vector<int64_t> ran(static_cast<size_t>(world), -1);
      run_on("thread", world, [&](Communicator& comm) {
        FitParts p = quiet;
        p.comm = dist_borrowed(comm);
        if (comm.rank() == 0) p.on_step = [&](int64_t, const std::map<std::string, double>& x) { steps.push_back(x); };
        auto policy = fit_fixture_model();
        const auto r = T(placed, world).fit(policy, data, p);
        const auto w = comm.rank() < 2 ? dist_weights_rel(policy, one) : 0.0;
        std::lock_guard<std::mutex> lock(m);
        rel[static_cast<size_t>(comm.rank())] = w;
        ran[static_cast<size_t>(comm.rank())] = r.steps;
      });
      for (int r = 0; r < world; ++r) {
        CAPTURE(r);
        CHECK(rel[static_cast<size_t>(r)] <= 1e-5);
        CHECK(ran[static_cast<size_t>(r)] == 2);
      }
      REQUIRE(steps.size() == 2);
      for (size_t s = 0; s < 2; ++s) {
        CAPTURE(s);
        CHECK(steps[s].at(metric) == doctest::Approx(ref_steps[s].at(metric)).epsilon(1e-5));
        CHECK(steps[s].at("grad_norm") == doctest::Approx(ref_steps[s].at("grad_norm")).epsilon(1e-5));
        CHECK(ref_steps[s].at("grad_norm") > 0.0);
        CHECK(steps[s].at("sharding/reference_elements_per_rank") == 0.0);  // the actor's ranks hold none of it
      }
    };
    // the rows' journey: rank 1's narrower token tensors are padded with 0 to rank 0's width
    run_on("thread", 2, [&](Communicator& comm) {
      const int64_t w = comm.rank() == 0 ? 5 : 3;
      TensorBatch mine;
      mine.set("input_ids", at::full({2, w}, comm.rank() + 1, at::kLong));
      mine.set("attention_mask", at::ones({2, w}, at::kLong));
      mine.set("desirable", at::full({2}, comm.rank(), at::kLong));
      const auto all = hybridrl::detail::gather_padded_rows(mine, comm, at::kCPU);
      CHECK(all.size() == 4);
      CHECK(all.tensor("input_ids").sizes() == at::IntArrayRef{4, 5});
      CHECK(at::equal(all.tensor("attention_mask").sum(1), at::tensor({5, 5, 3, 3}, at::kLong)));
      CHECK(at::equal(all.tensor("input_ids")[2], at::tensor({2, 2, 2, 0, 0}, at::kLong)));
      CHECK(at::equal(all.tensor("desirable"), at::tensor({0, 0, 1, 1}, at::kLong)));
    });
    auto pairs = std::make_shared<const PreferenceDataset>(PreferenceDataset::from_jsonl(pairs_path, tok, DatasetOptions{}.max_length(64)));
    auto labelled = std::make_shared<const LabelledDataset>(LabelledDataset::from_jsonl(labelled_path, tok, DatasetOptions{}.max_length(64)));
    SUBCASE("DPO, the reference on rank 2 of 3") { run(std::type_identity<DPOTrainer>{}, pairs, "2", 3, "dpo/loss"); }
    SUBCASE("KTO, the reference sharded over ranks 2-3 of 4") { run(std::type_identity<KTOTrainer>{}, labelled, "2-3", 4, "loss"); }
  }

  TEST_CASE("GRPO with Sharding<TP3D> (tensor 2; data 2 × tensor 2) fits as one process does; weights go to a TP = 1 rollout") {
    using TPGRPO = Trainer<Algorithm<GRPO>, Sharding<TP3D>, Rollout<Paged>, Loader<Bucketed>>;
    FitTempDir tmp("tp_grpo");
    auto prompts = fixture_prompts(tmp.path);
    auto options = [](int64_t tp) {
      auto o = online_fit_options<TPGRPO>(3, 3);
      o.geometry().micro_batch_size_per_gpu(8);
      o.sharding().tensor_parallel_size(tp);
      o.optim().eps(1e-6);  // see sharding/tp3d_test.cpp: eps 1e-8 magnifies 1e-9 gradient noise
      return o;
    };
    FitParts quiet;
    quiet.progress = nullptr;
    std::vector<std::map<std::string, double>> ref_steps;
    FitParts ref_parts = quiet;
    ref_parts.on_step = [&](int64_t, const std::map<std::string, double>& m) { ref_steps.push_back(m); };
    auto one = fit_fixture_model();
    TPGRPO(options(1)).fit(one, prompts, dist_reward, ref_parts);
    REQUIRE(ref_steps.size() == 3);
    CHECK(ref_steps[0]["weight_sync/bytes"] == 0.0);
    int64_t split_bytes = 0;  // what a rank of a tensor pair receives to rebuild the full weights (fp32)
    for (const auto& p : one->named_parameters()) {
      if (tensor_parallel_dim(p.key())) split_bytes += p.value().numel() * 4 / 2;
    }
    for (const int world : {2, 4}) {
      CAPTURE(world);
      auto [steps, rel] = fit_on_ranks(world, one, quiet, [&](CausalLM& policy, const FitParts& p) {
        TPGRPO(options(2), world).fit(policy, prompts, dist_reward, p);
      });
      for (const auto r : rel) CHECK(r <= 1e-5);
      REQUIRE(steps.size() == 3);
      CHECK(steps[0]["sharding/param_elements"] == ref_steps[0]["sharding/param_elements"]);
      CHECK(steps[0]["sharding/param_elements_per_rank"] < 0.6 * steps[0]["sharding/param_elements"]);
      CHECK(steps[0]["weight_sync/bytes"] == static_cast<double>(split_bytes));
      check_steps_like(steps, ref_steps);
      for (const auto& x : steps) CHECK(x.at("tokens_per_s") > 0.0);
    }
  }

  TEST_CASE("PPO with Sharding<TP3D> (tensor 2, the critic split alike) fits as one process does (TP3DPPOTrainer)") {
    FitTempDir tmp("tp_ppo");
    auto prompts = fixture_prompts(tmp.path);
    auto options = [](int64_t tp) {
      auto o = online_fit_options<TP3DPPOTrainer>(3, 11);
      o.geometry().micro_batch_size_per_gpu(8);
      o.sharding().tensor_parallel_size(tp);
      o.optim().eps(1e-6);  // as the GRPO case: eps 1e-8 magnifies 1e-9 gradient noise
      o.critic().optim().lr(5e-3).weight_decay(0.0).eps(1e-6);
      return o;
    };
    FitParts quiet;
    quiet.progress = nullptr;
    std::vector<std::map<std::string, double>> ref_steps;
    FitParts ref_parts = quiet;
    ref_parts.on_step = [&](int64_t, const std::map<std::string, double>& m) { ref_steps.push_back(m); };
    auto one = fit_fixture_model();
    TP3DPPOTrainer(options(1)).fit(one, prompts, dist_reward, ref_parts);
    REQUIRE(ref_steps.size() == 3);
    auto [steps, rel] = fit_on_ranks(2, one, quiet, [&](CausalLM& policy, const FitParts& p) {
      TP3DPPOTrainer(options(2), 2).fit(policy, prompts, dist_reward, p);
    });
    for (const auto r : rel) CHECK(r <= 1e-5);
    check_steps_like(steps, ref_steps);
    for (size_t s = 0; s < steps.size(); ++s) {  // the critic: its values, and its update
      CAPTURE(s);
      CHECK(steps[s].at("critic/values_mean") == doctest::Approx(ref_steps[s].at("critic/values_mean")).epsilon(1e-5));
      CHECK(steps[s].at("critic/grad_norm") == doctest::Approx(ref_steps[s].at("critic/grad_norm")).epsilon(1e-5));
      CHECK(ref_steps[s].at("critic/grad_norm") > 0.0);
    }
    CHECK(steps[0]["sharding/param_elements_per_rank"] < 0.6 * steps[0]["sharding/param_elements"]);
  }

  TEST_CASE("DPO with Sharding<FSDP> on 2 ranks fits as one process does; geometry errors name the fix") {
    FitTempDir tmp("dist_dpo");
    const ByteTokenizer tok;
    const auto path = tmp.path + "/pairs.jsonl";
    {
      std::ofstream f(path);
      for (int i = 0; i < 8; ++i) {
        f << nlohmann::json{{"prompt", "q" + std::to_string(i)}, {"chosen", std::string(3, static_cast<char>('a' + i))},
                            {"rejected", "zz" + std::to_string(i)}}.dump() << "\n";
      }
    }
    auto data = std::make_shared<const PreferenceDataset>(PreferenceDataset::from_jsonl(path, tok, DatasetOptions{}.max_length(64)));
    using DistDPO = Trainer<Algorithm<DPO>, Sharding<FSDP>, Loader<Bucketed>>;
    DistDPO::Options o;
    o.trainer().seed(5).total_steps(4);
    o.data().train_batch_size(4);
    o.geometry().ppo_mini_batch_size(4).micro_batch_size_per_gpu(1);
    o.optim().lr(2e-3).weight_decay(0.0);
    o.sharding().param_dtype(at::kFloat);
    o.loader().epochs(2).prefetch_factor(0).shuffle(false);
    FitParts quiet;
    quiet.progress = nullptr;
    std::vector<std::map<std::string, double>> ref_steps;
    FitParts rp = quiet;
    rp.on_step = [&](int64_t, const std::map<std::string, double>& m) { ref_steps.push_back(m); };
    auto one = fit_fixture_model();
    DistDPO(o).fit(one, data, rp);
    auto [steps, rel] = fit_on_ranks(2, one, quiet, [&](CausalLM& policy, const FitParts& p) { DistDPO(o, 2).fit(policy, data, p); });
    for (const auto r : rel) CHECK(r <= 1e-5);
    REQUIRE(steps.size() == ref_steps.size());
    for (size_t s = 0; s < steps.size(); ++s) {
      CAPTURE(s);
      CHECK(steps[s]["dpo/loss"] == doctest::Approx(ref_steps[s]["dpo/loss"]).epsilon(1e-5));
      CHECK(steps[s]["grad_norm"] == doctest::Approx(ref_steps[s]["grad_norm"]).epsilon(1e-5));
    }
    // a Trainer built for another world size than the group's
    run_on("thread", 2, [&](Communicator& comm) {
      FitParts p = quiet;
      p.comm = dist_borrowed(comm);
      CHECK(contains(error_of([&] { DistDPO(o).fit(fit_fixture_model(), data, p); }), "Trainer(options, comm->size())"));
    });
  }

  TEST_CASE("DPO on 2 ranks: an epoch's short last batch (3 pairs) is padded with a copy of its first pair, as one process training on that copy") {
    // Was: the ranks got 2 and 1 pairs, ran 2 and 1 micro-batches of the sharded policy, and the
    // first rank waited in an all-gather until the collective timeout. Lengths fall in file order,
    // so the length-sorted batches are [p0..p3] and [p4, p5, p6] (+ p4 padded); the one-process
    // run's 8th pair is p4 again, which sorts beside p4: its batches are the same rows.
    FitTempDir tmp("dist_dpo_short");
    const ByteTokenizer tok;
    auto pairs = [&](const std::string& name, int copies_of_p4) {
      const auto path = tmp.path + "/" + name;
      std::ofstream f(path);
      auto pair = [](int i) {
        return nlohmann::json{{"prompt", "q" + std::to_string(i)}, {"chosen", std::string(static_cast<size_t>(12 - i), 'a')},
                              {"rejected", std::string(static_cast<size_t>(12 - i), 'z')}}.dump();
      };
      for (int i = 0; i < 7; ++i) f << pair(i) << "\n";
      for (int c = 0; c < copies_of_p4; ++c) f << pair(4) << "\n";
      f.close();
      return std::make_shared<const PreferenceDataset>(PreferenceDataset::from_jsonl(path, tok, DatasetOptions{}.max_length(64)));
    };
    using DistDPO = Trainer<Algorithm<DPO>, Sharding<FSDP>, Loader<Bucketed>>;
    DistDPO::Options o;
    o.trainer().seed(5);
    o.data().train_batch_size(4);
    o.geometry().ppo_mini_batch_size(4).micro_batch_size_per_gpu(1);
    o.optim().lr(2e-3).weight_decay(0.0);
    o.sharding().param_dtype(at::kFloat);
    o.loader().epochs(1).prefetch_factor(0).shuffle(false).drop_last(false).window_batches(0);
    FitParts quiet;
    quiet.progress = nullptr;
    std::vector<std::map<std::string, double>> ref_steps;
    FitParts rp = quiet;
    rp.on_step = [&](int64_t, const std::map<std::string, double>& m) { ref_steps.push_back(m); };
    auto one = fit_fixture_model();
    DistDPO(o).fit(one, pairs("eight.jsonl", 1), rp);
    REQUIRE(ref_steps.size() == 2);
    const auto seven = pairs("seven.jsonl", 0);
    auto [steps, rel] = fit_on_ranks(2, one, quiet, [&](CausalLM& policy, const FitParts& p) { DistDPO(o, 2).fit(policy, seven, p); });
    for (const auto r : rel) CHECK(r <= 1e-5);
    REQUIRE(steps.size() == 2);
    CHECK(steps[0].at("data/repeated_rows") == 0.0);
    CHECK(steps[1].at("data/repeated_rows") == 1.0);
    for (size_t s = 0; s < 2; ++s) {
      CAPTURE(s);
      CHECK(steps[s].at("dpo/loss") == doctest::Approx(ref_steps[s].at("dpo/loss")).epsilon(1e-5));
      CHECK(steps[s].at("grad_norm") == doctest::Approx(ref_steps[s].at("grad_norm")).epsilon(1e-5));
    }
  }
}
