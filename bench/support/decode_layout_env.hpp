#pragma once
// BENCH_DECODE_LAYOUT=tokens|tokens_heads_fast|warp_per_head|warp_per_head_2: the paged decode
// kernel's layout for every engine the bench program makes (cuda::set_decode_layout), to time a
// whole generation or GRPO step with each; unset, the launcher picks.
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
#include <hybridrl/cuda/launchers.hpp>
#endif

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace hybridrl::bench {

inline void apply_decode_layout_env() {
  const char* v = std::getenv("BENCH_DECODE_LAYOUT");
  if (v == nullptr || *v == '\0') return;
#if defined(HYBRIDRL_HAS_CUDA_KERNELS)
  using cuda::DecodeLayout;
  const std::string s(v);
  DecodeLayout l = DecodeLayout::automatic;
  if (s == "tokens") l = DecodeLayout::tokens;
  else if (s == "tokens_heads_fast") l = DecodeLayout::tokens_heads_fast;
  else if (s == "warp_per_head") l = DecodeLayout::warp_per_head;
  else if (s == "warp_per_head_2") l = DecodeLayout::warp_per_head_2;
  else if (s != "automatic") {
    throw std::invalid_argument("BENCH_DECODE_LAYOUT=" + s +
                                ": use tokens, tokens_heads_fast, warp_per_head, warp_per_head_2 or automatic");
  }
  cuda::set_decode_layout(l);
  std::fprintf(stderr, "decode layout: %s\n", s.c_str());
#else
  std::fprintf(stderr, "BENCH_DECODE_LAYOUT ignored: built without hybridrl::cuda\n");
#endif
}

}  // namespace hybridrl::bench
