#pragma once
/// \file
/// The library's portable random numbers: SplitMix64 (Vigna's reference generator), the per-epoch
/// seed derivation and a Fisher–Yates shuffle on it. A seed gives the same sequence on every
/// platform and standard library (std::shuffle's algorithm is implementation-defined), so a
/// resumed run reproduces the order of the original one.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace hybridrl::detail {

/// SplitMix64: a tiny, fully specified generator (the outputs of Vigna's splitmix64.c).
class SplitMix64 {
 public:
  /// A generator whose state starts at `seed`.
  explicit constexpr SplitMix64(uint64_t seed) noexcept : state_(seed) {}
  /// The next 64-bit output.
  constexpr uint64_t next() noexcept {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n), without modulo bias (rejection sampling); n must be >= 1.
  uint64_t below(uint64_t n) noexcept {
    const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % n;
    uint64_t x = next();
    while (x >= limit) x = next();
    return x % n;
  }

 private:
  uint64_t state_;
};

/// The seed of one epoch's shuffle, derived from the run's seed (a different stream per epoch).
inline uint64_t epoch_seed(uint64_t seed, int64_t epoch, uint64_t stream = 0) noexcept {
  SplitMix64 g(seed ^ (0xD1B54A32D192ED03ULL * (static_cast<uint64_t>(epoch) + 1)) ^
               (stream * 0x8CB92BA72F3D8DD7ULL));
  return g.next();
}

/// Fisher–Yates with SplitMix64: the same permutation of `v` for the same seed everywhere.
template <class T>
void shuffle(std::vector<T>& v, uint64_t seed) {
  SplitMix64 g(seed);
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[g.below(i)]);
}

}  // namespace hybridrl::detail
