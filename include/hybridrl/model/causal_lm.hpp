#pragma once
/// \file
/// The Llama-family causal LM (Llama, Mistral, Qwen2) and its critic, with every forward mode the
/// trainer and rollout use, all giving the same logits for the same tokens:
/// - padded batch with attention mask (left or right padding): `forward(ids, ForwardArgs{}.attention_mask(m))`;
/// - packed rows (several sequences per row, positions restarting, no attention across them):
///   `forward(ids, ForwardArgs{}.cu_seqlens(cu))`, as Loader<Packed> lays them out;
/// - incremental decode with a caller-owned dense KV cache: `forward_decode(ids, cache)`, or any
///   cache layout through `forward_with_attention(ids, positions, attn_fn)`;
/// - per-token log-probs and entropy computed chunk by chunk over the sequence, so the full
///   [B, T, V] logits never exist at once (`log_probs_and_entropy`, `token_log_probs`).
/// Parameter names equal Hugging Face tensor names (`model.layers.0.self_attn.q_proj.weight`).

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/detail/compat.hpp"
#include "hybridrl/model/checkpointing.hpp"
#include "hybridrl/model/config.hpp"
#include "hybridrl/model/layers.hpp"

namespace hybridrl {

/// Inputs of a forward besides the token ids. All optional:
/// - attention_mask [B, T] (1 real token, 0 padding), left or right padding;
/// - position_ids [B, T]; default: `cumsum(mask) - 1` with a mask (so left padding does not shift
///   positions), restarting at each sequence when packed, else 0..T-1;
/// - cu_seqlens: packed rows. [R, S+1] int (per-row sequence starts, padded by repeating the row's
///   end, as Loader<Packed> writes) or [S+1] for a single row. Tokens after the last boundary, or
///   with attention_mask 0, are padding.
/// For forward_decode, attention_mask covers the cached tokens plus the new ones ([B, length+n])
/// and position_ids the new ones ([B, n]).
struct ForwardArgs {
  HYBRIDRL_ARG(at::Tensor, attention_mask);
  HYBRIDRL_ARG(at::Tensor, position_ids);
  HYBRIDRL_ARG(at::Tensor, cu_seqlens);
};

/// How log_probs_and_entropy works.
struct LogProbOptions {
  /// Sequence positions per chunk: peak logits memory is B × chunk_size × vocab floats.
  HYBRIDRL_ARG(int64_t, chunk_size) = 128;
  /// Logits are divided by this before the softmax (the sampling temperature, as verl does).
  HYBRIDRL_ARG(double, temperature) = 1.0;
  /// Also compute the entropy of each position's distribution.
  HYBRIDRL_ARG(bool, with_entropy) = true;
};

/// Per-token log-probs and entropies, fp32, [B, T] (entropy undefined unless requested).
struct TokenLogProbs {
  at::Tensor log_probs;  ///< log p(label_t | tokens ≤ t)
  at::Tensor entropy;    ///< entropy of p(· | tokens ≤ t)
};

/// A dense KV cache owned by the caller (Rollout<Naive> builds it): per layer keys and values
/// [B, kv_heads, capacity, head_dim]; `length` positions are filled and shared by all rows
/// (left-padded prompts carry their padding through `attention_mask`).
struct KvCache {
  std::vector<at::Tensor> keys;    ///< per layer [B, kv_heads, capacity, head_dim]
  std::vector<at::Tensor> values;  ///< per layer [B, kv_heads, capacity, head_dim]
  int64_t length = 0;              ///< filled positions

  /// Zeroed cache for `batch` rows of up to `capacity` tokens of a model with config `c`.
  static KvCache allocate(const ModelConfig& c, int64_t batch, int64_t capacity, at::TensorOptions options) {
    KvCache cache;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      cache.keys.push_back(at::zeros({batch, c.num_key_value_heads, capacity, c.head_dim}, options));
      cache.values.push_back(at::zeros({batch, c.num_key_value_heads, capacity, c.head_dim}, options));
    }
    return cache;
  }
  /// Tokens the cache can hold.
  [[nodiscard]] int64_t capacity() const { return keys.empty() ? 0 : keys.front().size(2); }
};

namespace detail {

/// Boolean "may attend" mask [B, 1, Tq, Tk] for queries at key indices q_offset..q_offset+Tq-1:
/// causal, within `window` when set, only valid keys (`key_valid` [B, Tk]) and only the same
/// segment (`seg_q` [B, Tq], `seg_k` [B, Tk]) when given. Every query may attend to itself, so a
/// padding row never has an empty softmax (its output is ignored). Undefined when plain causal
/// attention with q_offset 0 says the same.
inline at::Tensor attention_mask(int64_t B, int64_t Tq, int64_t Tk, int64_t q_offset, const at::Tensor& key_valid,
                                 const at::Tensor& seg_q, const at::Tensor& seg_k, std::optional<int64_t> window,
                                 at::Device device) {
  const bool window_bites = window && *window < Tk;
  if (!key_valid.defined() && !seg_q.defined() && !window_bites && q_offset == 0 && Tq == Tk) return {};
  auto qi = at::arange(q_offset, q_offset + Tq, at::TensorOptions().dtype(at::kLong).device(device)).view({Tq, 1});
  auto ki = at::arange(0, Tk, at::TensorOptions().dtype(at::kLong).device(device)).view({1, Tk});
  auto m = ki.le(qi);
  if (window_bites) m = m.logical_and((qi - ki).lt(*window));
  m = m.view({1, 1, Tq, Tk}).expand({B, 1, Tq, Tk});
  if (key_valid.defined()) m = m.logical_and(key_valid.to(device).to(at::kBool).view({B, 1, 1, Tk}));
  if (seg_q.defined()) m = m.logical_and(seg_q.view({B, 1, Tq, 1}).eq(seg_k.view({B, 1, 1, Tk})));
  return m.logical_or(ki.eq(qi).view({1, 1, Tq, Tk}));
}

/// Positions from an attention mask: `cumsum(mask) - 1`, 0 on leading padding.
inline at::Tensor positions_from_mask(const at::Tensor& mask) {
  return (mask.to(at::kLong).cumsum(-1) - 1).clamp_min(0);
}

/// Copies every parameter of `src` into the same-named parameter of `dst` (no grad), by name.
inline void copy_parameters(torch::nn::Module& dst, const torch::nn::Module& src) {
  c10::NoGradGuard no_grad;
  auto from = src.named_parameters();
  for (auto& p : dst.named_parameters()) {
    const auto* s = from.find(p.key());
    HYBRIDRL_CHECK(s != nullptr, fmt::format("copy_parameters: source has no parameter '{}'", p.key()),
                   "copy between models built from the same config");
    p.value().copy_(*s);
  }
}

}  // namespace detail

/// The decoder trunk, HF's `LlamaModel` (`model.` in tensor names): embed_tokens, layers, norm.
class DecoderImpl : public torch::nn::Module {
 public:
  /// A randomly initialised trunk for `c` (load weights with load_causal_lm / load_weights).
  explicit DecoderImpl(const ModelConfig& c) : config_(c), inv_freq_(rope_inverse_frequencies(c)) {
    c.validate();
    embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(DecoderLayer(c));
    norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  }

  /// Final hidden states [B, T, hidden] (after the last norm) of `input_ids` [B, T]; see ForwardArgs.
  at::Tensor forward(const at::Tensor& input_ids, const ForwardArgs& args = {}) {
    auto ids = input_ids.dim() == 1 ? input_ids.unsqueeze(0) : input_ids;
    const auto B = ids.size(0), T = ids.size(1);
    const auto dev = ids.device();
    at::Tensor key_valid = args.attention_mask().defined() ? args.attention_mask().to(dev).to(at::kBool) : at::Tensor();
    at::Tensor pos = args.position_ids().defined() ? args.position_ids().to(dev) : at::Tensor();
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
    auto mask = detail::attention_mask(B, T, T, 0, key_valid, seg, seg, config_.sliding_window, dev);
    return run(ids, pos, mask, nullptr);
  }

  /// Hidden states of `input_ids` at `positions` with attention done by `attn_fn` (KV caches).
  at::Tensor forward_with_attention(const at::Tensor& input_ids, const at::Tensor& positions, const AttentionFn& attn_fn) {
    return run(input_ids, positions.to(input_ids.device()), {}, attn_fn);
  }

  /// Recompute each layer in backward instead of storing its activations (training memory).
  void set_gradient_checkpointing(bool on) { checkpointing_ = on; }
  /// Whether activation checkpointing is on.
  [[nodiscard]] bool gradient_checkpointing() const noexcept { return checkpointing_; }
  /// Run forwards on CUDA under autocast to `dtype` (bf16 mixed precision); std::nullopt: off.
  void set_autocast(std::optional<at::ScalarType> dtype) { autocast_ = dtype; }
  /// The autocast dtype, if any.
  [[nodiscard]] std::optional<at::ScalarType> autocast() const noexcept { return autocast_; }
  /// The architecture this trunk was built for.
  [[nodiscard]] const ModelConfig& config() const noexcept { return config_; }
  /// The layer `i` (for rollout code that calls attention entry points directly).
  [[nodiscard]] DecoderLayer layer(int64_t i) const { return layers->ptr<DecoderLayerImpl>(static_cast<size_t>(i)); }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};

 private:
  at::Tensor run(const at::Tensor& ids, const at::Tensor& pos, const at::Tensor& mask, const AttentionFn& attn_fn) {
    std::optional<detail::compat::AutocastGuard> guard;
    if (autocast_) guard.emplace(ids.device().type(), *autocast_);
    auto h = embed_tokens(ids);
    const auto compute = (autocast_ && ids.is_cuda()) ? *autocast_ : h.scalar_type();
    auto [cos, sin] = rope_cos_sin(inv_freq_, pos, compute);
    LayerContext ctx{cos, sin, mask, true};
    const bool ckpt = checkpointing_ && is_training() && !attn_fn;
    for (int64_t i = 0; i < static_cast<int64_t>(layers->size()); ++i) {
      auto layer = this->layer(i).ptr();
      if (ckpt) {
        auto ac = autocast_;
        auto dev = ids.device().type();
        h = checkpoint(
            [layer, ctx, i, ac, dev](const at::Tensor& x) {
              std::optional<detail::compat::AutocastGuard> g;
              if (ac) g.emplace(dev, *ac);
              return layer->forward(x, ctx, i);
            },
            h, layer->parameters());
      } else {
        h = layer->forward(h, ctx, i, attn_fn);
      }
    }
    return norm(h);
  }

  ModelConfig config_;
  at::Tensor inv_freq_;  // fp32, deliberately not a buffer: .to(bf16) must not round it
  bool checkpointing_ = false;
  std::optional<at::ScalarType> autocast_;
};
/// Module holder of DecoderImpl.
TORCH_MODULE(Decoder);

namespace detail {

/// log-probs of `labels` (and entropies) from `hidden` through the output matrix `weight`
/// [V, hidden], chunk by chunk over dim 1; with grad, each chunk is checkpointed so backward keeps
/// only its hidden slice, never its logits.
inline TokenLogProbs chunked_log_probs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                       const LogProbOptions& o) {
  HYBRIDRL_CHECK(o.chunk_size() > 0 && o.temperature() > 0,
                 fmt::format("LogProbOptions: chunk_size {} and temperature {} must be positive", o.chunk_size(),
                             o.temperature()),
                 "set LogProbOptions{}.chunk_size(n).temperature(t) with n, t > 0");
  HYBRIDRL_CHECK(hidden.dim() == 3 && labels.dim() == 2 && hidden.size(0) == labels.size(0) &&
                     hidden.size(1) == labels.size(1),
                 fmt::format("log_probs_and_entropy: hidden {} and labels {} do not line up",
                             fmt::join(hidden.sizes(), "x"), fmt::join(labels.sizes(), "x")),
                 "pass hidden [B, T, hidden] and labels [B, T] (labels[t] is predicted from hidden[t])");
  const auto T = hidden.size(1);
  const double temp = o.temperature();
  const bool ent = o.with_entropy();
  std::vector<at::Tensor> lp, en;
  for (int64_t t0 = 0; t0 < T; t0 += o.chunk_size()) {
    const auto n = std::min(o.chunk_size(), T - t0);
    auto lab = labels.narrow(1, t0, n).to(hidden.device()).to(at::kLong).unsqueeze(-1);
    auto fn = [weight, lab, temp, ent](const at::Tensor& h) {
      auto logits = at::linear(h, weight);
      logits = logits.to(at::promote_types(logits.scalar_type(), at::kFloat));  // fp32 at least
      if (temp != 1.0) logits = logits / temp;
      auto logp = at::log_softmax(logits, -1);
      auto out = logp.gather(-1, lab);
      if (!ent) return out;
      auto entropy = at::logsumexp(logits, -1, true) - (logp.exp() * logits).sum(-1, true);
      return at::cat({out, entropy}, -1);
    };
    auto r = checkpoint(fn, hidden.narrow(1, t0, n), {weight});
    lp.push_back(r.select(-1, 0));
    if (ent) en.push_back(r.select(-1, 1));
  }
  TokenLogProbs out;
  out.log_probs = at::cat(lp, 1);
  if (ent) out.entropy = at::cat(en, 1);
  return out;
}

}  // namespace detail

/// The causal LM, HF's `LlamaForCausalLM` / `MistralForCausalLM` / `Qwen2ForCausalLM`:
/// the trunk (`model`) and `lm_head` (absent when tied to the embedding).
class CausalLMImpl : public torch::nn::Module {
 public:
  /// A randomly initialised model for `c`.
  explicit CausalLMImpl(const ModelConfig& c) {
    model = register_module("model", Decoder(c));
    if (!c.tie_word_embeddings) {
      lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, c.vocab_size).bias(false)));
    }
  }

  /// Logits [B, T, vocab] (in the compute dtype) of `input_ids` [B, T]; see ForwardArgs.
  at::Tensor forward(const at::Tensor& input_ids, const ForwardArgs& args = {}) {
    return logits(model->forward(input_ids, args));
  }

  /// Final hidden states [B, T, hidden]: feed slices of them to log_probs_and_entropy.
  at::Tensor hidden_states(const at::Tensor& input_ids, const ForwardArgs& args = {}) {
    return model->forward(input_ids, args);
  }

  /// Logits of hidden states (the output projection alone).
  at::Tensor logits(const at::Tensor& hidden) {
    std::optional<detail::compat::AutocastGuard> guard;
    if (model->autocast()) guard.emplace(hidden.device().type(), *model->autocast());
    return at::linear(hidden, output_weight());
  }

  /// Logits of `input_ids` [B, n] at `positions` [B, n], with attention done by `attn_fn` for each
  /// layer (the caller writes k/v into its cache and attends over it: the paged rollout's entry point).
  at::Tensor forward_with_attention(const at::Tensor& input_ids, const at::Tensor& positions, const AttentionFn& attn_fn) {
    return logits(model->forward_with_attention(input_ids, positions, attn_fn));
  }

  /// Incremental decode with a caller-owned dense cache: writes the k/v of `input_ids` [B, n] at
  /// cache positions [length, length+n), attends over [0, length+n), advances `cache.length` and
  /// returns logits [B, n, vocab]. args: attention_mask [B, length+n] and position_ids [B, n]
  /// (default: from the mask, else length..length+n-1).
  at::Tensor forward_decode(const at::Tensor& input_ids, KvCache& cache, const ForwardArgs& args = {}) {
    const auto& c = model->config();
    const auto B = input_ids.size(0), n = input_ids.size(1), L0 = cache.length, Tk = L0 + n;
    HYBRIDRL_CHECK(static_cast<int64_t>(cache.keys.size()) == c.num_hidden_layers &&
                       cache.values.size() == cache.keys.size(),
                   fmt::format("forward_decode: the cache has {} layers, the model {}", cache.keys.size(),
                               c.num_hidden_layers),
                   "allocate the cache with KvCache::allocate(model->config(), ...)");
    HYBRIDRL_CHECK(Tk <= cache.capacity() && cache.keys.front().size(0) == B,
                   fmt::format("forward_decode: {} cached + {} new tokens for {} rows exceed the cache "
                               "([{} rows, {} positions])", L0, n, B, cache.keys.front().size(0), cache.capacity()),
                   "allocate a larger cache or generate fewer tokens");
    const auto dev = input_ids.device();
    at::Tensor key_valid;
    if (args.attention_mask().defined()) {
      key_valid = args.attention_mask().to(dev).to(at::kBool);
      HYBRIDRL_CHECK(key_valid.size(1) == Tk,
                     fmt::format("forward_decode: attention_mask has {} columns, expected {} (cached + new)",
                                 key_valid.size(1), Tk),
                     "pass the mask of every token so far, prompt padding included");
    }
    at::Tensor pos = args.position_ids();
    if (!pos.defined()) {
      pos = key_valid.defined() ? detail::positions_from_mask(key_valid).narrow(1, L0, n)
                                : at::arange(L0, Tk, at::TensorOptions().dtype(at::kLong).device(dev)).expand({B, n});
    }
    auto mask = detail::attention_mask(B, n, Tk, L0, key_valid, {}, {}, c.sliding_window, dev);
    auto decoder = model;
    auto fn = [&cache, decoder, mask, L0, n, Tk](int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v) {
      auto& kc = cache.keys[static_cast<size_t>(layer)];
      auto& vc = cache.values[static_cast<size_t>(layer)];
      kc.narrow(2, L0, n).copy_(k);
      vc.narrow(2, L0, n).copy_(v);
      // mask is undefined only for a prefill from position 0: plain causal then
      return decoder->layer(layer)->self_attn->attend(q, kc.narrow(2, 0, Tk), vc.narrow(2, 0, Tk), mask,
                                                      !mask.defined());
    };
    auto out = forward_with_attention(input_ids, pos, fn);
    cache.length = Tk;
    return out;
  }

  /// log p(labels[b, t] | hidden[b, t]) and entropies, fp32 [B, T], computed `chunk_size` positions
  /// at a time; pass only the hidden positions you need (e.g. the response part).
  TokenLogProbs log_probs_and_entropy(const at::Tensor& hidden, const at::Tensor& labels, const LogProbOptions& o = {}) {
    std::optional<detail::compat::AutocastGuard> guard;
    if (model->autocast()) guard.emplace(hidden.device().type(), *model->autocast());
    return detail::chunked_log_probs(hidden, output_weight(), labels, o);
  }

  /// Next-token log-probs of a batch: entry t is log p(input_ids[t+1] | input_ids[≤t]), [B, T-1].
  TokenLogProbs token_log_probs(const at::Tensor& input_ids, const ForwardArgs& args = {}, const LogProbOptions& o = {}) {
    auto h = hidden_states(input_ids, args);
    const auto T = h.size(1);
    return log_probs_and_entropy(h.narrow(1, 0, T - 1), input_ids.narrow(1, 1, T - 1), o);
  }

  /// The output matrix [vocab, hidden]: lm_head's, or the embedding's when tied.
  [[nodiscard]] at::Tensor output_weight() const {
    return lm_head ? lm_head->weight : model->embed_tokens->weight;
  }
  /// The architecture.
  [[nodiscard]] const ModelConfig& config() const noexcept { return model->config(); }
  /// Activation checkpointing on or off (see DecoderImpl::set_gradient_checkpointing).
  void set_gradient_checkpointing(bool on) { model->set_gradient_checkpointing(on); }
  /// bf16 (or fp16) autocast on CUDA, or std::nullopt for none.
  void set_autocast(std::optional<at::ScalarType> dtype) { model->set_autocast(dtype); }

  Decoder model{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
/// Module holder of CausalLMImpl.
TORCH_MODULE(CausalLM);

/// The critic: the same trunk with a scalar head, HF's `...ForTokenClassification` with one label
/// (`score` = Linear(hidden, 1) with bias), as verl's critic.
class ValueModelImpl : public torch::nn::Module {
 public:
  /// A randomly initialised critic for `c` (score: normal(0, initializer_range), bias 0, as HF).
  explicit ValueModelImpl(const ModelConfig& c) {
    model = register_module("model", Decoder(c));
    score = register_module("score", torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, 1).bias(true)));
    c10::NoGradGuard no_grad;
    score->weight.normal_(0.0, c.initializer_range);
    score->bias.zero_();
  }
  /// Values [B, T] (fp32) of every position; see ForwardArgs.
  at::Tensor forward(const at::Tensor& input_ids, const ForwardArgs& args = {}) {
    auto h = model->forward(input_ids, args);
    std::optional<detail::compat::AutocastGuard> guard;
    if (model->autocast()) guard.emplace(h.device().type(), *model->autocast());
    return score(h).squeeze(-1).to(at::kFloat);
  }
  /// The architecture.
  [[nodiscard]] const ModelConfig& config() const noexcept { return model->config(); }
  /// Activation checkpointing on or off.
  void set_gradient_checkpointing(bool on) { model->set_gradient_checkpointing(on); }
  /// bf16 autocast on CUDA, or std::nullopt for none.
  void set_autocast(std::optional<at::ScalarType> dtype) { model->set_autocast(dtype); }

  Decoder model{nullptr};
  torch::nn::Linear score{nullptr};
};
/// Module holder of ValueModelImpl.
TORCH_MODULE(ValueModel);

/// A critic whose trunk is a copy of `policy`'s (score freshly initialised): verl's critic init.
inline ValueModel make_value_model(const CausalLM& policy) {
  ValueModel v(policy->config());
  const auto p = policy->parameters();
  v->to(p.front().device(), p.front().scalar_type());
  detail::copy_parameters(*v->model, *policy->model);
  return v;
}

/// The frozen reference model: a deep copy of `policy` (same device and dtype) with no grads, in
/// eval mode, sharing no tensor with the policy.
inline CausalLM make_reference(const CausalLM& policy) {
  CausalLM ref(policy->config());
  const auto p = policy->parameters();
  ref->to(p.front().device(), p.front().scalar_type());
  detail::copy_parameters(*ref, *policy);
  for (auto& q : ref->parameters()) q.requires_grad_(false);
  ref->set_autocast(policy->model->autocast());
  ref->eval();
  return ref;
}

}  // namespace hybridrl
