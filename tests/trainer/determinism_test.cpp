// Determinism on the CPU: one seed gives bitwise-identical metrics for every algorithm (and
// another seed other metrics, so the comparison can fail); rollout/weights_fingerprint is the
// fingerprint of the weights the step generated with, computed here independently from the
// parameters' bytes; a recorded step (trainer.record_rollouts_every) replays from its recording
// (FitParts::replay_dir) to the recorded loss bit for bit, whatever the sampler would draw now.
#include <hybridrl/hybridrl.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <span>
#include <string>
#include <vector>

#include "../support/fit.hpp"
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"

using namespace hybridrl;
using namespace hybridrl::testing;

namespace {

using StepMetrics = std::vector<std::map<std::string, double>>;

/// The metrics that do not measure time or memory (as reproducible_metrics reads metrics.jsonl).
std::map<std::string, double> det_reproducible(const std::map<std::string, double>& m) {
  std::map<std::string, double> out;
  for (const auto& [k, v] : m) {
    if (k.rfind("time/", 0) != 0 && k.rfind("memory/", 0) != 0 && k != "tokens_per_s" && k != "rollout/tokens_per_s") {
      out.emplace(k, v);
    }
  }
  return out;
}

/// Both runs have the same keys and every value is the same bits (NaN included); the first
/// difference is reported.
bool det_bitwise_equal(const StepMetrics& a, const StepMetrics& b) {
  if (a.size() != b.size()) return false;
  for (size_t s = 0; s < a.size(); ++s) {
    const auto x = det_reproducible(a[s]), y = det_reproducible(b[s]);
    if (x.size() != y.size()) return false;
    for (const auto& [k, v] : x) {
      const auto it = y.find(k);
      if (it == y.end() || std::memcmp(&v, &it->second, sizeof v) != 0) {
        MESSAGE("step " << s + 1 << ": " << k << " differs");
        return false;
      }
    }
  }
  return true;
}

FitParts det_parts(StepMetrics& steps) {
  FitParts parts;
  parts.progress = nullptr;
  parts.on_step = [&steps](int64_t, const std::map<std::string, double>& m) { steps.push_back(m); };
  return parts;
}

std::vector<double> det_band_reward(std::span<const RewardInput> in) {
  std::vector<double> out;
  for (const auto& x : in) out.push_back(share_in_band(x, 100));
  return out;
}

std::string det_pairs(const std::string& dir) {
  const auto path = dir + "/det_pairs.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < 12; ++i) {
    const char c = static_cast<char>('a' + i % 13), r = static_cast<char>('n' + i % 13);
    out << nlohmann::json{{"prompt", std::string("say ") + c}, {"chosen", std::string(3, c)}, {"rejected", std::string(2, r)}}.dump()
        << "\n";
  }
  return path;
}

std::string det_labelled(const std::string& dir) {
  const auto path = dir + "/det_labelled.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < 12; ++i) {
    const char c = static_cast<char>('a' + i % 13);
    out << nlohmann::json{{"prompt", std::string("say ") + c}, {"completion", i % 2 == 0 ? std::string(3, c) : "zq"},
                          {"label", i % 2 == 0}}.dump()
        << "\n";
  }
  return path;
}

/// Offline options shared by DPO, KTO and SFT: 4 rows a step, 3 steps over a shuffled dataset of 12.
template <class O>
O det_offline(uint64_t seed) {
  O o;
  o.trainer().total_steps(3).seed(seed);
  o.data().train_batch_size(4);
  o.geometry().ppo_mini_batch_size(4).micro_batch_size_per_gpu(2);
  o.optim().lr(2e-3).weight_decay(0.0).schedule(LRSchedule::constant);
  o.sharding().param_dtype(at::kFloat);
  o.loader().epochs(0).prefetch_factor(0);
  return o;
}

// The fingerprint as model/fingerprint.hpp documents it, written out byte by byte.
uint64_t det_mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t det_fingerprint_by_hand(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  uint64_t h = det_mix(named.size());
  for (const auto& [name, tensor] : named) {
    const auto t = tensor.contiguous();
    const auto* p = static_cast<const unsigned char*>(t.data_ptr());
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    uint64_t fnv = 0xCBF29CE484222325ull;
    for (const char c : name) fnv = (fnv ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
    h = det_mix(h ^ det_mix(fnv ^ det_mix(static_cast<uint64_t>(t.scalar_type()) << 48 ^ bytes)));
    for (uint64_t at0 = 0; at0 < bytes; at0 += uint64_t{1} << 24) {
      uint64_t sum = 0, w = 1;  // w = i mod 65521 + 1, counted up rather than divided (a 2^24-byte chunk)
      for (uint64_t i = 0; i < std::min<uint64_t>(uint64_t{1} << 24, bytes - at0); ++i) {
        sum += p[at0 + i] * w;
        w = w == 65521 ? 1 : w + 1;
      }
      h = det_mix(h ^ sum);
    }
  }
  return h >> 12;
}

std::vector<std::pair<std::string, at::Tensor>> det_named(const CausalLM& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : m->named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

}  // namespace

TEST_SUITE("trainer/determinism") {
  TEST_CASE("weights_fingerprint: every byte counts, its formula by hand, chunks past 2^24 bytes, below 2^52") {
    std::vector<std::pair<std::string, at::Tensor>> named{
        {"a", at::linspace(-1, 1, 7)}, {"b.weight", at::arange(12, at::kDouble).view({3, 4})}, {"c", at::ones({0})},
        {"d", at::full({3}, 2.5, at::kBFloat16)}, {"big", at::rand({(int64_t{1} << 22) + 5})}};  // 2^24 + 20 bytes
    const auto f = weights_fingerprint(named);
    CHECK(f == det_fingerprint_by_hand(named));
    CHECK(f < (uint64_t{1} << 52));
    // the same bytes elsewhere (a clone, a non-contiguous view made contiguous) give the same number
    auto copy = named;
    for (auto& [k, t] : copy) t = t.clone();
    CHECK(weights_fingerprint(copy) == f);
    // one bit of any tensor, a name, the order, a dtype: another number
    for (size_t i = 0; i < named.size(); ++i) {
      if (named[i].second.numel() == 0) continue;
      CAPTURE(named[i].first);
      auto flipped = named;
      auto t = flipped[i].second.clone();
      static_cast<unsigned char*>(t.data_ptr())[t.numel() * t.element_size() - 1] ^= 1;  // the last byte: in the second chunk of "big"
      flipped[i].second = t;
      CHECK(weights_fingerprint(flipped) != f);
      CHECK(weights_fingerprint(flipped) == det_fingerprint_by_hand(flipped));
    }
    auto renamed = named;
    renamed[0].first = "A";
    CHECK(weights_fingerprint(renamed) != f);
    auto swapped = named;
    std::swap(swapped[0], swapped[1]);
    CHECK(weights_fingerprint(swapped) != f);
    auto cast = named;
    cast[1].second = cast[1].second.to(at::kLong).to(at::kDouble);  // the same values, the same dtype
    CHECK(weights_fingerprint(cast) == f);
    cast[1].second = cast[1].second.to(at::kFloat);  // other bytes
    CHECK(weights_fingerprint(cast) != f);
    // a model: its named_parameters in order
    const auto model = fit_fixture_model();
    CHECK(weights_fingerprint(*model) == det_fingerprint_by_hand(det_named(model)));
  }

  TEST_CASE("GRPO (Rollout<Paged>) and PPO (Rollout<Naive>): one seed, the same metrics bit for bit; another, others") {
    FitTempDir tmp("det_online");
    auto prompts = fixture_prompts(tmp.path);
    using GRPOPaged = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
    using PPONaive = Trainer<Algorithm<PPO>, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>;
    auto grpo = [&](uint64_t seed) {
      StepMetrics steps;
      auto policy = fit_fixture_model();
      GRPOPaged(online_fit_options<GRPOPaged>(3, seed)).fit(policy, prompts, det_band_reward, det_parts(steps));
      return steps;
    };
    auto ppo = [&](uint64_t seed) {
      StepMetrics steps;
      auto policy = fit_fixture_model();
      auto o = online_fit_options<PPONaive>(3, seed);
      o.critic().optim().lr(5e-3).weight_decay(0.0);
      PPONaive(o).fit(policy, prompts, det_band_reward, det_parts(steps));
      return steps;
    };
    const auto g1 = grpo(3), g2 = grpo(3), g3 = grpo(4);
    REQUIRE(g1.size() == 3);
    CHECK(det_bitwise_equal(g1, g2));
    CHECK(!det_bitwise_equal(g1, g3));  // the sampler's noise comes from the seed
    CHECK(g1[2].count("loss") == 1);
    const auto p1 = ppo(11), p2 = ppo(11), p3 = ppo(12);
    REQUIRE(p1.size() == 3);
    CHECK(det_bitwise_equal(p1, p2));
    CHECK(!det_bitwise_equal(p1, p3));  // the critic's head and the sampler come from the seed
    CHECK(p1[2].count("critic/vf_loss") == 1);
  }

  TEST_CASE("DPO, KTO and SFT: one seed, the same metrics bit for bit; another seed, another shuffle") {
    FitTempDir tmp("det_offline");
    const ByteTokenizer tok;
    auto pairs = std::make_shared<const PreferenceDataset>(
        PreferenceDataset::from_jsonl(det_pairs(tmp.path), tok, DatasetOptions{}.max_length(64)));
    auto labelled = std::make_shared<const LabelledDataset>(
        LabelledDataset::from_jsonl(det_labelled(tmp.path), tok, DatasetOptions{}.max_length(64)));
    TaskOptions task;
    task.name("reverse").examples(12);
    std::istringstream text(task_jsonl(task, DataKind::completions));
    auto completions = std::make_shared<const CompletionDataset>(CompletionDataset::from_stream(text, "reverse", tok));
    using KTOPacked = Trainer<Algorithm<KTO>, Sharding<FSDP>, Loader<Packed>>;
    auto dpo = [&](uint64_t seed) {
      StepMetrics steps;
      auto policy = fit_fixture_model();
      DPOTrainer(det_offline<DPOTrainer::Options>(seed)).fit(policy, pairs, det_parts(steps));
      return steps;
    };
    auto kto = [&](uint64_t seed) {
      StepMetrics steps;
      auto policy = fit_fixture_model();
      auto o = det_offline<KTOPacked::Options>(seed);
      o.loader().row_length(64);
      KTOPacked(o).fit(policy, labelled, det_parts(steps));
      return steps;
    };
    auto sft = [&](uint64_t seed) {
      StepMetrics steps;
      auto policy = fit_fixture_model();
      SFTTrainer(det_offline<SFTTrainer::Options>(seed)).fit(policy, completions, det_parts(steps));
      return steps;
    };
    for (const auto& [name, run] : std::vector<std::pair<std::string, std::function<StepMetrics(uint64_t)>>>{
             {"dpo", dpo}, {"kto", kto}, {"sft", sft}}) {
      CAPTURE(name);
      const auto a = run(5), b = run(5), c = run(6);
      REQUIRE(a.size() == 3);
      CHECK(a[0].count("loss") == 1);
      CHECK(det_bitwise_equal(a, b));
      CHECK(!det_bitwise_equal(a, c));  // the loader's shuffle comes from the seed
    }
  }

  TEST_CASE("a KV pool too small for the batch: Rollout<Paged> preempts and recomputes, the run's results unchanged") {
    // 32 sequences of up to 33 prompt + 6 new tokens (3 blocks of 16 each): a pool of 4 blocks
    // holds one at a time (with a fork's block), 4096 tokens all of them
    FitTempDir tmp("det_kv");
    auto prompts = fixture_prompts(tmp.path);
    using GRPOPaged = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
    auto run = [&](int64_t kv_tokens) {
      StepMetrics steps;
      auto policy = fit_fixture_model();
      auto o = online_fit_options<GRPOPaged>(2, 3);
      o.rollout().kv_cache_tokens(kv_tokens);
      GRPOPaged(o).fit(policy, prompts, det_band_reward, det_parts(steps));
      return steps;
    };
    const auto roomy = run(4096), tight = run(64);
    REQUIRE(tight.size() == 2);
    CHECK(roomy[0].at("rollout/preemptions") == 0);
    CHECK(tight[0].at("rollout/preemptions") > 0);
    CHECK(tight[1].at("rollout/preemptions") > 0);
    // the draws are per (seed, step, group, sample), not per schedule: the same tokens, the same step
    for (size_t i = 0; i < 2; ++i) {
      CAPTURE(i);
      // (the engine's own log-probs may differ in the last bits: a batch of another size rounds otherwise)
      for (const char* k : {"loss", "grad_norm", "reward_mean", "kl", "entropy", "response_length_mean",
                            "rollout/weights_fingerprint"}) {
        CAPTURE(k);
        CHECK(tight[i].at(k) == roomy[i].at(k));
      }
    }
  }

  TEST_CASE("rollout/weights_fingerprint is the weights each step generated with; a recorded step replays to its loss") {
    using GRPONaive = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>;
    FitTempDir tmp("det_replay");
    auto prompts = fixture_prompts(tmp.path);
    const auto recorded_dir = tmp.path + "/recorded";
    auto options = [&](const std::string& out) {
      auto o = online_fit_options<GRPONaive>(3, 9);
      o.trainer().output_dir(out).save_every(1).keep_last(3).save_model(false).tensorboard(false);
      return o;
    };
    // the recorded run: every step's rollout written, a checkpoint after each step
    StepMetrics recorded;
    auto policy = fit_fixture_model();
    const auto initial = weights_fingerprint(*policy);
    auto o = options(recorded_dir);
    o.trainer().record_rollouts_every(1);
    GRPONaive(o).fit(policy, prompts, det_band_reward, det_parts(recorded));
    REQUIRE(recorded.size() == 3);
    const auto final_weights = det_named(policy);
    // the fingerprints: step 1 generated with the initial weights, step 3 with those after 2 steps
    CHECK(recorded[0].at("rollout/weights_fingerprint") == static_cast<double>(initial));
    CHECK(recorded[0].at("rollout/weights_fingerprint") == static_cast<double>(det_fingerprint_by_hand(det_named(fit_fixture_model()))));
    {
      StepMetrics two;
      auto p2 = fit_fixture_model();
      GRPONaive(online_fit_options<GRPONaive>(2, 9)).fit(p2, prompts, det_band_reward, det_parts(two));
      CHECK(recorded[2].at("rollout/weights_fingerprint") == static_cast<double>(weights_fingerprint(*p2)));
    }
    CHECK(recorded[1].at("rollout/weights_fingerprint") != recorded[0].at("rollout/weights_fingerprint"));
    CHECK(recorded[2].at("rollout/weights_fingerprint") != recorded[1].at("rollout/weights_fingerprint"));
    // what a recording holds
    RecordedStepInfo info;
    const auto batch = read_recorded_step(recorded_dir + "/rollouts", 2, 0, 1, at::kCPU, &info);
    CHECK(info.step == 2);
    CHECK(info.weights_fingerprint == recorded[1].at("rollout/weights_fingerprint"));
    CHECK(batch.size() == 32);  // 4 prompts × 8 samples
    for (const auto& k : {keys::responses, keys::response_mask, keys::rollout_log_probs, keys::scores}) {
      CAPTURE(k.name);
      CHECK(batch.has_tensor(k.str()));
    }
    CHECK(batch.has_column("answer"));
    CHECK(contains(error_of([&] { (void)read_recorded_step(recorded_dir + "/rollouts", 2, 0, 2, at::kCPU); }),
                   "was recorded by a run of 1 rank(s); this one has 2"));
    CHECK(contains(error_of([&] { (void)read_recorded_step(recorded_dir + "/rollouts", 4, 0, 1, at::kCPU); }),
                   "replay: step 4 has no recording"));
    // replayed from the checkpoint after step 1, sampling from the top 5 tokens only: steps 2 and 3 come from
    // the recordings, so the losses, rewards and final weights are the recorded run's, bit for bit
    auto replay = [&](const std::string& out, bool from_recording) {
      StepMetrics steps;
      auto p = fit_fixture_model();
      auto r = options(out);
      r.trainer().resume(recorded_dir + "/checkpoints/step_00000001");
      r.rollout().sampling().top_k(5);  // other tokens, were they drawn (a resumed run keeps its seed)
      auto parts = det_parts(steps);
      if (from_recording) parts.replay_dir = recorded_dir + "/rollouts";
      GRPONaive(r).fit(p, prompts, det_band_reward, parts);
      return std::make_pair(steps, det_named(p));
    };
    const auto [replayed, replayed_weights] = replay(tmp.path + "/replayed", true);
    REQUIRE(replayed.size() == 2);
    for (size_t i = 0; i < 2; ++i) {
      CAPTURE(i);
      const auto& a = recorded[i + 1];
      const auto& b = replayed[i];
      for (const char* k : {"loss", "grad_norm", "reward_mean", "kl", "entropy", "clip_frac", "rollout/log_prob_diff",
                            "response_length_mean", "rollout/weights_fingerprint"}) {
        CAPTURE(k);
        REQUIRE(b.count(k) == 1);
        CHECK(std::memcmp(&a.at(k), &b.at(k), sizeof(double)) == 0);
      }
      CHECK(b.at("replay/weights_fingerprint") == a.at("rollout/weights_fingerprint"));  // the recording's
    }
    REQUIRE(replayed_weights.size() == final_weights.size());
    for (size_t i = 0; i < final_weights.size(); ++i) CHECK(at::equal(replayed_weights[i].second, final_weights[i].second));
    // without the recordings top-5 sampling draws other tokens: another loss (the test can fail)
    const auto [drawn, drawn_weights] = replay(tmp.path + "/drawn", false);
    REQUIRE(drawn.size() == 2);
    CHECK(drawn[0].at("rollout/weights_fingerprint") == recorded[1].at("rollout/weights_fingerprint"));  // same weights
    CHECK(drawn[0].at("loss") != recorded[1].at("loss"));
    // the options: an offline run records nothing, a recording needs an output directory
    CHECK(contains(error_of([] { DPOTrainer(DPOTrainer::Options{}.trainer(TrainerOptions{}.output_dir("x").record_rollouts_every(1))); }),
                   "trainer.record_rollouts_every = 1 but an offline algorithm generates no rollouts"));
    CHECK(contains(error_of([] { GRPONaive(GRPONaive::Options{}.trainer(TrainerOptions{}.record_rollouts_every(2))); }),
                   "record_rollouts_every = 2 but output_dir is empty"));
  }
}
