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
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAException.h>
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
  /// Launch each decode step before the host has read the previous step's tokens (CUDA graphs
  /// only; vLLM's key): the next step's input ids are taken from the drawn tokens on the device,
  /// and the host's scheduling and stop rules run while the GPU computes. A row that stops at a
  /// token costs one wasted row-step; the tokens are the same as with it off.
  HYBRIDRL_ARG(bool, async_scheduling) = true;
  /// In training, free the KV pool (and the graphs) after each generation and allocate it again
  /// before the next, so the update phase has that memory (verl's free_cache_engine).
  HYBRIDRL_ARG(bool, free_cache_engine) = true;

  HYBRIDRL_FIELDS(n, sampling, block_size, memory_fraction, kv_cache_tokens, max_num_seqs, max_num_batched_tokens,
                  prefix_sharing, tensor_parallel_size, cuda_graphs, async_scheduling, free_cache_engine)

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
    budget_blocks_ = num_blocks_;
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
    if (sized_per_call_) fit_pool(requests, rule);
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
    // a replayed decode step whose drawn tokens the host has not read yet (async_scheduling):
    // the next step is launched first when it can be, so the host's work overlaps the GPU's
    std::optional<PendingDecode> pending;
    while (!sched.done() || pending) {
      const auto t0 = clock::now();
      bool ahead = false;
      if (pending) {
        ahead = prepare_ahead(*pending, sched, requests, seqs, rule);
        if (!ahead) {  // waiting for the tokens of a decode step is decode time
          settle(*pending, sched, requests, seqs, rule, false);
          pending.reset();
          stats_.decode_seconds += std::chrono::duration<double>(clock::now() - t0).count();
          continue;
        }
      }
      auto step = sched.schedule();
      HYBRIDRL_CHECK(!step.empty(), "Rollout<Paged>: the scheduler made no progress with sequences left",
                     "this is a bug: please report it with the options and prompt lengths");
      held_peak_ = std::max(held_peak_, num_blocks_ - pool_.num_free());
      copy_blocks(step.copies);
      if (graph_step(step, sched, requests, seqs, s, rule, pending, ahead)) {
        stats_.decode_seconds += std::chrono::duration<double>(clock::now() - t0).count();
        ++stats_.steps;
        ++stats_.graph_steps;
        stats_.overlapped_steps += ahead ? 1 : 0;
        continue;
      }
      HYBRIDRL_CHECK(!ahead, "Rollout<Paged>: a decode step launched ahead of the last one's tokens could not replay its graph",
                     "this is a bug: please report it; rollout.async_scheduling=false avoids it");
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
      // the layers store the step's keys and values (in their rotary kernel on CUDA); fn reads the cache
      const auto store = kv_write(meta.slot_mapping);
      auto fn = [&store, &meta, &sliding, &c, mixed, scale](int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v) {
        const auto& m = mixed && c.layer_window(layer) ? sliding : meta;
        const auto& [kc, vc] = store.caches[static_cast<size_t>(layer)];
        const auto ks = k[0].transpose(0, 1), vs = v[0].transpose(0, 1);
        return paged_attention(q[0].transpose(0, 1), kc, vc, m, scale, ks, vs).transpose(0, 1).unsqueeze(0);
      };
      const auto T = static_cast<int64_t>(ids.size());
      auto hidden = decoder->forward_with_attention(at::tensor(ids, at::kLong).view({1, T}).to(device_),
                                                    at::tensor(pos, at::kLong).view({1, T}).to(device_), fn, &store);
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
  /// Makes the KV pool available again (the caching allocator's unused blocks are given back to
  /// the device first, so the training phase's cached memory does not stand in the way). A pool
  /// sized from memory_fraction (kv_cache_tokens 0) is allocated by the next generate() call, at
  /// the blocks its requests can hold at once and no more than the fraction's: a GRPO batch of
  /// 512 x 384 tokens of the 160m config needs 7.0 GiB, not the 38.7 GiB the fraction allows on an
  /// H100 — and allocating, zeroing and freeing the rest every step cost ~50 ms of it. An
  /// explicit kv_cache_tokens is allocated here, that size.
  void resume_memory() {
    if (released_) {
      empty_device_cache();
      if (options_.kv_cache_tokens() == 0) {
        sized_per_call_ = true;  // fit_pool allocates
      } else {
        allocate();
      }
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

  // KV blocks request `i` holds at most: prompt + response (the last drawn token is never
  // computed), and a copy-on-write block for a fork
  int64_t blocks_for(const GenerationRequest& r, const StopRule& rule) const {
    const auto bs = options_.block_size();
    const auto L = static_cast<int64_t>(r.prompt.size());
    return (L + rule.budget(L) - 1 + bs - 1) / bs + 1;
  }

  // After resume_memory: a pool for every request at once (no preemption), at most the budget;
  // allocated when there is none or a later call needs more (the pool is idle between calls)
  void fit_pool(const std::vector<GenerationRequest>& req, const StopRule& rule) {
    int64_t need = 0;
    for (const auto& r : req) need += blocks_for(r, rule);
    need = std::min(need, budget_blocks_);
    if (kv_.defined() && need <= num_blocks_) return;
    drop_graphs();
    kv_ = at::Tensor();
    num_blocks_ = need;
    pool_ = BlockPool(num_blocks_, options_.block_size());
    allocate();
  }

  // every request must fit the pool alone (prompt + response, a copy-on-write block for forks)
  void check_fits(const std::vector<GenerationRequest>& req, const StopRule& rule) const {
    const auto bs = options_.block_size();
    for (size_t i = 0; i < req.size(); ++i) {
      const auto L = static_cast<int64_t>(req[i].prompt.size());
      const auto need = blocks_for(req[i], rule);
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
  //
  // The graphs share one device buffer of inputs and outputs (DecodeIO): the drawn tokens of the
  // last replay, then the host's inputs (ids, a gather index, positions, slots, seeds, samples,
  // generated counts, context lengths, block tables). A graph's first op gathers its input ids
  // from the index: a token the host staged, or the token the previous replay drew on the device
  // — what lets async_scheduling launch step t + 1 before the host has read step t's tokens. The
  // host side is two pinned staging buffers and two pinned output buffers, used by alternate
  // steps (a buffer is reused only after the step two back is settled).
  struct PendingDecode {
    std::vector<int64_t> seqs;  // the sequence of each row
    int parity = 0;             // its pinned buffers and event
  };
#if HYBRIDRL_PAGED_CUDA_GRAPHS
  struct DecodeGraph {
    int64_t rows = 0, width = 0;
    at::cuda::CUDAGraph graph;
    at::Tensor ids;  // the gathered input ids (static)
  };
  struct DecodeIO {
    int64_t M = 0, W = 0;  // rows and table width the buffers hold
    at::Tensor dev;        // int64: [tokens | ids | index | pos | slots | seeds | samples | positions] x M, ctx, tables
    at::Tensor log_probs;  // float [M], the drawn tokens' log-probs
    at::Tensor host_in[2], host_out[2];  // pinned: dev's layout; the tokens then their log-probs
    at::cuda::CUDAEvent done[2];         // after each parity's device-to-host copy
    int parity = 0;
    int64_t off(int k) const { return k * M; }  // the k-th int64 region (0 tokens ... 7 positions)
    int64_t ctx_off() const { return 8 * M; }   // int32 context lengths, then int32 tables [M, W]
    int64_t int_words() const { return (M * (1 + W) + 1) / 2; }
    at::Tensor longs(int k, int64_t rows) const { return dev.narrow(0, off(k), rows); }
    at::Tensor ctx(int64_t rows) const { return dev.narrow(0, ctx_off(), int_words()).view(at::kInt).narrow(0, 0, rows); }
    at::Tensor tables(int64_t rows) const {
      return dev.narrow(0, ctx_off(), int_words()).view(at::kInt).narrow(0, M, M * W).view({M, W}).narrow(0, 0, rows);
    }
  };
  std::vector<std::unique_ptr<DecodeGraph>> graphs_;
  std::unique_ptr<DecodeIO> io_;
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

  [[nodiscard]] bool graphs_usable() const {
#if HYBRIDRL_PAGED_CUDA_GRAPHS
    const auto& c = model_->config();
    return device_.is_cuda() && options_.cuda_graphs() &&
           paged_decode_kernel_covers(c.num_attention_heads, c.num_key_value_heads, c.head_dim);
#else
    return false;
#endif
  }
  [[nodiscard]] int64_t graph_width() const {
    const auto bs = options_.block_size();
    return std::min(num_blocks_, (model_->config().max_position_embeddings + bs - 1) / bs);
  }
  static int64_t padded_rows(int64_t n) {
    int64_t rows = 1;
    while (rows < n) rows *= 2;
    return rows;
  }

  // Decides, while `p` runs on the GPU, whether the next decode step can be launched before its
  // tokens are read: every running sequence is a row of `p` and no other work waits (no queued
  // prompt, no preemption possible, no row under min_new_tokens), and the graph for the rows
  // that go on is already captured. If so, rows that end by length are finished now and the
  // others get a placeholder token (settle writes the drawn one); the caller schedules the step.
  bool prepare_ahead(const PendingDecode& p, PagedScheduler& sched, const std::vector<GenerationRequest>& req,
                     const std::vector<GeneratedSequence>& seqs, const StopRule& rule) {
#if HYBRIDRL_PAGED_CUDA_GRAPHS
    if (!options_.async_scheduling() || sched.num_waiting() != 0) return false;
    std::vector<int64_t> go_on, ends;
    int64_t live = 0;
    for (auto id : p.seqs) {
      const auto& seq = seqs[static_cast<size_t>(id)];
      if (seq.done) continue;  // stopped at a token read while `p` was launched
      ++live;
      const auto generated = static_cast<int64_t>(seq.tokens.size()) + 1;  // with p's token
      const auto L = static_cast<int64_t>(req[static_cast<size_t>(id)].prompt.size());
      if (generated >= rule.budget(L)) {
        ends.push_back(id);
      } else {
        if (!rule.stop_ids.empty() && generated < rule.min_new_tokens) return false;
        go_on.push_back(id);
      }
    }
    if (go_on.empty() || live != sched.num_running() || live > options_.max_num_batched_tokens() ||
        static_cast<int64_t>(go_on.size()) > pool_.num_free()) {
      return false;
    }
    const auto rows = padded_rows(static_cast<int64_t>(go_on.size()));
    const auto width = graph_width();
    bool captured = false;
    for (const auto& g : graphs_) captured = captured || (g->rows == rows && g->width == width);
    if (!captured) return false;
    for (auto id : ends) sched.finish(id);  // `p` still writes their last KV slot: harmless, later
                                            // owners of the blocks write before they read
    for (auto id : go_on) sched.append(id, 0);
    return true;
#else
    (void)p, (void)sched, (void)req, (void)seqs, (void)rule;
    return false;
#endif
  }

  // Reads `p`'s drawn tokens (waiting for its copy) and applies them: the stop rules, and the
  // scheduler's token lists — a placeholder replaced (`ahead`: the next step was launched with
  // it) or the token appended. Rows of sequences finished meanwhile are skipped.
  void settle(const PendingDecode& p, PagedScheduler& sched, const std::vector<GenerationRequest>& req,
              std::vector<GeneratedSequence>& seqs, const StopRule& rule, bool ahead) {
#if HYBRIDRL_PAGED_CUDA_GRAPHS
    io_->done[p.parity].synchronize();
    const auto& out = io_->host_out[p.parity];
    const auto* tok = out.data_ptr<int64_t>();
    const auto* lp = reinterpret_cast<const float*>(tok + io_->M);
    for (size_t r = 0; r < p.seqs.size(); ++r) {
      const auto id = p.seqs[r];
      auto& seq = seqs[static_cast<size_t>(id)];
      if (seq.done) continue;
      rule.append(seq, static_cast<int64_t>(req[static_cast<size_t>(id)].prompt.size()), tok[r], lp[r]);
      if (sched.finished(id)) continue;  // ended by length in prepare_ahead
      if (ahead) sched.set_last_token(id, tok[r]);
      if (seq.done) sched.finish(id);
      else if (!ahead) sched.append(id, tok[r]);
    }
#else
    (void)p, (void)sched, (void)req, (void)seqs, (void)rule, (void)ahead;
#endif
  }

  // Replays the decode graph for `step` when it is a pure decode step the graphs cover. `ahead`:
  // launched before `pending`'s tokens were read (its rows' inputs are gathered on the device),
  // which is settled after the launch. With async_scheduling the step becomes `pending`.
  bool graph_step(const ScheduledStep& step, PagedScheduler& sched, const std::vector<GenerationRequest>& req,
                  std::vector<GeneratedSequence>& seqs, const SamplingOptions& s, const StopRule& rule,
                  std::optional<PendingDecode>& pending, bool ahead) {
#if HYBRIDRL_PAGED_CUDA_GRAPHS
    if (!graphs_usable()) return false;
    const auto S = static_cast<int64_t>(step.chunks.size());
    if (S > options_.max_num_seqs()) return false;
    const auto bs = options_.block_size();
    const auto width = graph_width();
    const int64_t before = ahead ? 1 : 0;  // the pending token not yet in seqs
    for (const auto& ch : step.chunks) {
      const auto& q = sched.sequence(ch.seq);
      if (ch.count != 1 || ch.start + 1 != static_cast<int64_t>(q.tokens.size()) || !q.followers.empty()) return false;
      if (static_cast<int64_t>(q.table.blocks().size()) > width) return false;
      // a row still under min_new_tokens needs the banned-token mask: the eager step does it
      if (!rule.stop_ids.empty() &&
          static_cast<int64_t>(seqs[static_cast<size_t>(ch.seq)].tokens.size()) + before < rule.min_new_tokens) {
        return false;
      }
    }
    if (!graphs_.empty() && !same_sampling(graph_sampling_, s)) drop_graphs();
    graph_sampling_ = s;
    const auto rows = padded_rows(S);
    DecodeGraph* g = nullptr;
    for (auto& p : graphs_) {
      if (p->rows == rows && p->width == width) g = p.get();
    }
    if (g == nullptr) {
      HYBRIDRL_CHECK(!ahead, "Rollout<Paged>: a decode graph would be captured while a step is in flight",
                     "this is a bug: please report it; rollout.async_scheduling=false avoids it");
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
    auto& io = *io_;
    const auto M = io.M, W = io.W;
    // stage this step's inputs in the pinned buffer of its parity (padding rows: token 0 at
    // position 0, no KV write, one key)
    const int par = io.parity;
    io.parity ^= 1;
    auto* h = io.host_in[par].data_ptr<int64_t>();  // laid out like dev (its tokens region unused)
    int64_t* ids = h + io.off(1);
    int64_t* index = h + io.off(2);
    int64_t* pos = h + io.off(3);
    int64_t* slots = h + io.off(4);
    int64_t* seeds = h + io.off(5);
    int64_t* samples = h + io.off(6);
    int64_t* positions = h + io.off(7);
    auto* ctx = reinterpret_cast<int32_t*>(h + io.ctx_off());
    auto* tables = ctx + M;
    std::vector<int64_t> prev_row;  // the row of each sequence in the pending step
    if (ahead) {
      prev_row.assign(seqs.size(), -1);
      for (size_t r = 0; r < pending->seqs.size(); ++r) prev_row[static_cast<size_t>(pending->seqs[r])] = static_cast<int64_t>(r);
    }
    int64_t used = 1;  // table columns any row uses
    for (int64_t r = 0; r < rows; ++r) {
      if (r >= S) {
        ids[r] = 0, index[r] = M + r, pos[r] = 0, slots[r] = -1, seeds[r] = 0, samples[r] = 0, positions[r] = 0;
        ctx[r] = 1;
        tables[r * W] = 0;
        continue;
      }
      const auto& ch = step.chunks[static_cast<size_t>(r)];
      const auto& q = sched.sequence(ch.seq);
      const auto& blocks = q.table.blocks();
      const auto prev = ahead ? prev_row[static_cast<size_t>(ch.seq)] : -1;
      HYBRIDRL_CHECK(!ahead || prev >= 0, "Rollout<Paged>: a row of a step launched ahead is not in the step before it",
                     "this is a bug: please report it; rollout.async_scheduling=false avoids it");
      ids[r] = ahead ? 0 : q.tokens[static_cast<size_t>(ch.start)];
      index[r] = ahead ? prev : M + r;
      pos[r] = ch.start;
      slots[r] = static_cast<int64_t>(blocks[static_cast<size_t>(ch.start / bs)]) * bs + ch.start % bs;
      ctx[r] = static_cast<int32_t>(ch.start + 1);
      std::copy(blocks.begin(), blocks.end(), tables + r * W);
      used = std::max<int64_t>(used, static_cast<int64_t>(blocks.size()));
      const auto& rq = req[static_cast<size_t>(ch.seq)];
      seeds[r] = static_cast<int64_t>(rq.seed);
      samples[r] = rq.sample;
      positions[r] = static_cast<int64_t>(seqs[static_cast<size_t>(ch.seq)].tokens.size()) + before;
    }
    // two copies in: the int64 regions with the context lengths, then the tables' used columns
    // (columns past a row's blocks are never read); the replay; the drawn tokens and log-probs out
    const auto stream = at::cuda::getCurrentCUDAStream(device_.index());
    auto* dev = io.dev.data_ptr<int64_t>();
    const auto in_bytes = static_cast<size_t>(io.ctx_off() - M) * sizeof(int64_t) + static_cast<size_t>(M) * sizeof(int32_t);
    C10_CUDA_CHECK(cudaMemcpyAsync(dev + M, h + M, in_bytes, cudaMemcpyHostToDevice, stream));
    C10_CUDA_CHECK(cudaMemcpy2DAsync(reinterpret_cast<int32_t*>(dev + io.ctx_off()) + M, W * sizeof(int32_t), tables,
                                     W * sizeof(int32_t), used * sizeof(int32_t), rows, cudaMemcpyHostToDevice, stream));
    g->graph.replay();
    auto* out = io.host_out[par].data_ptr<int64_t>();
    C10_CUDA_CHECK(cudaMemcpyAsync(out, dev, S * sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
    C10_CUDA_CHECK(cudaMemcpyAsync(out + M, io.log_probs.data_ptr<float>(), S * sizeof(float), cudaMemcpyDeviceToHost,
                                   stream));
    io.done[par].record(stream);
    PendingDecode launched;
    launched.parity = par;
    launched.seqs.reserve(static_cast<size_t>(S));
    for (const auto& ch : step.chunks) launched.seqs.push_back(ch.seq);
    if (ahead) settle(*pending, sched, req, seqs, rule, true);  // while this step runs
    sched.computed(step);  // after the placeholders are replaced: full blocks are hashed here
    if (options_.async_scheduling()) {
      pending = std::move(launched);
    } else {
      settle(launched, sched, req, seqs, rule, false);
      pending.reset();
    }
    return true;
#else
    (void)step, (void)sched, (void)req, (void)seqs, (void)s, (void)rule, (void)pending, (void)ahead;
    return false;
#endif
  }

#if HYBRIDRL_PAGED_CUDA_GRAPHS
  // The shared buffers for graphs of up to max_num_seqs rows (kept across captures: the graphs
  // read and write them by address).
  void ensure_io(int64_t width) {
    const auto M = padded_rows(options_.max_num_seqs());
    if (io_ && io_->M == M && io_->W == width) return;
    HYBRIDRL_CHECK(graphs_.empty(), "Rollout<Paged>: the decode buffers would change under captured graphs",
                   "this is a bug: please report it");
    auto io = std::make_unique<DecodeIO>();
    io->M = M;
    io->W = width;
    const auto l = at::TensorOptions().dtype(at::kLong).device(device_);
    io->dev = at::zeros({8 * M + io->int_words()}, l);
    io->log_probs = at::zeros({M}, l.dtype(at::kFloat));
    const auto pinned = at::TensorOptions().dtype(at::kLong).pinned_memory(true);
    for (int k = 0; k < 2; ++k) {
      io->host_in[k] = at::zeros({8 * M + io->int_words()}, pinned);
      io->host_out[k] = at::zeros({M + (M + 1) / 2}, pinned);
    }
    io_ = std::move(io);
  }

  std::unique_ptr<DecodeGraph> capture_decode(int64_t rows, int64_t width, const SamplingOptions& s) {
    ensure_io(width);
    auto g = std::make_unique<DecodeGraph>();
    g->rows = rows;
    g->width = width;
    g->ids = at::zeros({rows}, at::TensorOptions().dtype(at::kLong).device(device_));
    if (graph_pool_.first == 0 && graph_pool_.second == 0) graph_pool_ = at::cuda::graph_pool_handle();
    // the warm-up below runs for real: inputs of padding rows (the host's ids, no KV write, one key)
    auto& io = *io_;
    io.longs(1, rows).zero_();
    io.longs(2, rows).copy_(at::arange(io.M, io.M + rows, io.dev.options()));
    io.longs(3, rows).zero_();
    io.longs(4, rows).fill_(-1);
    io.ctx(rows).fill_(1);
    io.tables(rows).zero_();
    // one capture stream for the engine's life: cuBLAS keeps a workspace (32 MiB on Hopper) per
    // stream it ran on, allocated until the process ends, so a fresh pool stream per capture (every
    // step, where free_cache_engine drops the graphs) left 32 MiB more allocated after each step
    // until the pool's 32 streams were all used (1 GiB; seen on the H100 as +32 MiB a GRPO step)
    if (!capture_stream_) capture_stream_ = at::cuda::getStreamFromPool(false, device_.index());
    auto side = *capture_stream_;
    cudaDeviceSynchronize();  // the work before and the inputs above, done before the side stream's
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
    auto& io = *io_;
    const auto rows = g.rows;
    // the input ids: the host's, or the tokens the previous replay drew (regions 1 and 0)
    at::index_select_out(g.ids, io.dev.narrow(0, 0, 2 * io.M), 0, io.longs(2, rows));
    PagedAttentionMetadata meta;
    meta.block_tables = io.tables(rows);
    meta.context_lens = io.ctx(rows);
    meta.slot_mapping = io.longs(4, rows);
    meta.num_tokens = rows;
    meta.max_query_len = 1;
    meta.max_context_len = g.width * options_.block_size();
    meta.block_size = options_.block_size();
    meta.decode_only = true;
    PagedAttentionMetadata sliding = meta;  // the decode kernel takes the window per call (Qwen2 mixes)
    meta.sliding_window = c.mixed_windows() ? std::nullopt : c.layer_window(0);
    sliding.sliding_window = c.sliding_window;
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    // the layers store the step's keys and values in their rotary kernel; fn reads the cache
    const auto store = kv_write(meta.slot_mapping);
    auto fn = [&store, &meta, &sliding, &c, scale](int64_t layer, const at::Tensor& q, const at::Tensor&,
                                                  const at::Tensor&) {
      const auto& m = c.layer_window(layer) ? sliding : meta;
      const auto& [kc, vc] = store.caches[static_cast<size_t>(layer)];
      return paged_attention(q[0].transpose(0, 1), kc, vc, m, scale).transpose(0, 1).unsqueeze(0);
    };
    auto hidden = model_->model->forward_with_attention(g.ids.view({1, rows}), io.longs(3, rows).view({1, rows}), fn,
                                                        &store);
    auto logits = model_->logits(hidden[0]);
    SamplingRows sr;
    sr.seeds = io.longs(5, rows);
    sr.samples = io.longs(6, rows);
    sr.positions = io.longs(7, rows);
    auto drawn = sample_tokens(logits, s, sr);
    io.longs(0, rows).copy_(drawn.tokens);
    io.log_probs.narrow(0, 0, rows).copy_(drawn.log_probs);
  }
#endif

  /// Every layer's key and value cache with a step's slots: where the layers store its keys and values.
  KvWrite kv_write(const at::Tensor& slot_mapping) const {
    KvWrite w;
    w.slot_mapping = slot_mapping;
    w.caches.reserve(static_cast<size_t>(kv_.size(0)));
    for (int64_t l = 0; l < kv_.size(0); ++l) w.caches.emplace_back(kv_[l][0], kv_[l][1]);
    return w;
  }

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
  int64_t budget_blocks_ = 0;    // the pool's size from the options (memory_fraction or kv_cache_tokens)
  bool sized_per_call_ = false;  // after a resume: the pool fits each call's requests (fit_pool)
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
