#pragma once
/// \file
/// Rollout<Naive>'s engine room: a dense KV cache owned by the caller and the decode step that
/// writes into it and attends over it, through the model's forward_with_attention entry point.
/// All rows advance together; left-padded prompts carry their padding through attention_mask.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/model/attention.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include "hybridrl/model/config.hpp"

namespace hybridrl {

/// A dense KV cache: per layer keys and values [B, kv_heads, capacity, head_dim]; `length`
/// positions are filled and shared by all rows.
struct KVCache {
  std::vector<at::Tensor> keys;    ///< per layer [B, kv_heads, capacity, head_dim]
  std::vector<at::Tensor> values;  ///< per layer [B, kv_heads, capacity, head_dim]
  int64_t length = 0;              ///< filled positions

  /// Zeroed cache for `batch` rows of up to `capacity` tokens of a model with config `c`.
  static KVCache allocate(const ModelConfig& c, int64_t batch, int64_t capacity, at::TensorOptions options) {
    HYBRIDRL_CHECK(batch >= 1 && capacity >= 1,
                   fmt::format("KVCache::allocate: batch = {} and capacity = {} must be >= 1", batch, capacity),
                   "allocate for at least one row and one token");
    KVCache cache;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      cache.keys.push_back(at::zeros({batch, c.num_key_value_heads, capacity, c.head_dim}, options));
      cache.values.push_back(at::zeros({batch, c.num_key_value_heads, capacity, c.head_dim}, options));
    }
    return cache;
  }
  /// Tokens the cache can hold.
  [[nodiscard]] int64_t capacity() const { return keys.empty() ? 0 : keys.front().size(2); }
  /// Rows the cache holds.
  [[nodiscard]] int64_t rows() const { return keys.empty() ? 0 : keys.front().size(0); }
};

/// Incremental decode with a dense cache: writes the k/v of `input_ids` [B, n] at cache positions
/// [length, length+n), attends over [0, length+n), advances `cache.length` and returns logits
/// [B, n, vocab]. args: attention_mask [B, length+n] and position_ids [B, n] (default: from the
/// mask, else length..length+n-1). Needs a full (tp_size 1) model.
inline at::Tensor forward_decode(CausalLM model, const at::Tensor& input_ids, KVCache& cache, const ForwardArgs& args = {}) {
  const auto& c = model->config();
  HYBRIDRL_CHECK(!model->parallel().sharded(), "forward_decode: the model is a tensor-parallel shard",
                 "decode a dense cache with a full model (Rollout<Naive> takes full weights)");
  HYBRIDRL_CHECK(input_ids.dim() == 2 && input_ids.size(1) >= 1,
                 fmt::format("forward_decode: input_ids has shape {}", fmt::join(input_ids.sizes(), "x")),
                 "pass the new tokens as [B, n] with n >= 1");
  const auto B = input_ids.size(0), n = input_ids.size(1), L0 = cache.length, Tk = L0 + n;
  HYBRIDRL_CHECK(static_cast<int64_t>(cache.keys.size()) == c.num_hidden_layers &&
                     cache.values.size() == cache.keys.size(),
                 fmt::format("forward_decode: the cache has {} layers, the model {}", cache.keys.size(),
                             c.num_hidden_layers),
                 "allocate the cache with KVCache::allocate(model->config(), ...)");
  HYBRIDRL_CHECK(cache.keys.front().size(1) == c.num_key_value_heads && cache.keys.front().size(3) == c.head_dim,
                 fmt::format("forward_decode: the cache holds {} kv heads of size {}, the model {} of size {}",
                             cache.keys.front().size(1), cache.keys.front().size(3), c.num_key_value_heads, c.head_dim),
                 "allocate the cache with KVCache::allocate(model->config(), ...)");
  HYBRIDRL_CHECK(Tk <= cache.capacity() && cache.rows() == B,
                 fmt::format("forward_decode: {} cached + {} new tokens for {} rows exceed the cache "
                             "([{} rows, {} positions])", L0, n, B, cache.rows(), cache.capacity()),
                 "allocate a larger cache or generate fewer tokens");
  const auto dev = input_ids.device();
  at::Tensor key_valid;
  if (args.attention_mask().defined()) {
    key_valid = args.attention_mask().to(dev).to(at::kBool);
    HYBRIDRL_CHECK(key_valid.dim() == 2 && key_valid.size(0) == B && key_valid.size(1) == Tk,
                   fmt::format("forward_decode: attention_mask has shape {}, expected {}x{} (rows x cached + new)",
                               fmt::join(key_valid.sizes(), "x"), B, Tk),
                   "pass the mask of every token so far, prompt padding included");
  }
  at::Tensor pos = args.position_ids();
  if (pos.defined()) {
    HYBRIDRL_CHECK(pos.dim() == 2 && pos.size(0) == B && pos.size(1) == n,
                   fmt::format("forward_decode: position_ids has shape {}, expected {}x{} (the new tokens)",
                               fmt::join(pos.sizes(), "x"), B, n),
                   "pass the positions of the new tokens only");
  } else {
    pos = key_valid.defined() ? detail::positions_from_mask(key_valid).narrow(1, L0, n)
                              : at::arange(L0, Tk, at::TensorOptions().dtype(at::kLong).device(dev)).expand({B, n});
  }
  // Qwen2 may mix full and sliding-window layers: one mask for each
  const bool mixed = c.mixed_windows();
  auto mask = detail::attention_mask(B, n, Tk, L0, key_valid, {}, {}, mixed ? std::nullopt : c.layer_window(0), dev);
  auto sliding = mixed ? detail::attention_mask(B, n, Tk, L0, key_valid, {}, {}, c.sliding_window, dev) : at::Tensor();
  auto decoder = model->model;
  auto fn = [&cache, &c, decoder, full = mask, sliding, mixed, L0, n, Tk](int64_t layer, const at::Tensor& q,
                                                                      const at::Tensor& k, const at::Tensor& v) {
    const auto& layer_mask = mixed && c.layer_window(layer) ? sliding : full;
    auto& kc = cache.keys[static_cast<size_t>(layer)];
    auto& vc = cache.values[static_cast<size_t>(layer)];
    kc.narrow(2, L0, n).copy_(k);
    vc.narrow(2, L0, n).copy_(v);
    // layer_mask is undefined only for a prefill from position 0: plain causal then
    return decoder->layer(layer)->self_attn->attend(q, kc.narrow(2, 0, Tk), vc.narrow(2, 0, Tk), layer_mask,
                                                    !layer_mask.defined());
  };
  auto out = model->forward_with_attention(input_ids, pos, fn);
  cache.length = Tk;
  return out;
}

}  // namespace hybridrl
