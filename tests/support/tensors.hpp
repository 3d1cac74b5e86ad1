#pragma once
// Test support: small tensors written out by hand, scalar references the tests compare with, and
// the small checks every suite uses (error text of a call, max difference, random lengths).
#include <hybridrl/core/error.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
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

/// The message of the hybridrl::Error that `f()` throws, or "(no error)".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const hybridrl::Error& e) {
    return e.what();
  }
  return "(no error)";
}
/// True when `s` contains `needle`.
inline bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}
/// max |a − b| over all elements.
inline double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}
/// n lengths uniform in [1, hi] from a seeded std::mt19937 (the same on every platform).
inline std::vector<int64_t> random_lengths(size_t n, int64_t hi, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int64_t> d(1, hi);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace hybridrl::testing
