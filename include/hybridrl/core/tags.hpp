#pragma once
/// \file
/// The empty tag types that name each built-in policy. One header, so a reader sees every choice.

namespace hybridrl {

// ---- Algorithm<> tags ----
/// Proximal Policy Optimization with a critic and GAE (Schulman et al. 2017; verl's default).
struct PPO {};
/// Group Relative Policy Optimization: no critic, group-normalised outcome advantages (DeepSeekMath).
struct GRPO {};
/// Direct Preference Optimization on (chosen, rejected) pairs (Rafailov et al. 2023).
struct DPO {};
/// Kahneman–Tversky Optimization on completions labelled desirable/undesirable (Ethayarajh et al. 2024).
struct KTO {};
/// Supervised fine-tuning: the negative log-likelihood of completions given their prompts.
struct SFT {};

// ---- Sharding<> tags ----
/// Fully sharded data parallel: flat parameter shards per layer unit, gathered before use.
struct FSDP {};
/// A data × tensor (× pipeline) mesh with column/row-parallel linear layers.
struct TP3D {};

// ---- Rollout<> tags ----
/// Paged KV cache with continuous batching and prefix sharing (vLLM-style).
struct Paged {};
/// Dense padded KV cache; all sequences advance together. The reference oracle for Paged.
struct Naive {};

// ---- Loader<> tags ----
/// Packs samples into fixed-length rows with no attention across samples.
struct Packed {};
/// Groups samples of similar length; can cap a batch by token budget. The reference oracle for Packed.
struct Bucketed {};

}  // namespace hybridrl
