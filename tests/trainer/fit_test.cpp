// Trainer::fit for offline algorithms on the tiny llama fixture: DPO's first step is its loss at
// policy = reference (ln 2, by the formula), training lowers it, and the run writes metrics.jsonl,
// TensorBoard events, the plot, checkpoints (keep-last) and a final model that loads back; a run
// killed after a step resumes from its last checkpoint (mid-epoch and at an epoch boundary) and ends
// with the uninterrupted run's metrics and weights, bit for bit; KTO through Loader<Packed> scores
// packed rows as the padded path does and starts at its loss for z0 = 0; bad resume settings are
// errors naming the fix.
#include <hybridrl/hybridrl.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../support/fit.hpp"
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"

namespace hybridrl::testing {


/// `n` preference pairs of a learnable rule: the chosen answer repeats the prompt's letter.
inline std::string write_pairs(const std::string& dir, int n) {
  const auto path = dir + "/pairs.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < n; ++i) {
    const char c = static_cast<char>('a' + i % 13), r = static_cast<char>('n' + i % 13);
    out << nlohmann::json{{"prompt", std::string("say ") + c}, {"chosen", std::string(3, c)}, {"rejected", std::string(3, r)}}.dump()
        << "\n";
  }
  return path;
}

/// `n` labelled completions: desirable when the completion repeats the prompt's letter.
inline std::string write_labelled(const std::string& dir, int n) {
  const auto path = dir + "/labelled.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < n; ++i) {
    const char c = static_cast<char>('a' + i % 13);
    const bool good = i % 2 == 0;
    out << nlohmann::json{{"prompt", std::string("say ") + c},
                          {"completion", good ? std::string(3, c) : std::string("zq")},
                          {"label", good}}
               .dump()
        << "\n";
  }
  return path;
}


// The preset `hybridrl train` runs (Loader<Packed>; its fit loop comes from hybridrl::presets).
using FitDPO = DPOTrainer;

inline FitDPO::Options dpo_options(const std::string& out_dir) {
  FitDPO::Options o;
  o.trainer().output_dir(out_dir).save_every(2).keep_last(2).seed(5);
  o.data().train_batch_size(4);
  o.geometry().ppo_mini_batch_size(4).micro_batch_size_per_gpu(2);
  o.optim().lr(2e-3).weight_decay(0.0).schedule(LRSchedule::constant);
  o.sharding().param_dtype(at::kFloat);
  o.loader().epochs(3).prefetch_factor(0);
  return o;
}




using FitGRPO = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>;

inline FitGRPO::Options grpo_options(int64_t steps) { return online_fit_options<FitGRPO>(steps, 3); }
}  // namespace hybridrl::testing

using namespace hybridrl;
using namespace hybridrl::testing;

TEST_SUITE("trainer/fit") {
  TEST_CASE("DPO: the first step is ln 2 at policy = reference, training lowers the loss, the run's files are written") {
    FitTempDir tmp("dpo");
    const ByteTokenizer tok;
    auto data = PreferenceDataset::from_jsonl(write_pairs(tmp.path, 8), tok, DatasetOptions{}.max_length(64));
    auto policy = fit_fixture_model();
    const auto out = tmp.path + "/run";
    FitDPO trainer(dpo_options(out));
    FitParts parts;
    parts.progress = nullptr;
    const auto r = trainer.fit(policy, std::move(data), parts);
    CHECK(r.steps == 6);  // 8 pairs / 4 per step × 3 epochs
    CHECK(r.resumed_from == 0);
    const auto lines = reproducible_metrics(out);
    REQUIRE(lines.size() == 6);
    CHECK(lines[0]["step"] == 1);
    // policy = reference: every margin is 0, so the sigmoid loss is −log σ(0) = ln 2
    CHECK(lines[0]["dpo/loss"].get<double>() == doctest::Approx(std::log(2.0)).epsilon(1e-6));
    CHECK(lines[0]["rewards/margins"].get<double>() == doctest::Approx(0.0).epsilon(1e-9));
    CHECK(lines[5]["dpo/loss"].get<double>() < lines[0]["dpo/loss"].get<double>() - 0.05);
    CHECK(lines[5]["rewards/margins"].get<double>() > 0.0);
    for (const char* k : {"loss", "grad_norm", "lr", "epoch", "rewards/accuracies", "skipped_updates"}) {
      CAPTURE(k);
      CHECK(lines[3].contains(k));
    }
    CHECK(lines[3]["lr"].get<double>() == doctest::Approx(2e-3));
    CHECK(lines[2]["epoch"].get<double>() == 1.0);
    // the plot, TensorBoard events, the effective configuration
    std::ifstream svg(out + "/metrics.svg");
    std::string first_line;
    std::getline(svg, first_line);
    CHECK(first_line.find("<svg") != std::string::npos);
    int events = 0;
    for (const auto& e : std::filesystem::directory_iterator(out + "/tensorboard")) {
      events += e.path().filename().string().rfind("events.out.tfevents.", 0) == 0 ? 1 : 0;
    }
    CHECK(events == 1);
    std::ifstream cfg(out + "/run_config.json");
    const auto saved = from_json<FitDPO::Options>(nlohmann::json::parse(cfg));
    CHECK(saved.trainer().seed() == 5u);
    CHECK(saved.data().train_batch_size() == 4);
    // checkpoints every 2 steps, the newest 2 kept; each is a loadable Hugging Face directory
    CheckpointManager ck(out + "/checkpoints", 2);
    const auto list = ck.list();
    REQUIRE(list.size() == 2);
    CHECK(list[0].first == 4);
    CHECK(list[1].first == 6);
    CHECK(r.last_checkpoint == list[1].second);
    auto from_ckpt = load_causal_lm(list[1].second);
    // the final model, written as a Hugging Face directory, loads back to the same logits
    auto back = load_causal_lm(out + "/model");
    const auto ids = at::arange(1, 17, at::kLong).unsqueeze(0);
    c10::NoGradGuard g;
    const auto logits = policy->forward(ids);
    CHECK(at::equal(back->forward(ids), logits));
    CHECK(at::equal(from_ckpt->forward(ids), logits));
    const auto state = CheckpointManager::load(list[1].second);
    CHECK(state.step == 6);
    CHECK(state.tensors.count("model.model.embed_tokens.weight") == 1);
    CHECK(state.tensors.count("optimizer.step") == 1);
    CHECK(state.tensors.at("optimizer.step").item<int64_t>() == 6);
    CHECK(state.meta["loader"]["epoch"] == 3);
  }

  TEST_CASE("resume: a run killed after a step continues from its last checkpoint and ends bit for bit as the uninterrupted run") {
    const ByteTokenizer tok;
    FitTempDir tmp("resume");
    const auto pairs = write_pairs(tmp.path, 8);
    auto options = [&](const std::string& out, int64_t save_every) {
      auto o = dpo_options(out);
      o.trainer().save_every(save_every);
      o.optim().schedule(LRSchedule::cosine).warmup_steps(2);  // the schedule resumes too
      o.geometry().ppo_mini_batch_size(2).micro_batch_size_per_gpu(1);
      return o;
    };
    auto data = [&] {
      return std::make_shared<const PreferenceDataset>(
          PreferenceDataset::from_jsonl(pairs, tok, DatasetOptions{}.max_length(64)));
    };
    FitParts quiet;
    quiet.progress = nullptr;
    auto whole_model = fit_fixture_model();
    FitDPO(options(tmp.path + "/whole", 2)).fit(whole_model, data(), quiet);
    const auto whole = reproducible_metrics(tmp.path + "/whole");
    REQUIRE(whole.size() == 6);
    // killed after step 5 (checkpoint at 4: an epoch boundary) and after step 4 (checkpoint at 3: mid-epoch)
    for (auto [kill, save_every, from] : {std::tuple<int64_t, int64_t, int64_t>{5, 2, 4}, {4, 3, 3}}) {
      CAPTURE(kill);
      const auto out = tmp.path + "/killed_" + std::to_string(kill);
      FitParts crash = quiet;
      crash.on_step = [kill = kill](int64_t step, const std::map<std::string, double>&) {
        if (step == kill) throw std::runtime_error("killed");
      };
      CHECK_THROWS_AS(FitDPO(options(out, save_every)).fit(fit_fixture_model(), data(), crash), std::runtime_error);
      CHECK(reproducible_metrics(out).size() == static_cast<size_t>(kill));
      auto resumed_model = fit_fixture_model();  // the same starting model: the reference is built from it
      const auto r = FitDPO(options(out, save_every)).fit(resumed_model, data(), quiet);
      CHECK(r.resumed_from == from);
      CHECK(r.steps == 6);
      const auto lines = reproducible_metrics(out);
      REQUIRE(lines.size() == whole.size());
      for (size_t i = 0; i < lines.size(); ++i) {
        CAPTURE(i);
        CHECK(lines[i] == whole[i]);
      }
      const auto resumed_params = resumed_model->named_parameters();
      for (const auto& p : whole_model->named_parameters()) {
        CAPTURE(p.key());
        CHECK(at::equal(p.value(), resumed_params[p.key()]));
      }
    }
    // never: an output directory with checkpoints is refused; a resume path must be a directory
    auto never = options(tmp.path + "/whole", 2);
    never.trainer().resume("never");
    CHECK(contains(error_of([&] { FitDPO(never).fit(fit_fixture_model(), data(), quiet); }),
                   "trainer.resume = never but"));
    auto missing = options(tmp.path + "/other", 2);
    missing.trainer().resume(tmp.path + "/nowhere");
    CHECK(contains(error_of([&] { FitDPO(missing).fit(fit_fixture_model(), data(), quiet); }), "is not a directory"));
    auto endless = options(tmp.path + "/endless", 2);
    endless.loader().epochs(0);
    CHECK(contains(error_of([&] { FitDPO(endless).fit(fit_fixture_model(), data(), quiet); }),
                   "trainer.total_steps = 0 with loader.epochs = 0"));
    auto too_long = options(tmp.path + "/too_long", 2);
    too_long.trainer().total_steps(7);  // 3 epochs of 2 batches
    CHECK(contains(error_of([&] { FitDPO(too_long).fit(fit_fixture_model(), data(), quiet); }),
                   "trainer.total_steps = 7 but loader.epochs = 3 hold 6 batches"));
  }

  TEST_CASE("KTO through Loader<Packed>: packed scoring equals padded scoring; the first step is the loss at z0 = 0") {
    using FitKTO = Trainer<Algorithm<KTO>, Sharding<FSDP>, Loader<Packed>>;
    FitTempDir tmp("kto");
    const ByteTokenizer tok;
    auto data = std::make_shared<const LabelledDataset>(
        LabelledDataset::from_jsonl(write_labelled(tmp.path, 8), tok, DatasetOptions{}.max_length(64)));
    auto policy = fit_fixture_model();
    // the scorer, packed and padded, on one loader batch
    auto loader = Loader<Packed>::make(data, PackedOptions{}.batch_size(4).row_length(64).prefetch_factor(0));
    const auto batch = *loader.next();
    std::vector<ScoredKey> keys{scored_key("log_probs_sum"), scored_key("kl_log_probs_sum")};
    auto fwd = hybridrl::detail::frozen_forward(policy, LogProbOptions{});
    const auto opts = PackedOptions{}.row_length(64);
    auto pack = [&](const TensorBatch& b) { return Loader<Packed>::pack(b, opts); };
    const auto packed = hybridrl::detail::score_keys(batch, keys, fwd, &pack);
    const auto padded = hybridrl::detail::score_keys(batch, keys, fwd, static_cast<const std::nullptr_t*>(nullptr));
    for (const auto& k : keys) {
      CAPTURE(k.key);
      CHECK(at::allclose(packed.at(k.key), padded.at(k.key), 1e-5, 1e-5));
      CHECK(packed.at(k.key).lt(0).all().template item<bool>());  // sums of log-probs of real tokens
    }
    // and through fit(): at policy = reference every reward and z0 are 0, so each sample's loss is
    // its weight × (1 − σ(0)) = 0.5
    FitKTO::Options o;
    o.trainer().total_steps(4);
    o.data().train_batch_size(4);
    o.geometry().ppo_mini_batch_size(4).micro_batch_size_per_gpu(2);
    o.optim().lr(2e-3).weight_decay(0.0).schedule(LRSchedule::constant);
    o.sharding().param_dtype(at::kFloat);
    o.loader().row_length(64).epochs(2).prefetch_factor(0);
    std::vector<double> losses;
    FitParts parts;
    parts.progress = nullptr;
    parts.on_step = [&](int64_t, const std::map<std::string, double>& m) { losses.push_back(m.at("loss")); };
    const auto r = FitKTO(o).fit(policy, data, parts);
    CHECK(r.steps == 4);
    REQUIRE(losses.size() == 4);
    CHECK(losses[0] == doctest::Approx(0.5).epsilon(1e-6));
    CHECK(losses[3] < losses[0]);
  }

  TEST_CASE("GRPO with Rollout<Naive>: n samples per prompt, scored, the reward rises; a NaN reward skips the step") {
    FitTempDir tmp("grpo");
    auto prompts = fixture_prompts(tmp.path);
    std::vector<std::map<std::string, double>> steps;
    FitParts parts;
    parts.progress = nullptr;
    parts.on_step = [&](int64_t, const std::map<std::string, double>& m) { steps.push_back(m); };
    std::vector<int64_t> seen_rows;
    auto reward = [&](std::span<const RewardInput> in) {
      seen_rows.push_back(static_cast<int64_t>(in.size()));
      std::vector<double> out;
      for (const auto& x : in) {
        CHECK(x.field("answer").has_value());  // the dataset row reaches the reward
        out.push_back(share_in_band(x, 100));
      }
      return out;
    };
    auto policy = fit_fixture_model();
    const auto r = FitGRPO(grpo_options(15)).fit(policy, prompts, reward, parts);
    CHECK(r.steps == 15);
    REQUIRE(steps.size() == 15);
    CHECK(seen_rows.front() == 32);  // 4 prompts × 8 samples
    for (const char* k : {"reward_mean", "reward_std", "kl", "entropy", "clip_frac", "response_length_mean", "grad_norm",
                          "lr", "time/generate", "time/reward", "time/ref", "time/old_log_prob", "time/advantage",
                          "time/update", "time/weight_sync", "time/fingerprint", "tokens_per_s"}) {
      CAPTURE(k);
      CHECK(steps[4].count(k) == 1);
    }
    CHECK(steps[0]["response_length_mean"] == doctest::Approx(6.0));
    CHECK(steps[0]["kl"] == doctest::Approx(0.0).epsilon(1e-6));  // policy = reference at the first step
    CHECK(steps[0]["rollout/log_prob_diff"] < 1e-4);  // the engine's sampling log-probs = the policy's
    const double first = (steps[0]["reward_mean"] + steps[1]["reward_mean"] + steps[2]["reward_mean"]) / 3;
    const double last = (steps[12]["reward_mean"] + steps[13]["reward_mean"] + steps[14]["reward_mean"]) / 3;
    MESSAGE("GRPO reward (share of tokens in the band): " << first << " -> " << last);
    CHECK(first < 0.15);
    CHECK(last > first + 0.25);

    // a NaN reward at step 2: reported, the step not trained on (weights unchanged), step 3 trains
    std::vector<at::Tensor> after_1;
    FitParts nan_parts = parts;
    steps.clear();
    auto nan_policy = fit_fixture_model();
    nan_parts.on_step = [&](int64_t step, const std::map<std::string, double>& m) {
      steps.push_back(m);
      if (step == 1) {
        for (const auto& p : nan_policy->parameters()) after_1.push_back(p.detach().clone());
      }
      if (step == 2) {
        const auto now = nan_policy->parameters();
        for (size_t i = 0; i < now.size(); ++i) CHECK(at::equal(now[i], after_1[i]));
      }
    };
    int64_t call = 0;
    auto nan_reward = [&](std::span<const RewardInput> in) {
      ++call;
      std::vector<double> out;
      for (const auto& x : in) out.push_back(share_in_band(x, 100));
      if (call == 2) out[5] = NAN;
      return out;
    };
    FitGRPO(grpo_options(3)).fit(nan_policy, prompts, nan_reward, nan_parts);
    REQUIRE(steps.size() == 3);
    CHECK(steps[1]["reward_nonfinite"] == 1.0);
    CHECK(steps[1]["skipped_step"] == 1.0);
    CHECK(steps[1].count("grad_norm") == 0);
    CHECK(std::isfinite(steps[1]["reward_mean"]));  // over the finite rewards
    CHECK(steps[2]["skipped_step"] == 0.0);
    CHECK(steps[2].count("grad_norm") == 1);
    // trainer.on_nonfinite=stop: the run ends at that step with an Error naming it, after the
    // step's metrics
    steps.clear();
    call = 0;
    auto stop_options = grpo_options(3);
    stop_options.trainer().on_nonfinite("stop");
    auto stop_policy = fit_fixture_model();
    std::string err;
    try {
      FitGRPO(stop_options).fit(stop_policy, prompts, nan_reward, nan_parts);
    } catch (const Error& e) {
      err = e.what();
    }
    CHECK(err.find("step 2: 1 rewards are NaN or infinite (trainer.on_nonfinite = stop)") != std::string::npos);
    CHECK(steps.size() == 1);  // on_step ran for step 1 only; step 2 ended the run
    CHECK(error_of([] { TrainerOptions{}.on_nonfinite("halt").validate(); }).find("on_nonfinite = 'halt' is not a choice") !=
          std::string::npos);
  }
  TEST_CASE("GRPO on-policy: old log-probs from the update's forward give the separate pass's training and metrics") {
    FitTempDir tmp("grpo_onpolicy");
    auto prompts = fixture_prompts(tmp.path);
    auto reward = [](std::span<const RewardInput> in) {
      std::vector<double> out;
      for (const auto& x : in) out.push_back(share_in_band(x, 100));
      return out;
    };
    auto run = [&](bool from_update, auto tweak) {
      std::vector<std::map<std::string, double>> steps;
      FitParts parts;
      parts.progress = nullptr;
      parts.on_step = [&](int64_t, const std::map<std::string, double>& m) { steps.push_back(m); };
      auto o = grpo_options(3);
      o.geometry().old_log_probs_from_update(from_update);
      tweak(o);
      auto policy = fit_fixture_model();
      FitGRPO(o).fit(policy, prompts, reward, parts);
      std::vector<at::Tensor> w;
      for (const auto& p : policy->parameters()) w.push_back(p.detach().clone());
      return std::pair{steps, w};
    };
    auto same = [](auto&) {};
    const auto [reused, w_reused] = run(true, same);
    const auto [pass, w_pass] = run(false, same);
    REQUIRE(reused.size() == 3);
    REQUIRE(pass.size() == 3);
    for (size_t s = 0; s < 3; ++s) {
      CAPTURE(s);
      CHECK(reused[s].at("old_log_probs_from_update") == 1.0);
      CHECK(pass[s].at("old_log_probs_from_update") == 0.0);
      for (const char* k : {"kl", "entropy", "grad_norm", "reward_mean", "rollout/log_prob_diff", "rollout/ratio_mean"}) {
        CAPTURE(k);
        CHECK(reused[s].at(k) == doctest::Approx(pass[s].at(k)).epsilon(1e-5).scale(1e-6));
      }
    }
    for (size_t i = 0; i < w_pass.size(); ++i) CHECK((w_reused[i] - w_pass[i]).abs().max().item<double>() <= 1e-5);
    // two mini-batches: the policy moves between them, so the separate pass runs
    const auto [two, w_two] = run(true, [](auto& o) { o.geometry().ppo_mini_batch_size(2); });
    (void)w_two;
    CHECK(two[0].at("old_log_probs_from_update") == 0.0);
  }

  TEST_CASE("SFT: the first step's loss is the completion tokens' mean negative log-likelihood; training lowers it") {
    using FitSFT = SFTTrainer;  // Loader<Packed>, as `hybridrl train` runs it
    FitTempDir tmp("sft");
    const ByteTokenizer tok;
    TaskOptions task;
    task.name("reverse").examples(8);
    std::istringstream text(task_jsonl(task, DataKind::completions));
    auto data = std::make_shared<const CompletionDataset>(CompletionDataset::from_stream(text, "reverse", tok));
    auto policy = fit_fixture_model();
    // by hand: the model's logits, log-softmax, the completion tokens' log-probs, averaged (8 examples: one batch)
    double nll = 0;
    int64_t count = 0;
    {
      c10::NoGradGuard g;
      for (int64_t i = 0; i < data->size(); ++i) {
        const auto& s = (*data)[i];
        const auto ids = at::tensor(s.ids, at::kLong).unsqueeze(0);
        const auto logp = at::log_softmax(policy->forward(ids)[0].to(at::kDouble), -1);
        for (size_t t = s.prompt_ids.size(); t < s.ids.size(); ++t) {
          nll -= logp[static_cast<int64_t>(t) - 1][s.ids[t]].item<double>();
          ++count;
        }
      }
    }
    FitSFT::Options o;
    o.trainer().total_steps(30);
    o.data().train_batch_size(8);
    o.geometry().ppo_mini_batch_size(8).micro_batch_size_per_gpu(4);  // two micro-batches: gradients accumulated
    o.optim().lr(3e-3).weight_decay(0.0).schedule(LRSchedule::constant);
    o.sharding().param_dtype(at::kFloat);
    o.loader().epochs(0).prefetch_factor(0);
    std::vector<double> losses;
    FitParts parts;
    parts.progress = nullptr;
    parts.on_step = [&](int64_t, const std::map<std::string, double>& m) { losses.push_back(m.at("sft/loss")); };
    FitSFT(o).fit(policy, data, parts);
    REQUIRE(losses.size() == 30);
    CHECK(losses[0] == doctest::Approx(nll / static_cast<double>(count)).epsilon(1e-6));
    CHECK(losses[29] < 0.5 * losses[0]);
  }

  TEST_CASE("SFT: the first step's loss equals transformers' causal-LM loss (labels -100 on the prompts) on the fixture") {
    using FitSFT = SFTTrainer;  // Loader<Packed>, as `hybridrl train` runs it
    // tests/fixtures/models/llama/hf_sft_loss.json: make_model_fixtures.py --sft-loss (transformers 5.24)
    std::ifstream in(std::string(HYBRIDRL_FIXTURES_DIR) + "/models/llama/hf_sft_loss.json");
    const auto fixture = nlohmann::json::parse(in);
    std::stringstream lines;
    for (const auto& s : fixture["samples"]) lines << s.dump() << "\n";
    const IdTokenizer tok;
    auto data = std::make_shared<const CompletionDataset>(CompletionDataset::from_stream(lines, "hf", tok));
    REQUIRE(data->size() == 4);
    FitSFT::Options o;
    o.trainer().total_steps(1);
    o.data().train_batch_size(4);
    o.geometry().ppo_mini_batch_size(4).micro_batch_size_per_gpu(2);  // two micro-batches of the one mini-batch
    o.optim().lr(1e-3);
    o.sharding().param_dtype(at::kFloat);
    o.loader().epochs(0).prefetch_factor(0);
    double loss = 0;
    FitParts parts;
    parts.progress = nullptr;
    parts.on_step = [&](int64_t, const std::map<std::string, double>& m) { loss = m.at("sft/loss"); };
    FitSFT(o).fit(fit_fixture_model(), data, parts);
    MESSAGE("SFT loss " << loss << ", transformers " << fixture["loss"].get<double>());
    CHECK(loss == doctest::Approx(fixture["loss"].get<double>()).epsilon(1e-6));
  }
}
