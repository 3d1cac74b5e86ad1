#pragma once
// Test support: small tensors written out by hand, and scalar references the tests compare with.
#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace hybridrl::testing {

/// A [rows, cols] double tensor from nested lists.
inline at::Tensor mat(const std::vector<std::vector<double>>& m) {
  auto t = at::zeros({static_cast<int64_t>(m.size()), static_cast<int64_t>(m[0].size())}, at::kDouble);
  for (size_t i = 0; i < m.size(); ++i)
    for (size_t j = 0; j < m[i].size(); ++j) t[static_cast<int64_t>(i)][static_cast<int64_t>(j)] = m[i][j];
  return t;
}
/// A 1-D double tensor.
inline at::Tensor vec(const std::vector<double>& v) { return at::tensor(v, at::kDouble); }
/// A bool tensor (at::tensor has no bool overload in LibTorch 1.13).
inline at::Tensor bools(const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).to(at::kBool); }
/// The value of a 0-d (or one-element) tensor.
inline double val(const at::Tensor& t) { return t.item<double>(); }
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
/// −log σ(−x).
inline double softplus(double x) { return std::log1p(std::exp(x)); }

}  // namespace hybridrl::testing
