#pragma once
/// \file
/// Attention over a paged KV cache (the cache of Rollout<Paged>) for one scheduler step: a packed
/// batch of query chunks, chunk s holding the queries of sequence s at positions
/// [context_len[s] - query_len[s], context_len[s]), each attending causally over that sequence's
/// first context_len[s] cached tokens (its own keys included: write them first, write_kv_to_cache).
///
/// Three paths give the same result. The reference, on any device, gathers each sequence's keys and
/// values from its blocks into a padded dense tensor and runs scaled-dot-product attention under a
/// mask: simple, and the oracle of the kernel tests. On CUDA, in a target linked with
/// hybridrl::cuda, a step whose chunks are all one token (decode) goes to hybridrl's paged decode
/// kernel (src/cuda/paged_attention.cu), which reads K/V straight from the blocks. A CUDA step with
/// longer chunks (prefill, mixed) in bf16/fp16 goes to FlashAttention-2's varlen forward on the
/// packed queries: over the step's own keys when every chunk is a whole fresh prompt, else over
/// each sequence's context gathered once from its blocks — no query or key is padded.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/cuda/launchers.hpp"
#include "hybridrl/detail/compat.hpp"
#include "hybridrl/model/attention.hpp"

#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
#include <ATen/cuda/CUDAContext.h>
#endif

namespace hybridrl {

/// Which path a step's attention takes, chosen when its metadata is built (the host work differs).
enum class PagedAttentionPath {
  reference,  ///< gathers + masked SDPA per group; any device, dtype and shape
  kernel,     ///< the CUDA decode kernel (one query per sequence; paged_decode_kernel_covers)
  varlen,     ///< FlashAttention-2 varlen over packed chunks (CUDA, bf16/fp16; paged_varlen_covers)
};

/// Where each sequence of a step lives in the paged cache, built once per step on the host and
/// shared by every layer.
struct PagedAttentionMetadata {
  at::Tensor block_tables;   ///< int32 [S, max_blocks]: block ids per sequence (padding 0)
  at::Tensor context_lens;   ///< int32 [S]: cached tokens per sequence after this step's writes
  at::Tensor slot_mapping;   ///< int64 [T]: cache slot of each packed token (block * block_size + offset)
  int64_t num_tokens = 0;    ///< T, packed query tokens
  int64_t max_query_len = 0;
  int64_t max_context_len = 0;
  int64_t block_size = 16;
  std::optional<int64_t> sliding_window;  ///< a key is visible to a query less than this many positions back
  bool decode_only = false;  ///< every chunk is one token

  /// The reference path's work, precomputed: the decode rows (one query each) as one group, and
  /// each longer chunk as a group of its own, so no query is padded to another chunk's length
  /// (a step mixing one 8192-token chunk with 255 decodes would otherwise mask 255 × 8192 × K).
  struct Group {
    int64_t sequences = 0, queries = 0, keys = 0;  ///< S_g, Q_g (per sequence), K_g (the longest context)
    at::Tensor tokens;     ///< int64 [S_g * Q_g]: packed rows of the group's queries, sequence-major
    at::Tensor key_slots;  ///< int64 [S_g * K_g]: cache slot of each key (padding: slot 0, masked)
    at::Tensor mask;       ///< bool [S_g, 1, Q_g, K_g]: may attend
  };
  std::vector<Group> groups;

  /// The varlen path's work: int32 prefix sums [S + 1] of the query and context lengths, and the
  /// cache slot of every context key, packed sequence after sequence (int64 [sum of contexts]).
  at::Tensor cu_query_lens, cu_context_lens, context_slots;
  bool fresh = false;  ///< every chunk is a whole prompt from position 0: its keys are the step's own

  /// Metadata of a step: sequence s has block table `tables[s]`, `query_lens[s]` new tokens and
  /// `context_lens[s]` tokens in the cache counting them, in a cache of `block_size`-token blocks.
  /// `path` picks the host work: the reference path's groups (their key slots and masks cost
  /// ~4 ms of host work per decode step at 256 sequences), none (the decode kernel reads the block
  /// tables), or the varlen path's prefix sums and context slots.
  static PagedAttentionMetadata make(const std::vector<std::vector<int32_t>>& tables,
                                     const std::vector<int64_t>& query_lens, const std::vector<int64_t>& context_lens,
                                     int64_t block_size, std::optional<int64_t> sliding_window, at::Device device,
                                     PagedAttentionPath path = PagedAttentionPath::reference) {
    const auto S = static_cast<int64_t>(tables.size());
    HYBRIDRL_CHECK(S >= 1 && query_lens.size() == tables.size() && context_lens.size() == tables.size(),
                   fmt::format("PagedAttentionMetadata: {} block tables, {} query lengths, {} context lengths", S,
                               query_lens.size(), context_lens.size()),
                   "give one block table, query length and context length per sequence");
    PagedAttentionMetadata m;
    m.block_size = block_size;
    m.sliding_window = sliding_window;
    size_t max_blocks = 1;
    std::vector<int64_t> first(static_cast<size_t>(S));  // packed row of each sequence's first query
    for (int64_t s = 0; s < S; ++s) {
      const auto q = query_lens[static_cast<size_t>(s)], k = context_lens[static_cast<size_t>(s)];
      HYBRIDRL_CHECK(q >= 1 && k >= q && k <= static_cast<int64_t>(tables[static_cast<size_t>(s)].size()) * block_size,
                     fmt::format("PagedAttentionMetadata: sequence {} has {} queries, {} context tokens and {} blocks",
                                 s, q, k, tables[static_cast<size_t>(s)].size()),
                     "each sequence needs >= 1 query, a context holding its queries, and blocks for the context");
      first[static_cast<size_t>(s)] = m.num_tokens;
      m.num_tokens += q;
      m.max_query_len = std::max(m.max_query_len, q);
      m.max_context_len = std::max(m.max_context_len, k);
      max_blocks = std::max(max_blocks, tables[static_cast<size_t>(s)].size());
    }
    m.decode_only = m.max_query_len == 1;
    auto slot_of = [&](int64_t s, int64_t pos) {
      const auto& tab = tables[static_cast<size_t>(s)];
      return static_cast<int64_t>(tab[static_cast<size_t>(pos / block_size)]) * block_size + pos % block_size;
    };
    std::vector<int32_t> bt(static_cast<size_t>(S) * max_blocks, 0), cl(static_cast<size_t>(S));
    std::vector<int64_t> slots(static_cast<size_t>(m.num_tokens));
    for (int64_t s = 0; s < S; ++s) {
      const auto& tab = tables[static_cast<size_t>(s)];
      const auto q = query_lens[static_cast<size_t>(s)], k = context_lens[static_cast<size_t>(s)];
      std::copy(tab.begin(), tab.end(), bt.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(s) * max_blocks));
      cl[static_cast<size_t>(s)] = static_cast<int32_t>(k);
      for (int64_t j = 0; j < q; ++j) slots[static_cast<size_t>(first[static_cast<size_t>(s)] + j)] = slot_of(s, k - q + j);
    }
    // from_blob views the host vectors: clone before they go (.to(kCPU) would not copy)
    const auto i32 = at::TensorOptions().dtype(at::kInt), i64 = at::TensorOptions().dtype(at::kLong);
    m.block_tables = at::from_blob(bt.data(), {S, static_cast<int64_t>(max_blocks)}, i32).clone().to(device);
    m.context_lens = at::from_blob(cl.data(), {S}, i32).clone().to(device);
    m.slot_mapping = at::from_blob(slots.data(), {m.num_tokens}, i64).clone().to(device);
    if (path == PagedAttentionPath::kernel) return m;
    if (path == PagedAttentionPath::varlen) {
      std::vector<int32_t> cq(static_cast<size_t>(S) + 1, 0), ck(static_cast<size_t>(S) + 1, 0);
      std::vector<int64_t> keys;
      keys.reserve(static_cast<size_t>(std::accumulate(context_lens.begin(), context_lens.end(), int64_t{0})));
      m.fresh = true;
      for (int64_t s = 0; s < S; ++s) {
        const auto q = query_lens[static_cast<size_t>(s)], k = context_lens[static_cast<size_t>(s)];
        m.fresh = m.fresh && q == k;
        cq[static_cast<size_t>(s) + 1] = cq[static_cast<size_t>(s)] + static_cast<int32_t>(q);
        ck[static_cast<size_t>(s) + 1] = ck[static_cast<size_t>(s)] + static_cast<int32_t>(k);
        for (int64_t key = 0; key < k; ++key) keys.push_back(slot_of(s, key));
      }
      m.cu_query_lens = at::from_blob(cq.data(), {S + 1}, i32).clone().to(device);
      m.cu_context_lens = at::from_blob(ck.data(), {S + 1}, i32).clone().to(device);
      m.context_slots = at::from_blob(keys.data(), {static_cast<int64_t>(keys.size())}, i64).clone().to(device);
      return m;
    }
    // the reference path's groups
    std::vector<int64_t> decodes;
    for (int64_t s = 0; s < S; ++s) {
      if (query_lens[static_cast<size_t>(s)] == 1) decodes.push_back(s);
    }
    auto add_group = [&](const std::vector<int64_t>& members, int64_t Q) {
      Group g;
      g.sequences = static_cast<int64_t>(members.size());
      g.queries = Q;
      for (auto s : members) g.keys = std::max(g.keys, context_lens[static_cast<size_t>(s)]);
      const auto Sg = g.sequences, K = g.keys;
      std::vector<int64_t> toks(static_cast<size_t>(Sg * Q)), ks(static_cast<size_t>(Sg * K), 0);
      std::vector<uint8_t> may(static_cast<size_t>(Sg * Q * K), 0);
      for (int64_t i = 0; i < Sg; ++i) {
        const auto s = members[static_cast<size_t>(i)];
        const auto k = context_lens[static_cast<size_t>(s)];
        for (int64_t key = 0; key < k; ++key) ks[static_cast<size_t>(i * K + key)] = slot_of(s, key);
        for (int64_t j = 0; j < Q; ++j) {
          toks[static_cast<size_t>(i * Q + j)] = first[static_cast<size_t>(s)] + j;
          const auto pos = k - Q + j;
          const auto lo = sliding_window ? std::max<int64_t>(0, pos - *sliding_window + 1) : 0;
          std::fill(may.begin() + static_cast<std::ptrdiff_t>((i * Q + j) * K + lo),
                    may.begin() + static_cast<std::ptrdiff_t>((i * Q + j) * K + pos + 1), uint8_t{1});
        }
      }
      g.tokens = at::from_blob(toks.data(), {Sg * Q}, i64).clone().to(device);
      g.key_slots = at::from_blob(ks.data(), {Sg * K}, i64).clone().to(device);
      g.mask = at::from_blob(may.data(), {Sg, 1, Q, K}, at::TensorOptions().dtype(at::kByte)).clone().to(device).to(at::kBool);
      m.groups.push_back(std::move(g));
    };
    if (!decodes.empty()) add_group(decodes, 1);
    for (int64_t s = 0; s < S; ++s) {
      const auto q = query_lens[static_cast<size_t>(s)];
      if (q > 1) add_group({s}, q);
    }
    return m;
  }

  /// Sequences in the step.
  [[nodiscard]] int64_t num_sequences() const { return context_lens.size(0); }
};

/// True when the CUDA decode kernel covers heads / kv_heads / head_dim (head_dim 64 or 128, at
/// most 8 query heads per KV head); paged_attention runs the reference for other shapes.
constexpr bool paged_decode_kernel_covers(int64_t heads, int64_t kv_heads, int64_t head_dim) noexcept {
  return kv_heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= 8 && (head_dim == 64 || head_dim == 128);
}

/// True when the varlen path serves a step in `dtype` with heads of `head_dim` (CUDA, bf16 or fp16,
/// FlashAttention-2's head sizes, a LibTorch with the varlen op); paged_attention runs the
/// reference otherwise.
inline bool paged_varlen_covers(at::ScalarType dtype, int64_t head_dim) noexcept {
  return HYBRIDRL_HAS_VARLEN_FLASH && (dtype == at::kBFloat16 || dtype == at::kHalf) && head_dim % 8 == 0 &&
         head_dim <= 256;
}

/// The path a step on `device` in `dtype` takes: the kernel for a decode step it covers, the varlen
/// path for other CUDA steps it covers, else the reference. `kernel_linked`: the caller links
/// hybridrl::cuda (HYBRIDRL_HAS_CUDA_KERNELS).
inline PagedAttentionPath paged_attention_path(at::Device device, at::ScalarType dtype, bool decode_only, int64_t heads,
                                               int64_t kv_heads, int64_t head_dim, bool kernel_linked) noexcept {
  if (!device.is_cuda()) return PagedAttentionPath::reference;
  const bool kernel_dtype = dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16;
  if (decode_only && kernel_linked && kernel_dtype && paged_decode_kernel_covers(heads, kv_heads, head_dim))
    return PagedAttentionPath::kernel;
  if (paged_varlen_covers(dtype, head_dim)) return PagedAttentionPath::varlen;
  return PagedAttentionPath::reference;
}

/// The reference path: `q` [T, H, D] packed queries, caches [num_blocks, block_size, Hkv, D]
/// (H a multiple of Hkv) → [T, H, D]. Any device.
inline at::Tensor paged_attention_reference(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
                                            const PagedAttentionMetadata& m, double scale) {
  HYBRIDRL_CHECK(!m.groups.empty() || m.num_tokens == 0,
                 "paged_attention_reference: the metadata has no reference groups",
                 "make it with PagedAttentionPath::reference: this one was made for the decode kernel or the varlen path");
  const auto H = q.size(1), D = q.size(2), Hkv = key_cache.size(2);
  const auto slots = key_cache.size(0) * key_cache.size(1);
  auto out = at::empty({m.num_tokens, H, D}, q.options());
  for (const auto& g : m.groups) {
    const auto S = g.sequences, Q = g.queries, K = g.keys;
    auto k = key_cache.view({slots, Hkv, D}).index_select(0, g.key_slots).view({S, K, Hkv, D}).permute({0, 2, 1, 3});
    auto v = value_cache.view({slots, Hkv, D}).index_select(0, g.key_slots).view({S, K, Hkv, D}).permute({0, 2, 1, 3});
    if (H != Hkv) {
      k = k.repeat_interleave(H / Hkv, 1);
      v = v.repeat_interleave(H / Hkv, 1);
    }
    auto qq = q.index_select(0, g.tokens).view({S, Q, H, D}).permute({0, 2, 1, 3});
    auto o = scaled_dot_product_attention(qq, k, v, g.mask, false, scale);  // [S, H, Q, D]
    out.index_copy_(0, g.tokens, o.permute({0, 2, 1, 3}).reshape({S * Q, H, D}));
  }
  return out;
}

/// Attention of `q` [T, H, D] over the paged caches [num_blocks, block_size, Hkv, D] under `m`
/// (this step's keys already written) → [T, H, D]. A decode step on CUDA with hybridrl::cuda
/// linked runs the paged decode kernel; metadata made for the varlen path runs FlashAttention-2
/// (over `step_keys`/`step_values` [T, Hkv, D], the keys just written, when given and every chunk
/// is fresh); everything else runs paged_attention_reference.
inline at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
                                  const PagedAttentionMetadata& m, double scale, const at::Tensor& step_keys = {},
                                  const at::Tensor& step_values = {}) {
  constexpr const char* fn = "paged_attention";
  HYBRIDRL_CHECK(q.dim() == 3 && q.size(0) == m.num_tokens,
                 fmt::format("{}: q must be [{} tokens, heads, head_dim], got {} dims", fn, m.num_tokens, q.dim()),
                 "pass the step's packed queries, one row per token");
  HYBRIDRL_CHECK(key_cache.dim() == 4 && value_cache.sizes() == key_cache.sizes() && key_cache.size(3) == q.size(2) &&
                     key_cache.size(1) == m.block_size && q.size(1) % key_cache.size(2) == 0,
                 fmt::format("{}: caches must be [num_blocks, {}, kv_heads, {}] with kv_heads dividing {}", fn,
                             m.block_size, q.size(2), q.size(1)),
                 "allocate the caches with the model's kv heads and head size");
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  if (q.is_cuda() && m.decode_only && key_cache.is_contiguous() && value_cache.is_contiguous()) {
    cuda::KernelDtype dt{};
    bool ok = q.scalar_type() == key_cache.scalar_type();
    switch (q.scalar_type()) {
      case at::kFloat: dt = cuda::KernelDtype::f32; break;
      case at::kHalf: dt = cuda::KernelDtype::f16; break;
      case at::kBFloat16: dt = cuda::KernelDtype::bf16; break;
      default: ok = false;
    }
    if (ok) {
      const auto qc = q.contiguous();
      auto out = at::empty_like(qc);
      const auto S = m.num_sequences(), H = q.size(1), D = q.size(2);
      const auto splits = cuda::paged_decode_splits(S, key_cache.size(2), m.block_tables.size(1), m.block_size);
      auto ws = at::empty({std::max<int64_t>(1, splits > 1 ? S * H * splits * (D + 2) : 1)}, q.options().dtype(at::kFloat));
      const int rc = cuda::launch_paged_decode_attention(
          qc.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), m.block_tables.data_ptr<int32_t>(),
          m.context_lens.data_ptr<int32_t>(), out.data_ptr(), S, H, key_cache.size(2), D,
          m.block_size, m.block_tables.size(1), splits, m.sliding_window.value_or(0), static_cast<float>(scale), dt,
          ws.data_ptr<float>(), at::cuda::getCurrentCUDAStream().stream());
      if (rc == 0) return out;
      HYBRIDRL_CHECK(rc == -1, fmt::format("{}: the CUDA decode kernel failed to launch (cudaError {})", fn, rc),
                     "check the device and that hybridrl::cuda was built for its architecture");
      // rc -1: a shape the kernel does not cover (head_dim, group size): the reference does it
    }
  }
#endif
#if HYBRIDRL_HAS_VARLEN_FLASH
  if (q.is_cuda() && m.context_slots.defined() && q.scalar_type() == key_cache.scalar_type() &&
      paged_varlen_covers(q.scalar_type(), q.size(2))) {
    at::Tensor k, v;
    if (m.fresh && step_keys.defined() && step_values.defined()) {
      k = step_keys.contiguous();
      v = step_values.contiguous();
    } else {
      const auto slots = key_cache.size(0) * key_cache.size(1), Hkv = key_cache.size(2), D = key_cache.size(3);
      k = key_cache.view({slots, Hkv, D}).index_select(0, m.context_slots);
      v = value_cache.view({slots, Hkv, D}).index_select(0, m.context_slots);
    }
    return detail::compat::varlen_flash_attention(q.contiguous(), k, v, m.cu_query_lens, m.cu_context_lens,
                                                  m.max_query_len, m.max_context_len, scale, m.sliding_window);
  }
#endif
  return paged_attention_reference(q, key_cache, value_cache, m, scale);
}

}  // namespace hybridrl
