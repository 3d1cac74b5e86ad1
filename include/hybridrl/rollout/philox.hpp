#pragma once
/// \file
/// Philox-4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
/// SC'11), the counter-based generator of cuRAND and of PyTorch's CUDA generator. A draw is a pure
/// function of a 128-bit counter and a 64-bit key: sampling noise is a function of (seed, sample,
/// position, token) and not of a generator shared by a batch, so a request gets the same tokens
/// whatever else is in the batch and whichever engine (Naive, Paged, CPU, CUDA) runs it.
///
/// Two implementations of the same function: `philox4x32_10` (scalar, host; the CUDA kernels use
/// the same arithmetic) and `philox4x32_10(at::Tensor...)` on int64 tensors of 32-bit values (any
/// device, no host synchronisation). Both reproduce Random123's known-answer vectors.

#include <ATen/ATen.h>

#include <array>
#include <cstdint>

namespace hybridrl {

namespace detail::philox {
inline constexpr uint32_t kM0 = 0xD2511F53u;  ///< round multiplier of lanes 0/1
inline constexpr uint32_t kM1 = 0xCD9E8D57u;  ///< round multiplier of lanes 2/3
inline constexpr uint32_t kW0 = 0x9E3779B9u;  ///< key schedule (golden ratio)
inline constexpr uint32_t kW1 = 0xBB67AE85u;  ///< key schedule (sqrt(3) - 1)
}  // namespace detail::philox

/// One Philox-4x32-10 block: four 32-bit outputs of `counter` under `key`.
constexpr std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) noexcept {
  using namespace detail::philox;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k = {k[0] + kW0, k[1] + kW1};
  }
  return c;
}

namespace detail::philox {
/// hi and lo 32 bits of c * m for c, m < 2^32, without a product above 2^48 (no int64 overflow):
/// c * m = (c * m_hi) * 2^16 + c * m_lo with 16-bit halves of m.
inline std::array<at::Tensor, 2> mul_hi_lo(const at::Tensor& c, uint32_t m) {
  const auto lo_part = c * static_cast<int64_t>(m & 0xFFFFu);  // < 2^48
  const auto s = c * static_cast<int64_t>(m >> 16) + lo_part.__rshift__(16);  // product = s * 2^16 + (lo_part & 0xFFFF)
  return {s.__rshift__(16), s.bitwise_and(0xFFFF).__lshift__(16).bitwise_or(lo_part.bitwise_and(0xFFFF))};
}
}  // namespace detail::philox

/// The same block on tensors: c0..c3 and the key halves k0 / k1 are int64 tensors (broadcastable
/// to one shape; a per-row key is a [B, 1] column) holding values in [0, 2^32). Returns the four
/// output lanes, each int64 in [0, 2^32). Every intermediate stays below 2^49, so the int64
/// arithmetic is exact on every device.
inline std::array<at::Tensor, 4> philox4x32_10(at::Tensor c0, at::Tensor c1, at::Tensor c2, at::Tensor c3, at::Tensor k0,
                                               at::Tensor k1) {
  using namespace detail::philox;
  constexpr int64_t mask32 = 0xFFFFFFFFLL;
  for (int round = 0; round < 10; ++round) {
    auto [hi0, lo0] = mul_hi_lo(c0, kM0);
    auto [hi1, lo1] = mul_hi_lo(c2, kM1);
    c0 = hi1.bitwise_xor(c1).bitwise_xor(k0);
    c1 = lo1;
    c2 = hi0.bitwise_xor(c3).bitwise_xor(k1);
    c3 = lo0;
    k0 = (k0 + static_cast<int64_t>(kW0)).bitwise_and(mask32);
    k1 = (k1 + static_cast<int64_t>(kW1)).bitwise_and(mask32);
  }
  return {c0, c1, c2, c3};
}

/// Uniform floats in (0, 1) from 32-bit draws (int64 tensor): the top 24 bits, centred, so 0 and 1
/// never occur and -log(-log(u)) is finite.
inline at::Tensor uniform_from_bits(const at::Tensor& bits) {
  return (bits.__rshift__(8).to(at::kFloat) + 0.5f) * (1.0f / 16777216.0f);
}

}  // namespace hybridrl
