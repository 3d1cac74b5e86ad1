// Rollout benchmarks (a bench program: the GPU machine has no Google Benchmark). Prints one JSON
// object per measurement.
//   bench_rollout cpu                       Naive vs Paged generated tokens/s, a small random Llama
//   bench_rollout kernel                    paged decode kernel vs dense SDPA decode, bf16 (CUDA)
//   bench_rollout generate 160m|1b B...     Paged tokens/s, prompt 128, gen 256, bf16 (CUDA), random
//                                           weights, with the fused kernels on and off, against the
//                                           HBM roofline; greedy agreement of the two (CPU: Paged
//                                           and Naive); BENCH_GENERATE_ENGINES=paged,paged_sync,
//                                           paged_unfused runs only those (default all three)
//   bench_rollout breakdown 160m|1b B CTX   where a decode step's time goes: each op of one layer,
//                                           the LM head and the sampler replayed in CUDA graphs
//                                           (B rows, every context CTX tokens), fused and eager
// The peer for `generate` is bench/rollout/hf_generate_peer.py (transformers, same shapes), run
// in the same job; see docs/benchmarks.md.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "hybridrl/cuda/fused.hpp"
#include "hybridrl/cuda/paged_attention.hpp"
#include "hybridrl/detail/compat.hpp"
#include "hybridrl/rollout/naive.hpp"
#include "hybridrl/rollout/paged.hpp"
#include "../support/llama_configs.hpp"

#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
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

using bench::llama;  // bench/support/llama_configs.hpp

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

/// Bytes a decode step of B sequences reads at the HBM roofline (the rule): every weight
/// once, and the K and V of every context token, at the average context of a call (prompt P,
/// G new tokens: P + G / 2).
double decode_step_bytes(const ModelConfig& c, int64_t B, int64_t P, int64_t G, int64_t elem) {
  const double H = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double per_layer = H * (static_cast<double>(c.num_attention_heads * c.head_dim) + 2 * kv) +
                           static_cast<double>(c.num_attention_heads * c.head_dim) * H + 3 * H * I + 2 * H;
  const double weights = static_cast<double>(c.num_hidden_layers) * per_layer + 2 * static_cast<double>(c.vocab_size) * H + H;
  const double ctx = static_cast<double>(P) + static_cast<double>(G) / 2.0;
  const double kv_bytes = static_cast<double>(B) * ctx * static_cast<double>(c.num_hidden_layers) * 2 * kv;
  return (weights + kv_bytes) * static_cast<double>(elem);
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
  constexpr double kHbm = 4.8e12;  // H200 HBM3e, bytes/s
  for (auto B : batches) {
    const auto prompts = random_prompts(B, P, c.vocab_size);
    const auto opts = PagedOptions{}.max_num_seqs(std::max<int64_t>(B, 1)).kv_cache_tokens(B * (P + G) + 1024);
    PagedEngine paged(m, opts);
    if (dev.is_cuda()) {
      // the fused kernels on (the default) and off (the eager ops), same engine and weights; and
      // the fused engine with asynchronous scheduling off (each step waits for its tokens)
      PagedEngine sync(m, PagedOptions(opts).async_scheduling(false));
      TensorBatch on, off;
      // BENCH_GENERATE_ENGINES (comma-separated, default all): which of the three to run
      const char* only = std::getenv("BENCH_GENERATE_ENGINES");
      const std::string wanted = only != nullptr ? fmt::format(",{},", only) : std::string();
      for (int run = 0; run < 3; ++run) {
        const bool f = run != 1;
        const char* engine = run == 0 ? "paged" : run == 1 ? "paged_unfused" : "paged_sync";
        if (!wanted.empty() && wanted.find(fmt::format(",{},", engine)) == std::string::npos) continue;
        auto& e = run == 2 ? sync : paged;
        fused::set_enabled(f);
        time_generate(engine, e, prompts, sampled, model, dev);
        const auto st = e.stats();
        const double roof = static_cast<double>(B) * kHbm / decode_step_bytes(c, B, P, G, c10::elementSize(dtype));
        std::printf("{\"bench\": \"roofline\", \"engine\": \"%s\", \"model\": \"%s\", \"batch\": %lld, "
                    "\"decode_step_ms\": %.3f, \"decode_tokens_per_s\": %.1f, \"roofline_tokens_per_s\": %.1f, "
                    "\"decode_fraction_of_roofline\": %.3f, \"overlapped_steps\": %lld}\n",
                    engine, model.c_str(), static_cast<long long>(B), 1e3 * st.decode_seconds / static_cast<double>(G - 1),
                    static_cast<double>(st.generated_tokens - B) / st.decode_seconds, roof,
                    static_cast<double>(st.generated_tokens - B) / st.decode_seconds / roof,
                    static_cast<long long>(st.overlapped_steps));
        if (run < 2 && wanted.empty()) (f ? on : off) = paged.generate(prompts, greedy);
      }
      fused::set_enabled(true);
      if (on.empty() || off.empty()) continue;
      std::printf("{\"bench\": \"greedy_agreement\", \"what\": \"fused vs eager ops\", \"model\": \"%s\", "
                  "\"dtype\": \"%s\", \"batch\": %lld, \"leading_tokens_equal\": %.4f}\n",
                  model.c_str(), c10::toString(dtype), static_cast<long long>(B), agreement(on, off));
      std::fflush(stdout);
      continue;
    }
    NaiveEngine naive(m, NaiveOptions{}.max_batch_size(B));
    for (const auto& s : {sampled, greedy}) {
      time_generate("paged", paged, prompts, s, model, dev);
      time_generate("naive", naive, prompts, s, model, dev);
    }
    const auto a = paged.generate(prompts, greedy), b = naive.generate(prompts, greedy);
    std::printf("{\"bench\": \"greedy_agreement\", \"what\": \"paged vs naive\", \"model\": \"%s\", "
                "\"dtype\": \"%s\", \"batch\": %lld, \"leading_tokens_equal\": %.4f}\n",
                model.c_str(), c10::toString(dtype), static_cast<long long>(B), agreement(a, b));
    std::fflush(stdout);
  }
  return 0;
}

#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
/// GPU time of one call of `f` (µs): `reps` calls captured in one CUDA graph, the graph replayed
/// and timed (so the gaps between kernels are those of a captured decode step, with no host).
double graph_us(const std::function<void()>& f, int reps = 20) {
  const at::Device dev(at::kCUDA, 0);
  auto side = at::cuda::getStreamFromPool(false, 0);
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    f();
    side.synchronize();
    graph.capture_begin();
    for (int i = 0; i < reps; ++i) f();
    graph.capture_end();
  }
  side.synchronize();
  graph.replay();
  const double secs = seconds_of([&] { graph.replay(); }, dev, 5);
  return secs / reps * 1e6;
}
#endif

int bench_breakdown(const std::string& model, int64_t B, int64_t ctx_len) {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  c10::NoGradGuard g;
  const at::Device dev(at::kCUDA, 0);
  const auto dtype = at::kBFloat16;
  const auto c = llama(model);
  at::manual_seed(0);
  CausalLM m(c);
  m->to(dev, dtype);
  m->eval();
  auto layer = m->model->layer(0);
  auto& attn = *layer->self_attn;
  const int64_t bs = 16, blocks = (ctx_len + bs - 1) / bs;
  const auto opts = at::TensorOptions().device(dev).dtype(dtype);
  auto x = at::randn({1, B, c.hidden_size}, opts);
  auto pos = at::full({1, B}, ctx_len - 1, at::TensorOptions().device(dev).dtype(at::kLong));
  auto inv = rope_inverse_frequencies(c).to(dev);
  auto [cos, sin] = rope_cos_sin(inv, pos, dtype);
  auto kv = at::zeros({2, B * blocks, bs, c.num_key_value_heads, c.head_dim}, opts);
  auto kc = kv[0], vc = kv[1];
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < blocks; ++j) tables[static_cast<size_t>(b)].push_back(static_cast<int32_t>(b * blocks + j));
  }
  const auto meta = PagedAttentionMetadata::make(tables, std::vector<int64_t>(static_cast<size_t>(B), 1),
                                                 std::vector<int64_t>(static_cast<size_t>(B), ctx_len), bs, {}, dev);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  auto q = attn.q_proj(x).view({1, B, c.num_attention_heads, c.head_dim});
  auto k = attn.k_proj(x).view({1, B, c.num_key_value_heads, c.head_dim});
  auto v = attn.v_proj(x).view({1, B, c.num_key_value_heads, c.head_dim});
  auto a_out = at::randn({1, B, c.num_attention_heads * c.head_dim}, opts);
  auto gate = layer->mlp->gate_proj(x), up = layer->mlp->up_proj(x), act = at::silu(gate) * up;
  auto hidden = at::randn({B, c.hidden_size}, opts);
  auto logits = m->logits(hidden);
  SamplingRows rows;
  rows.seeds = at::arange(B, at::TensorOptions().device(dev).dtype(at::kLong));
  rows.samples = at::zeros({B}, rows.seeds.options());
  rows.positions = at::zeros({B}, rows.seeds.options());
  const auto s = SamplingOptions{}.temperature(1.0);
  for (bool f : {true, false}) {
    fused::set_enabled(f);
    std::vector<std::pair<const char*, double>> ops{
        {"input_norm", graph_us([&] { layer->input_layernorm(x); })},
        {"qkv_proj", graph_us([&] { attn.q_proj(x); attn.k_proj(x); attn.v_proj(x); })},
        {"rope", graph_us([&] {
           if (!fused::rope_(q, k, cos, sin)) {
             apply_rope(q.transpose(1, 2), cos, sin);
             apply_rope(k.transpose(1, 2), cos, sin);
           }
         })},
        {"kv_write", graph_us([&] { write_kv_to_cache(k[0], v[0], kc, vc, meta.slot_mapping); })},
        {"attention", graph_us([&] { paged_attention(q[0], kc, vc, meta, scale); })},
        {"o_proj", graph_us([&] { attn.o_proj(a_out); })},
        {"add_norm", graph_us([&] { layer->post_attention_layernorm->forward_add(x, x); })},
        {"gate_up_proj", graph_us([&] { layer->mlp->gate_proj(x); layer->mlp->up_proj(x); })},
        {"silu_mul", graph_us([&] {
           if (!fused::silu_mul(gate, up).defined()) at::silu(gate) * up;
         })},
        {"down_proj", graph_us([&] { layer->mlp->down_proj(act); })},
        {"residual_add", graph_us([&] { x + x; })},
    };
    double per_layer = 0;
    for (const auto& [name, us] : ops) per_layer += us;
    const double whole = graph_us([&] { layer->forward(x, LayerContext{cos, sin, {}, true, [&](int64_t, const at::Tensor& qq, const at::Tensor& kk, const at::Tensor& vv) {
                                    write_kv_to_cache(kk[0].transpose(0, 1), vv[0].transpose(0, 1), kc, vc, meta.slot_mapping);
                                    return paged_attention(qq[0].transpose(0, 1), kc, vc, meta, scale).transpose(0, 1).unsqueeze(0);
                                  }}); });
    const double head = graph_us([&] { m->model->norm(hidden); m->logits(hidden); });
    const double sample = graph_us([&] { sample_tokens(logits, s, rows); });
    std::printf("{\"bench\": \"decode_breakdown\", \"fused\": %s, \"model\": \"%s\", \"batch\": %lld, \"context\": %lld, \"layer_us\": {",
                f ? "true" : "false", model.c_str(), static_cast<long long>(B), static_cast<long long>(ctx_len));
    for (size_t i = 0; i < ops.size(); ++i) std::printf("%s\"%s\": %.1f", i ? ", " : "", ops[i].first, ops[i].second);
    std::printf("}, \"sum_of_ops_us\": %.1f, \"whole_layer_us\": %.1f, \"layers\": %lld, \"norm_lm_head_us\": %.1f, "
                "\"sample_us\": %.1f, \"step_estimate_ms\": %.3f}\n",
                per_layer, whole, static_cast<long long>(c.num_hidden_layers), head, sample,
                (whole * static_cast<double>(c.num_hidden_layers) + head + sample) / 1e3);
    std::fflush(stdout);
  }
  fused::set_enabled(true);
  return 0;
#else
  (void)model, (void)B, (void)ctx_len;
  std::fprintf(stderr, "bench_rollout breakdown: built without hybridrl::cuda\n");
  return 1;
#endif
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
    if (mode == "breakdown" && argc > 4) return bench_breakdown(argv[2], std::stoll(argv[3]), std::stoll(argv[4]));
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
  std::fprintf(stderr, "usage: bench_rollout cpu | kernel | generate 160m|1b [B...] | breakdown 160m|1b B CTX\n");
  return 2;
}
