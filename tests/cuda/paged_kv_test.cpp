// write_kv_to_cache: the LibTorch path against an explicit per-token loop, its errors, and — where
// a CUDA device and the hybridrl::cuda kernels exist — the kernel against the LibTorch path, bit
// for bit (a copy must not change a single bit in any dtype).

#include <hybridrl/cuda/paged_kv.hpp>

#include <ATen/ATen.h>

#include <vector>

#include "../support/doctest.hpp"

using hybridrl::Error;
using hybridrl::write_kv_to_cache;

namespace {

struct Case {
  at::Tensor key, value, key_cache, value_cache, slots;
};

// 6 tokens, 2 heads of 8, a cache of 3 blocks × 4 slots; tokens 1 and 4 are padding (-1).
Case make_case(at::ScalarType dtype, const at::Device& device) {
  at::manual_seed(7);
  Case c;
  c.key = at::randn({6, 2, 8}).to(dtype).to(device);
  c.value = at::randn({6, 2, 8}).to(dtype).to(device);
  c.key_cache = at::full({3, 4, 2, 8}, -5.0).to(dtype).to(device);
  c.value_cache = at::full({3, 4, 2, 8}, -7.0).to(dtype).to(device);
  c.slots = at::tensor(std::vector<int64_t>{9, -1, 0, 5, -1, 11}, at::kLong).to(device);
  return c;
}

}  // namespace

TEST_SUITE("cuda/paged_kv") {
  TEST_CASE("each token lands in its slot; padding and other slots are untouched") {
    auto c = make_case(at::kFloat, at::kCPU);
    const auto k0 = c.key_cache.clone();
    const auto v0 = c.value_cache.clone();
    write_kv_to_cache(c.key, c.value, c.key_cache, c.value_cache, c.slots);
    // Reference: slot s = block s / 4, offset s % 4.
    auto k_ref = k0.clone();
    auto v_ref = v0.clone();
    const std::vector<int64_t> slots{9, -1, 0, 5, -1, 11};
    for (int64_t i = 0; i < 6; ++i) {
      const auto s = slots[static_cast<size_t>(i)];
      if (s < 0) continue;
      k_ref[s / 4][s % 4].copy_(c.key[i]);
      v_ref[s / 4][s % 4].copy_(c.value[i]);
    }
    CHECK(at::equal(c.key_cache, k_ref));
    CHECK(at::equal(c.value_cache, v_ref));
    CHECK(at::equal(c.key_cache[0][1], k0[0][1]));  // slot 1 was nobody's
  }

  TEST_CASE("bad input is an Error naming the problem") {
    auto c = make_case(at::kFloat, at::kCPU);
    auto bad_slots = at::tensor(std::vector<int64_t>{12, -1, 0, 5, -1, 11}, at::kLong);
    CHECK_THROWS_AS(write_kv_to_cache(c.key, c.value, c.key_cache, c.value_cache, bad_slots), Error);
    auto short_slots = at::tensor(std::vector<int64_t>{0, 1}, at::kLong);
    CHECK_THROWS_AS(write_kv_to_cache(c.key, c.value, c.key_cache, c.value_cache, short_slots), Error);
    auto half_cache = c.value_cache.to(at::kHalf);
    CHECK_THROWS_AS(write_kv_to_cache(c.key, c.value, c.key_cache, half_cache, c.slots), Error);
    auto wrong_heads = at::zeros({3, 4, 1, 8});
    CHECK_THROWS_AS(write_kv_to_cache(c.key, c.value, wrong_heads, wrong_heads, c.slots), Error);
  }

  TEST_CASE("the CUDA kernel equals the LibTorch path bit for bit") {
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
    if (!at::hasCUDA()) {
      MESSAGE("no CUDA device: kernel not run");
      return;
    }
    for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
      auto cpu = make_case(dtype, at::kCPU);
      auto gpu = make_case(dtype, at::Device(at::kCUDA, 0));
      write_kv_to_cache(cpu.key, cpu.value, cpu.key_cache, cpu.value_cache, cpu.slots);
      write_kv_to_cache(gpu.key, gpu.value, gpu.key_cache, gpu.value_cache, gpu.slots);
      CHECK(at::equal(gpu.key_cache.cpu(), cpu.key_cache));
      CHECK(at::equal(gpu.value_cache.cpu(), cpu.value_cache));
    }
    // A row that is not a multiple of the 16-byte vector takes the scalar loop.
    auto key = at::randn({3, 1, 5}, at::Device(at::kCUDA, 0));
    auto kc = at::zeros({2, 2, 1, 5}, key.options());
    auto vc = at::zeros({2, 2, 1, 5}, key.options());
    auto slots = at::tensor(std::vector<int64_t>{3, 0, -1}, at::kLong).to(key.device());
    write_kv_to_cache(key, key, kc, vc, slots);
    CHECK(at::equal(kc.view({4, 5})[3].cpu(), key[0][0].cpu()));
    CHECK(at::equal(vc.view({4, 5})[0].cpu(), key[1][0].cpu()));
#else
    MESSAGE("built without hybridrl::cuda: the kernel is tested on CUDA builds");
#endif
  }
}
