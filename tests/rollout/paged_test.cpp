// Rollout<Paged> on the tiny Hugging Face fixtures: greedy tokens equal Rollout<Naive>, a
// full-recompute forward and transformers' greedy generate(), with and without prefix sharing,
// under chunked prefill and under a block budget that forces preemption; log-probs equal the
// model's; sampled tokens equal Naive's for the same seeds; shared-prefix blocks are held once;
// the pool leaks nothing; the scheduler alone (continuous batching, preemption order); the paged
// attention reference against dense attention; errors.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hybridrl/cuda/paged_attention.hpp"
#include "hybridrl/model/log_probs.hpp"
#include "hybridrl/model/pretrained.hpp"
#include "hybridrl/rollout/naive.hpp"
#include "hybridrl/rollout/paged.hpp"
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

namespace hybridrl::testing {
// Prompts of mixed lengths, some longer than a block of 4, two sharing a 9-token preamble.
inline std::vector<std::vector<int64_t>> paged_prompts() {
  return {{1, 17, 23, 99, 5, 61, 7},
          {1, 250},
          {1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51},
          {1, 40, 41, 42, 43, 44, 45, 46, 47, 9, 9},
          {1, 3, 5, 7, 11}};
}
inline PagedOptions small_paged() { return PagedOptions{}.block_size(4).kv_cache_tokens(512); }
}  // namespace hybridrl::testing

using hybridrl::testing::paged_prompts;
using hybridrl::testing::small_paged;

TEST_SUITE("rollout/paged") {
  TEST_CASE("greedy tokens equal Rollout<Naive> and a full recompute, for every fixture and scheduler regime") {
    const auto prompts = paged_prompts();
    const auto s = SamplingOptions{}.temperature(0).max_new_tokens(10).ignore_eos(true);
    for (std::string name : {"llama", "mistral", "qwen2"}) {
      CAPTURE(name);
      auto m = load_causal_lm(kRolloutModels + "/" + name);
      std::vector<std::vector<int64_t>> oracle;
      for (const auto& p : prompts) oracle.push_back(greedy_by_recompute(m, p, 10));
      NaiveEngine naive(m, NaiveOptions{});
      auto ref = naive.generate(prompt_batch(prompts), s);
      struct Regime {
        const char* what;
        PagedOptions o;
      };
      const std::vector<Regime> regimes{
          {"defaults, block 4", small_paged()},
          {"no prefix sharing", small_paged().prefix_sharing(false)},
          {"block 16", PagedOptions{}.kv_cache_tokens(512)},
          {"chunked prefill (3 tokens per step)", small_paged().max_num_batched_tokens(3)},
          {"two sequences at a time", small_paged().max_num_seqs(2)},
          {"a pool of 9 blocks (preempts)", small_paged().kv_cache_tokens(36)},
      };
      for (const auto& r : regimes) {
        CAPTURE(r.what);
        PagedEngine engine(m, r.o);
        auto out = engine.generate(prompt_batch(prompts), s);
        out.require(rollout_output_keys, "test");
        for (size_t i = 0; i < prompts.size(); ++i) {
          CAPTURE(i);
          CHECK(row_tokens(out, static_cast<int64_t>(i)) == oracle[i]);
        }
        CHECK(at::equal(out.tensor(keys::responses), ref.tensor(keys::responses)));
        CHECK(at::equal(out.tensor(keys::input_ids), ref.tensor(keys::input_ids)));
        CHECK(at::equal(out.tensor(keys::position_ids), ref.tensor(keys::position_ids)));
        CHECK(engine.stats().generated_tokens == 50);
        CHECK(engine.block_pool().num_free() == engine.num_blocks());  // every block came back
      }
    }
  }

  TEST_CASE("a pool too small for all sequences at once preempts the newest and recomputes it") {
    auto m = load_causal_lm(kRolloutModels + "/llama");
    const auto prompts = paged_prompts();
    const auto s = SamplingOptions{}.temperature(0).max_new_tokens(10).ignore_eos(true);
    PagedEngine roomy(m, small_paged());
    auto expect = roomy.generate(prompt_batch(prompts), s);
    CHECK(roomy.stats().preemptions == 0);
    PagedEngine tight(m, small_paged().kv_cache_tokens(36));  // 9 blocks; the 5 sequences need 20
    auto out = tight.generate(prompt_batch(prompts), s);
    CHECK(tight.stats().preemptions > 0);
    CHECK(at::equal(out.tensor(keys::responses), expect.tensor(keys::responses)));
    // recomputed log-probs agree with the incremental ones
    CHECK(at::allclose(out.tensor(keys::rollout_log_probs), expect.tensor(keys::rollout_log_probs), 1e-5, 1e-5));
    CHECK(tight.stats().kv_peak_utilization <= 1.0);
    CHECK(tight.stats().kv_peak_utilization > 0.5);
  }

  TEST_CASE("greedy tokens equal transformers' greedy generate() (tests/fixtures/models/hf_greedy.json)") {
    std::ifstream in(kRolloutModels + "/hf_greedy.json");
    REQUIRE(in.good());
    const auto ref = nlohmann::json::parse(in);
    for (std::string name : {"llama", "mistral", "qwen2", "qwen2_swa"}) {  // qwen2_swa: mixed full / window layers
      CAPTURE(name);
      const auto prompts = ref.at(name).at("prompts").get<std::vector<std::vector<int64_t>>>();
      const auto greedy = ref.at(name).at("greedy").get<std::vector<std::vector<int64_t>>>();
      PagedEngine engine(load_causal_lm(kRolloutModels + "/" + name), small_paged());
      const auto n = static_cast<int64_t>(greedy.front().size());
      auto out = engine.generate(prompt_batch(prompts), SamplingOptions{}.temperature(0).max_new_tokens(n).ignore_eos(true));
      for (size_t i = 0; i < prompts.size(); ++i) CHECK(row_tokens(out, static_cast<int64_t>(i)) == greedy[i]);
    }
  }

  TEST_CASE("n samples of a prompt: prefilled once, prompt blocks held once, same tokens as Naive") {
    auto m = load_causal_lm(kRolloutModels + "/qwen2");
    std::vector<int64_t> prompt(18);  // 4 full blocks of 4 and 2 tokens in a fifth
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int64_t>(7 + 3 * i);
    auto batch = prompt_batch({prompt, prompt, prompt, prompt});
    batch.set(keys::group_ids, at::zeros({4}, at::kLong));  // one group: samples 0..3
    const auto s = SamplingOptions{}.temperature(0.9).top_k(50).max_new_tokens(2).ignore_eos(true).seed(5);
    PagedEngine shared(m, small_paged());
    auto out = shared.generate(batch, s);
    // 19 tokens in the cache per sample at most: 5 blocks. Shared: the leader's 5, plus one private
    // copy of the partial fifth block per follower. Unshared: 5 blocks each.
    CHECK(shared.stats().cached_prompt_tokens == 3 * 18);
    CHECK(std::llround(shared.stats().kv_peak_utilization * static_cast<double>(shared.num_blocks())) == 5 + 3);
    PagedEngine separate(m, small_paged().prefix_sharing(false));
    auto out2 = separate.generate(batch, s);
    CHECK(separate.stats().cached_prompt_tokens == 0);
    CHECK(std::llround(separate.stats().kv_peak_utilization * static_cast<double>(separate.num_blocks())) == 4 * 5);
    // the samples differ from each other but not between engines: the noise is (seed, sample, position)
    NaiveEngine naive(m, NaiveOptions{});
    auto ref = naive.generate(batch, s);
    CHECK(at::equal(out.tensor(keys::responses), ref.tensor(keys::responses)));
    CHECK(at::equal(out2.tensor(keys::responses), ref.tensor(keys::responses)));
    CHECK(!at::equal(ref.tensor(keys::responses)[0], ref.tensor(keys::responses)[1]));
    CHECK(shared.block_pool().num_free() == shared.num_blocks());
  }

  TEST_CASE("the prefix cache serves a later call and is forgotten when the weights change") {
    auto m = load_causal_lm(kRolloutModels + "/llama");
    PagedEngine engine(m, small_paged());
    const auto s = SamplingOptions{}.temperature(0).max_new_tokens(3).ignore_eos(true);
    std::vector<int64_t> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};  // 2 full blocks of 4 + 3 tokens
    auto first = engine.generate(prompt_batch({prompt}), s);
    CHECK(engine.stats().cached_prompt_tokens == 0);
    auto again = engine.generate(prompt_batch({prompt}), s);
    CHECK(engine.stats().cached_prompt_tokens == 8);
    CHECK(at::equal(first.tensor(keys::responses), again.tensor(keys::responses)));
    WeightBucket bucket;
    for (const auto& p : m->named_parameters()) bucket.push_back({p.key(), p.value()});
    engine.load_weights(bucket);
    CHECK(engine.block_pool().num_cached() == 0);
    engine.generate(prompt_batch({prompt}), s);
    CHECK(engine.stats().cached_prompt_tokens == 0);
  }

  TEST_CASE("returned log-probs equal the model's log-probs of the chosen tokens (fp32, <= 1e-5)") {
    auto m = load_causal_lm(kRolloutModels + "/mistral");
    PagedEngine engine(m, small_paged());
    for (double T : {0.0, 0.7}) {
      CAPTURE(T);
      const auto s = SamplingOptions{}.temperature(T).top_p(0.9).max_new_tokens(9).ignore_eos(true).seed(3);
      auto out = engine.generate(prompt_batch(paged_prompts()), s);
      CHECK(max_rollout_log_prob_error(m, out, T) <= 1e-5);
    }
  }

  TEST_CASE("sampled tokens equal Rollout<Naive>'s for the same seeds, and stop rules agree") {
    auto m = load_causal_lm(kRolloutModels + "/llama");
    auto batch = prompt_batch(paged_prompts());
    batch.set(keys::group_ids, at::tensor(std::vector<int64_t>{3, 3, 8, 9, 9}, at::kLong));
    const auto stop = greedy_by_recompute(m, paged_prompts()[0], 4)[2];
    for (const auto& s : {SamplingOptions{}.temperature(1.0).max_new_tokens(12).seed(21),
                          SamplingOptions{}.temperature(0.6).top_k(5).min_p(0.05).max_new_tokens(12).seed(4),
                          SamplingOptions{}.temperature(0).max_new_tokens(12).stop_token_ids({stop}).min_new_tokens(1)}) {
      PagedEngine paged(m, small_paged().max_num_seqs(3));
      NaiveEngine naive(m, NaiveOptions{});
      auto a = paged.generate(batch, s), b = naive.generate(batch, s);
      CHECK(at::equal(a.tensor(keys::responses), b.tensor(keys::responses)));
      CHECK(at::equal(a.tensor(keys::finish_reason), b.tensor(keys::finish_reason)));
    }
  }

  TEST_CASE("release_memory frees the pool; resume_memory restores it; made engines load weights") {
    auto m = load_causal_lm(kRolloutModels + "/qwen2");
    auto engine = Rollout<Paged>::make(m->config(), small_paged());
    CHECK(engine.weight_spec() == WeightSpec{1, 0, at::kFloat});
    WeightBucket bucket;
    for (const auto& p : m->named_parameters()) bucket.push_back({p.key(), p.value()});
    engine.load_weights(WeightBucket(bucket.begin(), bucket.begin() + 4));
    engine.load_weights(WeightBucket(bucket.begin() + 4, bucket.end()));
    const auto s = SamplingOptions{}.temperature(0).max_new_tokens(4).ignore_eos(true);
    const auto batch = prompt_batch({{1, 2, 3}, {1, 9, 9, 9, 9, 9}});
    NaiveEngine naive(m, NaiveOptions{});
    const auto expect = naive.generate(batch, s).tensor(keys::responses);
    CHECK(at::equal(engine.generate(batch, s).tensor(keys::responses), expect));
    engine.release_memory();
    CHECK(contains(error_of([&] { engine.generate(batch, s); }), "call resume_memory()"));
    engine.resume_memory();
    CHECK(at::equal(engine.generate(batch, s).tensor(keys::responses), expect));
    CHECK(engine.stats().kv_cache_bytes == engine.num_blocks() * 2 * 2 * 4 * 2 * 16 * 4);
    CHECK(engine.num_blocks() == 512 / 4);  // kv_cache_tokens: that size, after a resume too
    // a pool sized from memory (kv_cache_tokens 0; 16384 tokens on the CPU): after a resume it is
    // allocated for the next call's requests, one fork block each: ceil((3 + 4 - 1) / 4) + 1 = 3
    // and ceil((6 + 4 - 1) / 4) + 1 = 4 blocks; a call that needs more grows it
    PagedEngine sized(m, PagedOptions{}.block_size(4));
    CHECK(sized.num_blocks() == 16384 / 4);
    sized.release_memory();
    sized.resume_memory();
    CHECK(at::equal(sized.generate(batch, s).tensor(keys::responses), expect));
    CHECK(sized.num_blocks() == 3 + 4);
    CHECK(sized.stats().kv_cache_bytes == 7 * 2 * 2 * 4 * 2 * 16 * 4);
    const auto longer = SamplingOptions(s).max_new_tokens(8);
    CHECK(at::equal(sized.generate(batch, longer).tensor(keys::responses), naive.generate(batch, longer).tensor(keys::responses)));
    CHECK(sized.num_blocks() == 4 + 5);  // ceil(10 / 4) + 1, ceil(13 / 4) + 1
    sized.generate(batch, s);
    CHECK(sized.num_blocks() == 9);  // a smaller call keeps the pool
    CHECK(sized.block_pool().num_free() == 9);
  }

  TEST_CASE("bad requests and options are refused before any model work, naming the fix") {
    auto m = load_causal_lm(kRolloutModels + "/llama");
    PagedEngine engine(m, small_paged().kv_cache_tokens(16));  // 4 blocks of 4
    const auto s = SamplingOptions{}.temperature(0).max_new_tokens(4);
    CHECK(contains(error_of([&] { engine.generate(prompt_batch({{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}), s); }),
                   "prompt 0 (10 tokens, up to 4 new) needs 5 KV blocks of 4 tokens; the pool has 4"));
    CHECK(contains(error_of([&] { engine.generate(prompt_batch({{1, 2}, {}}), s); }), "prompt 1 is empty"));
    CHECK(contains(error_of([&] { engine.generate(prompt_batch({{1, 320}}), s); }), "outside the vocabulary"));
    CHECK(contains(error_of([&] { engine.generate(prompt_batch({{1, 2}}), SamplingOptions{}.max_new_tokens(0)); }),
                   "rollout.max_new_tokens = 0 is below 1"));
    CHECK(contains(error_of([] { PagedOptions{}.block_size(12).validate(); }), "block_size = 12 is not a positive power of two"));
    CHECK(contains(error_of([] { PagedOptions{}.kv_cache_tokens(-1).validate(); }), "kv_cache_tokens = -1 is negative"));
    CHECK(engine.block_pool().num_free() == engine.num_blocks());
  }
}

TEST_SUITE("rollout/paged_cuda") {
  TEST_CASE("on CUDA, decode steps replay CUDA graphs: the same tokens as eager steps and as Rollout<Naive>") {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
    if (!at::hasCUDA()) {
      MESSAGE("no CUDA device: not run");
      return;
    }
    const auto c = hybridrl::testing::kernel_shaped_config();  // the decode kernel's shapes
    at::manual_seed(0);
    CausalLM m(c);
    m->to(at::Device(at::kCUDA, 0), at::kFloat);
    c10::NoGradGuard g;
    const auto prompts = prompt_batch(paged_prompts());
    for (const auto& s : {SamplingOptions{}.temperature(0).max_new_tokens(12).ignore_eos(true),
                          SamplingOptions{}.temperature(0.8).top_k(40).max_new_tokens(12).ignore_eos(true).seed(9)}) {
      CAPTURE(s.temperature());
      const auto o = PagedOptions{}.kv_cache_tokens(4096);
      PagedEngine graphs(m, o), eager(m, PagedOptions(o).cuda_graphs(false));
      NaiveEngine naive(m, NaiveOptions{});
      auto a = graphs.generate(prompts, s), b = eager.generate(prompts, s), n = naive.generate(prompts, s);
      CHECK(graphs.stats().graph_steps >= 10);
      CHECK(eager.stats().graph_steps == 0);
      CHECK(at::equal(a.tensor(keys::responses), b.tensor(keys::responses)));
      CHECK(at::equal(a.tensor(keys::responses), n.tensor(keys::responses)));
      CHECK(at::allclose(a.tensor(keys::rollout_log_probs), b.tensor(keys::rollout_log_probs), 1e-4, 1e-4));
      auto again = graphs.generate(prompts, s);  // the captured graphs serve a second call
      CHECK(at::equal(again.tensor(keys::responses), a.tensor(keys::responses)));
    }
    {  // one engine whose graphs are dropped and captured again: a change of sampling, and a
       // release_memory / resume_memory between steps (the fit loop's free_cache_engine)
      PagedEngine engine(m, PagedOptions{}.kv_cache_tokens(4096));
      const auto greedy = SamplingOptions{}.temperature(0).max_new_tokens(12).ignore_eos(true);
      const auto sampled = SamplingOptions{}.temperature(0.8).max_new_tokens(12).ignore_eos(true).seed(3);
      const auto first = engine.generate(prompts, greedy).tensor(keys::responses);
      engine.generate(prompts, sampled);
      CHECK(engine.stats().graph_steps >= 10);
      CHECK(at::equal(engine.generate(prompts, greedy).tensor(keys::responses), first));
      std::vector<int64_t> allocated;  // after each cycle: nothing left behind (cuBLAS's per-stream workspaces were)
      for (int i = 0; i < 3; ++i) {
        engine.release_memory();
        engine.resume_memory();
        CHECK(at::equal(engine.generate(prompts, greedy).tensor(keys::responses), first));
        CHECK(engine.stats().graph_steps >= 10);
        allocated.push_back(hybridrl::detail::compat::cuda_memory(0).allocated);
      }
      CHECK(allocated[1] == allocated[0]);
      CHECK(allocated[2] == allocated[0]);
    }
    // bf16: greedy tokens of the paged engine (kernel, graphs) against the dense path, reported
    m->to(at::kBFloat16);
    const auto greedy = SamplingOptions{}.temperature(0).max_new_tokens(12).ignore_eos(true);
    PagedEngine paged(m, PagedOptions{}.kv_cache_tokens(4096));
    NaiveEngine naive(m, NaiveOptions{});
    auto a = paged.generate(prompts, greedy).tensor(keys::responses), b = naive.generate(prompts, greedy).tensor(keys::responses);
    const double agree = a.eq(b).to(at::kDouble).mean().item<double>();
    MESSAGE("bf16 greedy tokens equal to the dense path: " << agree);
    CHECK(agree > 0.5);
    // bf16 prefill runs FlashAttention-2 varlen: over the step's keys for whole prompts, over keys
    // gathered from the blocks for chunks after cached ones (8 tokens per step)
    PagedEngine chunked(m, PagedOptions{}.kv_cache_tokens(4096).max_num_batched_tokens(8));
    auto ch = chunked.generate(prompts, greedy).tensor(keys::responses);
    const double agree_chunked = ch.eq(a).to(at::kDouble).mean().item<double>();
    MESSAGE("bf16 greedy tokens, chunked prefill against whole prompts: " << agree_chunked);
    CHECK(agree_chunked > 0.5);
#else
    MESSAGE("built without hybridrl::cuda: the CUDA engine is tested on CUDA builds");
#endif
  }

  TEST_CASE("async scheduling: steps launched before the last tokens are read give synchronous and eager steps' tokens") {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
    if (!at::hasCUDA()) {
      MESSAGE("no CUDA device: not run");
      return;
    }
    const auto c = hybridrl::testing::kernel_shaped_config();
    at::manual_seed(0);
    CausalLM m(c);
    m->to(at::Device(at::kCUDA, 0), at::kFloat);
    c10::NoGradGuard g;
    // 5 prompts x 3 samples (followers fork their leader), 8 running at most (a queue), a pool of
    // 160 tokens for up to 8 x 53 (preemption), sampled
    std::vector<std::vector<int64_t>> rows;
    std::vector<int64_t> groups;
    for (size_t i = 0; i < paged_prompts().size(); ++i) {
      for (int k = 0; k < 3; ++k) {
        rows.push_back(paged_prompts()[i]);
        groups.push_back(static_cast<int64_t>(i));
      }
    }
    auto prompts = prompt_batch(rows);
    prompts.set(keys::group_ids.str(), at::tensor(groups, at::kLong));
    const auto o = PagedOptions{}.block_size(4).kv_cache_tokens(160).max_num_seqs(8);
    const auto base = SamplingOptions{}.temperature(0.8).max_new_tokens(40).ignore_eos(true).seed(5);
    // stop ids drawn mid-response by two rows of an unstopped run: those rows (and others that
    // draw them) stop early, the rest run to the length limit
    PagedEngine probe(m, PagedOptions(o).async_scheduling(false));
    const auto free_run = probe.generate(prompts, base).tensor(keys::responses);
    const std::vector<int64_t> stops{free_run[0][6].item<int64_t>(), free_run[7][17].item<int64_t>()};
    for (const auto& s : {SamplingOptions(base).stop_token_ids(stops), SamplingOptions(base).stop_token_ids(stops).min_new_tokens(9),
                          base}) {
      CAPTURE(s.min_new_tokens());
      CAPTURE(s.stop_token_ids().size());
      PagedEngine async(m, o), sync(m, PagedOptions(o).async_scheduling(false)), eager(m, PagedOptions(o).cuda_graphs(false));
      auto a = async.generate(prompts, s), b = sync.generate(prompts, s), e = eager.generate(prompts, s);
      CHECK(async.stats().overlapped_steps >= 10);
      CHECK(sync.stats().overlapped_steps == 0);
      CHECK(sync.stats().graph_steps >= 10);
      CHECK(async.stats().preemptions > 0);
      for (const auto& k : {keys::responses, keys::response_mask, keys::finish_reason}) {
        CAPTURE(k.str());
        CHECK(at::equal(a.tensor(k), b.tensor(k)));
        CHECK(at::equal(a.tensor(k), e.tensor(k)));
      }
      // a row that stopped is computed once more under async scheduling: a step can have another
      // padded size (another GEMM shape), so log-probs may differ in the last bits (fp32)
      CHECK(at::allclose(a.tensor(keys::rollout_log_probs), b.tensor(keys::rollout_log_probs), 1e-4, 1e-4));
      CHECK(at::allclose(a.tensor(keys::rollout_log_probs), e.tensor(keys::rollout_log_probs), 1e-4, 1e-4));
      const auto reason = a.tensor(keys::finish_reason);
      const auto lengths = a.tensor(keys::response_mask).sum(1);
      if (s.stop_token_ids().empty()) {
        CHECK(reason.eq(static_cast<int64_t>(FinishReason::stop)).sum().item<int64_t>() == 0);
      } else if (s.min_new_tokens() == 0) {  // the same draws as the free run up to a stop id
        CHECK(reason[0].item<int64_t>() == static_cast<int64_t>(FinishReason::stop));
        CHECK(reason[7].item<int64_t>() == static_cast<int64_t>(FinishReason::stop));
        CHECK(lengths[0].item<int64_t>() <= 7);
        CHECK(lengths[7].item<int64_t>() <= 18);
      } else {
        CHECK(lengths.min().item<int64_t>() >= 9);
      }
      CHECK(async.block_pool().num_free() == async.num_blocks());  // nothing held after the call
      // a second call on the same engine: graphs captured, the same tokens
      CHECK(at::equal(async.generate(prompts, s).tensor(keys::responses), a.tensor(keys::responses)));
    }
#else
    MESSAGE("built without hybridrl::cuda: the CUDA engine is tested on CUDA builds");
#endif
  }
}

TEST_SUITE("rollout/paged_scheduler") {
  TEST_CASE("continuous batching: a finished sequence's slot is refilled in the next step") {
    BlockPool pool(64, 4);
    PagedScheduler sched(pool, {2, 100, true});
    const auto a = sched.add({1, 2, 3}), b = sched.add({4, 5}), c = sched.add({6, 7, 8, 9, 10});
    auto s1 = sched.schedule();  // a and b prefill; c waits (max_num_seqs 2)
    REQUIRE(s1.chunks.size() == 2);
    CHECK((s1.chunks[0].seq == a && s1.chunks[0].count == 3 && s1.chunks[1].seq == b && s1.chunks[1].count == 2));
    sched.computed(s1);
    sched.append(a, 11);
    sched.finish(b);
    auto s2 = sched.schedule();  // a decodes one token; c is admitted in the same step
    REQUIRE(s2.chunks.size() == 2);
    CHECK((s2.chunks[0].seq == a && s2.chunks[0].start == 3 && s2.chunks[0].count == 1));
    CHECK((s2.chunks[1].seq == c && s2.chunks[1].start == 0 && s2.chunks[1].count == 5));
    CHECK(s2.num_tokens == 6);
    sched.computed(s2);
    sched.finish(a);
    sched.finish(c);
    CHECK(sched.done());
    CHECK(pool.num_free() == 64);
  }

  TEST_CASE("the token budget chunks a long prefill; decode comes first") {
    BlockPool pool(64, 4);
    PagedScheduler sched(pool, {8, 4, true});
    const auto a = sched.add({1, 2}), b = sched.add({3, 4, 5, 6, 7, 8, 9});
    auto s1 = sched.schedule();  // a: 2, b: 2 of 7
    REQUIRE(s1.chunks.size() == 2);
    CHECK((s1.chunks[1].seq == b && s1.chunks[1].count == 2));
    sched.computed(s1);
    CHECK(sched.sequence(a).ready());
    CHECK(!sched.sequence(b).ready());
    sched.append(a, 50);
    auto s2 = sched.schedule();  // a: its 1 drawn token first, then b: 3 more
    REQUIRE(s2.chunks.size() == 2);
    CHECK((s2.chunks[0].seq == a && s2.chunks[0].count == 1 && s2.chunks[1].seq == b && s2.chunks[1].start == 2 &&
           s2.chunks[1].count == 3));
  }

  TEST_CASE("out of blocks: the newest running sequence is preempted, requeued first, and recomputed whole") {
    BlockPool pool(4, 2);
    PagedScheduler sched(pool, {8, 100, false});
    const auto a = sched.add({1, 2, 3}), b = sched.add({4, 5, 6});  // 2 blocks each: the pool is full
    auto s1 = sched.schedule();
    REQUIRE(s1.chunks.size() == 2);
    sched.computed(s1);
    sched.append(a, 7);  // a's 4th token fits its second block
    sched.append(b, 8);
    auto s2 = sched.schedule();
    CHECK(s2.preempted == 0);
    sched.computed(s2);
    sched.append(a, 9);  // a's 5th token needs a third block: b (newest) goes
    sched.append(b, 10);
    auto s3 = sched.schedule();
    CHECK(s3.preempted == 1);
    REQUIRE(s3.chunks.size() == 1);
    CHECK((s3.chunks[0].seq == a && s3.chunks[0].start == 4));
    CHECK(sched.sequence(b).state == PagedSequence::State::waiting);
    CHECK(sched.sequence(b).num_computed == 0);
    sched.computed(s3);
    sched.finish(a);
    auto s4 = sched.schedule();  // b comes back with its prompt and both drawn tokens
    REQUIRE(s4.chunks.size() == 1);
    CHECK((s4.chunks[0].seq == b && s4.chunks[0].start == 0 && s4.chunks[0].count == 5));
    CHECK(sched.preemptions() == 1);
  }

  TEST_CASE("followers fork their leader after its prefill; the partial block is copied on write") {
    BlockPool pool(16, 4);
    PagedScheduler sched(pool, {8, 100, true});
    const auto lead = sched.add({1, 2, 3, 4, 5, 6});  // one full block and 2 tokens
    const auto f1 = sched.add_follower(lead), f2 = sched.add_follower(lead);
    auto s1 = sched.schedule();
    REQUIRE(s1.chunks.size() == 1);  // only the leader is prefilled
    sched.computed(s1);
    const auto forks = sched.fork_followers(lead);
    CHECK(forks == std::vector<int64_t>{f1, f2});
    CHECK(pool.ref_count(sched.sequence(lead).table.blocks()[0]) == 3);
    CHECK(pool.num_free() == 14);  // 2 blocks held by three sequences
    for (auto id : {lead, f1, f2}) sched.append(id, 100 + id);
    auto s2 = sched.schedule();
    CHECK(s2.chunks.size() == 3);
    CHECK(s2.copies.size() == 2);  // the first two writers copy the partial block; the last keeps it
    CHECK(pool.num_free() == 12);
    CHECK(sched.cached_tokens() == 12);
    for (auto id : {lead, f1, f2}) sched.finish(id);
    CHECK(pool.num_free() == 16);
  }
}

TEST_SUITE("rollout/paged_attention") {
  TEST_CASE("the reference equals dense causal attention over each sequence's own keys") {
    at::manual_seed(3);
    const int64_t bs = 4, Hkv = 2, H = 6, D = 8, blocks = 20;
    auto kc = at::randn({blocks, bs, Hkv, D}), vc = at::randn({blocks, bs, Hkv, D});
    // three sequences: a 5-token prefill chunk after 6 cached, a 1-token decode over 9, a fresh 3-token prompt
    const std::vector<std::vector<int32_t>> tables{{7, 2, 11}, {0, 19, 4}, {13}};
    const std::vector<int64_t> qlens{5, 1, 3}, ctx{11, 9, 3};
    for (std::optional<int64_t> window : {std::optional<int64_t>{}, std::optional<int64_t>{3}}) {
      CAPTURE(window.value_or(0));
      const auto meta = PagedAttentionMetadata::make(tables, qlens, ctx, bs, window, at::kCPU);
      // the decode row is one group, each longer chunk its own: no query padded to another's length
      REQUIRE(meta.groups.size() == 3);
      CHECK((meta.groups[0].sequences == 1 && meta.groups[0].queries == 1 && meta.groups[0].keys == 9));
      CHECK((meta.groups[1].queries == 5 && meta.groups[1].keys == 11 && meta.groups[2].queries == 3));
      auto q = at::randn({9, H, D});
      auto out = paged_attention(q, kc, vc, meta, 0.3);
      int64_t t = 0;
      for (size_t s = 0; s < tables.size(); ++s) {
        // this sequence's keys in order, by hand from its table
        std::vector<at::Tensor> ks, vs;
        for (int64_t j = 0; j < ctx[s]; ++j) {
          ks.push_back(kc[tables[s][static_cast<size_t>(j / bs)]][j % bs]);
          vs.push_back(vc[tables[s][static_cast<size_t>(j / bs)]][j % bs]);
        }
        auto K = at::stack(ks).repeat_interleave(H / Hkv, 1), V = at::stack(vs).repeat_interleave(H / Hkv, 1);  // [k, H, D]
        for (int64_t j = 0; j < qlens[s]; ++j, ++t) {
          const auto pos = ctx[s] - qlens[s] + j;
          const auto lo = window ? std::max<int64_t>(0, pos - *window + 1) : 0;
          auto k = K.narrow(0, lo, pos - lo + 1), v = V.narrow(0, lo, pos - lo + 1);
          auto w = at::softmax((k * q[t].unsqueeze(0)).sum(-1) * 0.3, 0);  // [k, H]
          auto expect = (w.unsqueeze(-1) * v).sum(0);
          CHECK((out[t] - expect).abs().max().item<double>() < 1e-5);
        }
      }
    }
    // without the reference groups (a step the decode kernel serves) the reference refuses, naming why
    const auto bare = PagedAttentionMetadata::make({{13}}, {1}, {3}, bs, {}, at::kCPU, PagedAttentionPath::kernel);
    CHECK(bare.groups.empty());
    CHECK(bare.slot_mapping.size(0) == 1);
    CHECK(contains(error_of([&] { paged_attention_reference(at::zeros({1, H, D}), kc, vc, bare, 0.3); }),
                   "the metadata has no reference groups"));
    CHECK(contains(error_of([&] { PagedAttentionMetadata::make({{1}}, {2}, {5}, bs, {}, at::kCPU); }),
                   "sequence 0 has 2 queries, 5 context tokens and 1 blocks"));
    // the varlen path's metadata: prefix sums of queries and contexts, context slots packed in order
    // (block 7 then 2 for sequence 0 at 4-token blocks: slots 28..31, 8; sequence 1 in block 5: 20, 21)
    const auto var = PagedAttentionMetadata::make({{7, 2}, {5}}, {3, 2}, {5, 2}, 4, {}, at::kCPU, PagedAttentionPath::varlen);
    CHECK(var.groups.empty());
    CHECK(!var.fresh);
    CHECK(at::equal(var.cu_query_lens, at::tensor(std::vector<int32_t>{0, 3, 5})));
    CHECK(at::equal(var.cu_context_lens, at::tensor(std::vector<int32_t>{0, 5, 7})));
    CHECK(at::equal(var.context_slots, at::tensor(std::vector<int64_t>{28, 29, 30, 31, 8, 20, 21})));
    CHECK(PagedAttentionMetadata::make({{7, 2}, {5}}, {5, 2}, {5, 2}, 4, {}, at::kCPU, PagedAttentionPath::varlen).fresh);
    // on the CPU every step takes the reference
    CHECK((paged_attention_path(at::kCPU, at::kBFloat16, false, 4, 2, 64, true) == PagedAttentionPath::reference));
    CHECK((paged_attention_path(at::kCPU, at::kFloat, true, 4, 2, 64, true) == PagedAttentionPath::reference));
  }
}
