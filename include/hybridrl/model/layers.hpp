#pragma once
/// \file
/// The building blocks of a Llama-family decoder, named and computed as in Hugging Face's
/// `modeling_llama.py` / `modeling_qwen2.py`: RMSNorm, rotary embeddings (with llama3 / linear
/// frequency scaling), the SwiGLU MLP, grouped-query attention with optional q/k/v bias, and the
/// pre-norm decoder layer. Submodules carry HF's names so parameter names equal HF tensor names.
/// Built with a ParallelContext (model/parallel.hpp), attention holds num_heads / tp_size query
/// heads and the MLP intermediate_size / tp_size features; at tp_size 1 they are the full layers.

#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <numbers>
#include <optional>
#include <utility>
#include <vector>

#include "hybridrl/cuda/fused.hpp"
#include "hybridrl/cuda/paged_kv.hpp"
#include "hybridrl/detail/compat.hpp"
#include "hybridrl/model/attention.hpp"
#include "hybridrl/model/config.hpp"
#include "hybridrl/model/parallel.hpp"

namespace hybridrl {

/// Root-mean-square layer norm: `weight * (x / sqrt(mean(x²) + eps))`, computed in fp32 and cast
/// back to the input dtype before the weight multiply (as HF does).
class RMSNormImpl : public torch::nn::Module {
 public:
  /// A norm over the last dimension of size `dim`, weight initialised to ones.
  RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
    weight = register_parameter("weight", torch::ones({dim}, ParameterInit::options()));
  }
  /// Normalised `x` ([..., dim]).
  at::Tensor forward(const at::Tensor& x) {
    if (auto fused = fused::rms_norm(x, weight, eps_); fused.defined()) return fused;  // inference on CUDA
    if (x.is_cuda() && c10::GradMode::is_enabled() && fused::enabled() && x.scalar_type() == weight.scalar_type()) {
      // training on CUDA: hybridrl's kernel and its backward, else LibTorch's (≥ 2.10; one
      // rounding of weight · x · rstd instead of two): within one unit in the last place of the eager ops
      if (auto fused = fused::rms_norm_train(x, at::Tensor(), weight, eps_).second; fused.defined()) return fused;
      if (auto fused = detail::compat::fused_rms_norm(x, weight, eps_); fused.defined()) return fused;
    }
    auto h = x.to(at::kFloat);
    h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
    return weight * h.to(x.scalar_type());
  }
  /// {h, forward(h)} with h = x + residual: a pre-norm layer's residual add and its next norm (one
  /// kernel on CUDA, in inference and in training — there with one kernel for the backward of
  /// both, the gradient h gets from the stream added in it).
  std::pair<at::Tensor, at::Tensor> forward_add(const at::Tensor& x, const at::Tensor& residual) {
    if (auto fused = fused::add_rms_norm(x, residual, weight, eps_); fused.first.defined()) return fused;
    if (c10::GradMode::is_enabled()) {
      if (auto fused = fused::rms_norm_train(x, residual, weight, eps_); fused.first.defined()) return fused;
    }
    auto h = x + residual;
    return {h, forward(h)};
  }
  /// {x, forward(x)} for a layer that goes on using x (its residual stream): in training on CUDA
  /// x comes back through the norm's op, whose backward kernel then adds the stream's gradient of
  /// x in (one gradient for the layer's input, no sum by autograd); elsewhere x itself.
  std::pair<at::Tensor, at::Tensor> forward_keep(const at::Tensor& x) {
    if (x.is_cuda() && c10::GradMode::is_enabled() && fused::enabled() && x.scalar_type() == weight.scalar_type()) {
      if (auto fused = fused::rms_norm_train(x, at::Tensor(), weight, eps_, /*keep=*/true); fused.first.defined()) {
        return fused;
      }
    }
    return {x, forward(x)};
  }
  at::Tensor weight;  ///< [dim]

 private:
  double eps_;
};
/// Module holder of RMSNormImpl.
TORCH_MODULE(RMSNorm);

/// Inverse rotary frequencies `1 / theta^(2i/d)` for head_dim `d`, with the config's scaling
/// applied (llama3: smooth interpolation between scaled low and unscaled high frequencies; linear:
/// divided by `factor`). fp32, on CPU.
inline at::Tensor rope_inverse_frequencies(const ModelConfig& c) {
  const auto d = c.head_dim;
  auto inv = 1.0 / at::pow(c.rope_theta, at::arange(0, d, 2, at::kLong).to(at::kFloat) / static_cast<double>(d));
  const auto& s = c.rope_scaling;
  if (s.type == "linear") return inv / s.factor;
  if (s.type != "llama3") return inv;
  const double old_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_len / s.low_freq_factor;
  const double high_wavelen = old_len / s.high_freq_factor;
  auto wavelen = 2.0 * std::numbers::pi / inv;
  auto scaled = at::where(wavelen > low_wavelen, inv / s.factor, inv);
  auto smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  auto smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return at::where(medium, smoothed, scaled);
}

/// cos and sin tables for `positions` ([B, T] int): each [B, T, head_dim], fp32 then cast to `dtype`.
inline std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, const at::Tensor& positions,
                                                      at::ScalarType dtype) {
  auto freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq.to(positions.device()).view({1, 1, -1});
  auto emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

/// Applies rotary embeddings to `x` [B, heads, T, D] with cos/sin [B, T, D] (HF's rotate_half form).
inline at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto half = x.size(-1) / 2;
  auto rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

/// apply_rope for tokens in rows: x [N, heads, D], cos / sin [N, D].
inline at::Tensor apply_rope_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto half = x.size(-1) / 2;
  auto rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

/// One tensor holding `parts` stacked along dim 0, each part re-pointed to its slice (values,
/// names and shapes kept; the parts' old storage is released). Inference only (no grad).
inline at::Tensor fuse_rows(std::initializer_list<at::Tensor*> parts) {
  std::vector<at::Tensor> ts;
  for (auto* p : parts) ts.push_back(*p);
  auto fused = at::cat(ts, 0);
  int64_t off = 0;
  for (auto* p : parts) {
    const auto n = p->size(0);
    p->set_(fused.narrow(0, off, n));
    off += n;
  }
  return fused;
}

namespace detail {
// The rows of parts that lie back to back in one storage, as one tensor aliasing them (no copy)
// and differentiable: the backward hands each part its rows of the gradient (slices, no copy)
struct StackedRows : torch::autograd::Function<StackedRows> {
  static at::Tensor alias(at::TensorList parts) {
    auto sizes = parts.front().sizes().vec();
    sizes[0] = 0;
    for (const auto& p : parts) sizes[0] += p.size(0);
    const auto& first = parts.front();
    return at::empty({0}, first.options()).set_(first.storage(), first.storage_offset(), sizes, first.strides());
  }
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList parts) {
    std::vector<int64_t> rows;
    for (const auto& p : parts) rows.push_back(p.size(0));
    ctx->saved_data["rows"] = rows;
    return alias(parts);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    torch::autograd::variable_list out;
    int64_t off = 0;
    for (const auto r : ctx->saved_data["rows"].toIntVector()) {
      out.push_back(grads[0].narrow(0, off, r));
      off += r;
    }
    return out;
  }
};
}  // namespace detail

/// `parts` stacked along dim 0 as one tensor without a copy, where they already lie so: each
/// contiguous, of one dtype, device, storage and trailing shape, and each starting where the one
/// before ends (fuse_projections' parameters; a sharding engine's unit gathered into one flat
/// buffer). The result aliases them; with autograd recording it is differentiable, the gradient
/// of each part its rows of the result's. Undefined otherwise (the caller runs the parts apart).
inline at::Tensor stacked_rows(std::initializer_list<at::Tensor> parts) {
  const auto& first = *parts.begin();
  int64_t expect = 0;
  bool grad = false;
  for (const auto& p : parts) {
    if (!p.defined() || p.dim() == 0 || p.numel() == 0 || !p.is_contiguous() ||
        p.scalar_type() != first.scalar_type() || p.device() != first.device() ||
        !p.storage().is_alias_of(first.storage()) || p.sizes().slice(1) != first.sizes().slice(1) ||
        (&p != &first && p.storage_offset() != expect)) {
      return {};
    }
    expect = p.storage_offset() + p.numel();
    grad = grad || p.requires_grad();
  }
  const at::TensorList list(parts.begin(), parts.size());
  if (!grad || !c10::GradMode::is_enabled()) {
    c10::NoGradGuard ng;
    return detail::StackedRows::alias(list);
  }
  return detail::StackedRows::apply(list);
}

/// Attention over keys/values the caller provides: (layer index, q [B,H,T,D], k, v [B,Hkv,T,D]
/// after rotary) → [B, H, T, D]. The KV-cache entry point of the rollout: it stores k/v where it
/// likes (dense or paged) and attends over the cache.
using AttentionFn = std::function<at::Tensor(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v)>;

/// Where the layers of a forward store the keys and values they compute, for a caller keeping a
/// paged KV cache: each layer writes its own before it calls the caller's attention — on CUDA in
/// the kernel that rotates them (one pass, no write_kv_to_cache launch), else through
/// write_kv_to_cache — so the attention function only reads the cache.
struct KvWrite {
  std::vector<std::pair<at::Tensor, at::Tensor>> caches;  ///< per layer: key and value cache [blocks, block_size, Hkv, D]
  at::Tensor slot_mapping;  ///< int64 [B·T]: the cache slot of each token of the forward (−1: not stored)
};

/// What every layer of one forward shares: the rotary tables, the attention mask and, for KV-cache
/// decoding, who does the attention (and where the keys and values go).
struct LayerContext {
  at::Tensor cos, sin;     ///< [B, T, head_dim] in the compute dtype
  at::Tensor mask;         ///< bool "may attend" [B, 1, Tq, Tk], or undefined for plain causal
  bool causal = true;      ///< add the causal mask inside attention (only when `mask` is undefined)
  AttentionFn attention;   ///< when set, the caller's attention (KV cache) replaces `attend`
  /// Packed sequences without padding (the trunk runs on one row [1, N]; DecoderImpl::forward
  /// unpads): sequence s is rows [cu_seqlens[s], cu_seqlens[s+1]) (int32), attention causal
  /// within it through FlashAttention-2's varlen kernel, `window` this layer's sliding window.
  struct Varlen {
    at::Tensor cu_seqlens;
    int64_t max_seqlen = 0;
    std::optional<int64_t> window;
    at::ScalarType dtype = at::kBFloat16;  ///< q, k, v cast to it (autocast leaves rotary outputs in fp32)
  };
  std::optional<Varlen> varlen;
  const KvWrite* kv_write = nullptr;  ///< with `attention`: the layers store k/v in these caches first
};

/// Grouped-query self-attention with rotary embeddings; q/k/v bias for Qwen2 (or Llama
/// `attention_bias`). Parameters: q_proj, k_proj, v_proj, o_proj as in HF.
class AttentionImpl : public torch::nn::Module {
 public:
  /// Projections sized from `c`; with a sharded `pc`, this rank's heads only.
  explicit AttentionImpl(const ModelConfig& c, const ParallelContext& pc = {})
      : heads_(detail::tp_local_size(c.num_attention_heads, pc, "num_attention_heads")),
        kv_heads_(detail::tp_local_size(c.num_key_value_heads, pc, "num_key_value_heads")),
        head_dim_(c.head_dim) {
    const bool qkv_bias = c.qkv_bias || c.attention_bias;
    const auto H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
    q_proj = register_module("q_proj", ColumnParallelLinear(c.hidden_size, H * D, qkv_bias, pc));
    k_proj = register_module("k_proj", ColumnParallelLinear(c.hidden_size, Hkv * D, qkv_bias, pc));
    v_proj = register_module("v_proj", ColumnParallelLinear(c.hidden_size, Hkv * D, qkv_bias, pc));
    o_proj = register_module("o_proj", RowParallelLinear(H * D, c.hidden_size, c.attention_bias, pc));
  }

  /// q [B, H, T, D], k and v [B, Hkv, T, D] of `x` [B, T, hidden], rotary applied to q and k.
  /// With `cache`, k and v are also stored at their slots there (`*stored` set to whether the
  /// projection did it: in its rotary kernel on CUDA; otherwise the caller stores them).
  std::tuple<at::Tensor, at::Tensor, at::Tensor> project(const at::Tensor& x, const at::Tensor& cos,
                                                         const at::Tensor& sin, const fused::CacheRows* cache = nullptr,
                                                         bool* stored = nullptr) {
    const auto B = x.size(0), T = x.size(1);
    if (stored != nullptr) *stored = false;
    at::Tensor q, k, v;
    if (auto qkv = fused_projection(x); qkv.defined()) {
      if (fused::applies(x) && cos.scalar_type() == x.scalar_type()) {
        // inference on CUDA: one kernel to split, rotate (and store in the cache)
        auto [fq, fk, fv] = fused::qkv_rope(qkv, heads_, kv_heads_, head_dim_, cos, sin, cache);
        if (fq.defined()) {
          if (stored != nullptr) *stored = cache != nullptr;
          return {fq.transpose(1, 2), fk.transpose(1, 2), fv.transpose(1, 2)};
        }
      }
      const auto parts = qkv.split_with_sizes({heads_ * head_dim_, kv_heads_ * head_dim_, kv_heads_ * head_dim_}, -1);
      q = parts[0].view({B, T, heads_, head_dim_});
      k = parts[1].view({B, T, kv_heads_, head_dim_});
      v = parts[2].view({B, T, kv_heads_, head_dim_}).transpose(1, 2);
    } else {
      q = q_proj(x).view({B, T, heads_, head_dim_});
      k = k_proj(x).view({B, T, kv_heads_, head_dim_});
      v = v_proj(x).view({B, T, kv_heads_, head_dim_}).transpose(1, 2);
    }
    if (fused::rope_(q, k, cos, sin)) return {q.transpose(1, 2), k.transpose(1, 2), v};  // inference on CUDA
    return {apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin), v};
  }

  /// Softmax attention of q over k/v (kv heads repeated for GQA); `mask` bool [B,1,Tq,Tk] or undefined.
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                    bool causal) const {
    const auto rep = heads_ / kv_heads_;
    auto kk = rep == 1 ? k : k.repeat_interleave(rep, 1);
    auto vv = rep == 1 ? v : v.repeat_interleave(rep, 1);
    return scaled_dot_product_attention(q, kk, vv, mask, causal, 1.0 / std::sqrt(static_cast<double>(head_dim_)));
  }

  /// o_proj of the attention output [B, H, T, D] → [B, T, hidden].
  at::Tensor output(const at::Tensor& attn) {
    const auto B = attn.size(0), T = attn.size(2);
    return o_proj(attn.transpose(1, 2).reshape({B, T, heads_ * head_dim_}));
  }

  /// Self-attention of `x` under `ctx` (layer index `layer`); with `ctx.attention` the caller does
  /// the attention (KV cache).
  at::Tensor forward(const at::Tensor& x, const LayerContext& ctx, int64_t layer = 0) {
#if HYBRIDRL_HAS_VARLEN_FLASH
    if (ctx.varlen && !ctx.attention) return forward_varlen(x, ctx);
#endif
    std::optional<fused::CacheRows> cache;
    if (ctx.kv_write != nullptr && ctx.attention) {
      const auto& [kc, vc] = ctx.kv_write->caches.at(static_cast<size_t>(layer));
      cache = fused::CacheRows{kc, vc, ctx.kv_write->slot_mapping};
    }
    bool stored = false;
    auto [q, k, v] = project(x, ctx.cos, ctx.sin, cache ? &*cache : nullptr, &stored);
    if (cache && !stored) {  // the caller's attention reads the cache: store this step's keys and values
      const auto B = k.size(0), T = k.size(2);
      write_kv_to_cache(k.transpose(1, 2).reshape({B * T, kv_heads_, head_dim_}),
                        v.transpose(1, 2).reshape({B * T, kv_heads_, head_dim_}), cache->key_cache, cache->value_cache,
                        cache->slot_mapping);
    }
    auto a = ctx.attention ? ctx.attention(layer, q, k, v)
                           : attend(q, k, v, ctx.mask, ctx.causal && !ctx.mask.defined());
    return output(a);
  }

#if HYBRIDRL_HAS_VARLEN_FLASH
  /// Packed sequences in one row (`ctx.varlen`; x [1, N, hidden]): q, k, v stay [N, heads, D] from
  /// the projections to FlashAttention-2's varlen kernel and back to o_proj — no transpose, no
  /// copy to make them contiguous; the rotary is one kernel with its backward on CUDA.
  at::Tensor forward_varlen(const at::Tensor& x, const LayerContext& ctx) {
    const auto& vl = *ctx.varlen;
    const auto N = x.size(1);
    at::Tensor q, k, v;
    if (auto qkv = fused_projection(x); qkv.defined() && ctx.cos.scalar_type() == x.scalar_type()) {
      // one GEMM for q|k|v, one kernel to split and rotate: [1, N, heads, D] in inference; in
      // training [N, heads, D], the kernel's backward writing the GEMM's gradient in one pass
      auto [fq, fk, fv] = fused::qkv_rope(qkv, heads_, kv_heads_, head_dim_, ctx.cos, ctx.sin);
      if (fq.defined()) {
        q = fq[0], k = fk[0], v = fv[0];
      } else {
        // squeeze, not [0]: a select's backward would fill a zero tensor and copy the gradient in
        std::tie(q, k, v) = fused::qkv_rope_train(qkv.squeeze(0), heads_, kv_heads_, head_dim_, ctx.cos[0], ctx.sin[0]);
      }
      if (!q.defined()) {
        const auto parts = qkv.squeeze(0).split_with_sizes({heads_ * head_dim_, kv_heads_ * head_dim_, kv_heads_ * head_dim_}, -1);
        q = apply_rope_rows(parts[0].view({N, heads_, head_dim_}), ctx.cos[0], ctx.sin[0]);
        k = apply_rope_rows(parts[1].view({N, kv_heads_, head_dim_}), ctx.cos[0], ctx.sin[0]);
        v = parts[2].view({N, kv_heads_, head_dim_});
      }
    }
    if (!q.defined()) {
      q = q_proj(x).view({N, heads_, head_dim_});
      k = k_proj(x).view({N, kv_heads_, head_dim_});
      v = v_proj(x).view({N, kv_heads_, head_dim_});
      const auto cos = ctx.cos[0], sin = ctx.sin[0];  // [N, D]
      auto [rq, rk] = fused::rope(q, k, cos, sin);
      if (rq.defined()) {
        q = rq, k = rk;
      } else {
        q = apply_rope_rows(q, cos, sin), k = apply_rope_rows(k, cos, sin);
      }
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
    q = q.to(vl.dtype), k = k.to(vl.dtype), v = v.to(vl.dtype);
    // every row of one length (no window): cuDNN's dense kernel on [rows, heads, length, D] views
    const auto rows = vl.cu_seqlens.size(0) - 1;
    at::Tensor a;
    if (!vl.window && rows * vl.max_seqlen == N) a = detail::compat::dense_cudnn_attention(q, k, v, rows, scale);
    if (!a.defined()) {
      a = detail::compat::varlen_flash_attention(q, k, v, vl.cu_seqlens, vl.cu_seqlens, vl.max_seqlen, vl.max_seqlen,
                                                 scale, vl.window);
    }
    return o_proj(a.view({1, N, heads_ * head_dim_}));
  }
#endif

  /// Makes q_proj, k_proj and v_proj's weights (and biases) slices of one [(H + 2 Hkv) D,
  /// hidden] tensor, so the forward runs one GEMM for the three (see fused_projection). The
  /// parameters keep their names, shapes and values, and writing into them (a weight load) writes
  /// the fused tensor. Should a parameter be re-pointed later (a device or dtype move), the
  /// forward runs the three again. A no-op for a tensor-parallel shard.
  void fuse_projections() {
    if (q_proj->parallel().sharded()) return;
    c10::NoGradGuard ng;
    fuse_rows({&q_proj->weight, &k_proj->weight, &v_proj->weight});
    if (q_proj->bias.defined()) fuse_rows({&q_proj->bias, &k_proj->bias, &v_proj->bias});
  }

  [[nodiscard]] int64_t num_heads() const noexcept { return heads_; }        ///< query heads (this rank's)
  [[nodiscard]] int64_t num_kv_heads() const noexcept { return kv_heads_; }  ///< key/value heads (this rank's)
  [[nodiscard]] int64_t head_dim() const noexcept { return head_dim_; }      ///< per-head size

  ColumnParallelLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr};
  RowParallelLinear o_proj{nullptr};

 private:
  // x's q|k|v projection [..., (H + 2 Hkv) D] in one GEMM where q_proj's, k_proj's and v_proj's
  // weights (and biases) lie back to back in one storage (stacked_rows: after fuse_projections,
  // or gathered in a sharding engine's flat unit) and share x's dtype; undefined otherwise
  at::Tensor fused_projection(const at::Tensor& x) {
    if (q_proj->parallel().sharded() || x.scalar_type() != q_proj->weight.scalar_type()) return {};
    auto w = stacked_rows({q_proj->weight, k_proj->weight, v_proj->weight});
    if (!w.defined()) return {};
    at::Tensor b;
    if (q_proj->bias.defined() && !(b = stacked_rows({q_proj->bias, k_proj->bias, v_proj->bias})).defined()) return {};
    return at::linear(x, w, b);
  }

  int64_t heads_, kv_heads_, head_dim_;
};
/// Module holder of AttentionImpl.
TORCH_MODULE(Attention);

/// SwiGLU feed-forward: `down_proj(silu(gate_proj(x)) * up_proj(x))`; gate/up column-parallel,
/// down row-parallel.
class MLPImpl : public torch::nn::Module {
 public:
  /// Projections sized from `c`; with a sharded `pc`, this rank's intermediate features only.
  explicit MLPImpl(const ModelConfig& c, const ParallelContext& pc = {}) {
    gate_proj = register_module("gate_proj", ColumnParallelLinear(c.hidden_size, c.intermediate_size, c.mlp_bias, pc));
    up_proj = register_module("up_proj", ColumnParallelLinear(c.hidden_size, c.intermediate_size, c.mlp_bias, pc));
    down_proj = register_module("down_proj", RowParallelLinear(c.intermediate_size, c.hidden_size, c.mlp_bias, pc));
  }
  /// The MLP of `x` [..., hidden].
  at::Tensor forward(const at::Tensor& x) {
    if (auto gate_up = fused_projection(x); gate_up.defined()) {
      // one GEMM for gate|up, one kernel for silu(gate) * up (on CUDA; in training its backward
      // writes the GEMM's gradient in one pass)
      auto act = fused::silu_mul_halves(gate_up);
      if (!act.defined()) act = fused::silu_mul_halves_train(gate_up);
      if (!act.defined()) {
        const auto halves = gate_up.chunk(2, -1);
        act = at::silu(halves[0]) * halves[1];
      }
      return down_proj(act);
    }
    auto gate = gate_proj(x), up = up_proj(x);
    auto act = fused::silu_mul(gate, up);                 // inference on CUDA: one kernel
    if (!act.defined()) act = fused::silu_mul_train(gate, up);  // training on CUDA: with its backward
    return down_proj(act.defined() ? act : at::silu(gate) * up);
  }

  /// gate_proj's and up_proj's weights (and biases) become the two halves of one [2 I, hidden]
  /// tensor, one GEMM for both (as AttentionImpl::fuse_projections).
  void fuse_projections() {
    if (gate_proj->parallel().sharded()) return;
    c10::NoGradGuard ng;
    fuse_rows({&gate_proj->weight, &up_proj->weight});
    if (gate_proj->bias.defined()) fuse_rows({&gate_proj->bias, &up_proj->bias});
  }

  ColumnParallelLinear gate_proj{nullptr}, up_proj{nullptr};
  RowParallelLinear down_proj{nullptr};

 private:
  // x's gate|up projection [..., 2 I] in one GEMM where the two weights (and biases) lie back to
  // back in one storage and share x's dtype (as AttentionImpl's); undefined otherwise
  at::Tensor fused_projection(const at::Tensor& x) {
    if (gate_proj->parallel().sharded() || x.scalar_type() != gate_proj->weight.scalar_type()) return {};
    auto w = stacked_rows({gate_proj->weight, up_proj->weight});
    if (!w.defined()) return {};
    at::Tensor b;
    if (gate_proj->bias.defined() && !(b = stacked_rows({gate_proj->bias, up_proj->bias})).defined()) return {};
    return at::linear(x, w, b);
  }
};
/// Module holder of MLPImpl.
TORCH_MODULE(MLP);

/// Pre-norm decoder layer: `x + attn(norm(x))`, then `x + mlp(norm(x))`.
class DecoderLayerImpl : public torch::nn::Module {
 public:
  /// A layer sized from `c` (this rank's shard under a sharded `pc`).
  explicit DecoderLayerImpl(const ModelConfig& c, const ParallelContext& pc = {}) {
    self_attn = register_module("self_attn", Attention(c, pc));
    mlp = register_module("mlp", MLP(c, pc));
    input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
    post_attention_layernorm =
        register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  }
  /// The layer (index `layer`) applied to `x` [B, T, hidden].
  at::Tensor forward(const at::Tensor& x, const LayerContext& ctx, int64_t layer = 0) {
    auto [out, h] = forward_carry(x, at::Tensor(), ctx, layer);
    return h + out;
  }
  /// The same layer with the residual stream carried to the next one (vLLM's decoder layout), for
  /// inference: `x` is the previous layer's MLP output and `residual` the stream it adds to (the
  /// first layer: the embeddings and an undefined residual). Returns {this layer's MLP output, the
  /// stream it adds to}. The stream's add is done by the next norm (one kernel with it on CUDA),
  /// so a layer launches one kernel fewer; forward() is this plus the add, so the values are the
  /// same bit for bit.
  std::pair<at::Tensor, at::Tensor> forward_carry(const at::Tensor& x, const at::Tensor& residual,
                                                  const LayerContext& ctx, int64_t layer = 0) {
    auto [h, normed] = residual.defined() ? input_layernorm->forward_add(x, residual) : input_layernorm->forward_keep(x);
    auto [h2, normed2] = post_attention_layernorm->forward_add(h, self_attn->forward(normed, ctx, layer));
    return {mlp(normed2), h2};
  }

  /// For inference: one GEMM for q|k|v and one for gate|up (AttentionImpl / MLPImpl::fuse_projections).
  void fuse_projections() {
    self_attn->fuse_projections();
    mlp->fuse_projections();
  }

  Attention self_attn{nullptr};
  MLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
/// Module holder of DecoderLayerImpl.
TORCH_MODULE(DecoderLayer);

}  // namespace hybridrl
