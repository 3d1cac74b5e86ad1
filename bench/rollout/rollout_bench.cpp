// Rollout benchmarks (a bench program: the GPU machine has no Google Benchmark). Prints one JSON
// object per measurement.
//   bench_rollout cpu                       Naive vs Paged generated tokens/s, a small random Llama
//   bench_rollout kernel                    paged decode kernel vs dense SDPA decode, bf16 (CUDA)
//   bench_rollout generate 160m|1b B...     Paged and Naive tokens/s, prompt 128, gen 256, bf16 (CUDA),
//                                           random weights, and greedy agreement Paged vs Naive
// The peer for `generate` is bench/rollout/hf_generate_peer.py (transformers, same shapes), run
// in the same job; see docs/benchmarks.md.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "hybridrl/cuda/paged_attention.hpp"
#include "hybridrl/detail/compat.hpp"
#include "hybridrl/rollout/naive.hpp"
#include "hybridrl/rollout/paged.hpp"

#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
#include <ATen/cuda/CUDAContext.h>
#endif

using namespace hybridrl;

namespace {

void sync([[maybe_unused]] const at::Device& d) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (d.is_cuda()) cudaDeviceSynchronize();
#endif
}

double seconds_of(const std::function<void()>& f, const at::Device& d, int reps = 1) {
  sync(d);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  sync(d);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

ModelConfig llama(const std::string& name) {
  ModelConfig c;
  if (name == "small") {  // CPU: a few ms per step
    c.vocab_size = 2048; c.hidden_size = 256; c.intermediate_size = 688; c.num_hidden_layers = 4;
    c.num_attention_heads = 8; c.num_key_value_heads = 4;
  } else if (name == "160m") {  // ../shared/bench/hf_baseline.py's configs
    c.vocab_size = 32000; c.hidden_size = 768; c.intermediate_size = 2048; c.num_hidden_layers = 12;
    c.num_attention_heads = 12; c.num_key_value_heads = 12;
  } else {
    c.vocab_size = 32000; c.hidden_size = 2048; c.intermediate_size = 5632; c.num_hidden_layers = 22;
    c.num_attention_heads = 32; c.num_key_value_heads = 4;
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.max_position_embeddings = 2048;
  c.rms_norm_eps = 1e-5;
  c.eos_token_id = 2;
  return c;
}

TensorBatch random_prompts(int64_t B, int64_t P, int64_t vocab) {
  at::manual_seed(1);
  auto ids = at::randint(100, vocab, {B, P}, at::kLong);
  return TensorBatch({{keys::input_ids.str(), ids}, {keys::attention_mask.str(), at::ones({B, P}, at::kLong)}});
}

double agreement(const TensorBatch& a, const TensorBatch& b) {
  auto x = a.tensor(keys::responses), y = b.tensor(keys::responses);
  const auto R = std::min(x.size(1), y.size(1));
  // the fraction of rows' leading tokens that agree before the first difference, over all tokens
  auto same = x.narrow(1, 0, R).eq(y.narrow(1, 0, R)).to(at::kLong).cumprod(1);
  return same.sum().item<double>() / static_cast<double>(x.size(0) * R);
}

template <class Engine>
void time_generate(const char* what, Engine& e, const TensorBatch& prompts, const SamplingOptions& s,
                   const std::string& model, const at::Device& dev) {
  const char* mode = s.temperature() == 0.0 ? "greedy" : "sampled";
  e.generate(prompts, SamplingOptions(s).max_new_tokens(16));  // warm-up: allocator, cuBLAS handles
  TensorBatch out;
  const double secs = seconds_of([&] { out = e.generate(prompts, s); }, dev);
  const auto st = e.stats();
  std::printf("{\"bench\": \"generate\", \"engine\": \"%s\", \"mode\": \"%s\", \"model\": \"%s\", \"batch\": %lld, \"generated_tokens\": "
              "%lld, \"seconds\": %.3f, \"tokens_per_s\": %.1f, \"prefill_s\": %.3f, \"decode_s\": %.3f, \"steps\": "
              "%lld, \"graph_steps\": %lld, \"preemptions\": %lld}\n",
              what, mode, model.c_str(), static_cast<long long>(prompts.size()), static_cast<long long>(st.generated_tokens),
              secs, static_cast<double>(st.generated_tokens) / secs, st.prefill_seconds, st.decode_seconds,
              static_cast<long long>(st.steps), static_cast<long long>(st.graph_steps), static_cast<long long>(st.preemptions));
  std::fflush(stdout);
}

int bench_generate(const std::string& model, const std::vector<int64_t>& batches, const at::Device& dev,
                   at::ScalarType dtype, int64_t P, int64_t G) {
  c10::NoGradGuard g;
  const auto c = llama(model);
  at::manual_seed(0);
  CausalLM m(c);
  m->to(dev, dtype);
  const auto sampled = SamplingOptions{}.temperature(1.0).max_new_tokens(G).ignore_eos(true).seed(3);
  const auto greedy = SamplingOptions{}.temperature(0).max_new_tokens(G).ignore_eos(true);
  for (auto B : batches) {
    const auto prompts = random_prompts(B, P, c.vocab_size);
    PagedEngine paged(m, PagedOptions{}.max_num_seqs(std::max<int64_t>(B, 1)).kv_cache_tokens(B * (P + G) + 1024));
    NaiveEngine naive(m, NaiveOptions{}.max_batch_size(B));
    // on CUDA only the sampled rollout is timed (device time is scarce); greedy is for agreement
    for (const auto& s : dev.is_cuda() ? std::vector<SamplingOptions>{sampled} : std::vector<SamplingOptions>{sampled, greedy}) {
      time_generate("paged", paged, prompts, s, model, dev);
      time_generate("naive", naive, prompts, s, model, dev);
    }
    const auto a = paged.generate(prompts, greedy), b = naive.generate(prompts, greedy);
    std::printf("{\"bench\": \"greedy_agreement\", \"model\": \"%s\", \"dtype\": \"%s\", \"batch\": %lld, "
                "\"leading_tokens_equal\": %.4f}\n",
                model.c_str(), c10::toString(dtype), static_cast<long long>(B), agreement(a, b));
    std::fflush(stdout);
  }
  return 0;
}

int bench_kernel() {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  const at::Device dev(at::kCUDA, 0);
  const int64_t L = 1024, bs = 16;
  struct Shape {
    int64_t H, Hkv, D;
  };
  for (auto sh : {Shape{32, 4, 64}, Shape{32, 8, 128}}) {
    for (int64_t B : {1, 8, 64, 256}) {
      const auto blocks = B * L / bs;
      auto opt = at::TensorOptions().device(dev).dtype(at::kBFloat16);
      auto kc = at::randn({blocks, bs, sh.Hkv, sh.D}, opt), vc = at::randn({blocks, bs, sh.Hkv, sh.D}, opt);
      auto q = at::randn({B, sh.H, sh.D}, opt);
      std::vector<std::vector<int32_t>> tables(static_cast<size_t>(B));
      auto perm = at::randperm(blocks, at::kLong);  // blocks scattered over the pool, as after churn
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t j = 0; j < L / bs; ++j) tables[static_cast<size_t>(b)].push_back(static_cast<int32_t>(perm[b * (L / bs) + j].item<int64_t>()));
      }
      const auto meta = PagedAttentionMetadata::make(tables, std::vector<int64_t>(static_cast<size_t>(B), 1),
                                                     std::vector<int64_t>(static_cast<size_t>(B), L), bs, {}, dev);
      const double scale = 1.0 / std::sqrt(static_cast<double>(sh.D));
      const double bytes = 2.0 * static_cast<double>(B * L * sh.Hkv * sh.D) * 2.0;
      for (int i = 0; i < 10; ++i) paged_attention(q, kc, vc, meta, scale);
      const double ours = seconds_of([&] { paged_attention(q, kc, vc, meta, scale); }, dev, 100);
      // the split count and pipeline depth the heuristics chose against others, for tuning:
      // "splits/stages": microseconds
      std::string sweep;
      for (int64_t sp : {1, 2, 4, 8}) {
        for (int stages : {2, 3}) {
          auto out = at::empty_like(q);
          auto ws = at::empty({B * sh.H * sp * (sh.D + 2)}, q.options().dtype(at::kFloat));
          auto launch = [&] {
            cuda::launch_paged_decode_attention(q.data_ptr(), kc.data_ptr(), vc.data_ptr(),
                                                meta.block_tables.data_ptr<int32_t>(), meta.context_lens.data_ptr<int32_t>(),
                                                out.data_ptr(), B, sh.H, sh.Hkv, sh.D, bs, L / bs, sp, 0,
                                                static_cast<float>(scale), cuda::KernelDtype::bf16, ws.data_ptr<float>(),
                                                at::cuda::getCurrentCUDAStream().stream(), stages);
          };
          for (int i = 0; i < 5; ++i) launch();
          sweep += fmt::format("{}\"{}/{}\": {:.1f}", sweep.empty() ? "" : ", ", sp, stages,
                               seconds_of(launch, dev, 50) * 1e6);
        }
      }
      double peer = 0.0;
#if HYBRIDRL_HAS_SDPA_GQA
      // the peer: dense decode over a contiguous [B, Hkv, L, D] cache, GQA-aware (cuDNN / flash via SDPA)
      auto kd = at::randn({B, sh.Hkv, L, sh.D}, opt), vd = at::randn({B, sh.Hkv, L, sh.D}, opt);
      auto qd = q.view({B, sh.H, 1, sh.D});
      auto dense = [&] { return at::scaled_dot_product_attention(qd, kd, vd, {}, 0.0, false, scale, true); };
      for (int i = 0; i < 10; ++i) dense();
      peer = seconds_of([&] { dense(); }, dev, 100);
#endif
      std::printf("{\"bench\": \"paged_decode_kernel\", \"batch\": %lld, \"heads\": %lld, \"kv_heads\": %lld, "
                  "\"head_dim\": %lld, \"context\": %lld, \"us\": %.1f, \"TB_per_s\": %.2f, \"splits\": %lld, "
                  "\"dense_sdpa_us\": %.1f, \"dense_sdpa_TB_per_s\": %.2f, \"us_by_splits_stages\": {%s}}\n",
                  static_cast<long long>(B), static_cast<long long>(sh.H), static_cast<long long>(sh.Hkv),
                  static_cast<long long>(sh.D), static_cast<long long>(L), ours * 1e6, bytes / ours / 1e12,
                  static_cast<long long>(cuda::paged_decode_splits(B, sh.Hkv, L / bs, bs)), peer * 1e6,
                  peer > 0 ? bytes / peer / 1e12 : 0.0, sweep.c_str());
      std::fflush(stdout);
    }
  }
  // prefill attention of one layer (the 1b shape, 128-token prompts): the varlen path over the
  // step's own keys (fresh prompts) and over keys gathered from the blocks (a prompt after a cached
  // prefix takes this), against the reference path (gathers + masked SDPA); metadata included
  for (int64_t B : {64, 256}) {
    const int64_t P = 128, H = 32, Hkv = 4, D = 64;
    auto opt = at::TensorOptions().device(dev).dtype(at::kBFloat16);
    const auto blocks = B * P / bs;
    auto kc = at::randn({blocks, bs, Hkv, D}, opt), vc = at::randn({blocks, bs, Hkv, D}, opt);
    auto q = at::randn({B * P, H, D}, opt), ks = at::randn({B * P, Hkv, D}, opt), vs = at::randn({B * P, Hkv, D}, opt);
    std::vector<std::vector<int32_t>> tables(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < P / bs; ++j) tables[static_cast<size_t>(b)].push_back(static_cast<int32_t>(b * (P / bs) + j));
    }
    const std::vector<int64_t> lens(static_cast<size_t>(B), P);
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    auto run = [&](PagedAttentionPath path, bool own) {
      const auto m = PagedAttentionMetadata::make(tables, lens, lens, bs, {}, dev, path);
      if (own) return paged_attention(q, kc, vc, m, scale, ks, vs);
      return paged_attention(q, kc, vc, m, scale);
    };
    double t[3];
    int i = 0;
    for (auto [path, own] : {std::pair{PagedAttentionPath::varlen, true}, std::pair{PagedAttentionPath::varlen, false},
                             std::pair{PagedAttentionPath::reference, false}}) {
      for (int w = 0; w < 3; ++w) run(path, own);
      t[i++] = seconds_of([&] { run(path, own); }, dev, 20);
    }
    std::printf("{\"bench\": \"prefill_attention\", \"batch\": %lld, \"prompt\": %lld, \"varlen_fresh_us\": %.1f, "
                "\"varlen_gathered_us\": %.1f, \"reference_us\": %.1f}\n",
                static_cast<long long>(B), static_cast<long long>(P), t[0] * 1e6, t[1] * 1e6, t[2] * 1e6);
    std::fflush(stdout);
  }
  // the rest of a decode step's fixed costs: sampling over a 32000-token vocabulary, metadata
  for (int64_t B : {64, 256}) {
    auto logits = at::randn({B, 32000}, at::TensorOptions().device(dev));
    SamplingRows r;
    r.seeds = at::arange(B, at::TensorOptions().dtype(at::kLong).device(dev));
    r.samples = at::zeros({B}, r.seeds.options());
    r.positions = at::zeros({B}, r.seeds.options());
    const auto s = SamplingOptions{}.temperature(1.0);
    for (int i = 0; i < 3; ++i) sample_tokens(logits, s, r);
    const double t_sample = seconds_of([&] { sample_tokens(logits, s, r); }, dev, 20);
    const double t_greedy = seconds_of([&] { sample_tokens(logits, SamplingOptions{}.temperature(0), r); }, dev, 20);
    std::vector<std::vector<int32_t>> tables(static_cast<size_t>(B), std::vector<int32_t>(24, 1));
    const double t_meta = seconds_of([&] {
      PagedAttentionMetadata::make(tables, std::vector<int64_t>(static_cast<size_t>(B), 1),
                                   std::vector<int64_t>(static_cast<size_t>(B), 384), 16, {}, dev);
    }, dev, 20);
    std::printf("{\"bench\": \"step_costs\", \"batch\": %lld, \"sample_ms\": %.3f, \"greedy_ms\": %.3f, "
                "\"metadata_ms\": %.3f}\n",
                static_cast<long long>(B), t_sample * 1e3, t_greedy * 1e3, t_meta * 1e3);
  }
  return 0;
#else
  std::fprintf(stderr, "bench_rollout kernel: built without hybridrl::cuda\n");
  return 1;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "cpu";
  try {
    if (mode == "cpu") return bench_generate("small", {16, 64}, at::kCPU, at::kFloat, 32, 64);
    if (mode == "kernel") return bench_kernel();
    if (mode == "generate" && argc > 2) {
      std::vector<int64_t> batches;
      for (int i = 3; i < argc; ++i) batches.push_back(std::stoll(argv[i]));
      if (batches.empty()) batches = {64, 256};
      return bench_generate(argv[2], batches, at::Device(at::kCUDA, 0), at::kBFloat16, 128, 256);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_rollout: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: bench_rollout cpu | kernel | generate 160m|1b [B...]\n");
  return 2;
}
