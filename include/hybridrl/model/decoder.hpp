#pragma once
/// \file
/// The decoder trunk (HF's `LlamaModel`, `model.` in tensor names) and its per-layer runner hook.
/// A LayerRunner runs one decoder layer; the default calls its forward. Activation checkpointing,
/// autocast and a sharding engine's gather-before / free-after are wrappers that compose
/// (`activation_checkpoint_runner(autocast_runner(dtype, fsdp_runner))`): the Decoder has no flags
/// for them. Sharding engines own the knobs (their options) and install the composed runner.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/detail/compat.hpp"
#include "hybridrl/model/activation_checkpoint.hpp"
#include "hybridrl/model/attention.hpp"
#include "hybridrl/model/config.hpp"
#include "hybridrl/model/layers.hpp"
#include "hybridrl/model/parallel.hpp"

namespace hybridrl {

/// Inputs of a forward besides the token ids. All optional:
/// - attention_mask [B, T] (1 real token, 0 padding), left or right padding;
/// - position_ids [B, T]; default: `cumsum(mask) - 1` with a mask (so left padding does not shift
///   positions), restarting at each sequence when packed, else 0..T-1;
/// - cu_seqlens: packed rows. [R, S+1] int (per-row sequence starts, padded by repeating the row's
///   end, as Loader<Packed> writes) or [S+1] for a single row. Tokens after the last boundary, or
///   with attention_mask 0, are padding. May be combined with attention_mask (both must allow a key).
/// For forward_decode, attention_mask covers the cached tokens plus the new ones ([B, length+n])
/// and position_ids the new ones ([B, n]).
struct ForwardArgs {
  HYBRIDRL_ARG(at::Tensor, attention_mask);
  HYBRIDRL_ARG(at::Tensor, position_ids);
  HYBRIDRL_ARG(at::Tensor, cu_seqlens);
};

/// Runs decoder layer `layer` on hidden states `h` [B, T, hidden] under `ctx` and returns its
/// output. Wrappers call an inner runner and add work around it.
using LayerRunner =
    std::function<at::Tensor(int64_t layer, DecoderLayerImpl& module, const at::Tensor& h, const LayerContext& ctx)>;

/// The runner that just calls `module.forward(h, ctx, layer)`.
inline LayerRunner default_layer_runner() {
  return [](int64_t layer, DecoderLayerImpl& module, const at::Tensor& h, const LayerContext& ctx) {
    return module.forward(h, ctx, layer);
  };
}

/// Wraps `inner`: in training mode with grad, the layer keeps no activations and backward reruns
/// `inner` (so a gather-before / free-after inside it runs again for the recompute). Decode
/// (`ctx.attention` set), eval mode and no-grad run `inner` directly.
inline LayerRunner activation_checkpoint_runner(LayerRunner inner = default_layer_runner()) {
  return [inner = std::move(inner)](int64_t layer, DecoderLayerImpl& module, const at::Tensor& h,
                                    const LayerContext& ctx) {
    if (ctx.attention || !module.is_training()) return inner(layer, module, h, ctx);
    auto self = std::dynamic_pointer_cast<DecoderLayerImpl>(module.shared_from_this());
    return activation_checkpoint(
        [inner, self, layer, ctx](const at::Tensor& x) { return inner(layer, *self, x, ctx); }, h,
        module.parameters());
  };
}

/// Wraps `inner` in autocast to `dtype` (bf16 or fp16 matmuls; RMSNorm and softmax stay fp32) on
/// the device of `h` (CUDA or CPU), with the rotary tables in `dtype`. The layer output is in the
/// autocast dtype's promotion with the residual stream (fp32 master weights: fp32).
inline LayerRunner autocast_runner(at::ScalarType dtype, LayerRunner inner = default_layer_runner()) {
  return [dtype, inner = std::move(inner)](int64_t layer, DecoderLayerImpl& module, const at::Tensor& h,
                                           const LayerContext& ctx) {
    detail::compat::AutocastGuard guard(h.device().type(), dtype);
    LayerContext c = ctx;
    c.cos = ctx.cos.to(dtype);
    c.sin = ctx.sin.to(dtype);
    return inner(layer, module, h, c);
  };
}

/// Throws hybridrl::Error when a token id of `ids` lies outside [0, vocab_size). A reduction and a
/// host read: call it where ids are on the CPU (the model's forward does so for CPU ids only, so
/// CUDA forwards never synchronise on it).
inline void check_token_ids(const at::Tensor& ids, int64_t vocab_size, std::string_view what = "input_ids") {
  if (ids.numel() == 0) return;
  auto flat = ids.reshape({-1});
  const auto hi = flat.argmax().item<int64_t>();
  const auto max_id = flat[hi].item<int64_t>();
  HYBRIDRL_CHECK(max_id < vocab_size,
                 fmt::format("{}: token id {} >= vocab_size {} (flat index {})", what, max_id, vocab_size, hi),
                 "tokenize with the model's own tokenizer, or use a config.json whose vocab_size covers it");
  const auto lo = flat.argmin().item<int64_t>();
  const auto min_id = flat[lo].item<int64_t>();
  HYBRIDRL_CHECK(min_id >= 0, fmt::format("{}: token id {} is negative (flat index {})", what, min_id, lo),
                 "replace negative ids (e.g. an ignore index of -100) with the pad id before the forward");
}

/// The decoder trunk, HF's `LlamaModel` (`model.` in tensor names): embed_tokens, layers, norm.
class DecoderImpl : public torch::nn::Module {
 public:
  /// A randomly initialised trunk for `c`, this rank's shard under a sharded `pc` (load weights
  /// with load_causal_lm / load_weights).
  explicit DecoderImpl(const ModelConfig& c, const ParallelContext& pc = {})
      : config_(c), pc_(pc), inv_freq_(rope_inverse_frequencies(c)) {
    c.validate();
    pc.validate();
    embed_tokens = register_module("embed_tokens", VocabParallelEmbedding(c.vocab_size, c.hidden_size, pc));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(DecoderLayer(c, pc));
    norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  }

  /// Final hidden states [B, T, hidden] (after the last norm) of `input_ids` [B, T]; see ForwardArgs.
  at::Tensor forward(const at::Tensor& input_ids, const ForwardArgs& args = {}) {
    auto ids = input_ids.dim() == 1 ? input_ids.unsqueeze(0) : input_ids;
    HYBRIDRL_CHECK(ids.dim() == 2, fmt::format("forward: input_ids has shape {}", fmt::join(ids.sizes(), "x")),
                   "pass token ids [B, T] (or [T] for one sequence)");
    const auto B = ids.size(0), T = ids.size(1);
    const auto dev = ids.device();
    // one sequence given as [T]: its mask and positions may be [T] too
    auto as_rows = [&](const at::Tensor& t) {
      return t.defined() && t.dim() == 1 && input_ids.dim() == 1 ? t.unsqueeze(0) : t;
    };
    const auto am = as_rows(args.attention_mask()), pp = as_rows(args.position_ids());
    check_shape(am, B, T, "attention_mask");
    check_shape(pp, B, T, "position_ids");
    at::Tensor key_valid = am.defined() ? am.to(dev).to(at::kBool) : at::Tensor();
    at::Tensor pos = pp.defined() ? pp.to(dev).to(at::kLong) : at::Tensor();
    at::Tensor seg;
    if (args.cu_seqlens().defined()) {
      auto cu = args.cu_seqlens().to(dev).to(at::kLong);
      if (cu.dim() == 1) cu = cu.unsqueeze(0);
      HYBRIDRL_CHECK(cu.dim() == 2 && cu.size(0) == B && cu.size(1) >= 2,
                     fmt::format("packed forward: cu_seqlens has shape {} but input_ids has {} rows",
                                 fmt::join(cu.sizes(), "x"), B),
                     "pass cu_seqlens [rows, sequences+1] (or [sequences+1] for one row) as Loader<Packed> writes");
      auto t = at::arange(T, at::TensorOptions().dtype(at::kLong).device(dev)).expand({B, T}).contiguous();
      auto ends = cu.narrow(1, 1, cu.size(1) - 1).contiguous();
      seg = at::searchsorted(ends, t, /*out_int32=*/false, /*right=*/true);
      const auto S = ends.size(1);
      auto in_seq = seg.lt(S);
      key_valid = key_valid.defined() ? key_valid.logical_and(in_seq) : in_seq;
      if (!pos.defined()) {
        auto starts = cu.narrow(1, 0, S).gather(1, seg.clamp_max(S - 1));
        pos = (t - starts).clamp_min(0);
      }
    }
    if (!pos.defined()) {
      pos = key_valid.defined() ? detail::positions_from_mask(key_valid)
                                : at::arange(T, at::TensorOptions().dtype(at::kLong).device(dev)).expand({B, T});
    }
    if (key_valid.defined() || seg.defined()) {  // (no padding: plain causal SDPA is flash already)
      if (const auto half = varlen_dtype_of(ids)) return run_unpadded(ids, pos, key_valid, seg, *half);
    }
    // one mask per kind of layer: Qwen2 may mix full and sliding-window layers
    const bool mixed = config_.mixed_windows();
    LayerMasks masks;
    masks.all = detail::attention_mask(B, T, T, 0, key_valid, seg, seg,
                                       mixed ? std::nullopt : config_.layer_window(0), dev);
    if (mixed) masks.sliding = detail::attention_mask(B, T, T, 0, key_valid, seg, seg, config_.sliding_window, dev);
    return run(ids, pos, masks, nullptr);
  }

  /// Hidden states of `input_ids` at `positions` with attention done by `attn_fn` (KV caches);
  /// with `kv_write`, each layer stores its keys and values in those caches before calling
  /// attn_fn (which then only reads them).
  at::Tensor forward_with_attention(const at::Tensor& input_ids, const at::Tensor& positions, const AttentionFn& attn_fn,
                                    const KvWrite* kv_write = nullptr) {
    return run(input_ids, positions.to(input_ids.device()), LayerMasks{}, attn_fn, kv_write);
  }

  /// Installs the per-layer runner (default_layer_runner() when empty): a sharding engine composes
  /// activation checkpointing, autocast and its parameter gather/free here.
  void set_layer_runner(LayerRunner runner) {
    custom_runner_ = static_cast<bool>(runner);
    runner_ = runner ? std::move(runner) : default_layer_runner();
  }
  /// The per-layer runner in use.
  [[nodiscard]] const LayerRunner& layer_runner() const noexcept { return runner_; }
  /// The architecture this trunk was built for.
  [[nodiscard]] const ModelConfig& config() const noexcept { return config_; }
  /// This rank's tensor-parallel place (tp_size 1: the full model).
  [[nodiscard]] const ParallelContext& parallel() const noexcept { return pc_; }
  /// For inference engines: one GEMM for q|k|v and one for gate|up in every layer where the fused
  /// CUDA kernels apply (DecoderLayerImpl::fuse_projections; parameters keep names and values).
  void fuse_projections() {
    for (int64_t i = 0; i < static_cast<int64_t>(layers->size()); ++i) layer(i)->fuse_projections();
  }
  /// The dtype a forward of token ids on `ids`' device attends in through FlashAttention-2's
  /// varlen kernel with the padding removed (CUDA, bf16/fp16 weights or autocast, LibTorch >= 2.6,
  /// fused kernels on), or nullopt where it takes the masked SDPA path.
  [[nodiscard]] std::optional<at::ScalarType> varlen_dtype(const at::Tensor& ids) const { return varlen_dtype_of(ids); }
  /// The layer `i` (for rollout code that calls attention entry points directly).
  [[nodiscard]] DecoderLayer layer(int64_t i) const { return layers->ptr<DecoderLayerImpl>(static_cast<size_t>(i)); }

  VocabParallelEmbedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};

 private:
  static void check_shape(const at::Tensor& t, int64_t B, int64_t T, std::string_view what) {
    HYBRIDRL_CHECK(!t.defined() || (t.dim() == 2 && t.size(0) == B && t.size(1) == T),
                   fmt::format("forward: {} has shape {} but input_ids has {}x{}", what,
                               t.defined() ? fmt::format("{}", fmt::join(t.sizes(), "x")) : "", B, T),
                   fmt::format("pass {} [B, T] matching input_ids", what));
  }

  // The "may attend" mask of every layer (undefined = plain causal) or, where the config mixes
  // full and sliding-window layers, of the full ones, with `sliding` for the others.
  struct LayerMasks {
    at::Tensor all, sliding;
  };

  // Padded or packed rows on CUDA in bf16/fp16 (the weights', or autocast's): the trunk runs on
  // the valid tokens alone, packed into one row, with FlashAttention-2's varlen kernel (verl's
  // remove-padding), so no layer computes a padding token and no [B, T, T] mask is built.
  // (see the public varlen_dtype())
  std::optional<at::ScalarType> varlen_dtype_of(const at::Tensor& ids) const {
#if HYBRIDRL_HAS_VARLEN_FLASH
    if (!ids.is_cuda() || !fused::enabled() || config_.head_dim % 8 != 0 || config_.head_dim > 256) return std::nullopt;
    if (detail::compat::AutocastGuard::enabled(at::kCUDA)) {
      const auto a = detail::compat::AutocastGuard::get_dtype(at::kCUDA);
      if (a == at::kBFloat16 || a == at::kHalf) return a;
    }
    const auto w = embed_tokens->weight.scalar_type();
    if (w == at::kBFloat16 || w == at::kHalf) return w;
#else
    (void)ids;
#endif
    return std::nullopt;
  }

  // The valid tokens of `ids` [B, T] (key_valid, and within a packed row's sequences) as one row;
  // each row's (each packed sequence's) tokens one varlen sequence; hidden states scattered back
  // to [B, T, hidden] (zeros at padding).
  at::Tensor run_unpadded(const at::Tensor& ids, const at::Tensor& pos, const at::Tensor& key_valid,
                          const at::Tensor& seg, at::ScalarType dtype) {
    const auto B = ids.size(0), T = ids.size(1);
    const auto dev = ids.device();
    auto row = at::arange(B, at::TensorOptions().dtype(at::kLong).device(dev)).view({B, 1}).expand({B, T});
    // sequence id of every token: its row, or (row, segment) in packed rows
    auto seq = seg.defined() ? row * (T + 1) + seg : row;
    auto valid = key_valid.defined() ? key_valid : at::ones({B, T}, at::TensorOptions().dtype(at::kBool).device(dev));
    const auto idx = valid.reshape({-1}).nonzero().squeeze(1);  // one host sync: the token count
    const auto N = idx.size(0);
    const bool every = N == B * T;  // no padding (full packed rows): no gather, no scatter back
    const auto ids_p = every ? ids.reshape({1, N}) : ids.reshape({-1}).index_select(0, idx).view({1, N});
    const auto pos_p = every ? pos.reshape({1, N}) : pos.reshape({-1}).index_select(0, idx).view({1, N});
    auto [uniq, inverse, counts] =
        at::unique_consecutive(every ? seq.reshape({-1}) : seq.reshape({-1}).index_select(0, idx), false, true);
    (void)uniq, (void)inverse;
    const auto cu = at::cat({at::zeros({1}, counts.options()), counts.cumsum(0)}).to(at::kInt);
    const auto max_len = N > 0 ? counts.max().item<int64_t>() : 0;
    auto h = embed_tokens(ids_p);
    if (!inv_freq_here_.defined() || inv_freq_here_.device() != dev) inv_freq_here_ = inv_freq_.to(dev);
    auto [cos, sin] = rope_cos_sin(inv_freq_here_, pos_p, h.scalar_type());
    LayerContext ctx{cos, sin, {}, true, nullptr};
    ctx.varlen = LayerContext::Varlen{cu, max_len, std::nullopt, dtype};
    for (int64_t i = 0; i < static_cast<int64_t>(layers->size()); ++i) {
      ctx.varlen->window = config_.layer_window(i);
      h = runner_(i, *layer(i), h, ctx);
    }
    h = norm(h);
    if (every) return h.view({B, T, h.size(-1)});
    return at::zeros({B * T, h.size(-1)}, h.options()).index_copy(0, idx, h.squeeze(0)).view({B, T, h.size(-1)});
  }

  at::Tensor run(const at::Tensor& ids, const at::Tensor& pos, const LayerMasks& masks, const AttentionFn& attn_fn,
                 const KvWrite* kv_write = nullptr) {
    if (ids.device().is_cpu()) check_token_ids(ids, config_.vocab_size);  // CUDA: no sync per forward
    auto h = embed_tokens(ids);
    // the fp32 frequencies on the ids' device, copied once (no host-to-device copy per forward,
    // so a forward can be captured in a CUDA graph)
    if (!inv_freq_here_.defined() || inv_freq_here_.device() != ids.device()) inv_freq_here_ = inv_freq_.to(ids.device());
    auto [cos, sin] = rope_cos_sin(inv_freq_here_, pos, h.scalar_type());
    LayerContext ctx{cos, sin, masks.all, true, attn_fn};
    ctx.kv_write = kv_write;
    const bool mixed = masks.sliding.defined();
    if (!custom_runner_ && !c10::GradMode::is_enabled()) {
      // inference with the plain runner: the residual stream carried across layers, its add done
      // by the next norm (DecoderLayerImpl::forward_carry; the same values, a kernel fewer a layer)
      at::Tensor residual;
      for (int64_t i = 0; i < static_cast<int64_t>(layers->size()); ++i) {
        if (mixed) ctx.mask = config_.layer_window(i) ? masks.sliding : masks.all;
        std::tie(h, residual) = layer(i)->forward_carry(h, residual, ctx, i);
      }
      return residual.defined() ? norm->forward_add(h, residual).second : norm(h);
    }
    for (int64_t i = 0; i < static_cast<int64_t>(layers->size()); ++i) {
      if (mixed) ctx.mask = config_.layer_window(i) ? masks.sliding : masks.all;
      h = runner_(i, *layer(i), h, ctx);
    }
    return norm(h);
  }

  ModelConfig config_;
  ParallelContext pc_;
  at::Tensor inv_freq_;  // fp32, deliberately not a buffer: .to(bf16) must not round it
  at::Tensor inv_freq_here_;  // inv_freq_ on the device of the last forward
  LayerRunner runner_ = default_layer_runner();
  bool custom_runner_ = false;  // set_layer_runner installed one: inference goes through it, layer by layer
};
/// Module holder of DecoderImpl.
TORCH_MODULE(Decoder);

}  // namespace hybridrl
