#pragma once
/// \file
/// Attention math shared by every forward mode: scaled dot-product attention (LibTorch >= 2's fused
/// SDPA kernels, plain matmul + softmax on 1.13; the version test is HYBRIDRL_HAS_SDPA in
/// detail/compat.hpp), the boolean "may attend" mask of padded / packed / windowed / cached
/// attention, and positions from an attention mask.

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <optional>

#include "hybridrl/detail/compat.hpp"

namespace hybridrl {

/// Scaled dot-product attention. q, k, v: [batch, heads, seq, head_dim] (k/v heads already
/// repeated for GQA); `mask` is a boolean "may attend" mask broadcastable to [batch, heads, q_len,
/// k_len], or undefined for none; `causal` adds the causal mask (aligned to the last key).
inline at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const at::Tensor& mask, bool causal, double scale) {
  auto causal_mask = [&] {
    const auto ql = q.size(-2), kl = k.size(-2);
    return at::ones({ql, kl}, q.options().dtype(at::kBool)).tril(kl - ql);
  };
#if HYBRIDRL_HAS_SDPA
  if (!mask.defined()) return at::scaled_dot_product_attention(q, k, v, {}, 0.0, causal, scale);
  at::Tensor m = causal ? mask.logical_and(causal_mask()) : mask;
  return at::scaled_dot_product_attention(q, k, v, m, 0.0, false, scale);
#else
  auto scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  at::Tensor m = mask;
  if (causal) m = m.defined() ? m.logical_and(causal_mask()) : causal_mask();
  if (m.defined()) scores = scores.masked_fill(m.logical_not(), -std::numeric_limits<float>::infinity());
  // softmax in fp32 at least (double stays double)
  return at::matmul(at::softmax(scores, -1, at::promote_types(q.scalar_type(), at::kFloat)).to(q.scalar_type()), v);
#endif
}

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

}  // namespace detail
}  // namespace hybridrl
