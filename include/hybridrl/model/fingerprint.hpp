#pragma once
/// \file
/// A fingerprint of a model's weights: 52 bits that change when any byte of any parameter changes
/// (with probability 1 − 2^-52 for a random change), computed where the weights are, CPU or GPU,
/// with one device-to-host copy. The trainer reports the rollout engine's as the metric
/// `rollout/weights_fingerprint` every step: the weights each step generated with, so a weight
/// sync that did not happen (the same fingerprint after an update) or that differs between two
/// runs of one seed is visible in metrics.jsonl.
///
/// The fingerprint is exact: each tensor's bytes are summed with position weights in int64
/// (bytes < 2^8, weights < 2^17, chunks of 2^24 bytes: no sum reaches 2^63, and integer sums do
/// not depend on the order of the reduction), and the sums, the names, dtypes and sizes are
/// mixed on the host. Equal fingerprints on CPU and CUDA mean equal bytes.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hybridrl {

namespace detail {

/// splitmix64's finaliser: a bijection of 64 bits whose every output bit depends on every input bit.
[[nodiscard]] constexpr uint64_t mix64(uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// FNV-1a of a name (stable across builds and platforms, unlike std::hash).
[[nodiscard]] constexpr uint64_t fnv1a(std::string_view s) noexcept {
  uint64_t h = 0xCBF29CE484222325ull;
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  return h;
}

}  // namespace detail

/// The fingerprint of named tensors, in the order given (a model's named_parameters() order):
/// an integer below 2^52, so a double holds it exactly (metrics.jsonl, the mean of equal values).
[[nodiscard]] inline uint64_t weights_fingerprint(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  constexpr int64_t kChunk = int64_t{1} << 24;  // bytes per int64 sum: < 2^24 × 2^8 × 2^17 = 2^49
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> sums;  // one int64 per chunk, on the weights' device
  std::vector<uint64_t> heads;   // per tensor: its name, dtype and size
  std::vector<size_t> firsts;    // per tensor: its first entry in `sums`
  // the position weights (i mod 65521) + 1 for i below the longest chunk these tensors need (not
  // always 2^24: a small model's fingerprint made 128 MB of fresh int64 pages a call, most of the
  // trainer suite's system time on the CPU), on the device of the last tensor
  int64_t longest = 0;
  for (const auto& nt : named) {
    longest = std::max(longest, std::min(kChunk, nt.second.numel() * static_cast<int64_t>(nt.second.element_size())));
  }
  at::Tensor weights;
  for (const auto& [name, tensor] : named) {
    firsts.push_back(sums.size());
    const auto t = tensor.detach().contiguous().view({-1});
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    heads.push_back(detail::mix64(detail::fnv1a(name) ^ detail::mix64(static_cast<uint64_t>(t.scalar_type()) << 48 ^
                                                                      static_cast<uint64_t>(bytes))));
    if (bytes == 0) continue;
    const auto raw = t.view(at::kByte);  // the bytes as they are stored
    if (!weights.defined() || weights.device() != raw.device()) {
      weights = (at::arange(longest, at::TensorOptions().dtype(at::kLong).device(raw.device())) % 65521) + 1;
    }
    for (int64_t at0 = 0; at0 < bytes; at0 += kChunk) {
      const int64_t n = std::min(kChunk, bytes - at0);
      sums.push_back((raw.narrow(0, at0, n).to(at::kLong) * weights.narrow(0, 0, n)).sum());
    }
  }
  firsts.push_back(sums.size());
  std::vector<int64_t> host;
  if (!sums.empty()) {
    const auto all = at::stack(sums).to(at::kCPU);  // one copy from the device
    host.assign(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
  }
  uint64_t h = detail::mix64(named.size());
  for (size_t i = 0; i < heads.size(); ++i) {
    h = detail::mix64(h ^ heads[i]);
    for (size_t k = firsts[i]; k < firsts[i + 1]; ++k) h = detail::mix64(h ^ static_cast<uint64_t>(host[k]));
  }
  return h >> 12;
}

/// The fingerprint of a module's parameters (named_parameters() order), e.g. `policy.ptr()`.
template <class Module>
[[nodiscard]] uint64_t weights_fingerprint(const Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& p : module.named_parameters()) named.emplace_back(p.key(), p.value());
  return weights_fingerprint(named);
}

}  // namespace hybridrl
