#pragma once
/// \file
/// Host launchers of hybridrl's CUDA kernels. The kernels ship as source (src/cuda/*.cu) and are
/// compiled in the consumer's own build by `hybridrl_add_cuda_kernels()` (cmake/hybridrlCuda.cmake)
/// into the target hybridrl::cuda, for the consumer's CUDA architectures; nothing prebuilt ships.
/// These declarations need no CUDA header: pointers are untyped and the stream is a cudaStream_t
/// passed as void*. Use the LibTorch-facing functions (cuda/paged_kv.hpp) instead of these.

#include <cstddef>
#include <cstdint>

namespace hybridrl::cuda {

/// Element type of a kernel's tensors.
enum class KernelDtype : int { f32 = 0, f16 = 1, bf16 = 2 };

/// Writes `num_tokens` rows of `row_elems` elements from `key`/`value` (contiguous [N, row]) into
/// the paged caches (contiguous [slots, row]) at `slot_mapping[i]` (int64; −1 = skip the token).
/// Returns the cudaError_t of the launch as int (0 = success).
int launch_write_kv_to_cache(const void* key, const void* value, void* key_cache,
                             void* value_cache, const int64_t* slot_mapping, int64_t num_tokens,
                             int64_t row_elems, int64_t num_slots, KernelDtype dtype,
                             void* stream);

/// Splits of the sequence axis the paged decode kernel uses for `num_seqs` sequences of
/// `kv_heads` KV heads with block tables `max_blocks` wide: enough CTAs to fill the device when the
/// batch is small, 1 when it is large. A function of the shapes alone (never of the context
/// lengths), so a captured launch stays valid while the contexts grow.
int64_t paged_decode_splits(int64_t num_seqs, int64_t kv_heads, int64_t max_blocks, int64_t block_size);

/// Paged decode attention, one query token per sequence: q [S, H, D] (contiguous), caches
/// [num_blocks, block_size, Hkv, D] (contiguous), block_tables int32 [S, max_blocks],
/// context_lens int32 [S] → out [S, H, D]. All query heads of one KV head are done by one CTA
/// (grid S × Hkv × splits); `sliding_window` 0 = none. `workspace` holds
/// S·H·splits·(D+2) floats when splits > 1. Returns the cudaError_t of the launch as int
/// (0 = success), or −1 for a head_dim / group size the kernel does not cover (the caller falls
/// back to the reference path). `pipeline_stages` (bf16/fp16): K/V tiles buffered per warp, 2 or
/// 3; 0 picks 3 where the deeper buffers still keep the whole grid resident, else 2.
int launch_paged_decode_attention(const void* q, const void* key_cache, const void* value_cache,
                                  const int32_t* block_tables, const int32_t* context_lens, void* out,
                                  int64_t num_seqs, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                  int64_t block_size, int64_t max_blocks, int64_t splits,
                                  int64_t sliding_window, float scale, KernelDtype dtype, float* workspace,
                                  void* stream, int pipeline_stages = 0);

/// RMSNorm of `rows` rows of `dim` (contiguous; x, weight and out of one dtype): out = weight *
/// (h * rsqrt(mean(h²) + eps)) rounded as the eager ops round, h = x, or with `residual` h = x +
/// residual (rounded to the dtype), which is also written to `residual_out` (both or neither).
/// With `rstd` (float [rows]) each row's rsqrt(mean(h²) + eps) is written there (the backward's).
int launch_rms_norm(const void* x, const void* residual, void* residual_out, const void* weight, void* out,
                    float* rstd, int64_t rows, int64_t dim, float eps, KernelDtype dtype, void* stream);

/// Blocks launch_rms_norm_backward runs for `rows` rows of `dim` — the rows of the float
/// [blocks, dim] partial weight gradient it writes — or 0 where it does not apply (dim not a
/// multiple of 16 bytes, or over 1024 · 16 bytes: bf16 rows up to 8192, fp32 up to 4096).
int64_t rms_norm_backward_blocks(int64_t rows, int64_t dim, KernelDtype dtype);

/// The backward of launch_rms_norm (every tensor contiguous, 16-byte aligned): from the norm's
/// input `h`, `grad_out` and the forward's `rstd`, grad_in = the gradient of h (plus
/// `grad_residual`, the gradient h receives besides, when given), and the weight's gradient as
/// `blocks` partial sums, grad_weight_partial float [blocks, dim] (blocks from
/// rms_norm_backward_blocks; sum its rows). Computed in float, grad_in rounded once.
int launch_rms_norm_backward(const void* h, const void* grad_out, const void* grad_residual, const void* weight,
                             const float* rstd, void* grad_in, float* grad_weight_partial, int64_t rows, int64_t dim,
                             int64_t blocks, KernelDtype dtype, void* stream);

/// Rotary embeddings (HF's rotate_half form) of q [tokens, heads, head_dim] and k [tokens,
/// kv_heads, head_dim], rows `q_stride` / `k_stride` elements apart (heads contiguous within a
/// row), written to q_out / k_out with rows `q_out_stride` / `k_out_stride` apart (in place when
/// they are q_in / k_in); v's rows (`v_stride` apart) are copied to v_out (`v_out_stride` apart)
/// when v_in is given. cos / sin [tokens, head_dim].
/// With `slot_mapping` (int64 [tokens]; −1 = skip the token; v_in given) each token's rotated k
/// and its v are also stored in row slot_mapping[t] of the paged caches `key_cache` /
/// `value_cache` (contiguous [num_slots, kv_heads · head_dim]; a slot outside them is skipped):
/// write_kv_to_cache in the same pass.
int launch_rope(const void* q_in, const void* k_in, const void* v_in, int64_t q_stride, int64_t k_stride,
                int64_t v_stride, void* q_out, void* k_out, void* v_out, int64_t q_out_stride, int64_t k_out_stride,
                int64_t v_out_stride, const void* cos, const void* sin, int64_t tokens, int64_t heads,
                int64_t kv_heads, int64_t head_dim, KernelDtype dtype, void* stream, void* key_cache = nullptr, void* value_cache = nullptr, const int64_t* slot_mapping = nullptr,
                int64_t num_slots = 0);

/// out [rows, cols] (contiguous) = silu(gate) * up, gate's and up's rows `in_stride` elements apart.
int launch_silu_mul(const void* gate, const void* up, int64_t in_stride, void* out, int64_t rows, int64_t cols,
                    KernelDtype dtype, void* stream);

/// The backward of out [rows, cols] = silu(gate) * up: grad_gate and grad_up from grad_out
/// [rows, cols] (contiguous), computed in float and rounded once to the dtype. gate's and up's
/// rows `in_stride` elements apart, their gradients' `out_stride` apart (the halves of one fused
/// gate|up projection and of its gradient, or separate tensors: cols).
int launch_silu_mul_backward(const void* gate, const void* up, int64_t in_stride, const void* grad_out,
                             void* grad_gate, void* grad_up, int64_t out_stride, int64_t rows, int64_t cols,
                             KernelDtype dtype, void* stream);

/// One AdamW step (torch.optim.AdamW: decoupled weight decay, bias correction at `step` ≥ 1, no
/// amsgrad) over n float elements in place: param, exp_avg and exp_avg_sq updated from grad, each
/// read once and the three written once, in float with torch's fused kernel's order of operations.
/// `inv_scale` (a float on the device, or null): each gradient is divided by it as it is read.
/// `copy` (or null): n elements of `copy_dtype` (bf16 or f16) that get the new parameter rounded
/// to that dtype in the same pass — a mixed-precision unit's compute copy.
int launch_adamw(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n, double lr,
                 double beta1, double beta2, double weight_decay, double eps, int64_t step, const float* inv_scale,
                 void* stream, void* copy = nullptr, KernelDtype copy_dtype = KernelDtype::bf16);

/// Up to kMaxFlatPieces pieces of one flat float buffer, each from a source tensor (contiguous, of
/// one dtype for all) or zeros (src null): dst[offset, offset + n) = float(src[0, n)).
inline constexpr int kMaxFlatPieces = 32;
struct FlatPieces {
  const void* src[kMaxFlatPieces] = {};
  int64_t offset[kMaxFlatPieces] = {};
  int64_t n[kMaxFlatPieces] = {};
  int64_t block_start[kMaxFlatPieces] = {};  ///< the launcher's: the first block of each piece
  int vec[kMaxFlatPieces] = {};              ///< the launcher's: 16-byte loads allowed
  int count = 0;
};

/// Writes every piece of `pieces` into `dst` (float) in one launch, cast from `src_dtype`: a
/// sharded unit's parameter gradients into its flat buffer, the gaps zeroed.
int launch_pack_flat(const FlatPieces& pieces, KernelDtype src_dtype, float* dst, void* stream);

/// One token per row of `logits` [rows, vocab] (row `row_stride` elements apart): argmax of the
/// logits (greedy) or of logits · inv_temperature + Gumbel noise from Philox-4x32-10 at counter
/// (token / 4, positions[row], samples[row], 0) under key seeds[row] (rollout/sampler.hpp's
/// draw), and the log-softmax of the tempered logits at the drawn token (tokens int64, log_probs
/// float, [rows]).
int launch_sample_tokens(const void* logits, int64_t rows, int64_t vocab, int64_t row_stride, float inv_temperature,
                         bool greedy, const int64_t* seeds, const int64_t* samples, const int64_t* positions,
                         int64_t* tokens, float* log_probs, KernelDtype dtype, void* stream);

/// Per row of `logits` [rows, vocab] (rows `row_stride` apart), x = logits · inv_temperature:
/// log_probs[r] = log_softmax(x)[labels[r]] (NaN for a label outside the vocabulary), and with
/// `entropy` non-null the entropy of softmax(x); lse[r] and mean[r] (E_p[x]) are what the
/// backward needs. All float [rows]. Nothing [rows, vocab] is written.
int launch_token_log_prob(const void* logits, int64_t rows, int64_t vocab, int64_t row_stride, const int64_t* labels,
                          float inv_temperature, float* log_probs, float* entropy, float* lse, float* mean,
                          KernelDtype dtype, void* stream);

/// The gradient of launch_token_log_prob's outputs with respect to the logits: `grad` [rows, vocab]
/// (contiguous, the logits' dtype) from grad_log_probs and grad_entropy (float [rows]; either may
/// be null: zero).
int launch_token_log_prob_backward(const void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                                   const int64_t* labels, float inv_temperature, const float* lse, const float* mean,
                                   const float* grad_log_probs, const float* grad_entropy, void* grad,
                                   KernelDtype dtype, void* stream);

/// Free and total memory of the current CUDA device (cudaMemGetInfo); returns its cudaError_t as int.
int device_memory(std::size_t* free_bytes, std::size_t* total_bytes);

/// Programmatic dependent launch (PDL, Hopper and later) of every kernel above: each may be
/// scheduled while the kernel before it on the stream finishes, and waits for it before its first
/// instruction (src/cuda/launch.cuh) — the launch gaps of a decode step's ~10 kernels a layer
/// overlap. Off unless the environment says HYBRIDRL_PDL=1; a CUDA graph records it at capture.
void set_programmatic_launch(bool on);
/// Whether programmatic dependent launch is on (it takes effect on devices of compute capability 9+).
bool programmatic_launch();

}  // namespace hybridrl::cuda
