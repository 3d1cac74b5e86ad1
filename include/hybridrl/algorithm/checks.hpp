#pragma once
/// \file
/// Argument checks and small masked reductions shared by the algorithm headers (hybridrl::detail).
/// Shape checks never synchronise with the device; value checks (finite inputs) read one boolean
/// back and are used only where a whole batch is processed once (advantages), not per micro-batch.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // formats at::IntArrayRef (tensor shapes)

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "hybridrl/core/error.hpp"

namespace hybridrl::detail {

/// Throws unless `t` is defined and has `dim` dimensions.
inline void check_dims(std::string_view fn, std::string_view name, const at::Tensor& t, int64_t dim) {
  HYBRIDRL_CHECK(t.defined(), fmt::format("{}: '{}' is an undefined tensor", fn, name),
                 fmt::format("pass '{}' as a defined tensor", name));
  HYBRIDRL_CHECK(t.dim() == dim,
                 fmt::format("{}: '{}' must be {}-D but has shape {}", fn, name, dim, t.sizes()),
                 dim == 2 ? std::string("token-level tensors are [batch, response_length]")
                          : std::string("sequence-level tensors are [batch]"));
}

/// Throws unless `t` is a floating-point tensor.
inline void check_floating(std::string_view fn, std::string_view name, const at::Tensor& t) {
  HYBRIDRL_CHECK(at::isFloatingType(t.scalar_type()),
                 fmt::format("{}: '{}' must be a floating-point tensor, got {}", fn, name,
                             std::string(c10::toString(t.scalar_type()))),
                 fmt::format("convert it first, e.g. {}.to(at::kFloat)", name));
}

/// Throws unless `a` and `b` have the same shape.
inline void check_same_shape(std::string_view fn, std::string_view a_name, const at::Tensor& a,
                             std::string_view b_name, const at::Tensor& b) {
  HYBRIDRL_CHECK(a.sizes() == b.sizes(),
                 fmt::format("{}: '{}' has shape {} but '{}' has shape {}", fn, a_name, a.sizes(),
                             b_name, b.sizes()),
                 "pass tensors that describe the same samples and tokens (same [batch, T])");
}

/// Throws when `t` holds a NaN or an infinity (one device→host read).
inline void check_finite(std::string_view fn, std::string_view name, const at::Tensor& t) {
  HYBRIDRL_CHECK(t.numel() == 0 || at::isfinite(t).all().item<bool>(),
                 fmt::format("{}: '{}' contains NaN or infinite values", fn, name),
                 "check the reward function / model outputs that produced it; every value must be "
                 "finite before advantages or losses are computed");
}

/// Throws unless the scalar option `value` is finite.
inline void check_finite_option(std::string_view field, double value) {
  HYBRIDRL_CHECK(std::isfinite(value), fmt::format("{} = {} is not a finite number", field, value),
                 fmt::format("set {} to a finite value", field));
}

/// The mask as a tensor of `dtype` (bool masks become 0/1).
inline at::Tensor mask_as(const at::Tensor& mask, at::ScalarType dtype) {
  return mask.scalar_type() == dtype ? mask : mask.to(dtype);
}

/// Mean of `x` over the mask's 1-entries; 0 when the mask is empty. Detached, for metrics.
inline at::Tensor masked_mean_metric(const at::Tensor& x, const at::Tensor& mask) {
  auto m = mask_as(mask, x.scalar_type());
  return ((x.detach() * m).sum() / m.sum().clamp_min(1.0));
}

}  // namespace hybridrl::detail
