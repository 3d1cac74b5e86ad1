// Paged decode attention: one query token per sequence attends over that sequence's KV blocks.
// Host launcher declared in include/hybridrl/cuda/launchers.hpp; the LibTorch-facing entry point
// (with its reference fallback) is hybridrl::paged_attention in include/hybridrl/cuda/paged_attention.hpp.
//
// Layout: caches [num_blocks, block_size, Hkv, D]; q/out [S, H, D], query head h reads KV head
// h / G (G = H / Hkv). Grid (S, Hkv, splits), 128 threads. One CTA does all G query heads of
// its KV head, so each K/V row is read from memory once for the group. bf16 / fp16 caches take
// the tensor-core kernel below (paged_decode_mma_kernel); fp32 takes this CUDA-core one, where
// each lane loads 16 bytes
// of a key row and of a value row at a time; the D / VEC lanes of a row form a "token group"
// and a warp covers 32 / (D / VEC) tokens per step. Every lane keeps an online softmax (max,
// sum, accumulator) per head over its tokens; the groups of a warp merge by shuffles, the
// 4 warps through shared memory. With splits > 1 each CTA does one slice of the sequence and
// writes its normalised partial output with its max and sum; a second kernel merges the slices.
// The grid depends only on (S, Hkv, splits): contexts can grow under a captured launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "hybridrl/cuda/launchers.hpp"
#include "launch.cuh"

namespace hybridrl::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

template <class T>
struct Vec;  // 16 bytes of T as floats
template <>
struct Vec<float> {
  static constexpr int n = 4;
  __device__ static void load(const float* p, float* out) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
  }
  __device__ static float to_float(float x) { return x; }
  __device__ static float from_float(float x) { return x; }
};
template <>
struct Vec<__half> {
  static constexpr int n = 8;
  __device__ static void load(const __half* p, float* out) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
  __device__ static __half from_float(float x) { return __float2half_rn(x); }
};
template <>
struct Vec<__nv_bfloat16> {
  static constexpr int n = 8;
  __device__ static void load(const __nv_bfloat16* p, float* out) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
  __device__ static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};

template <class T, int D, int G>
__global__ void __launch_bounds__(kThreads)
    paged_decode_kernel(const T* __restrict__ q, const T* __restrict__ key_cache, const T* __restrict__ value_cache,
                        const int32_t* __restrict__ block_tables, const int32_t* __restrict__ context_lens,
                        T* __restrict__ out, float* __restrict__ workspace, int heads, int kv_heads, int block_size,
                        int max_blocks, int splits, int window, float scale) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  constexpr int VEC = Vec<T>::n;
  constexpr int LPT = D / VEC;        // lanes per token row
  constexpr int TPW = 32 / LPT;       // tokens per warp step
  static_assert(LPT >= 1 && LPT <= 32 && 32 % LPT == 0, "head_dim must be VEC * a power of two <= 32");
  const int seq = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tg = lane / LPT, part = lane % LPT;  // token group within the warp, slice of the row
  const int ctx = context_lens[seq];
  int first = 0;
  if (window > 0 && ctx > window) first = ctx - window;
  // this CTA's slice of [first, ctx): whole blocks of the table, split evenly
  const int blocks_per_split = (max_blocks + splits - 1) / splits;
  int begin = split * blocks_per_split * block_size, end = (split + 1) * blocks_per_split * block_size;
  if (begin < first) begin = first;
  if (end > ctx) end = ctx;

  // q of the group's heads, this lane's slice, pre-scaled
  float qv[G][VEC];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const T* qp = q + (static_cast<int64_t>(seq) * heads + kvh * G + g) * D + part * VEC;
    Vec<T>::load(qp, qv[g]);
#pragma unroll
    for (int i = 0; i < VEC; ++i) qv[g][i] *= scale;
  }
  float m[G], l[G], acc[G][VEC];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[g][i] = 0.f;
  }
  const int32_t* table = block_tables + static_cast<int64_t>(seq) * max_blocks;
  const int64_t row = static_cast<int64_t>(kv_heads) * D;  // elements per cache slot
  for (int base = begin + warp * TPW; base < end; base += kWarps * TPW) {
    const int tok = base + tg;
    const bool valid = tok < end;
    float kf[VEC], vf[VEC];
    if (valid) {
      const int64_t slot = static_cast<int64_t>(table[tok / block_size]) * block_size + tok % block_size;
      const int64_t off = slot * row + static_cast<int64_t>(kvh) * D + part * VEC;
      Vec<T>::load(key_cache + off, kf);
      Vec<T>::load(value_cache + off, vf);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) kf[i] = vf[i] = 0.f;
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < VEC; ++i) s = fmaf(qv[g][i], kf[i], s);
#pragma unroll
      for (int o = LPT / 2; o >= 1; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (valid) {
        const float mn = fmaxf(m[g], s);
        const float corr = __expf(m[g] - mn);
        const float p = __expf(s - mn);
        l[g] = l[g] * corr + p;
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[g][i] = fmaf(acc[g][i], corr, p * vf[i]);
        m[g] = mn;
      }
    }
  }
  // merge the token groups of the warp (lanes with the same `part` hold the same dims)
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int o = LPT; o < 32; o *= 2) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[g], o);
      const float lo = __shfl_xor_sync(0xffffffffu, l[g], o);
      const float mn = fmaxf(m[g], mo);
      const float a = __expf(m[g] - mn), b = __expf(mo - mn);
      l[g] = l[g] * a + lo * b;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float ao = __shfl_xor_sync(0xffffffffu, acc[g][i], o);
        acc[g][i] = acc[g][i] * a + ao * b;
      }
      m[g] = mn;
    }
  }
  // merge the warps through shared memory: lanes of token group 0 hold each warp's result
  __shared__ float sm_m[kWarps][G], sm_l[kWarps][G];
  __shared__ float sm_acc[kWarps][G][D];
  if (tg == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (part == 0) {
        sm_m[warp][g] = m[g];
        sm_l[warp][g] = l[g];
      }
#pragma unroll
      for (int i = 0; i < VEC; ++i) sm_acc[warp][g][part * VEC + i] = acc[g][i];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    float mx = -FLT_MAX;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w][g]);
    float sum = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float e = __expf(sm_m[w][g] - mx);
      sum += sm_l[w][g] * e;
      o += sm_acc[w][g][d] * e;
    }
    const int h = kvh * G + g;
    if (splits == 1) {
      out[(static_cast<int64_t>(seq) * heads + h) * D + d] = Vec<T>::from_float(sum > 0.f ? o / sum : 0.f);
    } else {
      // workspace: normalised partial outputs [S, H, splits, D], then maxes and sums [S, H, splits]
      const int64_t sh = static_cast<int64_t>(seq) * heads + h;
      const int64_t num = static_cast<int64_t>(gridDim.x) * heads * splits;
      workspace[(sh * splits + split) * D + d] = sum > 0.f ? o / sum : 0.f;
      if (d == 0) {
        workspace[num * D + sh * splits + split] = mx;
        workspace[num * D + num + sh * splits + split] = sum;
      }
    }
  }
}


// ---- tensor-core kernel (bf16 / fp16 caches, G <= 8): per warp, tiles of 16 tokens ----
// S = Q Kᵀ and O += P V with mma.m16n8k16 (fp32 accumulators): the G query heads are the rows of
// the A operand (padded to 16, rows >= G zero), so every K/V row read from memory serves all G
// heads through the tensor cores instead of 2·G·D CUDA-core FMAs. K/V tiles stream into shared
// memory with cp.async, STAGES deep per warp (STAGES - 1 tiles in flight while one is computed);
// rows are padded by 16 bytes (conflict-free reads).
template <class T>
struct MmaOp;
template <>
struct MmaOp<__nv_bfloat16> {
  __device__ static void run(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  __device__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};
template <>
struct MmaOp<__half> {
  __device__ static void run(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  __device__ static uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

__device__ inline void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
__device__ inline void ldmatrix_x4_trans(uint32_t r[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

constexpr int kTile = 16;  // tokens per warp tile

template <int D>
__host__ __device__ constexpr int mma_row() { return D + 8; }  // elements per smem row: +16 bytes
template <int D, int STAGES>
__host__ __device__ constexpr int mma_smem_bytes() {
  const int stages = STAGES * kWarps * 2 * kTile * mma_row<D>() * 2;  // stages x warps x (K, V) x rows x bytes
  const int merge = kWarps * 8 * (D + 2) * 4;
  return stages > merge ? stages : merge;
}

template <class T, int D, int G, int STAGES>
__global__ void __launch_bounds__(kThreads)
    paged_decode_mma_kernel(const T* __restrict__ q, const T* __restrict__ key_cache, const T* __restrict__ value_cache,
                            const int32_t* __restrict__ block_tables, const int32_t* __restrict__ context_lens,
                            T* __restrict__ out, float* __restrict__ workspace, int heads, int kv_heads,
                            int block_size, int max_blocks, int splits, int window, float scale) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  static_assert(G >= 1 && G <= 8 && D % 16 == 0, "tensor-core decode: G <= 8 query heads per KV head, D % 16 == 0");
  static_assert(STAGES >= 2 && STAGES <= 4, "2 to 4 pipeline stages");
  static_assert(Vec<T>::n == 8, "16-bit elements");
  constexpr int R = mma_row<D>();
  constexpr int KS = D / 16;          // k-steps of Q Kᵀ
  constexpr int NT = D / 8;           // n-tiles of P V
  constexpr int CH = D / 8;           // 16-byte chunks per row
  constexpr int LOADS = kTile * CH / 32;  // chunks per lane per tile, for K and for V
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  const int seq = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int grp = lane >> 2, quad = lane & 3;  // mma fragment coordinates
  const int ctx = context_lens[seq];
  int first = 0;
  if (window > 0 && ctx > window) first = ctx - window;
  const int blocks_per_split = (max_blocks + splits - 1) / splits;
  int begin = split * blocks_per_split * block_size, end = (split + 1) * blocks_per_split * block_size;
  if (begin < first) begin = first;
  if (end > ctx) end = ctx;
  const int32_t* table = block_tables + static_cast<int64_t>(seq) * max_blocks;
  const int64_t row = static_cast<int64_t>(kv_heads) * D;

  // Q as A fragments: row grp is query head kvh * G + grp (zero past G); rows 8..15 are zero
  uint32_t qa[KS][2];
  {
    const bool live = grp < G;
    const T* qp = q + (static_cast<int64_t>(seq) * heads + kvh * G + (live ? grp : 0)) * D;
#pragma unroll
    for (int k = 0; k < KS; ++k) {
      const uint32_t lo = *reinterpret_cast<const uint32_t*>(qp + k * 16 + quad * 2);
      const uint32_t hi = *reinterpret_cast<const uint32_t*>(qp + k * 16 + 8 + quad * 2);
      qa[k][0] = live ? lo : 0u;
      qa[k][1] = live ? hi : 0u;
    }
  }
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m = -FLT_MAX, l = 0.f;  // of head row grp; l is this lane's part of the row sum

  T* my = smem + warp * STAGES * 2 * kTile * R;  // this warp's stages of K and V tiles
  auto issue = [&](int tile_start, int stage) {
    T* ks = my + stage * 2 * kTile * R;
    T* vs = ks + kTile * R;
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
      const int c = lane + 32 * i, t = c / CH, ch = c % CH;
      int tok = tile_start + t;
      if (tok >= end) tok = end - 1;  // a real row; its scores are masked
      const int64_t slot = static_cast<int64_t>(table[tok / block_size]) * block_size + tok % block_size;
      const int64_t off = slot * row + static_cast<int64_t>(kvh) * D + ch * 8;
      cp_async16(ks + t * R + ch * 8, key_cache + off);
      cp_async16(vs + t * R + ch * 8, value_cache + off);
    }
  };
  const int stride = kWarps * kTile;
  int tile = begin + warp * kTile, stage = 0;
  // prologue: the first STAGES - 1 tiles in flight, one commit group each (empty past the end)
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (tile + i * stride < end) issue(tile + i * stride, i);
    cp_async_commit();
  }
  for (; tile < end; tile += stride, stage = stage + 1 == STAGES ? 0 : stage + 1) {
    // refill the stage computed last iteration with the tile STAGES - 1 ahead
    const int ahead = tile + (STAGES - 1) * stride;
    if (ahead < end) issue(ahead, stage == 0 ? STAGES - 1 : stage - 1);
    cp_async_commit();
    cp_async_wait<STAGES - 1>();  // this iteration's tile has landed
    __syncwarp();
    const T* ks = my + stage * 2 * kTile * R;
    const T* vs = ks + kTile * R;
    // S = Q Kᵀ for tokens [tile, tile + 16): two n-tiles of 8 tokens
    float sc[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
      const T* kr = ks + (n * 8 + grp) * R + quad * 2;
#pragma unroll
      for (int k = 0; k < KS; ++k) {
        const uint32_t a[4] = {qa[k][0], 0u, qa[k][1], 0u};
        const uint32_t b[2] = {*reinterpret_cast<const uint32_t*>(kr + k * 16),
                               *reinterpret_cast<const uint32_t*>(kr + k * 16 + 8)};
        MmaOp<T>::run(sc[n], a, b);
      }
    }
    // online softmax of row grp over the tile (the row's 16 scores sit in the 4 lanes of a quad)
    float tmax = -FLT_MAX;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int tok = tile + n * 8 + quad * 2 + j;
        sc[n][j] = tok < end ? sc[n][j] * scale : -INFINITY;
        tmax = fmaxf(tmax, sc[n][j]);
      }
    }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
    const float mn = fmaxf(m, tmax);
    const float corr = __expf(m - mn);
    m = mn;
    float p[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int j = 0; j < 2; ++j) p[n][j] = __expf(sc[n][j] - mn);
    }
    l = l * corr + p[0][0] + p[0][1] + p[1][0] + p[1][1];
    // P as the A fragment of P V (k = the tile's 16 tokens): rows 8..15 zero
    const uint32_t pa[4] = {MmaOp<T>::pack(p[0][0], p[0][1]), 0u, MmaOp<T>::pack(p[1][0], p[1][1]), 0u};
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      // V [16 tokens][dims n*8 .. n*8 + 16) transposed: b fragments of n-tiles n and n + 1
      const int mtx = lane >> 3, r = lane & 7;
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, vs + ((mtx & 1) * 8 + r) * R + n * 8 + (mtx >> 1) * 8);
      o[n][0] *= corr;
      o[n][1] *= corr;
      o[n + 1][0] *= corr;
      o[n + 1][1] *= corr;
      const uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
      MmaOp<T>::run(o[n], pa, b0);
      MmaOp<T>::run(o[n + 1], pa, b1);
    }
    __syncwarp();  // the stage is refilled next iteration
  }
  // the row sum over the quad
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  __syncthreads();  // stages are reused as the merge buffer
  float* sm_m = reinterpret_cast<float*>(smem_raw);
  float* sm_l = sm_m + kWarps * 8;
  float* sm_acc = sm_l + kWarps * 8;  // [warp][8][D]
  if (quad == 0) {
    sm_m[warp * 8 + grp] = m;
    sm_l[warp * 8 + grp] = l;
  }
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    sm_acc[(warp * 8 + grp) * D + n * 8 + quad * 2] = o[n][0];
    sm_acc[(warp * 8 + grp) * D + n * 8 + quad * 2 + 1] = o[n][1];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    float mx = -FLT_MAX;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w * 8 + g]);
    float sum = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float e = __expf(sm_m[w * 8 + g] - mx);
      sum += sm_l[w * 8 + g] * e;
      acc += sm_acc[(w * 8 + g) * D + d] * e;
    }
    const int h = kvh * G + g;
    const int64_t sh = static_cast<int64_t>(seq) * heads + h;
    if (splits == 1) {
      out[sh * D + d] = Vec<T>::from_float(sum > 0.f ? acc / sum : 0.f);
    } else {
      const int64_t num = static_cast<int64_t>(gridDim.x) * heads * splits;
      workspace[(sh * splits + split) * D + d] = sum > 0.f ? acc / sum : 0.f;
      if (d == 0) {
        workspace[num * D + sh * splits + split] = mx;
        workspace[num * D + num + sh * splits + split] = sum;
      }
    }
  }
}

template <class T, int D>
__global__ void paged_decode_merge_kernel(const float* __restrict__ workspace, T* __restrict__ out, int heads,
                                          int splits) {
  detail::wait_for_prior_grids();  // PDL: the grid this one follows is done (src/cuda/launch.cuh)
  const int seq = blockIdx.x, h = blockIdx.y;
  const int64_t sh = static_cast<int64_t>(seq) * heads + h;
  const int64_t num = static_cast<int64_t>(gridDim.x) * heads * splits;
  const float* ms = workspace + num * D + sh * splits;
  const float* ls = workspace + num * D + num + sh * splits;
  float mx = -FLT_MAX;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, ls[s] > 0.f ? ms[s] : -FLT_MAX);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float sum = 0.f, o = 0.f;
    for (int s = 0; s < splits; ++s) {
      if (ls[s] <= 0.f) continue;  // a slice past the context, or outside the window
      const float w = ls[s] * __expf(ms[s] - mx);
      sum += w;
      o += w * workspace[(sh * splits + s) * D + d];
    }
    out[sh * D + d] = Vec<T>::from_float(sum > 0.f ? o / sum : 0.f);
  }
}

// Pipeline depth of the tensor-core kernel: 3 stages where the deeper buffers cost no wave (every
// CTA of the grid still resident at once), else 2 — more bytes in flight per SM when the grid is
// small (64 sequences x 4 KV heads is under two CTAs per SM), occupancy when it is large.
int mma_stages(int per_sm3, int64_t ctas) {
  static const int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
    return n;
  }();
  return static_cast<int64_t>(per_sm3) * sms >= ctas ? 3 : 2;
}

template <class T, int D, int G>
int launch_group(const void* q, const void* kc, const void* vc, const int32_t* bt, const int32_t* cl, void* out,
                 int S, int H, int Hkv, int bs, int max_blocks, int splits, int window, float scale, float* ws,
                 int stages, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(S), static_cast<unsigned>(Hkv), static_cast<unsigned>(splits));
  if constexpr (sizeof(T) == 2) {  // bf16 / fp16: tensor cores
    constexpr int smem2 = mma_smem_bytes<D, 2>(), smem3 = mma_smem_bytes<D, 3>();
    auto* k2 = paged_decode_mma_kernel<T, D, G, 2>;
    auto* k3 = paged_decode_mma_kernel<T, D, G, 3>;
    static const cudaError_t attr = [&] {
      const auto a = cudaFuncSetAttribute(k2, cudaFuncAttributeMaxDynamicSharedMemorySize, smem2);
      return a != cudaSuccess ? a : cudaFuncSetAttribute(k3, cudaFuncAttributeMaxDynamicSharedMemorySize, smem3);
    }();
    if (attr != cudaSuccess) return static_cast<int>(attr);
    static const int per_sm3 = [&] {  // CTAs of the 3-stage kernel resident per SM
      int n = 0;
      return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k3, kThreads, smem3) == cudaSuccess ? n : 0;
    }();
    if (stages == 0) stages = mma_stages(per_sm3, static_cast<int64_t>(S) * Hkv * splits);
    detail::launch((stages >= 3 ? k3 : k2), grid, kThreads, stages >= 3 ? smem3 : smem2, stream,
        static_cast<const T*>(q), static_cast<const T*>(kc), static_cast<const T*>(vc), bt, cl, static_cast<T*>(out),
        ws, H, Hkv, bs, max_blocks, splits, window, scale);
  } else {
    detail::launch(paged_decode_kernel<T, D, G>, grid, kThreads, 0, stream,
        static_cast<const T*>(q), static_cast<const T*>(kc), static_cast<const T*>(vc), bt, cl, static_cast<T*>(out),
        ws, H, Hkv, bs, max_blocks, splits, window, scale);
  }
  if (splits > 1) {
    detail::launch(paged_decode_merge_kernel<T, D>, dim3(static_cast<unsigned>(S), static_cast<unsigned>(H)), D < 128 ? D : 128, 0,
                                      stream, ws, static_cast<T*>(out), H, splits);
  }
  return static_cast<int>(cudaGetLastError());
}

template <class T, int D>
int launch_dim(int G, const void* q, const void* kc, const void* vc, const int32_t* bt, const int32_t* cl, void* out,
               int S, int H, int Hkv, int bs, int mb, int splits, int window, float scale, float* ws, int stages,
               cudaStream_t st) {
  switch (G) {
    case 1: return launch_group<T, D, 1>(q, kc, vc, bt, cl, out, S, H, Hkv, bs, mb, splits, window, scale, ws, stages, st);
    case 2: return launch_group<T, D, 2>(q, kc, vc, bt, cl, out, S, H, Hkv, bs, mb, splits, window, scale, ws, stages, st);
    case 3: return launch_group<T, D, 3>(q, kc, vc, bt, cl, out, S, H, Hkv, bs, mb, splits, window, scale, ws, stages, st);
    case 4: return launch_group<T, D, 4>(q, kc, vc, bt, cl, out, S, H, Hkv, bs, mb, splits, window, scale, ws, stages, st);
    case 5: return launch_group<T, D, 5>(q, kc, vc, bt, cl, out, S, H, Hkv, bs, mb, splits, window, scale, ws, stages, st);
    case 6: return launch_group<T, D, 6>(q, kc, vc, bt, cl, out, S, H, Hkv, bs, mb, splits, window, scale, ws, stages, st);
    case 7: return launch_group<T, D, 7>(q, kc, vc, bt, cl, out, S, H, Hkv, bs, mb, splits, window, scale, ws, stages, st);
    case 8: return launch_group<T, D, 8>(q, kc, vc, bt, cl, out, S, H, Hkv, bs, mb, splits, window, scale, ws, stages, st);
    default: return -1;
  }
}

template <class T>
int launch_type(int D, int G, const void* q, const void* kc, const void* vc, const int32_t* bt, const int32_t* cl,
                void* out, int S, int H, int Hkv, int bs, int mb, int splits, int window, float scale, float* ws,
                int stages, cudaStream_t st) {
  switch (D) {
    case 64: return launch_dim<T, 64>(G, q, kc, vc, bt, cl, out, S, H, Hkv, bs, mb, splits, window, scale, ws, stages, st);
    case 128: return launch_dim<T, 128>(G, q, kc, vc, bt, cl, out, S, H, Hkv, bs, mb, splits, window, scale, ws, stages, st);
    default: return -1;
  }
}

}  // namespace

int64_t paged_decode_splits(int64_t num_seqs, int64_t kv_heads, int64_t max_blocks, int64_t block_size) {
  static int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      return 108;
    }
    return n;
  }();
  // one wave of CTAs is enough (bench_rollout kernel's split sweep on the H200: at 64 x 4 CTAs a
  // second split costs 24%); a small batch splits down to 128 tokens per slice
  const int64_t ctas = num_seqs * kv_heads;
  const int64_t want = (sms + ctas - 1) / ctas;
  const int64_t most = (max_blocks * block_size + 127) / 128;
  int64_t s = want < most ? want : most;
  if (s > max_blocks) s = max_blocks;
  return s < 1 ? 1 : s;
}

int launch_paged_decode_attention(const void* q, const void* key_cache, const void* value_cache,
                                  const int32_t* block_tables, const int32_t* context_lens, void* out,
                                  int64_t num_seqs, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                  int64_t block_size, int64_t max_blocks, int64_t splits, int64_t sliding_window,
                                  float scale, KernelDtype dtype, float* workspace, void* stream, int pipeline_stages) {
  if (num_seqs == 0) return 0;
  if (kv_heads <= 0 || heads % kv_heads != 0 || splits < 1 ||
      (pipeline_stages != 0 && pipeline_stages != 2 && pipeline_stages != 3)) return -1;
  const int G = static_cast<int>(heads / kv_heads);
  const int S = static_cast<int>(num_seqs), H = static_cast<int>(heads), Hkv = static_cast<int>(kv_heads);
  const int D = static_cast<int>(head_dim), bs = static_cast<int>(block_size), mb = static_cast<int>(max_blocks);
  const int sp = static_cast<int>(splits), win = static_cast<int>(sliding_window);
  auto st = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case KernelDtype::f32:
      return launch_type<float>(D, G, q, key_cache, value_cache, block_tables, context_lens, out, S, H, Hkv, bs, mb, sp,
                                win, scale, workspace, pipeline_stages, st);
    case KernelDtype::f16:
      return launch_type<__half>(D, G, q, key_cache, value_cache, block_tables, context_lens, out, S, H, Hkv, bs, mb,
                                 sp, win, scale, workspace, pipeline_stages, st);
    case KernelDtype::bf16:
      return launch_type<__nv_bfloat16>(D, G, q, key_cache, value_cache, block_tables, context_lens, out, S, H, Hkv, bs,
                                        mb, sp, win, scale, workspace, pipeline_stages, st);
  }
  return -1;
}

int device_memory(std::size_t* free_bytes, std::size_t* total_bytes) {
  return static_cast<int>(cudaMemGetInfo(free_bytes, total_bytes));
}

}  // namespace hybridrl::cuda
