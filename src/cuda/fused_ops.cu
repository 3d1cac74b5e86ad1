// Fused inference kernels of the decoder and the sampler: RMSNorm (with the residual add before
// it), rotary embeddings on q and k in place, SiLU(gate) * up, and one-pass token sampling; and
// for training and scoring, the head's log-prob (and entropy) of labels and SiLU(gate) * up, each
// with its backward. Each
// replaces a chain of LibTorch ops (8 for a norm, ~10 for the rotary of q and k, 2 for the MLP's
// activation, ~170 for a Philox + Gumbel-max draw over the vocabulary) by one launch.
//
// Numerics follow the eager ops they replace, rounding where those round: the rotary and the
// activation round every intermediate the eager bf16/fp16 ops round, so they are bit-identical
// to them; the norm sums its squares in another order (the result may differ by one unit in the
// last place of the output dtype); the sampler computes the same Philox uniforms and Gumbel noise
// with the same float functions (logf), so it draws the same tokens as the tensor path
// (rollout/sampler.hpp), and its log-prob differs only by the summation order of the softmax.
// Host launchers declared in include/hybridrl/cuda/launchers.hpp; the LibTorch-facing entry
// points are in include/hybridrl/cuda/fused.hpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "hybridrl/cuda/launchers.hpp"
#include "launch.cuh"

namespace hybridrl::cuda {
namespace {

template <class T>
__device__ __forceinline__ float to_f(T x);
template <>
__device__ __forceinline__ float to_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/// `x` rounded to T and back: what an eager op producing a T tensor stores.
template <class T>
__device__ __forceinline__ float round_to(float x) { return to_f<T>(from_f<T>(x)); }

/// Sum over the block (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float v, float* shared) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? shared[lane] : 0.0f;
  if (warp == 0) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  const float total = shared[0];
  __syncthreads();  // shared may be reused by the caller
  return total;
}

// ---- RMSNorm, with the residual add before it ----
// out = weight * T(h * rsqrt(mean(h²) + eps)), h = x (+ residual, rounded to T and stored in
// residual_out); rstd (float, per row) gets rsqrt(mean(h²) + eps) when given. One block per row,
// element by element: the kernel for rows the 16-byte one below does not take.
template <class T>
__global__ void rms_norm_kernel(const T* __restrict__ x, const T* __restrict__ residual, T* __restrict__ residual_out,
                                const T* __restrict__ weight, T* __restrict__ out, float* __restrict__ rstd,
                                int64_t dim, float eps) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * dim;
  const T* rr = residual != nullptr ? residual + row * dim : nullptr;
  T* hr = residual_out != nullptr ? residual_out + row * dim : nullptr;
  float sq = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float h = to_f<T>(xr[i]);
    if (rr != nullptr) {
      h = round_to<T>(h + to_f<T>(rr[i]));
      hr[i] = from_f<T>(h);
    }
    sq += h * h;
  }
  const float mean = block_sum(sq, shared) * (1.0f / static_cast<float>(dim));
  const float r = rsqrtf(mean + eps);
  if (rstd != nullptr && threadIdx.x == 0) rstd[row] = r;
  T* o = out + row * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float h = rr != nullptr ? to_f<T>(hr[i]) : to_f<T>(xr[i]);
    o[i] = from_f<T>(to_f<T>(weight[i]) * round_to<T>(h * r));
  }
}

/// The sum of `v` over a block of `warps` full warps with one barrier: each warp's sum goes to
/// `slot[warp]`, and every thread adds the slots up in the same order (the same total in every
/// thread). A caller reducing again before all threads have read the slots passes other slots
/// (two sets, used in turn, are enough: the next barrier orders the reads before the writes).
__device__ __forceinline__ float block_sum_once(float v, float* slot, int warps) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) slot[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += slot[w];
  return total;
}

/// 16 bytes of T as floats, and back.
template <class T>
__device__ __forceinline__ void unpack16(const uint4& p, float* f) {
  const T* t = reinterpret_cast<const T*>(&p);
#pragma unroll
  for (int k = 0; k < static_cast<int>(16 / sizeof(T)); ++k) f[k] = to_f<T>(t[k]);
}
template <class T>
__device__ __forceinline__ uint4 pack16(const float* f) {
  uint4 p;
  T* t = reinterpret_cast<T*>(&p);
#pragma unroll
  for (int k = 0; k < static_cast<int>(16 / sizeof(T)); ++k) t[k] = from_f<T>(f[k]);
  return p;
}

// The same norm in 16-byte packs (dim a multiple of N = 16 / sizeof(T), rows 16-byte aligned): a
// row per block of a few warps, each thread holding P packs of it in registers — the weights
// loaded first (they do not depend on the row), the sum of squares reduced with shuffles and one
// barrier, the row never read twice. At decode's 256-512 rows this is the shape that keeps the
// most loads in flight: a warp per row (tried) leaves each lane walking its chunks one after
// another, a block per row with 2-byte accesses (the kernel above) issues 8 times the loads.
// The arithmetic per element is the kernel above's.
template <class T, int P>
__global__ void rms_norm_vec_kernel(const T* __restrict__ x, const T* __restrict__ residual,
                                    T* __restrict__ residual_out, const T* __restrict__ weight, T* __restrict__ out,
                                    float* __restrict__ rstd, int64_t dim, float eps) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  constexpr int N = 16 / sizeof(T);
  __shared__ float slot[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
  const int chunks = static_cast<int>(dim / N);
  uint4 w[P];
  float h[P][N];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int c = threadIdx.x + p * blockDim.x;
    if (c < chunks) w[p] = *reinterpret_cast<const uint4*>(weight + c * N);
  }
  float sq = 0.0f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int c = threadIdx.x + p * blockDim.x;
    if (c >= chunks) continue;
    unpack16<T>(*reinterpret_cast<const uint4*>(x + base + c * N), h[p]);
    if (residual != nullptr) {
      float r[N];
      unpack16<T>(*reinterpret_cast<const uint4*>(residual + base + c * N), r);
#pragma unroll
      for (int k = 0; k < N; ++k) h[p][k] = round_to<T>(h[p][k] + r[k]);
      *reinterpret_cast<uint4*>(residual_out + base + c * N) = pack16<T>(h[p]);
    }
#pragma unroll
    for (int k = 0; k < N; ++k) sq += h[p][k] * h[p][k];
  }
  const float mean = block_sum_once(sq, slot, blockDim.x / 32) * (1.0f / static_cast<float>(dim));
  const float r = rsqrtf(mean + eps);
  if (rstd != nullptr && threadIdx.x == 0) rstd[blockIdx.x] = r;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int c = threadIdx.x + p * blockDim.x;
    if (c >= chunks) continue;
    float wf[N], o[N];
    unpack16<T>(w[p], wf);
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = wf[k] * round_to<T>(h[p][k] * r);
    *reinterpret_cast<uint4*>(out + base + c * N) = pack16<T>(o);
  }
}

// The norm's backward for training, 16-byte packs as above: from h (the norm's input), dy (the
// output's gradient), rstd (the forward's) and, for a norm with the residual add before it, dres
// (the gradient h receives from the residual stream):
//   dx = r · (w·dy − x̂ · mean(w·dy · x̂)) + dres,  x̂ = h·r,   (float, rounded once)
//   dw = Σ_rows dy · T(x̂)                                    (the forward multiplies w by T(x̂))
// A block walks rows blockIdx.x, + gridDim.x, …, keeping its share of dw in registers, and writes
// it to dw_partial [gridDim.x, dim] (float): the caller sums the blocks. One read of h and dy per
// row; the weights read once per block.
template <class T>
__global__ void __launch_bounds__(1024) rms_norm_backward_vec_kernel(const T* __restrict__ h, const T* __restrict__ dy,
                                             const T* __restrict__ dres, const T* __restrict__ weight,
                                             const float* __restrict__ rstd, T* __restrict__ dx,
                                             float* __restrict__ dw_partial, int64_t rows, int64_t dim) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  // one 16-byte pack of the row per thread (rows up to 1024 packs; wider rows take LibTorch's
  // kernel: four packs a thread ran out of registers at 1024 threads)
  constexpr int N = 16 / sizeof(T);
  __shared__ float slots[2][32];
  const int c = threadIdx.x;
  const bool live = c < static_cast<int>(dim / N);
  const int warps = blockDim.x / 32;
  float w[N], acc[N];
  if (live) unpack16<T>(*reinterpret_cast<const uint4*>(weight + c * N), w);
#pragma unroll
  for (int k = 0; k < N; ++k) acc[k] = 0.0f;
  int turn = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x, turn ^= 1) {
    const int64_t base = row * dim;
    const float r = rstd[row];
    float xh[N], g[N];
    float dot = 0.0f;
    if (live) {
      float hv[N], dv[N];
      unpack16<T>(*reinterpret_cast<const uint4*>(h + base + c * N), hv);
      unpack16<T>(*reinterpret_cast<const uint4*>(dy + base + c * N), dv);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        xh[k] = hv[k] * r;
        g[k] = dv[k] * w[k];
        dot += g[k] * xh[k];
        acc[k] += dv[k] * round_to<T>(xh[k]);
      }
    }
    const float mean = block_sum_once(dot, slots[turn], warps) * (1.0f / static_cast<float>(dim));
    if (live) {
      float o[N];
      if (dres != nullptr) {
        unpack16<T>(*reinterpret_cast<const uint4*>(dres + base + c * N), o);
      } else {
#pragma unroll
        for (int k = 0; k < N; ++k) o[k] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < N; ++k) o[k] += r * (g[k] - xh[k] * mean);
      *reinterpret_cast<uint4*>(dx + base + c * N) = pack16<T>(o);
    }
  }
  if (live) {
    float* d = dw_partial + static_cast<int64_t>(blockIdx.x) * dim + c * N;
#pragma unroll
    for (int k = 0; k < N; k += 4) *reinterpret_cast<float4*>(d + k) = make_float4(acc[k], acc[k + 1], acc[k + 2], acc[k + 3]);
  }
}

// ---- rotary embeddings of q and k (and v's copy) ----
// Rows of q [tokens, heads, D], k and v [tokens, kv_heads, D] are read `*_stride` elements apart
// (the slices of one fused q|k|v projection, or separate tensors) and written `*_out_stride`
// apart (contiguous tensors, or the slices of one fused gradient; in place when out == in): x_i ← x_i cos_i − x_{i+D/2} sin_i, x_{i+D/2} ← x_{i+D/2} cos_{i+D/2} +
// x_i sin_{i+D/2}, each product and the sum rounded to T (HF's rotate_half form as eager ops
// compute it; __fmul_rn keeps the compiler from contracting a product and the sum into an FMA,
// which rounds once). cos / sin [tokens, D]. One block per token; q's heads, then k's, then v's.
template <class T>
__global__ void rope_kernel(const T* q_in, const T* k_in, const T* v_in, int64_t q_stride, int64_t k_stride,
                            int64_t v_stride, T* q_out, T* k_out, T* v_out, int64_t q_out_stride,
                            int64_t k_out_stride, int64_t v_out_stride, const T* __restrict__ cos,
                            const T* __restrict__ sin, int heads, int kv_heads, int head_dim, T* key_cache,
                            T* value_cache, const int64_t* __restrict__ slots, int64_t num_slots) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  const int64_t token = blockIdx.x;
  int64_t slot = slots != nullptr ? slots[token] : -1;
  if (slot >= num_slots) slot = -1;  // outside the cache: skipped, as write_kv_to_cache's kernel does
  T* kc = slot >= 0 ? key_cache + slot * kv_heads * head_dim : nullptr;
  T* vc = slot >= 0 ? value_cache + slot * kv_heads * head_dim : nullptr;
  const int half = head_dim / 2;
  const T* c = cos + token * head_dim;
  const T* s = sin + token * head_dim;
  const int pairs = (heads + kv_heads) * half;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int head = p / half, i = p % half;
    const bool is_q = head < heads;
    const int h = is_q ? head : head - heads;
    const T* x = (is_q ? q_in + token * q_stride : k_in + token * k_stride) + h * head_dim;
    T* y = (is_q ? q_out + token * q_out_stride : k_out + token * k_out_stride) + h * head_dim;
    const float a = to_f<T>(x[i]), b = to_f<T>(x[i + half]);
    const float lo = round_to<T>(round_to<T>(__fmul_rn(a, to_f<T>(c[i]))) + round_to<T>(__fmul_rn(-b, to_f<T>(s[i]))));
    const float hi =
        round_to<T>(round_to<T>(__fmul_rn(b, to_f<T>(c[i + half]))) + round_to<T>(__fmul_rn(a, to_f<T>(s[i + half]))));
    y[i] = from_f<T>(lo);
    y[i + half] = from_f<T>(hi);
    if (!is_q && kc != nullptr) {
      kc[h * head_dim + i] = from_f<T>(lo);
      kc[h * head_dim + i + half] = from_f<T>(hi);
    }
  }
  if (v_in != nullptr) {
    const int n = kv_heads * head_dim;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
      v_out[token * v_out_stride + e] = v_in[token * v_stride + e];
      if (vc != nullptr) vc[e] = v_in[token * v_stride + e];
    }
  }
}

// The same, 8 pairs per thread with 16-byte loads and stores (rows and pointers 16-byte aligned,
// head_dim / 2 a multiple of 8): a thread takes x[i..i+8) and x[i+half..i+half+8) of one head of
// one token, so a block covers several tokens (the kernel above gives each token a block, and its
// 2-byte accesses left it at a third of the memory bandwidth on training's [tokens x heads] rows).
// The arithmetic per element is the kernel above's: bit-identical results.
template <class T>
__global__ void rope_vec_kernel(const T* q_in, const T* k_in, const T* v_in, int64_t q_stride, int64_t k_stride,
                                int64_t v_stride, T* q_out, T* k_out, T* v_out, int64_t q_out_stride,
                                int64_t k_out_stride, int64_t v_out_stride, const T* __restrict__ cos,
                                const T* __restrict__ sin, int64_t tokens, int heads, int kv_heads, int head_dim,
                                T* key_cache, T* value_cache, const int64_t* __restrict__ slots, int64_t num_slots) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  constexpr int N = 16 / sizeof(T);
  using P = uint4;
  const int half = head_dim / 2, chunks = half / N;  // per head
  const int per_token = (heads + kv_heads) * chunks;
  const int v_chunks = v_in != nullptr ? kv_heads * head_dim / N : 0;
  const int64_t items = tokens * (per_token + v_chunks);
  for (int64_t it = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; it < items;
       it += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t token = it / (per_token + v_chunks);
    const int w = static_cast<int>(it - token * (per_token + v_chunks));
    int64_t slot = slots != nullptr ? slots[token] : -1;  // the token's cache row (−1: none)
    if (slot >= num_slots) slot = -1;                    // outside the cache: skipped
    if (w >= per_token) {  // v's copy
      const int e = (w - per_token) * N;
      const P val = *reinterpret_cast<const P*>(v_in + token * v_stride + e);
      *reinterpret_cast<P*>(v_out + token * v_out_stride + e) = val;
      if (slot >= 0) *reinterpret_cast<P*>(value_cache + slot * kv_heads * head_dim + e) = val;
      continue;
    }
    const int head = w / chunks, i0 = (w % chunks) * N;
    const bool is_q = head < heads;
    const int h = is_q ? head : head - heads;
    const T* x = (is_q ? q_in + token * q_stride : k_in + token * k_stride) + h * head_dim;
    T* y = (is_q ? q_out + token * q_out_stride : k_out + token * k_out_stride) + h * head_dim;
    const T* c = cos + token * head_dim;
    const T* sn = sin + token * head_dim;
    P xa = *reinterpret_cast<const P*>(x + i0), xb = *reinterpret_cast<const P*>(x + i0 + half);
    const P ca = *reinterpret_cast<const P*>(c + i0), cb = *reinterpret_cast<const P*>(c + i0 + half);
    const P sa = *reinterpret_cast<const P*>(sn + i0), sb = *reinterpret_cast<const P*>(sn + i0 + half);
    const T* a = reinterpret_cast<const T*>(&xa);
    const T* b = reinterpret_cast<const T*>(&xb);
    P ya, yb;
    T* lo = reinterpret_cast<T*>(&ya);
    T* hi = reinterpret_cast<T*>(&yb);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float av = to_f<T>(a[k]), bv = to_f<T>(b[k]);
      const float c0 = to_f<T>(reinterpret_cast<const T*>(&ca)[k]), c1 = to_f<T>(reinterpret_cast<const T*>(&cb)[k]);
      const float s0 = to_f<T>(reinterpret_cast<const T*>(&sa)[k]), s1 = to_f<T>(reinterpret_cast<const T*>(&sb)[k]);
      lo[k] = from_f<T>(round_to<T>(round_to<T>(__fmul_rn(av, c0)) + round_to<T>(__fmul_rn(-bv, s0))));
      hi[k] = from_f<T>(round_to<T>(round_to<T>(__fmul_rn(bv, c1)) + round_to<T>(__fmul_rn(av, s1))));
    }
    *reinterpret_cast<P*>(y + i0) = ya;
    *reinterpret_cast<P*>(y + i0 + half) = yb;
    if (!is_q && slot >= 0) {
      T* kc = key_cache + slot * kv_heads * head_dim + h * head_dim;
      *reinterpret_cast<P*>(kc + i0) = ya;
      *reinterpret_cast<P*>(kc + i0 + half) = yb;
    }
  }
}

// ---- SiLU(gate) * up, and its backward ----
// gate and up rows `in_stride` elements apart (the halves of one fused gate|up projection, or
// separate tensors), out [rows, cols] contiguous. A block row per matrix row (no 64-bit division
// per element), N elements per thread step: 16 bytes when every row allows it, else 1.
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

/// silu(g) · u as the eager ops compute it: silu rounded to T, the product rounded once
/// (__fmul_rn: no contraction into an FMA with anything around it).
template <class T>
__device__ __forceinline__ T silu_mul_value(float g, float u) {
  const float act = round_to<T>(g / (1.0f + expf(-g)));
  return from_f<T>(__fmul_rn(act, u));
}

template <class T, int N>
__global__ void silu_mul_kernel(const T* __restrict__ gate, const T* __restrict__ up, int64_t in_stride,
                                T* __restrict__ out, int64_t rows, int64_t cols) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  const int64_t groups = cols / N;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const auto* g = reinterpret_cast<const Pack<T, N>*>(gate + r * in_stride);
    const auto* u = reinterpret_cast<const Pack<T, N>*>(up + r * in_stride);
    auto* o = reinterpret_cast<Pack<T, N>*>(out + r * cols);
    for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < groups;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const Pack<T, N> gv = g[c], uv = u[c];
      Pack<T, N> ov;
#pragma unroll
      for (int k = 0; k < N; ++k) ov.v[k] = silu_mul_value<T>(to_f<T>(gv.v[k]), to_f<T>(uv.v[k]));
      o[c] = ov;
    }
  }
}

// The backward of out = silu(g) · u, in float from the T inputs, each gradient rounded once:
//   ∂u = ∂out · silu(g),   ∂g = ∂out · u · σ(g) · (1 + g · (1 − σ(g)))
// (the eager backward rounds ∂out · u and ∂out · silu(g) to T first: this is one rounding
// closer to the exact gradient). gate / up rows `in_stride` elements apart, their gradients'
// `out_stride` apart (separate tensors, or the halves of one fused gate|up projection and of its
// gradient), grad_out [rows, cols] contiguous; a block row per matrix row, as the forward.
template <class T, int N>
__global__ void silu_mul_backward_kernel(const T* __restrict__ gate, const T* __restrict__ up, int64_t in_stride,
                                         const T* __restrict__ grad_out, T* __restrict__ grad_gate,
                                         T* __restrict__ grad_up, int64_t out_stride, int64_t rows, int64_t cols) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  const int64_t groups = cols / N;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const auto* g = reinterpret_cast<const Pack<T, N>*>(gate + r * in_stride);
    const auto* u = reinterpret_cast<const Pack<T, N>*>(up + r * in_stride);
    const auto* d = reinterpret_cast<const Pack<T, N>*>(grad_out + r * cols);
    auto* dg = reinterpret_cast<Pack<T, N>*>(grad_gate + r * out_stride);
    auto* du = reinterpret_cast<Pack<T, N>*>(grad_up + r * out_stride);
    for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < groups;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const Pack<T, N> gv = g[c], uv = u[c], dv = d[c];
      Pack<T, N> gg, gu;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float x = to_f<T>(gv.v[k]), y = to_f<T>(uv.v[k]), dy = to_f<T>(dv.v[k]);
        const float sig = 1.0f / (1.0f + expf(-x));
        gu.v[k] = from_f<T>(dy * (x * sig));
        gg.v[k] = from_f<T>(dy * y * sig * (1.0f + x * (1.0f - sig)));
      }
      dg[c] = gg;
      du[c] = gu;
    }
  }
}

// ---- AdamW over one fp32 tensor ----
// torch.optim.AdamW's step (decoupled weight decay, bias-corrected, no amsgrad) in float, the
// order of torch's fused kernel: g ← g / inv_scale (when given: the clip factor's reciprocal, read
// on the device), p ← p − lr·wd·p, m ← β1·m + (1 − β1)·g, v ← β2·v + (1 − β2)·g², p ← p −
// step_size · m / (√v / √bc2 + eps). Reads p, g, m, v and writes p, m, v once (16-byte packs):
// torch's kernel also writes the scaled gradient back, a fifth pass the step does not need.
// With a copy pointer (C not float: bf16 or fp16) the new parameter is also written there,
// rounded to C: the compute copy the next forward reads, with no cast kernel of its own.
template <int N, class C = float>
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, int64_t n, float lr_wd, float beta1, float beta2, float eps,
                             float step_size, float bc2_sqrt, const float* __restrict__ inv_scale,
                             C* __restrict__ copy = nullptr) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  const float inv = inv_scale != nullptr ? *inv_scale : 1.0f;
  const int64_t groups = n / N;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < groups;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Pack<float, N> pp = reinterpret_cast<Pack<float, N>*>(p)[i];
    const Pack<float, N> gg = reinterpret_cast<const Pack<float, N>*>(g)[i];
    Pack<float, N> mm = reinterpret_cast<Pack<float, N>*>(m)[i];
    Pack<float, N> vv = reinterpret_cast<Pack<float, N>*>(v)[i];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float gr = inv_scale != nullptr ? gg.v[k] / inv : gg.v[k];
      float pr = pp.v[k];
      pr -= lr_wd * pr;
      mm.v[k] = beta1 * mm.v[k] + (1.0f - beta1) * gr;
      vv.v[k] = beta2 * vv.v[k] + (1.0f - beta2) * gr * gr;
      const float denom = sqrtf(vv.v[k]) / bc2_sqrt + eps;
      pp.v[k] = pr - step_size * mm.v[k] / denom;
    }
    reinterpret_cast<Pack<float, N>*>(p)[i] = pp;
    reinterpret_cast<Pack<float, N>*>(m)[i] = mm;
    reinterpret_cast<Pack<float, N>*>(v)[i] = vv;
    if constexpr (!std::is_same_v<C, float>) {
      Pack<C, N> cc;
#pragma unroll
      for (int k = 0; k < N; ++k) cc.v[k] = from_f<C>(pp.v[k]);
      reinterpret_cast<Pack<C, N>*>(copy)[i] = cc;
    }
  }
}

// ---- a unit's gradients cast into its flat float buffer, one launch ----
// Each piece is a source tensor (or none: zeros) written to dst[offset, offset + n) in float.
// Blocks are dealt to the pieces in order (block_start), each block covering pack_span<N>() elements
// of one piece: N-element loads (16 bytes of the source) where the piece allows them, else one by one.
constexpr int kPackThreads = 256, kPackSteps = 4;
template <int N>
__host__ __device__ constexpr int64_t pack_span() { return int64_t{kPackThreads} * N * kPackSteps; }

template <class S, int N>
__global__ void pack_flat_kernel(FlatPieces pieces, float* __restrict__ dst) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  int p = 0;
  while (p + 1 < pieces.count && static_cast<int64_t>(blockIdx.x) >= pieces.block_start[p + 1]) ++p;
  const int64_t n = pieces.n[p];
  const S* src = static_cast<const S*>(pieces.src[p]);
  float* out = dst + pieces.offset[p];
  const int64_t base = (static_cast<int64_t>(blockIdx.x) - pieces.block_start[p]) * pack_span<N>();
  const bool vec = pieces.vec[p] != 0;
#pragma unroll
  for (int k = 0; k < kPackSteps; ++k) {
    const int64_t i = base + (static_cast<int64_t>(k) * kPackThreads + threadIdx.x) * N;
    if (vec && i + N <= n) {
      float o[N];
      if (src != nullptr) {
        const Pack<S, N> x = *reinterpret_cast<const Pack<S, N>*>(src + i);
#pragma unroll
        for (int j = 0; j < N; ++j) o[j] = to_f<S>(x.v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < N; ++j) o[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < N; j += 4) {  // 16-byte stores (dst is 16-byte aligned where vec)
        *reinterpret_cast<Pack<float, 4>*>(out + i + j) = Pack<float, 4>{{o[j], o[j + 1], o[j + 2], o[j + 3]}};
      }
    } else {
      for (int64_t j = i; j < i + N && j < n; ++j) out[j] = src != nullptr ? to_f<S>(src[j]) : 0.0f;
    }
  }
}

// ---- sampling: Philox-4x32-10 + Gumbel-max, and the log-softmax at the drawn token ----
struct Philox {
  uint32_t x[4];
};
__device__ __forceinline__ Philox philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                                uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(kM0, c0), lo0 = kM0 * c0;
    const uint32_t hi1 = __umulhi(kM1, c2), lo1 = kM1 * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

/// The running state of one thread (or warp, block) over a row: the best Gumbel score and its
/// token (the lowest index among ties, as argmax), the tempered logit there, and the online
/// softmax's max and sum.
struct DrawState {
  float best = -INFINITY;
  int64_t token = INT64_MAX;
  float z_at = 0.0f;
  float m = -INFINITY;
  float s = 0.0f;
};

__device__ __forceinline__ void merge(DrawState& a, const DrawState& b) {
  if (b.best > a.best || (b.best == a.best && b.token < a.token)) {
    a.best = b.best;
    a.token = b.token;
    a.z_at = b.z_at;
  }
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return;
  a.s = (a.m == -INFINITY ? 0.0f : a.s * expf(a.m - m)) + (b.m == -INFINITY ? 0.0f : b.s * expf(b.m - m));
  a.m = m;
}

__device__ __forceinline__ DrawState shfl_xor(const DrawState& d, int o) {
  DrawState r;
  r.best = __shfl_xor_sync(0xffffffffu, d.best, o);
  r.token = __shfl_xor_sync(0xffffffffu, d.token, o);
  r.z_at = __shfl_xor_sync(0xffffffffu, d.z_at, o);
  r.m = __shfl_xor_sync(0xffffffffu, d.m, o);
  r.s = __shfl_xor_sync(0xffffffffu, d.s, o);
  return r;
}

__device__ __forceinline__ void add_token(DrawState& d, float z, float score, int64_t v) {
  if (score > d.best || (score == d.best && v < d.token)) {
    d.best = score;
    d.token = v;
    d.z_at = z;
  }
  if (z > d.m) {
    d.s = (d.m == -INFINITY ? 0.0f : d.s * expf(d.m - z)) + 1.0f;
    d.m = z;
  } else if (z != -INFINITY) {
    d.s += expf(z - d.m);
  }
}

constexpr int kSampleThreads = 512;

// One block per row. Thread t takes the Philox blocks t, t + blockDim, ... (4 tokens each).
template <class T>
__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const T* __restrict__ logits, int64_t vocab, int64_t row_stride, float inv_temperature, bool greedy,
                  const int64_t* __restrict__ seeds, const int64_t* __restrict__ samples,
                  const int64_t* __restrict__ positions, int64_t* __restrict__ tokens, float* __restrict__ log_probs) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  __shared__ DrawState shared[kSampleThreads / 32];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * row_stride;
  const uint64_t seed = static_cast<uint64_t>(seeds[row]);
  const uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  const uint32_t c1 = static_cast<uint32_t>(positions[row]), c2 = static_cast<uint32_t>(samples[row]);
  DrawState d;
  const int64_t blocks = (vocab + 3) / 4;
  for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) {
    Philox r{};
    if (!greedy) r = philox4x32_10(static_cast<uint32_t>(b), c1, c2, 0u, k0, k1);
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t v = 4 * b + lane;
      if (v >= vocab) break;
      const float raw = to_f<T>(x[v]);
      if (greedy) {
        add_token(d, raw, raw, v);
      } else {
        const float z = __fmul_rn(raw, inv_temperature);  // rounded before the noise is added, as eager
        const float u = (static_cast<float>(r.x[lane] >> 8) + 0.5f) * (1.0f / 16777216.0f);
        const float g = -logf(-logf(u));
        add_token(d, z, z + g, v);
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) merge(d, shfl_xor(d, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = d;
  __syncthreads();
  if (warp == 0) {
    d = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : DrawState{};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) merge(d, shfl_xor(d, o));
    if (lane == 0) {
      // every score -inf (all logits -inf): token 0, as argmax over an all -inf row
      const int64_t tok = d.token == INT64_MAX ? 0 : d.token;
      tokens[row] = tok;
      const float z_at = d.token == INT64_MAX ? -INFINITY : d.z_at;
      log_probs[row] = z_at - (d.m + logf(d.s));
    }
  }
}

// ---- log-probs of labels (and entropies) from logits, with the backward ----
// Training and scoring's head: x = float(logits) · inv_temperature over a row [vocab]. Two passes
// over the row (the second reads it from L2: a row is 64 KB at a 32k vocabulary in bf16): the max
// m, then Σ e^{x−m} and Σ e^{x−m}·x, so lse = m + log Σ, log p(label) = x_label − lse, entropy =
// lse − E_p[x] with E_p[x] = Σ e^{x−m}·x / Σ. No running rescale, no branch per element, one
// expf per element (the accurate one: the kernel is bound by its loads, not by the exp), 16-byte
// loads where the row allows them. Nothing
// [rows, vocab] is written in the forward; the backward writes the logits' gradient once, in the
// logits' dtype (16-byte stores where it can):
//   ∂/∂x_v = g_lp · (1[v = label] − p_v) + g_H · p_v · (E_p[x] − x_v),   p_v = e^{x_v − lse},
// times inv_temperature. One block per row.
constexpr int kLogProbThreads = 512;

/// f(v, x) for each element of a row of `vocab` values, x as float: 16-byte loads when `vec`
/// (the row 16-byte aligned), the tail and unaligned rows element by element.
template <class T, class F>
__device__ __forceinline__ void for_each_in_row(const T* __restrict__ l, int64_t vocab, bool vec, F&& f) {
  constexpr int n = 16 / static_cast<int>(sizeof(T));
  int64_t done = 0;
  if (vec) {
    const int64_t chunks = vocab / n;
    const uint4* p = reinterpret_cast<const uint4*>(l);
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const uint4 raw = p[c];
      const T* vals = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < n; ++k) f(c * n + k, to_f<T>(vals[k]));
    }
    done = chunks * n;
  }
  for (int64_t v = done + threadIdx.x; v < vocab; v += blockDim.x) f(v, to_f<T>(l[v]));
}

/// The block's max (blockDim.x a multiple of 32).
__device__ float block_max(float v, float* shared) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? shared[lane] : -INFINITY;
  if (warp == 0) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  const float total = shared[0];
  __syncthreads();
  return total;
}

template <class T>
__global__ void token_log_prob_kernel(const T* __restrict__ logits, int64_t vocab, int64_t row_stride,
                                      const int64_t* __restrict__ labels, float inv, bool vec,
                                      float* __restrict__ log_probs, float* __restrict__ entropy,
                                      float* __restrict__ lse_out, float* __restrict__ mean_out) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* l = logits + row * row_stride;
  float m = -INFINITY;
  for_each_in_row(l, vocab, vec, [&](int64_t, float x) { m = fmaxf(m, x); });
  // inv > 0, and rounding is monotone: max(x) · inv is max(x · inv) exactly
  m = block_max(m, shared) * inv;
  float s = 0.0f, w = 0.0f;
  for_each_in_row(l, vocab, vec, [&](int64_t, float x) {
    const float y = x * inv;
    const float e = expf(y - m);
    s += e;
    w += y == -INFINITY ? 0.0f : e * y;  // a masked (−inf) logit adds nothing, not 0 · −inf
  });
  s = block_sum(s, shared);
  w = block_sum(w, shared);
  if (threadIdx.x == 0) {
    const float lse = m + logf(s);
    const float mean = w / s;
    const int64_t label = labels[row];
    log_probs[row] = label >= 0 && label < vocab ? to_f<T>(l[label]) * inv - lse : __int_as_float(0x7fc00000);
    if (entropy != nullptr) entropy[row] = lse - mean;
    lse_out[row] = lse;
    mean_out[row] = mean;
  }
}

template <class T>
__global__ void token_log_prob_backward_kernel(const T* __restrict__ logits, int64_t vocab, int64_t row_stride,
                                               const int64_t* __restrict__ labels, float inv, bool vec,
                                               const float* __restrict__ lse, const float* __restrict__ mean,
                                               const float* __restrict__ grad_log_probs,
                                               const float* __restrict__ grad_entropy, T* __restrict__ grad) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  const int64_t row = blockIdx.x;
  const T* l = logits + row * row_stride;
  T* g = grad + row * vocab;
  const float glp = grad_log_probs != nullptr ? grad_log_probs[row] : 0.0f;
  const float gh = grad_entropy != nullptr ? grad_entropy[row] : 0.0f;
  const float z = lse[row], e = mean[row];
  const int64_t label = labels[row];
  const auto d = [&](int64_t v, float x_raw) {
    const float x = x_raw * inv;
    const float p = expf(x - z);
    float r = -glp * p + gh * p * (e - x);
    if (v == label) r += glp;
    return from_f<T>(r * inv);
  };
  constexpr int n = 16 / static_cast<int>(sizeof(T));
  int64_t done = 0;
  if (vec) {  // the row and its gradient row both 16-byte aligned
    const int64_t chunks = vocab / n;
    const uint4* p = reinterpret_cast<const uint4*>(l);
    uint4* q = reinterpret_cast<uint4*>(g);
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const uint4 raw = p[c];
      const T* vals = reinterpret_cast<const T*>(&raw);
      uint4 out;
      T* o = reinterpret_cast<T*>(&out);
#pragma unroll
      for (int k = 0; k < n; ++k) o[k] = d(c * n + k, to_f<T>(vals[k]));
      q[c] = out;
    }
    done = chunks * n;
  }
  for (int64_t v = done + threadIdx.x; v < vocab; v += blockDim.x) g[v] = d(v, to_f<T>(l[v]));
}

/// Whether `p` is 16-byte aligned.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// Whether rows of `bytes_per_row` starting at `p` are all 16-byte aligned.
inline bool aligned_rows(const void* p, int64_t bytes_per_row) { return aligned16(p) && bytes_per_row % 16 == 0; }

template <class F>
int by_dtype(KernelDtype dtype, F&& f) {
  switch (dtype) {
    case KernelDtype::f32: return f(float{});
    case KernelDtype::f16: return f(__half{});
    case KernelDtype::bf16: return f(__nv_bfloat16{});
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace

namespace {
/// Packs per thread (1, 2 or 4) of the 16-byte RMSNorm kernels for rows of `dim` T, 0 where they
/// do not apply (dim not a multiple of a pack, or more than 4096 packs).
int rms_norm_packs(int64_t dim, int64_t elem_bytes) {
  const int64_t n = 16 / elem_bytes;
  if (dim % n != 0) return 0;
  const int64_t chunks = dim / n;
  return chunks <= 1024 ? 1 : chunks <= 2048 ? 2 : chunks <= 4096 ? 4 : 0;
}
/// Threads of a block of the 16-byte kernels: the packs of a row over P, rounded up to full warps.
int rms_norm_threads(int64_t dim, int64_t elem_bytes, int packs) {
  const int64_t chunks = dim / (16 / elem_bytes);
  const int64_t t = (chunks + packs - 1) / packs;
  return static_cast<int>((t + 31) / 32 * 32);
}
int64_t kernel_elem_bytes(KernelDtype dtype) { return dtype == KernelDtype::f32 ? 4 : 2; }
}  // namespace

int launch_rms_norm(const void* x, const void* residual, void* residual_out, const void* weight, void* out,
                    float* rstd, int64_t rows, int64_t dim, float eps, KernelDtype dtype, void* stream) {
  if (rows == 0) return 0;
  if ((residual == nullptr) != (residual_out == nullptr)) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t eb = kernel_elem_bytes(dtype);
  const int packs = rms_norm_packs(dim, eb);
  const bool vec = packs > 0 && aligned_rows(x, dim * eb) && aligned16(weight) && aligned_rows(out, dim * eb) &&
                   (residual == nullptr || (aligned_rows(residual, dim * eb) && aligned_rows(residual_out, dim * eb)));
  return by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* s = static_cast<cudaStream_t>(stream);
    const auto* xt = static_cast<const T*>(x);
    const auto* rt = static_cast<const T*>(residual);
    auto* ht = static_cast<T*>(residual_out);
    const auto* wt = static_cast<const T*>(weight);
    auto* ot = static_cast<T*>(out);
    const auto blocks = static_cast<unsigned>(rows);
    if (vec) {
      const int threads = rms_norm_threads(dim, eb, packs);
      if (packs == 1) detail::launch(rms_norm_vec_kernel<T, 1>, blocks, threads, 0, s, xt, rt, ht, wt, ot, rstd, dim, eps);
      if (packs == 2) detail::launch(rms_norm_vec_kernel<T, 2>, blocks, threads, 0, s, xt, rt, ht, wt, ot, rstd, dim, eps);
      if (packs == 4) detail::launch(rms_norm_vec_kernel<T, 4>, blocks, threads, 0, s, xt, rt, ht, wt, ot, rstd, dim, eps);
    } else {
      detail::launch(rms_norm_kernel<T>, blocks, dim >= 2048 ? 512 : 256, 0, s, xt, rt, ht, wt, ot, rstd, dim, eps);
    }
    return static_cast<int>(cudaGetLastError());
  });
}

int64_t rms_norm_backward_blocks(int64_t rows, int64_t dim, KernelDtype dtype) {
  const int64_t eb = kernel_elem_bytes(dtype);
  // one pack a thread: the backward holds four values per element (weight, dw, x̂, w·dy), and at
  // two or four packs a thread a block of 1024 threads runs out of registers
  const int packs = rms_norm_packs(dim, eb);
  if (packs != 1 || rows == 0) return 0;
  static const int sms = [] {
    int device = 0, n = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      return 132;
    }
    return n;
  }();
  // about 1024 threads a multiprocessor: enough rows in flight to stream, few partial rows of dw
  const int64_t per_sm = std::max<int64_t>(1, 1024 / rms_norm_threads(dim, eb, packs));
  return std::min<int64_t>(rows, per_sm * sms);
}

int launch_rms_norm_backward(const void* h, const void* grad_out, const void* grad_residual, const void* weight,
                             const float* rstd, void* grad_in, float* grad_weight_partial, int64_t rows, int64_t dim,
                             int64_t blocks, KernelDtype dtype, void* stream) {
  if (rows == 0) return 0;
  const int64_t eb = kernel_elem_bytes(dtype);
  const int packs = rms_norm_packs(dim, eb);
  if (packs != 1 || blocks <= 0 || !aligned_rows(h, dim * eb) || !aligned_rows(grad_out, dim * eb) ||
      !aligned_rows(grad_in, dim * eb) || !aligned16(weight) || !aligned16(grad_weight_partial) ||
      (grad_residual != nullptr && !aligned_rows(grad_residual, dim * eb))) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* s = static_cast<cudaStream_t>(stream);
    const int threads = rms_norm_threads(dim, eb, packs);
    const auto args = std::make_tuple(static_cast<const T*>(h), static_cast<const T*>(grad_out),
                                      static_cast<const T*>(grad_residual), static_cast<const T*>(weight), rstd,
                                      static_cast<T*>(grad_in), grad_weight_partial, rows, dim);
    const auto g = static_cast<unsigned>(blocks);
    std::apply([&](auto... a) { detail::launch(rms_norm_backward_vec_kernel<T>, g, threads, 0, s, a...); }, args);
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_rope(const void* q_in, const void* k_in, const void* v_in, int64_t q_stride, int64_t k_stride,
                int64_t v_stride, void* q_out, void* k_out, void* v_out, int64_t q_out_stride, int64_t k_out_stride,
                int64_t v_out_stride, const void* cos, const void* sin, int64_t tokens, int64_t heads,
                int64_t kv_heads, int64_t head_dim, KernelDtype dtype, void* stream, void* key_cache,
                void* value_cache, const int64_t* slot_mapping, int64_t num_slots) {
  if (tokens == 0) return 0;
  if (head_dim % 2 != 0 || (v_in == nullptr) != (v_out == nullptr)) return static_cast<int>(cudaErrorInvalidValue);
  if (slot_mapping != nullptr && (key_cache == nullptr || value_cache == nullptr || v_in == nullptr)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (slot_mapping == nullptr) key_cache = value_cache = nullptr;
  const auto pairs = (heads + kv_heads) * head_dim / 2;
  const int threads = pairs >= 512 ? 512 : pairs >= 256 ? 256 : 128;
  return by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int64_t N = 16 / sizeof(T);
    const bool vec = (head_dim / 2) % N == 0 && q_stride % N == 0 && k_stride % N == 0 && q_out_stride % N == 0 &&
                     k_out_stride % N == 0 && (v_in == nullptr || (v_stride % N == 0 && v_out_stride % N == 0)) && aligned16(q_in) && aligned16(k_in) && aligned16(q_out) &&
                     aligned16(k_out) && aligned16(cos) && aligned16(sin) &&
                     (v_in == nullptr || (aligned16(v_in) && aligned16(v_out))) &&
                     (slot_mapping == nullptr || (aligned16(key_cache) && aligned16(value_cache)));
    if (vec) {
      const int64_t items = tokens * ((heads + kv_heads) * head_dim / 2 / N + (v_in != nullptr ? kv_heads * head_dim / N : 0));
      const int64_t blocks = std::min<int64_t>((items + 255) / 256, int64_t{1} << 20);
      detail::launch(rope_vec_kernel<T>, static_cast<unsigned>(blocks), 256, 0, static_cast<cudaStream_t>(stream),
          static_cast<const T*>(q_in), static_cast<const T*>(k_in), static_cast<const T*>(v_in), q_stride, k_stride,
          v_stride, static_cast<T*>(q_out), static_cast<T*>(k_out), static_cast<T*>(v_out), q_out_stride, k_out_stride,
          v_out_stride, static_cast<const T*>(cos), static_cast<const T*>(sin), tokens, static_cast<int>(heads), static_cast<int>(kv_heads), static_cast<int>(head_dim),
          static_cast<T*>(key_cache), static_cast<T*>(value_cache), slot_mapping, num_slots);
      return static_cast<int>(cudaGetLastError());
    }
    detail::launch(rope_kernel<T>, static_cast<unsigned>(tokens), threads, 0, static_cast<cudaStream_t>(stream),
        static_cast<const T*>(q_in), static_cast<const T*>(k_in), static_cast<const T*>(v_in), q_stride, k_stride,
        v_stride, static_cast<T*>(q_out), static_cast<T*>(k_out), static_cast<T*>(v_out), q_out_stride, k_out_stride,
        v_out_stride, static_cast<const T*>(cos), static_cast<const T*>(sin), static_cast<int>(heads), static_cast<int>(kv_heads), static_cast<int>(head_dim),
        static_cast<T*>(key_cache), static_cast<T*>(value_cache), slot_mapping, num_slots);
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_silu_mul(const void* gate, const void* up, int64_t in_stride, void* out, int64_t rows, int64_t cols,
                    KernelDtype dtype, void* stream) {
  if (rows == 0 || cols == 0) return 0;
  return by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int n = 16 / static_cast<int>(sizeof(T));
    const bool vec = cols % n == 0 && in_stride % n == 0 && aligned16(gate) && aligned16(up) &&
                     aligned16(out);
    const int threads = 128;
    const int64_t groups = vec ? cols / n : cols;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>((groups + threads - 1) / threads, 1024)),
                    static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
    if (vec) {
      detail::launch(silu_mul_kernel<T, n>, grid, threads, 0, static_cast<cudaStream_t>(stream),
          static_cast<const T*>(gate), static_cast<const T*>(up), in_stride, static_cast<T*>(out), rows, cols);
    } else {
      detail::launch(silu_mul_kernel<T, 1>, grid, threads, 0, static_cast<cudaStream_t>(stream),
          static_cast<const T*>(gate), static_cast<const T*>(up), in_stride, static_cast<T*>(out), rows, cols);
    }
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_silu_mul_backward(const void* gate, const void* up, int64_t in_stride, const void* grad_out,
                             void* grad_gate, void* grad_up, int64_t out_stride, int64_t rows, int64_t cols,
                             KernelDtype dtype, void* stream) {
  if (rows == 0 || cols == 0) return 0;
  return by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int w = 16 / static_cast<int>(sizeof(T));
    const bool vec = cols % w == 0 && in_stride % w == 0 && out_stride % w == 0 && aligned16(gate) && aligned16(up) &&
                     aligned16(grad_out) && aligned16(grad_gate) && aligned16(grad_up);
    const int threads = 128;
    const int64_t groups = vec ? cols / w : cols;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>((groups + threads - 1) / threads, 1024)),
                    static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
    const auto args = std::make_tuple(static_cast<const T*>(gate), static_cast<const T*>(up), in_stride,
                                      static_cast<const T*>(grad_out), static_cast<T*>(grad_gate),
                                      static_cast<T*>(grad_up), out_stride, rows, cols);
    const auto s = static_cast<cudaStream_t>(stream);
    if (vec) {
      std::apply([&](auto... a) { detail::launch(silu_mul_backward_kernel<T, w>, grid, threads, 0, s, a...); }, args);
    } else {
      std::apply([&](auto... a) { detail::launch(silu_mul_backward_kernel<T, 1>, grid, threads, 0, s, a...); }, args);
    }
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_adamw(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n, double lr,
                 double beta1, double beta2, double weight_decay, double eps, int64_t step, const float* inv_scale,
                 void* stream, void* copy, KernelDtype copy_dtype) {
  if (n == 0) return 0;
  if (step < 1) return static_cast<int>(cudaErrorInvalidValue);
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const auto args = std::make_tuple(param, grad, exp_avg, exp_avg_sq, n, static_cast<float>(lr * weight_decay),
                                    static_cast<float>(beta1), static_cast<float>(beta2), static_cast<float>(eps),
                                    static_cast<float>(lr / bc1), static_cast<float>(std::sqrt(bc2)), inv_scale);
  if (copy != nullptr && copy_dtype == KernelDtype::f32) return static_cast<int>(cudaErrorInvalidValue);
  const bool vec = n % 4 == 0 && aligned16(param) && aligned16(grad) && aligned16(exp_avg) && aligned16(exp_avg_sq) &&
                   reinterpret_cast<uintptr_t>(copy) % 8 == 0;
  const int threads = 256;
  const int64_t groups = vec ? n / 4 : n;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((groups + threads - 1) / threads, 132 * 16));
  const auto s = static_cast<cudaStream_t>(stream);
  auto run = [&](auto tag) {
    using C = decltype(tag);
    C* c = static_cast<C*>(copy);
    if (vec) {
      std::apply([&](auto... a) { detail::launch(adamw_kernel<4, C>, blocks, threads, 0, s, a..., c); }, args);
    } else {
      std::apply([&](auto... a) { detail::launch(adamw_kernel<1, C>, blocks, threads, 0, s, a..., c); }, args);
    }
    return static_cast<int>(cudaGetLastError());
  };
  if (copy == nullptr) return run(float{});
  return copy_dtype == KernelDtype::bf16 ? run(__nv_bfloat16{}) : run(__half{});
}

int launch_pack_flat(const FlatPieces& pieces, KernelDtype src_dtype, float* dst, void* stream) {
  if (pieces.count <= 0) return 0;
  if (pieces.count > kMaxFlatPieces) return static_cast<int>(cudaErrorInvalidValue);
  return by_dtype(src_dtype, [&](auto tag) {
    using S = decltype(tag);
    constexpr int N = 16 / static_cast<int>(sizeof(S));
    FlatPieces k = pieces;
    int64_t blocks = 0;
    for (int p = 0; p < k.count; ++p) {
      k.vec[p] = k.n[p] % N == 0 && aligned16(k.src[p]) && aligned16(dst + k.offset[p]);
      k.block_start[p] = blocks;
      blocks += (k.n[p] + pack_span<N>() - 1) / pack_span<N>();
    }
    if (blocks == 0) return 0;
    if (blocks > INT32_MAX) return static_cast<int>(cudaErrorInvalidValue);
    detail::launch(pack_flat_kernel<S, N>, static_cast<unsigned>(blocks), kPackThreads, 0, static_cast<cudaStream_t>(stream), k, dst);
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_sample_tokens(const void* logits, int64_t rows, int64_t vocab, int64_t row_stride, float inv_temperature,
                         bool greedy, const int64_t* seeds, const int64_t* samples, const int64_t* positions,
                         int64_t* tokens, float* log_probs, KernelDtype dtype, void* stream) {
  if (rows == 0) return 0;
  return by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::launch(sample_kernel<T>, static_cast<unsigned>(rows), kSampleThreads, 0, static_cast<cudaStream_t>(stream),
        static_cast<const T*>(logits), vocab, row_stride, inv_temperature, greedy, seeds, samples, positions, tokens,
        log_probs);
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_token_log_prob(const void* logits, int64_t rows, int64_t vocab, int64_t row_stride, const int64_t* labels,
                          float inv_temperature, float* log_probs, float* entropy, float* lse, float* mean,
                          KernelDtype dtype, void* stream) {
  if (rows == 0) return 0;
  return by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::launch(token_log_prob_kernel<T>, static_cast<unsigned>(rows), kLogProbThreads, 0, static_cast<cudaStream_t>(stream),
        static_cast<const T*>(logits), vocab, row_stride, labels, inv_temperature,
        aligned_rows(logits, row_stride * static_cast<int64_t>(sizeof(T))), log_probs, entropy, lse, mean);
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_token_log_prob_backward(const void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                                   const int64_t* labels, float inv_temperature, const float* lse, const float* mean,
                                   const float* grad_log_probs, const float* grad_entropy, void* grad,
                                   KernelDtype dtype, void* stream) {
  if (rows == 0) return 0;
  return by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::launch(token_log_prob_backward_kernel<T>, static_cast<unsigned>(rows), kLogProbThreads, 0, static_cast<cudaStream_t>(stream),
            static_cast<const T*>(logits), vocab, row_stride, labels, inv_temperature,
            aligned_rows(logits, row_stride * static_cast<int64_t>(sizeof(T))) &&
                aligned_rows(grad, vocab * static_cast<int64_t>(sizeof(T))),
            lse, mean, grad_log_probs, grad_entropy, static_cast<T*>(grad));
    return static_cast<int>(cudaGetLastError());
  });
}

void set_programmatic_launch(bool on) { detail::programmatic_launch_flag().store(on ? 1 : 0); }
bool programmatic_launch() { return detail::programmatic_launch_flag().load() != 0; }

}  // namespace hybridrl::cuda
