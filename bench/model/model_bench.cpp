// Model benchmarks on CPU: forward+backward tokens/s of the test-sized Llama (the geometry of
// tests/fixtures/models/llama: hidden 64, 2 layers, 4 heads, 2 KV heads, vocab 320), plain and
// with activation checkpointing, and the chunked log-prob path the trainer uses.
#include <benchmark/benchmark.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include "hybridrl/model/model.hpp"
#include "hybridrl/rollout/naive/dense_kv_cache.hpp"

using namespace hybridrl;

namespace {

ModelConfig test_config() {
  ModelConfig c;
  c.vocab_size = 320;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rms_norm_eps = 1e-6;
  return c;
}

/// args: batch, sequence length, activation checkpointing (0/1).
void BM_Model_ForwardBackward(benchmark::State& state) {
  torch::manual_seed(0);
  at::set_num_threads(1);
  CausalLM m(test_config());
  m->train();
  if (state.range(2) != 0) m->model->set_layer_runner(activation_checkpoint_runner());
  const auto B = state.range(0), T = state.range(1);
  auto ids = torch::randint(0, 320, {B, T});
  for (auto _ : state) {
    auto logits = m->forward(ids);
    auto loss = at::cross_entropy_loss(logits.narrow(1, 0, T - 1).reshape({-1, 320}),
                                       ids.narrow(1, 1, T - 1).reshape({-1}));
    loss.backward();
    benchmark::DoNotOptimize(loss.item<float>());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(B * T * state.iterations()),
                                                  benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Model_ForwardBackward)
    ->ArgNames({"batch", "seq", "ckpt"})
    ->Args({4, 128, 0})
    ->Args({4, 128, 1})
    ->Args({1, 512, 0})
    ->Unit(benchmark::kMillisecond);

/// Policy-loss path: token_log_probs (chunked, checkpointed chunks) + backward. args: batch, seq, chunk.
void BM_Model_LogProbsBackward(benchmark::State& state) {
  torch::manual_seed(0);
  at::set_num_threads(1);
  CausalLM m(test_config());
  m->train();
  const auto B = state.range(0), T = state.range(1);
  auto ids = torch::randint(0, 320, {B, T});
  for (auto _ : state) {
    auto lp = token_log_probs(m, ids, {}, LogProbOptions{}.chunk_size(state.range(2)));
    auto loss = -(lp.log_probs.mean() + 0.01 * lp.entropy.mean());
    loss.backward();
    benchmark::DoNotOptimize(loss.item<float>());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(B * T * state.iterations()),
                                                  benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Model_LogProbsBackward)->ArgNames({"batch", "seq", "chunk"})->Args({4, 128, 32})->Unit(benchmark::kMillisecond);

/// Greedy-style decode steps with the dense KV cache (no grad). args: batch, prompt, new tokens.
void BM_Model_DecodeDenseCache(benchmark::State& state) {
  torch::manual_seed(0);
  at::set_num_threads(1);
  const auto c = test_config();
  CausalLM m(c);
  m->eval();
  torch::NoGradGuard g;
  const auto B = state.range(0), P = state.range(1), N = state.range(2);
  auto prompt = torch::randint(0, 320, {B, P});
  for (auto _ : state) {
    auto cache = KVCache::allocate(c, B, P + N, at::TensorOptions().dtype(at::kFloat));
    auto logits = forward_decode(m, prompt, cache);
    for (int64_t t = 0; t < N; ++t) {
      auto next = logits.select(1, logits.size(1) - 1).argmax(-1, true);
      logits = forward_decode(m, next, cache);
    }
    benchmark::DoNotOptimize(logits.data_ptr());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(B * N * state.iterations()),
                                                  benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Model_DecodeDenseCache)->ArgNames({"batch", "prompt", "new"})->Args({4, 32, 32})->Unit(benchmark::kMillisecond);

}  // namespace
