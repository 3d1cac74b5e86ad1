#pragma once
/// \file
/// `Rollout<Paged>`: a paged KV cache (fixed-size blocks in one pool preallocated from a memory
/// budget, per-sequence block tables), the scheduler of rollout/paged/scheduler.hpp (a token
/// budget per step, continuous batching, preemption by recompute, a prompt prefilled once for its
/// n samples, a prefix cache reset when the weights change), and attention through
/// hybridrl::paged_attention (the CUDA decode kernel where it is linked, else the reference).
/// Tensor-parallel generation (accepts_tensor_parallel_weights) comes with the sharding issue; the
/// engine refuses a sharded model until then.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/cuda/launchers.hpp"
#include "hybridrl/cuda/paged_attention.hpp"
#include "hybridrl/cuda/paged_kv.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include "hybridrl/rollout/concepts.hpp"
#include "hybridrl/rollout/generation.hpp"
#include "hybridrl/rollout/paged/block_pool.hpp"
#include "hybridrl/rollout/paged/scheduler.hpp"
#include "hybridrl/rollout/sampler.hpp"
#include "hybridrl/rollout/sampling.hpp"
#include "hybridrl/sharding/weight_spec.hpp"
#include "hybridrl/sharding/weights.hpp"

#if defined(HYBRIDRL_HAS_CUDA_KERNELS) && defined(HYBRIDRL_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define HYBRIDRL_PAGED_CUDA_GRAPHS 1
#else
#define HYBRIDRL_PAGED_CUDA_GRAPHS 0
#endif

#include <memory>

namespace hybridrl {

/// Run-time options of Rollout<Paged>.
struct PagedOptions {
  /// Samples per prompt (GRPO's group size): the trainer repeats each prompt n times with one
  /// group id (the geometry's rollout_n is read from here); generate() takes its requests as given.
  HYBRIDRL_ARG(int64_t, n) = 1;
  HYBRIDRL_ARG(SamplingOptions, sampling) = {};
  /// Tokens per KV block.
  HYBRIDRL_ARG(int64_t, block_size) = 16;
  /// Fraction of free device memory the KV cache may take after weights are loaded (CUDA, when
  /// kv_cache_tokens is 0).
  HYBRIDRL_ARG(double, memory_fraction) = 0.5;
  /// Tokens the KV pool holds (rounded up to whole blocks); 0 = memory_fraction of the free device
  /// memory on CUDA, 16384 tokens on the CPU.
  HYBRIDRL_ARG(int64_t, kv_cache_tokens) = 0;
  /// Sequences decoded together at most.
  HYBRIDRL_ARG(int64_t, max_num_seqs) = 256;
  /// Tokens (prefill + decode) processed in one scheduler step at most.
  HYBRIDRL_ARG(int64_t, max_num_batched_tokens) = 8192;
  /// Share the prompt blocks among the n samples of one prompt.
  HYBRIDRL_ARG(bool, prefix_sharing) = true;
  /// Tensor-parallel size of the generation engine (the one owner of this knob: the batch
  /// geometry reads it, it is not set there).
  HYBRIDRL_ARG(int64_t, tensor_parallel_size) = 1;
  /// Capture the decode step in CUDA graphs (CUDA only).
  HYBRIDRL_ARG(bool, cuda_graphs) = true;
  /// In training, free the KV pool (and the graphs) after each generation and allocate it again
  /// before the next, so the update phase has that memory (verl's free_cache_engine).
  HYBRIDRL_ARG(bool, free_cache_engine) = true;

  HYBRIDRL_FIELDS(n, sampling, block_size, memory_fraction, kv_cache_tokens, max_num_seqs, max_num_batched_tokens,
                  prefix_sharing, tensor_parallel_size, cuda_graphs, free_cache_engine)

  /// Throws hybridrl::Error for an impossible value (problem starts with the field name).
  void validate() const {
    sampling_.validate();  // inline fields: rollout.temperature, not rollout.sampling.temperature
    HYBRIDRL_CHECK(n_ >= 1, fmt::format("n = {} is below 1", n_), "sample at least one response per prompt");
    HYBRIDRL_CHECK(block_size_ >= 1 && (block_size_ & (block_size_ - 1)) == 0,
                   fmt::format("block_size = {} is not a positive power of two", block_size_),
                   "use 16 (the usual choice) or another power of two");
    HYBRIDRL_CHECK(memory_fraction_ > 0.0 && memory_fraction_ < 1.0,
                   fmt::format("memory_fraction = {} is outside (0, 1)", memory_fraction_),
                   "use a fraction such as 0.5; training state needs the rest");
    HYBRIDRL_CHECK(kv_cache_tokens_ >= 0, fmt::format("kv_cache_tokens = {} is negative", kv_cache_tokens_),
                   "use 0 (from memory_fraction on CUDA) or a token count such as 65536");
    HYBRIDRL_CHECK(max_num_seqs_ >= 1, fmt::format("max_num_seqs = {} is below 1", max_num_seqs_),
                   "allow at least one sequence per step, e.g. 256");
    HYBRIDRL_CHECK(max_num_batched_tokens_ >= 1,
                   fmt::format("max_num_batched_tokens = {} is below 1", max_num_batched_tokens_),
                   "allow a positive token budget per scheduler step, e.g. 8192");
    HYBRIDRL_CHECK(tensor_parallel_size_ >= 1,
                   fmt::format("tensor_parallel_size = {} is below 1", tensor_parallel_size_),
                   "use 1 or a tensor-parallel size that divides the number of GPUs");
  }
};

/// The engine of Rollout<Paged>: generates with a paged KV pool [layers, 2, blocks, block_size,
/// kv_heads, head_dim] sized once at construction, from a full (tp_size 1) model.
class PagedEngine {
 public:
  /// Generates with `model` (its device and dtype) under `options`; allocates the KV pool.
  PagedEngine(CausalLM model, PagedOptions options) : model_(std::move(model)), options_(std::move(options)) {
    options_.validate();
    HYBRIDRL_CHECK(!model_->parallel().sharded(), "Rollout<Paged>: the model is a tensor-parallel shard",
                   "give Rollout<Paged> a full model (tensor-parallel generation comes with the sharding issue)");
    model_->eval();
    const auto& c = model_->config();
    const auto p = model_->parameters().front();
    device_ = p.device();
    // one GEMM for q|k|v and one for gate|up in every layer (used where the fused kernels run)
    if (device_.is_cuda()) model_->model->fuse_projections();
    dtype_ = p.scalar_type();
    block_bytes_ = 2 * c.num_hidden_layers * options_.block_size() * c.num_key_value_heads * c.head_dim *
                   static_cast<int64_t>(c10::elementSize(dtype_));
    num_blocks_ = pool_blocks();
    pool_ = BlockPool(num_blocks_, options_.block_size());
    allocate();
  }

  /// An engine with a randomly initialised model for `c` on `device` in `dtype`; load its weights
  /// with load_weights (the trainer's export) before generating.
  static PagedEngine make(const ModelConfig& c, const PagedOptions& options, at::Device device = at::kCPU,
                          at::ScalarType dtype = at::kFloat) {
    return PagedEngine(inference_model(c, device, dtype), options);
  }

  /// Generates responses for `prompts` with the engine's sampling options.
  TensorBatch generate(const TensorBatch& prompts) { return generate(prompts, options_.sampling()); }

  /// Generates responses for `prompts` (input_ids [B, P], attention_mask, optional group_ids and
  /// sampling_seeds) under `s`; returns rollout_output_keys plus the prompts batch's other data.
  /// Rows of one group with the same prompt share its prefill when prefix_sharing is on.
  TensorBatch generate(const TensorBatch& prompts, const SamplingOptions& s) {
    HYBRIDRL_CHECK(!released_, "Rollout<Paged>.generate: the engine's KV memory is released",
                   "call resume_memory() after the weight update, before generating");
    detail::validate_member(s, "rollout");
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto& c = model_->config();
    auto requests = read_requests(prompts, s, c, "Rollout<Paged>");
    const auto rule = StopRule::make(s, c);
    check_fits(requests, rule);
    stats_ = {};
    stats_.kv_cache_bytes = num_blocks_ * block_bytes_;
    c10::NoGradGuard no_grad;
    PagedScheduler sched(pool_, {options_.max_num_seqs(), options_.max_num_batched_tokens(), options_.prefix_sharing()});
    std::map<int64_t, std::pair<int64_t, int64_t>> leaders;  // group -> (leader id, group size)
    for (size_t i = 0; i < requests.size(); ++i) {
      const auto& r = requests[i];
      auto it = leaders.find(r.group);
      if (options_.prefix_sharing() && it != leaders.end() && it->second.second < options_.max_num_seqs() &&
          requests[static_cast<size_t>(it->second.first)].prompt == r.prompt) {
        sched.add_follower(it->second.first);
        ++it->second.second;
      } else {
        sched.add(r.prompt);
        leaders[r.group] = {static_cast<int64_t>(i), 1};
      }
    }
    std::vector<GeneratedSequence> seqs(requests.size());
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    auto decoder = model_->model;
    while (!sched.done()) {
      const auto t0 = clock::now();
      auto step = sched.schedule();
      HYBRIDRL_CHECK(!step.empty(), "Rollout<Paged>: the scheduler made no progress with sequences left",
                     "this is a bug: please report it with the options and prompt lengths");
      held_peak_ = std::max(held_peak_, num_blocks_ - pool_.num_free());
      copy_blocks(step.copies);
      if (graph_step(step, sched, requests, seqs, s, rule)) {
        stats_.decode_seconds += std::chrono::duration<double>(clock::now() - t0).count();
        ++stats_.steps;
        ++stats_.graph_steps;
        continue;
      }
      // the step's packed tokens, their positions and slots; each sequence's place in the pool
      std::vector<int64_t> ids, pos;
      std::vector<std::vector<int32_t>> tables;
      std::vector<int64_t> qlens, ctx;
      bool prefill = false;
      for (const auto& ch : step.chunks) {
        const auto& q = sched.sequence(ch.seq);
        for (int64_t t = ch.start; t < ch.start + ch.count; ++t) {
          ids.push_back(q.tokens[static_cast<size_t>(t)]);
          pos.push_back(t);
        }
        prefill = prefill || ch.start < q.prompt_len;
        tables.push_back(q.table.blocks());
        qlens.push_back(ch.count);
        ctx.push_back(ch.start + ch.count);
      }
      // the path decides the host work: none for the decode kernel, prefix sums for varlen flash
      bool decode_only = true;
      for (auto q : qlens) decode_only = decode_only && q == 1;
      const auto path = paged_attention_path(device_, dtype_, decode_only, c.num_attention_heads,
                                             c.num_key_value_heads, c.head_dim, HYBRIDRL_PAGED_CUDA_GRAPHS != 0);
      // a model mixing full and sliding-window layers (Qwen2) gets the step's metadata twice:
      // only the reference path's masks depend on the window, the kernels take it as an argument
      const bool mixed = c.mixed_windows();
      const auto meta = PagedAttentionMetadata::make(tables, qlens, ctx, options_.block_size(),
                                                     mixed ? std::nullopt : c.layer_window(0), device_, path);
      PagedAttentionMetadata sliding;
      if (mixed) {
        if (meta.groups.empty()) {
          sliding = meta;
          sliding.sliding_window = c.sliding_window;
        } else {
          sliding = PagedAttentionMetadata::make(tables, qlens, ctx, options_.block_size(), c.sliding_window, device_, path);
        }
      }
      auto fn = [this, &meta, &sliding, &c, mixed, scale](int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& v) {
        const auto& m = mixed && c.layer_window(layer) ? sliding : meta;
        auto kc = kv_[layer][0];
        auto vc = kv_[layer][1];
        const auto ks = k[0].transpose(0, 1), vs = v[0].transpose(0, 1);
        write_kv_to_cache(ks, vs, kc, vc, m.slot_mapping);
        return paged_attention(q[0].transpose(0, 1), kc, vc, m, scale, ks, vs).transpose(0, 1).unsqueeze(0);
      };
      const auto T = static_cast<int64_t>(ids.size());
      auto hidden = decoder->forward_with_attention(at::tensor(ids, at::kLong).view({1, T}).to(device_),
                                                    at::tensor(pos, at::kLong).view({1, T}).to(device_), fn);
      sched.computed(step);
      // draw for every sequence whose tokens are all in the cache (a leader's followers from its row)
      std::vector<int64_t> rows, who;
      int64_t end = 0;
      for (const auto& ch : step.chunks) {
        end += ch.count;
        if (!sched.sequence(ch.seq).ready()) continue;
        rows.push_back(end - 1);
        who.push_back(ch.seq);
        for (auto f : sched.fork_followers(ch.seq)) {
          rows.push_back(end - 1);
          who.push_back(f);
        }
      }
      if (!rows.empty()) draw(sched, hidden[0], rows, who, requests, seqs, s, rule);
      const auto dt = std::chrono::duration<double>(clock::now() - t0).count();
      (prefill ? stats_.prefill_seconds : stats_.decode_seconds) += dt;
      ++stats_.steps;
    }
    stats_.sequences = static_cast<int64_t>(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      stats_.prompt_tokens += static_cast<int64_t>(requests[i].prompt.size());
      stats_.generated_tokens += static_cast<int64_t>(seqs[i].tokens.size());
    }
    stats_.preemptions = sched.preemptions();
    stats_.cached_prompt_tokens = sched.cached_tokens();
    stats_.kv_peak_utilization = static_cast<double>(held_peak_) / static_cast<double>(num_blocks_);
    held_peak_ = 0;
    stats_.seconds = std::chrono::duration<double>(clock::now() - start).count();
    return rollout_batch(prompts, requests, seqs, c.pad_token_id.value_or(0));
  }

  /// Full weights in the model's dtype.
  [[nodiscard]] WeightSpec weight_spec() const {
    WeightSpec w;
    w.dtype = dtype_;
    return w;
  }

  /// Copies a bucket of named tensors (Hugging Face names, full shapes) into the model's
  /// parameters in place (the KV pool stays), and forgets the prefix cache: its keys and values
  /// came from the old weights.
  void load_weights(const WeightBucket& bucket) {
    load_named_weights(model_, bucket, "Rollout<Paged>");
    pool_.reset_prefix_cache();
  }


  /// Frees the KV pool (for the update phase); generate() refuses to run until resume_memory().
  void release_memory() {
    drop_graphs();
    kv_ = at::Tensor();
    pool_ = BlockPool(num_blocks_, options_.block_size());  // nothing cached survives the release
    released_ = true;
    // back to the device, not to the caching allocator: training's tensors (optimizer state
    // made at its first step) would otherwise be carved out of the freed block, and the pool's
    // one large allocation could not be made again (seen on the H200: OOM at the second step)
    empty_device_cache();
  }
  /// Allocates the KV pool again, the same size (the caching allocator's unused blocks are given
  /// back to the device first, so the training phase's cached memory does not stand in the way).
  void resume_memory() {
    if (released_) {
      empty_device_cache();
      allocate();
    }
    released_ = false;
  }

  /// Counters of the last generate() call.
  [[nodiscard]] RolloutStats stats() const { return stats_; }
  /// The model the engine generates with.
  [[nodiscard]] const CausalLM& model() const noexcept { return model_; }
  /// The engine's options.
  [[nodiscard]] const PagedOptions& options() const noexcept { return options_; }
  /// Blocks in the KV pool.
  [[nodiscard]] int64_t num_blocks() const noexcept { return num_blocks_; }
  /// The block accounting (free blocks, the prefix cache).
  [[nodiscard]] const BlockPool& block_pool() const noexcept { return pool_; }

 private:
  int64_t pool_blocks() const {
    const auto bs = options_.block_size();
    if (options_.kv_cache_tokens() > 0) return (options_.kv_cache_tokens() + bs - 1) / bs;
    if (!device_.is_cuda()) return (16384 + bs - 1) / bs;
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
    std::size_t free_bytes = 0, total = 0;
    const int rc = cuda::device_memory(&free_bytes, &total);
    HYBRIDRL_CHECK(rc == 0, fmt::format("Rollout<Paged>: cudaMemGetInfo failed (cudaError {})", rc),
                   "check the device, or size the pool with rollout.kv_cache_tokens");
    const auto blocks = static_cast<int64_t>(options_.memory_fraction() * static_cast<double>(free_bytes)) / block_bytes_;
    HYBRIDRL_CHECK(blocks >= 1,
                   fmt::format("Rollout<Paged>: {} of the {} MiB free on the device holds no KV block of {} KiB",
                               options_.memory_fraction(), free_bytes >> 20, block_bytes_ >> 10),
                   "free device memory, raise rollout.memory_fraction, or set rollout.kv_cache_tokens");
    return blocks;
#else
    throw Error("Rollout<Paged>: the KV pool on CUDA is sized from free device memory, which needs hybridrl::cuda",
                "link hybridrl::cuda (hybridrl_add_cuda_kernels()) or set rollout.kv_cache_tokens");
#endif
  }

  void empty_device_cache() const {
#if HYBRIDRL_PAGED_CUDA_GRAPHS
    if (device_.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  }

  void allocate() {
    const auto& c = model_->config();
    kv_ = at::zeros({c.num_hidden_layers, 2, num_blocks_, options_.block_size(), c.num_key_value_heads, c.head_dim},
                    at::TensorOptions().dtype(dtype_).device(device_));
  }

  // every request must fit the pool alone (prompt + response, a copy-on-write block for forks)
  void check_fits(const std::vector<GenerationRequest>& req, const StopRule& rule) const {
    const auto bs = options_.block_size();
    for (size_t i = 0; i < req.size(); ++i) {
      const auto L = static_cast<int64_t>(req[i].prompt.size());
      const auto tokens = L + rule.budget(L) - 1;  // the last drawn token is never computed
      const auto need = (tokens + bs - 1) / bs + 1;
      HYBRIDRL_CHECK(need <= num_blocks_,
                     fmt::format("Rollout<Paged>.generate: prompt {} ({} tokens, up to {} new) needs {} KV blocks of {} "
                                 "tokens; the pool has {}",
                                 i, L, rule.budget(L), need, bs, num_blocks_),
                     "raise rollout.kv_cache_tokens (or rollout.memory_fraction on CUDA), or lower "
                     "rollout.max_new_tokens / the prompt length");
    }
  }


  // ---- CUDA graphs of the decode step (every scheduled sequence computes its last drawn token) ----
  // One graph per padded batch size (powers of two up to max_num_seqs), captured on first use for
  // the call's sampling options: the model forward over static input buffers, the paged decode
  // kernel reading static block tables, and the sampler writing static outputs. Padding rows
  // write no KV (slot -1) and attend to one token. A replay costs one launch instead of the
  // ~40 LibTorch ops per layer of an eager step.
#if HYBRIDRL_PAGED_CUDA_GRAPHS
  struct DecodeGraph {
    int64_t rows = 0, width = 0;
    at::cuda::CUDAGraph graph;
    at::Tensor ids, pos, slots, tables, ctx, seeds, samples, positions;  // static inputs
    at::Tensor host;                                                    // pinned staging
    at::Tensor tokens, log_probs;                                       // static outputs
  };
  std::vector<std::unique_ptr<DecodeGraph>> graphs_;
  std::optional<c10::cuda::CUDAStream> capture_stream_;  // where every decode graph is captured
  SamplingOptions graph_sampling_;
  decltype(at::cuda::graph_pool_handle()) graph_pool_{0, 0};
#endif

  void drop_graphs() {
#if HYBRIDRL_PAGED_CUDA_GRAPHS
    graphs_.clear();
    // a fresh memory pool for the next captures: the caching allocator keeps a released pool's
    // entry (use count 0) until its blocks are freed, and capturing into it again trips its
    // internal assert (`use_count > 0`, seen with LibTorch 2.11 when the sampling changed)
    graph_pool_ = {0, 0};
#endif
  }

  static bool same_sampling(const SamplingOptions& a, const SamplingOptions& b) {
    return a.temperature() == b.temperature() && a.top_k() == b.top_k() && a.top_p() == b.top_p() &&
           a.min_p() == b.min_p();
  }

  bool graph_step(const ScheduledStep& step, PagedScheduler& sched, const std::vector<GenerationRequest>& req,
                  std::vector<GeneratedSequence>& seqs, const SamplingOptions& s, const StopRule& rule) {
#if HYBRIDRL_PAGED_CUDA_GRAPHS
    const auto& c = model_->config();
    if (!device_.is_cuda() || !options_.cuda_graphs() ||
        !paged_decode_kernel_covers(c.num_attention_heads, c.num_key_value_heads, c.head_dim)) {
      return false;
    }
    const auto S = static_cast<int64_t>(step.chunks.size());
    if (S > options_.max_num_seqs()) return false;
    const auto bs = options_.block_size();
    const auto width = std::min(num_blocks_, (c.max_position_embeddings + bs - 1) / bs);
    for (const auto& ch : step.chunks) {
      const auto& q = sched.sequence(ch.seq);
      if (ch.count != 1 || ch.start + 1 != static_cast<int64_t>(q.tokens.size()) || !q.followers.empty()) return false;
      if (static_cast<int64_t>(q.table.blocks().size()) > width) return false;
      // a row still under min_new_tokens needs the banned-token mask: the eager step does it
      if (!rule.stop_ids.empty() && static_cast<int64_t>(seqs[static_cast<size_t>(ch.seq)].tokens.size()) < rule.min_new_tokens) {
        return false;
      }
    }
    if (!graphs_.empty() && !same_sampling(graph_sampling_, s)) drop_graphs();
    graph_sampling_ = s;
    int64_t rows = 1;
    while (rows < S) rows *= 2;
    DecodeGraph* g = nullptr;
    for (auto& p : graphs_) {
      if (p->rows == rows && p->width == width) g = p.get();
    }
    if (g == nullptr) {
      try {
        graphs_.push_back(capture_decode(rows, width, s));
      } catch (const std::exception& e) {
        drop_graphs();
        throw Error(fmt::format("Rollout<Paged>: capturing the decode step for {} rows in a CUDA graph failed: {}", rows,
                                e.what()),
                    "set rollout.cuda_graphs=false to decode eagerly, and report this with the model's config");
      }
      g = graphs_.back().get();
    }
    // stage this step's inputs (padding rows: token 0 at position 0, no KV write, one key)
    auto* h = g->host.data_ptr<int64_t>();
    const auto W = g->width;
    int64_t* ids = h;
    int64_t* pos = h + rows;
    int64_t* slots = h + 2 * rows;
    int64_t* seeds = h + 3 * rows;
    int64_t* samples = h + 4 * rows;
    int64_t* positions = h + 5 * rows;
    auto* ctx = reinterpret_cast<int32_t*>(h + 6 * rows);
    auto* tables = ctx + rows;
    std::fill(h, h + 6 * rows, 0);
    std::fill(slots, slots + rows, -1);
    std::fill(ctx, ctx + rows, 1);
    std::fill(tables, tables + rows * W, 0);
    for (int64_t r = 0; r < S; ++r) {
      const auto& ch = step.chunks[static_cast<size_t>(r)];
      const auto& q = sched.sequence(ch.seq);
      const auto& blocks = q.table.blocks();
      ids[r] = q.tokens[static_cast<size_t>(ch.start)];
      pos[r] = ch.start;
      slots[r] = static_cast<int64_t>(blocks[static_cast<size_t>(ch.start / bs)]) * bs + ch.start % bs;
      ctx[r] = static_cast<int32_t>(ch.start + 1);
      std::copy(blocks.begin(), blocks.end(), tables + r * W);
      const auto& rq = req[static_cast<size_t>(ch.seq)];
      seeds[r] = static_cast<int64_t>(rq.seed);
      samples[r] = rq.sample;
      positions[r] = static_cast<int64_t>(seqs[static_cast<size_t>(ch.seq)].tokens.size());
    }
    auto longs = g->host.narrow(0, 0, 6 * rows);
    auto ints = g->host.narrow(0, 6 * rows, g->host.size(0) - 6 * rows).view(at::kInt);  // pinned, like the rest
    g->ids.copy_(longs.narrow(0, 0, rows), true);
    g->pos.copy_(longs.narrow(0, rows, rows), true);
    g->slots.copy_(longs.narrow(0, 2 * rows, rows), true);
    g->seeds.copy_(longs.narrow(0, 3 * rows, rows), true);
    g->samples.copy_(longs.narrow(0, 4 * rows, rows), true);
    g->positions.copy_(longs.narrow(0, 5 * rows, rows), true);
    g->ctx.copy_(ints.narrow(0, 0, rows), true);
    g->tables.copy_(ints.narrow(0, rows, rows * W).view({rows, W}), true);
    g->graph.replay();
    sched.computed(step);
    auto tok = g->tokens.narrow(0, 0, S).to(at::kCPU);  // waits for the replay
    auto lp = g->log_probs.narrow(0, 0, S).to(at::kCPU);
    for (int64_t r = 0; r < S; ++r) {
      const auto id = step.chunks[static_cast<size_t>(r)].seq;
      auto& seq = seqs[static_cast<size_t>(id)];
      const auto t = tok.data_ptr<int64_t>()[r];
      rule.append(seq, static_cast<int64_t>(req[static_cast<size_t>(id)].prompt.size()), t, lp.data_ptr<float>()[r]);
      if (seq.done) sched.finish(id);
      else sched.append(id, t);
    }
    return true;
#else
    (void)step, (void)sched, (void)req, (void)seqs, (void)s, (void)rule;
    return false;
#endif
  }

#if HYBRIDRL_PAGED_CUDA_GRAPHS
  std::unique_ptr<DecodeGraph> capture_decode(int64_t rows, int64_t width, const SamplingOptions& s) {
    auto g = std::make_unique<DecodeGraph>();
    g->rows = rows;
    g->width = width;
    const auto l = at::TensorOptions().dtype(at::kLong).device(device_);
    const auto i = at::TensorOptions().dtype(at::kInt).device(device_);
    g->ids = at::zeros({rows}, l);
    g->pos = at::zeros({rows}, l);
    g->slots = at::full({rows}, -1, l);
    g->seeds = at::zeros({rows}, l);
    g->samples = at::zeros({rows}, l);
    g->positions = at::zeros({rows}, l);
    g->ctx = at::ones({rows}, i);
    g->tables = at::zeros({rows, width}, i);
    // 6 int64 rows, then ctx and the tables as int32 (packed two per int64)
    g->host = at::empty({6 * rows + (rows * (1 + width) + 1) / 2}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
    g->tokens = at::zeros({rows}, l);
    g->log_probs = at::zeros({rows}, l.dtype(at::kFloat));
    if (graph_pool_.first == 0 && graph_pool_.second == 0) graph_pool_ = at::cuda::graph_pool_handle();
    cudaDeviceSynchronize();
    // one capture stream for the engine's life: cuBLAS keeps a workspace (32 MiB on Hopper) per
    // stream it ran on, allocated until the process ends, so a fresh pool stream per capture (every
    // step, where free_cache_engine drops the graphs) left 32 MiB more allocated after each step
    // until the pool's 32 streams were all used (1 GiB; seen on the H100 as +32 MiB a GRPO step)
    if (!capture_stream_) capture_stream_ = at::cuda::getStreamFromPool(false, device_.index());
    auto side = *capture_stream_;
    {
      c10::cuda::CUDAStreamGuard guard(side);
      decode_body(*g, s);  // warm-up on the capture stream (cuBLAS workspaces, the allocator)
      side.synchronize();
      g->graph.capture_begin(graph_pool_);
      decode_body(*g, s);
      g->graph.capture_end();
    }
    side.synchronize();
    return g;
  }

  void decode_body(DecodeGraph& g, const SamplingOptions& s) {
    const auto& c = model_->config();
    PagedAttentionMetadata meta;
    meta.block_tables = g.tables;
    meta.context_lens = g.ctx;
    meta.slot_mapping = g.slots;
    meta.num_tokens = g.rows;
    meta.max_query_len = 1;
    meta.max_context_len = g.width * options_.block_size();
    meta.block_size = options_.block_size();
    meta.decode_only = true;
    PagedAttentionMetadata sliding = meta;  // the decode kernel takes the window per call (Qwen2 mixes)
    meta.sliding_window = c.mixed_windows() ? std::nullopt : c.layer_window(0);
    sliding.sliding_window = c.sliding_window;
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    auto fn = [this, &meta, &sliding, &c, scale](int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v) {
      const auto& m = c.layer_window(layer) ? sliding : meta;
      auto kc = kv_[layer][0];
      auto vc = kv_[layer][1];
      write_kv_to_cache(k[0].transpose(0, 1), v[0].transpose(0, 1), kc, vc, m.slot_mapping);
      return paged_attention(q[0].transpose(0, 1), kc, vc, m, scale).transpose(0, 1).unsqueeze(0);
    };
    auto hidden = model_->model->forward_with_attention(g.ids.view({1, g.rows}), g.pos.view({1, g.rows}), fn);
    auto logits = model_->logits(hidden[0]);
    SamplingRows sr;
    sr.seeds = g.seeds;
    sr.samples = g.samples;
    sr.positions = g.positions;
    auto drawn = sample_tokens(logits, s, sr);
    g.tokens.copy_(drawn.tokens);
    g.log_probs.copy_(drawn.log_probs);
  }
#endif

  void copy_blocks(const std::vector<BlockCopy>& copies) {
    if (copies.empty()) return;
    std::vector<int64_t> src, dst;
    for (const auto& cp : copies) {
      src.push_back(cp.src);
      dst.push_back(cp.dst);
    }
    auto s = at::tensor(src, at::kLong).to(device_), d = at::tensor(dst, at::kLong).to(device_);
    kv_.index_copy_(2, d, kv_.index_select(2, s));  // all sources read before any destination is written
  }

  void draw(PagedScheduler& sched, const at::Tensor& hidden, const std::vector<int64_t>& rows,
            const std::vector<int64_t>& who, const std::vector<GenerationRequest>& req, std::vector<GeneratedSequence>& seqs,
            const SamplingOptions& s, const StopRule& rule) {
    const auto& c = model_->config();
    auto logits = model_->logits(hidden.index_select(0, at::tensor(rows, at::kLong).to(device_)));
    std::vector<int64_t> seed_v, sample_v, pos_v;
    for (auto id : who) {
      const auto& r = req[static_cast<size_t>(id)];
      seed_v.push_back(static_cast<int64_t>(r.seed));
      sample_v.push_back(r.sample);
      pos_v.push_back(static_cast<int64_t>(seqs[static_cast<size_t>(id)].tokens.size()));
    }
    SamplingRows sr;
    sr.seeds = at::tensor(seed_v, at::kLong).to(device_);
    sr.samples = at::tensor(sample_v, at::kLong).to(device_);
    sr.positions = at::tensor(pos_v, at::kLong).to(device_);
    sr.banned = rule.banned(pos_v, c.vocab_size, device_);
    auto drawn = sample_tokens(logits, s, sr);
    auto tok = drawn.tokens.to(at::kCPU).contiguous();
    auto lp = drawn.log_probs.to(at::kCPU).contiguous();
    for (size_t j = 0; j < who.size(); ++j) {
      const auto id = who[j];
      auto& seq = seqs[static_cast<size_t>(id)];
      const auto t = tok.data_ptr<int64_t>()[j];
      rule.append(seq, static_cast<int64_t>(req[static_cast<size_t>(id)].prompt.size()), t, lp.data_ptr<float>()[j]);
      if (seq.done) sched.finish(id);
      else sched.append(id, t);
    }
  }

  CausalLM model_;
  PagedOptions options_;
  at::Device device_ = at::kCPU;
  at::ScalarType dtype_ = at::kFloat;
  int64_t block_bytes_ = 0, num_blocks_ = 0, held_peak_ = 0;
  BlockPool pool_{1, 1};
  at::Tensor kv_;
  RolloutStats stats_;
  bool released_ = false;
};

/// Paged KV cache with continuous batching. The descriptor of Rollout<Paged>; `make(config,
/// options, device, dtype)` builds its engine.
template <>
struct Rollout<Paged> {
  using tag = Paged;
  using options_type = PagedOptions;
  static constexpr std::string_view name = "Paged";
  using engine_type = PagedEngine;
  static constexpr bool accepts_tensor_parallel_weights = true;

  /// The engine for a model of config `c` on `device` in `dtype`.
  static engine_type make(const ModelConfig& c, const PagedOptions& options, at::Device device = at::kCPU,
                          at::ScalarType dtype = at::kFloat) {
    return PagedEngine::make(c, options, device, dtype);
  }
};
static_assert(rollout_policy<Rollout<Paged>>,
              "hybridrl: Rollout<Paged> must model rollout_policy (rollout/concepts.hpp)");
static_assert(rollout_engine<PagedEngine>, "hybridrl: PagedEngine must model rollout_engine (rollout/concepts.hpp)");

}  // namespace hybridrl
