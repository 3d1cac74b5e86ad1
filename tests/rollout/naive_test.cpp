// Rollout<Naive> on the tiny Hugging Face fixtures: greedy tokens equal a step-by-step
// full-recompute forward (no KV cache) for mixed prompt lengths; returned log-probs equal the
// model's log-probs of the chosen tokens; stop rules; per-request seeds; weight loading; errors.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hybridrl/model/log_probs.hpp"
#include "hybridrl/model/pretrained.hpp"
#include "hybridrl/rollout/naive.hpp"
#include "../support/rollout.hpp"
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using hybridrl::testing::contains;
using hybridrl::testing::error_of;


using hybridrl::testing::greedy_by_recompute;
using hybridrl::testing::kRolloutModels;
using hybridrl::testing::max_rollout_log_prob_error;
using hybridrl::testing::prompt_batch;
using hybridrl::testing::row_tokens;

TEST_SUITE("rollout/naive") {
  TEST_CASE("greedy tokens equal a full-recompute forward, for mixed prompt lengths and every fixture") {
    const std::vector<std::vector<int64_t>> prompts{{1, 17, 23, 99, 5, 61, 7}, {1, 250}, {1, 40, 41, 42, 43}};
    for (std::string name : {"llama", "mistral", "qwen2"}) {
      CAPTURE(name);
      auto m = load_causal_lm(kRolloutModels + "/" + name);
      // chunks of 2 rows: the last chunk holds one row, so chunking is covered too
      NaiveEngine engine(m, NaiveOptions{}.max_batch_size(2));
      const auto s = SamplingOptions{}.temperature(0).max_new_tokens(9).ignore_eos(true);
      auto out = engine.generate(prompt_batch(prompts), s);
      out.require(rollout_output_keys, "test");
      for (size_t i = 0; i < prompts.size(); ++i) {
        CHECK(row_tokens(out, static_cast<int64_t>(i)) == greedy_by_recompute(m, prompts[i], 9));
        CHECK(out.tensor(keys::finish_reason)[static_cast<int64_t>(i)].item<int64_t>() ==
              static_cast<int64_t>(FinishReason::length));
      }
      CHECK(engine.stats().generated_tokens == 27);
      CHECK(engine.stats().prompt_tokens == 14);
    }
  }

  TEST_CASE("greedy tokens equal transformers' greedy generate() (tests/fixtures/models/hf_greedy.json)") {
    // made by make_model_fixtures.py --greedy with transformers 5.17 (fp32, CPU, eager attention)
    std::ifstream in(kRolloutModels + "/hf_greedy.json");
    REQUIRE(in.good());
    const auto ref = nlohmann::json::parse(in);
    for (std::string name : {"llama", "mistral", "qwen2", "qwen2_swa"}) {  // qwen2_swa: mixed full / window layers
      CAPTURE(name);
      const auto prompts = ref.at(name).at("prompts").get<std::vector<std::vector<int64_t>>>();
      const auto greedy = ref.at(name).at("greedy").get<std::vector<std::vector<int64_t>>>();
      NaiveEngine engine(load_causal_lm(kRolloutModels + "/" + name), NaiveOptions{});
      const auto n = static_cast<int64_t>(greedy.front().size());
      auto out = engine.generate(prompt_batch(prompts), SamplingOptions{}.temperature(0).max_new_tokens(n).ignore_eos(true));
      for (size_t i = 0; i < prompts.size(); ++i) CHECK(row_tokens(out, static_cast<int64_t>(i)) == greedy[i]);
    }
  }

  TEST_CASE("pad_rollout_batch: rows padded to a longer prompt equal the same rows generated beside it") {
    auto m = load_causal_lm(kRolloutModels + "/llama");
    NaiveEngine engine(m, NaiveOptions{});
    const auto s = SamplingOptions{}.temperature(0.8).max_new_tokens(5).ignore_eos(true).seed(11);
    const std::vector<std::vector<int64_t>> two{{1, 9, 8}, {1, 300, 2, 44}};
    auto alone = engine.generate(prompt_batch(two), s);
    auto three = two;
    three.push_back({1, 5, 6, 7, 8, 9, 10, 11});  // the longest prompt: 8 tokens
    auto beside = engine.generate(prompt_batch(three), s).slice(0, 2);
    const auto P = beside.tensor(keys::prompts).size(1), R = beside.tensor(keys::responses).size(1);
    REQUIRE(P == 8);
    REQUIRE(alone.tensor(keys::prompts).size(1) == 4);
    const auto padded = pad_rollout_batch(alone, P, R, m->config().pad_token_id.value_or(0));
    for (const auto& k : {keys::prompts, keys::responses, keys::response_mask, keys::input_ids, keys::attention_mask,
                          keys::position_ids, keys::finish_reason, keys::group_ids}) {
      const std::string key(k.name);
      CAPTURE(key);
      CHECK(at::equal(padded.tensor(k), beside.tensor(k)));
    }
    CHECK(at::allclose(padded.tensor(keys::rollout_log_probs), beside.tensor(keys::rollout_log_probs), 0, 1e-5));
    // longer responses: right padding, masks and log-probs 0
    const auto wider = pad_rollout_batch(alone, 4, R + 3, 0);
    CHECK(wider.tensor(keys::responses).size(1) == R + 3);
    CHECK(wider.tensor(keys::response_mask).narrow(1, R, 3).sum().item<int64_t>() == 0);
    CHECK(wider.tensor(keys::rollout_log_probs).narrow(1, R, 3).abs().sum().item<double>() == 0.0);
    CHECK(at::equal(wider.tensor(keys::input_ids).narrow(1, 0, 4 + R), alone.tensor(keys::input_ids)));
    CHECK(contains(error_of([&] { (void)pad_rollout_batch(alone, 3, R, 0); }), "more than P = 3"));
  }

  TEST_CASE("returned log-probs equal the model's log-probs of the chosen tokens (fp32, <= 1e-5)") {
    auto m = load_causal_lm(kRolloutModels + "/llama");
    NaiveEngine engine(m, NaiveOptions{});
    for (double T : {0.0, 0.8}) {
      CAPTURE(T);
      const auto s = SamplingOptions{}.temperature(T).max_new_tokens(6).ignore_eos(true).seed(3);
      auto out = engine.generate(prompt_batch({{1, 9, 8, 7}, {1, 300, 2, 44, 45, 46}}), s);
      CHECK(max_rollout_log_prob_error(m, out, T) <= 1e-5);
    }
  }

  TEST_CASE("stop rules: EOS and stop ids end a response (included), min_new_tokens bans them, ignore_eos") {
    auto m = load_causal_lm(kRolloutModels + "/llama");
    NaiveEngine engine(m, NaiveOptions{});
    const std::vector<int64_t> prompt{1, 17, 23, 99};
    const auto free_run = greedy_by_recompute(m, prompt, 12);
    const auto stop = free_run[3];  // the 4th greedy token
    size_t first = 0;
    while (free_run[first] != stop) ++first;
    auto out = engine.generate(prompt_batch({prompt}),
                               SamplingOptions{}.temperature(0).max_new_tokens(12).stop_token_ids({stop}).ignore_eos(true));
    CHECK(row_tokens(out, 0) == std::vector<int64_t>(free_run.begin(), free_run.begin() + static_cast<long>(first) + 1));
    CHECK(out.tensor(keys::finish_reason)[0].item<int64_t>() == static_cast<int64_t>(FinishReason::stop));
    // the model's EOS (config eos_token_id) stops too, unless ignore_eos
    CHECK(m->config().eos_token_id.has_value());
    auto eos_cfg = m->config();
    eos_cfg.eos_token_id = stop;
    auto m2 = CausalLM(eos_cfg);
    hybridrl::detail::copy_parameters(*m2, *m);
    NaiveEngine e2(m2, NaiveOptions{});
    auto by_eos = e2.generate(prompt_batch({prompt}), SamplingOptions{}.temperature(0).max_new_tokens(12));
    CHECK(row_tokens(by_eos, 0).size() == first + 1);
    auto ignored = e2.generate(prompt_batch({prompt}), SamplingOptions{}.temperature(0).max_new_tokens(12).ignore_eos(true));
    CHECK(row_tokens(ignored, 0) == free_run);
    // generation_config.json's stop ids (ModelConfig::eos_token_ids) stop as EOS does
    auto gen_cfg = m->config();
    gen_cfg.eos_token_id.reset();
    gen_cfg.eos_token_ids = {stop};
    auto m3 = CausalLM(gen_cfg);
    hybridrl::detail::copy_parameters(*m3, *m);
    NaiveEngine e3(m3, NaiveOptions{});
    auto by_list = e3.generate(prompt_batch({prompt}), SamplingOptions{}.temperature(0).max_new_tokens(12));
    CHECK(row_tokens(by_list, 0) == std::vector<int64_t>(free_run.begin(), free_run.begin() + static_cast<long>(first) + 1));
    CHECK(row_tokens(e3.generate(prompt_batch({prompt}), SamplingOptions{}.temperature(0).max_new_tokens(12).ignore_eos(true)), 0) ==
          free_run);
    // min_new_tokens: the stop token cannot be drawn before it, so the response is at least that long
    auto longer = e2.generate(prompt_batch({prompt}),
                              SamplingOptions{}.temperature(0).max_new_tokens(12).min_new_tokens(static_cast<int64_t>(first) + 2));
    const auto toks = row_tokens(longer, 0);
    CHECK(toks.size() >= first + 2);
    for (size_t t = 0; t + 1 < first + 2 && t < toks.size(); ++t) CHECK(toks[t] != stop);
  }

  TEST_CASE("a response stops at the model's context (finish_reason length)") {
    auto m = load_causal_lm(kRolloutModels + "/llama");
    const auto ctx = m->config().max_position_embeddings;
    std::vector<int64_t> prompt(static_cast<size_t>(ctx - 3), 5);
    NaiveEngine engine(m, NaiveOptions{});
    auto out = engine.generate(prompt_batch({prompt}), SamplingOptions{}.temperature(0).max_new_tokens(50).ignore_eos(true));
    CHECK(row_tokens(out, 0).size() == 3);
    CHECK(out.tensor(keys::finish_reason)[0].item<int64_t>() == static_cast<int64_t>(FinishReason::length));
  }

  TEST_CASE("per-request seeds: a request draws the same tokens whatever else is in the batch") {
    auto m = load_causal_lm(kRolloutModels + "/qwen2");
    NaiveEngine engine(m, NaiveOptions{}.max_batch_size(3));
    const auto s = SamplingOptions{}.temperature(1.0).top_p(0.95).max_new_tokens(8).ignore_eos(true).seed(11);
    auto a = prompt_batch({{1, 5, 6}, {1, 7}});
    a.set(keys::group_ids, at::tensor(std::vector<int64_t>{40, 41}, at::kLong));
    auto b = prompt_batch({{1, 99, 98, 97, 96}, {1, 7}, {1, 5, 6}, {1, 5, 6}});
    b.set(keys::group_ids, at::tensor(std::vector<int64_t>{7, 41, 40, 40}, at::kLong));
    auto oa = engine.generate(a, s), ob = engine.generate(b, s);
    CHECK(row_tokens(ob, 1) == row_tokens(oa, 1));  // group 41, its first sample
    CHECK(row_tokens(ob, 2) == row_tokens(oa, 0));  // group 40, its first sample
    CHECK(row_tokens(ob, 3) != row_tokens(ob, 2));  // group 40's second sample draws other noise
    // explicit sampling_seeds override the derived ones
    auto c = prompt_batch({{1, 5, 6}});
    c.set(keys::sampling_seeds, at::tensor(std::vector<int64_t>{static_cast<int64_t>(request_seed(11, 40))}, at::kLong));
    c.set(keys::group_ids, at::tensor(std::vector<int64_t>{999}, at::kLong));
    CHECK(row_tokens(engine.generate(c, s), 0) == row_tokens(oa, 0));
    CHECK(at::equal(ob.tensor(keys::group_ids), b.tensor(keys::group_ids)));
  }

  TEST_CASE("load_weights fills a made engine: it then generates as one built on the checkpoint") {
    auto m = load_causal_lm(kRolloutModels + "/mistral");
    auto engine = Rollout<Naive>::make(m->config(), NaiveOptions{});
    CHECK(engine.weight_spec() == WeightSpec{1, 0, at::kFloat});
    const auto s = SamplingOptions{}.temperature(0).max_new_tokens(5).ignore_eos(true);
    const auto batch = prompt_batch({{1, 3, 4, 5}, {1, 6}});
    WeightBucket bucket;
    for (const auto& p : m->named_parameters()) bucket.push_back({p.key(), p.value()});
    engine.load_weights(WeightBucket(bucket.begin(), bucket.begin() + 3));  // buckets, in any split
    engine.load_weights(WeightBucket(bucket.begin() + 3, bucket.end()));
    NaiveEngine direct(m, NaiveOptions{});
    CHECK(at::equal(engine.generate(batch, s).tensor(keys::responses), direct.generate(batch, s).tensor(keys::responses)));
    CHECK(contains(error_of([&] { engine.load_weights({{"model.nope.weight", at::zeros({1})}}); }),
                   "has no parameter 'model.nope.weight'"));
    CHECK(contains(error_of([&] { engine.load_weights({{"model.norm.weight", at::zeros({3})}}); }), "has shape [3]"));
    engine.release_memory();
    CHECK(contains(error_of([&] { engine.generate(batch, s); }), "call resume_memory()"));
    engine.resume_memory();
    CHECK(engine.generate(batch, s).size() == 2);
  }

  TEST_CASE("bad requests are refused before any model work, naming the row and the fix") {
    auto m = load_causal_lm(kRolloutModels + "/llama");
    NaiveEngine engine(m, NaiveOptions{});
    const auto s = SamplingOptions{}.temperature(0).max_new_tokens(4);
    CHECK(contains(error_of([&] { engine.generate(prompt_batch({{1, 2}, {}}), s); }), "prompt 1 is empty"));
    CHECK(contains(error_of([&] { engine.generate(prompt_batch({{1, 320}}), s); }),
                   "prompt 0 holds token id 320 outside the vocabulary [0, 320)"));
    const std::vector<int64_t> too_long(static_cast<size_t>(m->config().max_position_embeddings), 3);
    CHECK(contains(error_of([&] { engine.generate(prompt_batch({too_long}), s); }), "no room for a response"));
    CHECK(contains(error_of([&] { engine.generate(prompt_batch({{1, 2}}), SamplingOptions{}.max_new_tokens(0)); }),
                   "rollout.max_new_tokens = 0 is below 1"));
    CHECK(contains(error_of([&] { engine.generate(TensorBatch({{"x", at::zeros({2})}}), s); }), "has no 'input_ids'"));
  }
}
