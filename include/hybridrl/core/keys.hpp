#pragma once
/// \file
/// Every TensorBatch key that crosses an axis, as a named constant with its shape, dtype and the
/// component that produces it. Loader output, rollout output and algorithm input are written
/// against these constants, never against string literals.
///
/// Naming grammar: `[<model>_][<role>_]<quantity>[_<reduction>]`
/// - model ∈ {old, ref, rollout}: which model produced a per-token quantity (none = the policy
///   being trained, with grad);
/// - role ∈ {chosen, rejected, kl}: which sequence of a unit (DPO pair, KTO mismatched pair);
/// - reduction ∈ {sum, mean}: a per-sequence [B] reduction of a per-token [B, T] quantity.
/// So "log_probs" is always [B, T] and "log_probs_sum" always [B].
///
/// Token alignment: a per-token quantity (log-probs, values, advantages, masks...) has the shape of
/// the token tensor it accompanies — `responses` [B, R] in an online (rollout) batch, `input_ids`
/// [B, T] in an offline batch — and entry t describes token t. In an offline batch `log_probs[:, 0]`
/// is 0 (the first token is not predicted) and `response_mask[:, 0]` is 0, so
/// `(log_probs * response_mask).sum(-1)` is the summed response log-prob in both layouts.

#include <array>
#include <string>
#include <string_view>

namespace hybridrl {

/// One TensorBatch key: its name and what every batch that carries it promises about it.
struct Key {
  std::string_view name;      ///< the string stored in the batch
  std::string_view shape;     ///< e.g. "[B, T]"; B = sequences, T = tokens, R = response tokens
  std::string_view dtype;     ///< e.g. "int64", "float (compute dtype)", "bool"
  std::string_view producer;  ///< which component writes it (named in missing-key errors)

  /// The key as a std::string (TensorBatch's accessors take strings).
  [[nodiscard]] std::string str() const { return std::string(name); }
  operator std::string() const { return std::string(name); }  // NOLINT: keys read as strings
  operator std::string_view() const noexcept { return name; }  // NOLINT
  friend bool operator==(const Key& a, const Key& b) noexcept { return a.name == b.name; }
};

namespace keys {

// ---- token sequences (Loader for prompts and offline data; Rollout for generated sequences) ----
/// Token ids: prompts (online, left-padded) or full prompt + response sequences (offline).
inline constexpr Key input_ids{"input_ids", "[B, T]", "int64", "Loader (collate) or Rollout"};
/// 1 on real tokens, 0 on padding (int64 0/1, as verl's attention_mask).
inline constexpr Key attention_mask{"attention_mask", "[B, T]", "int64 0/1", "Loader (collate) or Rollout"};
/// Position of each token inside its sequence (restarts per sequence in packed rows).
inline constexpr Key position_ids{"position_ids", "[B, T]", "int64", "Loader (collate) or Rollout"};
/// 1 on the tokens a loss trains on (response tokens), aligned with the batch's token tensor.
inline constexpr Key response_mask{"response_mask", "[B, T] or [B, R]", "int64 0/1",
                                   "Loader (offline data) or Rollout (generated responses)"};
/// Prompt tokens of a generated batch, left-padded to P.
inline constexpr Key prompts{"prompts", "[B, P]", "int64", "Rollout (generate)"};
/// Generated response tokens, right-padded to R.
inline constexpr Key responses{"responses", "[B, R]", "int64", "Rollout (generate)"};
/// Log-probs of the sampled tokens: log_softmax(logits / temperature) at the token (temperature 1
/// when greedy), before top-k / top-p / min-p, as the trainer recomputes them (rollout/sampler.hpp).
inline constexpr Key rollout_log_probs{"rollout_log_probs", "[B, R]", "float32", "Rollout (generate)"};
/// Why each sequence stopped (FinishReason as int64: 0 length, 1 stop token, 2 aborted).
inline constexpr Key finish_reason{"finish_reason", "[B]", "int64", "Rollout (generate)"};
/// Rows generated from the same prompt share a group id (GRPO/RLOO baselines).
inline constexpr Key group_ids{"group_ids", "[B]", "int64",
                               "repeat_for_rollout (from the Loader's uid column)"};

/// Optional per-request sampling seed (64-bit pattern); without it a request's seed is
/// request_seed(rollout.seed, group id).
inline constexpr Key sampling_seeds{"sampling_seeds", "[B]", "int64", "the caller (optional input of generate)"};

// ---- packed rows (Loader<Packed> / pack()) ----
/// Sequence index of each token inside the micro-batch, -1 on padding.
inline constexpr Key segment_ids{"segment_ids", "[R, L]", "int64", "pack (Loader<Packed>)"};
/// Per-row sequence boundaries, padded by repeating the row's end.
inline constexpr Key cu_seqlens{"cu_seqlens", "[R, S+1]", "int32", "pack (Loader<Packed>)"};

// ---- offline data ----
inline constexpr Key chosen_input_ids{"chosen_input_ids", "[B, T]", "int64", "Loader (preference pairs)"};
inline constexpr Key chosen_attention_mask{"chosen_attention_mask", "[B, T]", "int64 0/1", "Loader (preference pairs)"};
inline constexpr Key chosen_position_ids{"chosen_position_ids", "[B, T]", "int64", "Loader (preference pairs)"};
inline constexpr Key chosen_response_mask{"chosen_response_mask", "[B, T]", "int64 0/1", "Loader (preference pairs)"};
inline constexpr Key rejected_input_ids{"rejected_input_ids", "[B, T]", "int64", "Loader (preference pairs)"};
inline constexpr Key rejected_attention_mask{"rejected_attention_mask", "[B, T]", "int64 0/1", "Loader (preference pairs)"};
inline constexpr Key rejected_position_ids{"rejected_position_ids", "[B, T]", "int64", "Loader (preference pairs)"};
inline constexpr Key rejected_response_mask{"rejected_response_mask", "[B, T]", "int64 0/1", "Loader (preference pairs)"};
/// KTO's mismatched pair of row i: prompt i with the completion of row (i − 1) mod B (TRL's order).
inline constexpr Key kl_input_ids{"kl_input_ids", "[B, T]", "int64", "Loader (labelled completions)"};
inline constexpr Key kl_attention_mask{"kl_attention_mask", "[B, T]", "int64 0/1", "Loader (labelled completions)"};
inline constexpr Key kl_position_ids{"kl_position_ids", "[B, T]", "int64", "Loader (labelled completions)"};
inline constexpr Key kl_response_mask{"kl_response_mask", "[B, T]", "int64 0/1", "Loader (labelled completions)"};
/// KTO label: true = desirable completion.
inline constexpr Key desirable{"desirable", "[B]", "bool", "Loader (labelled completions)"};

// ---- scores from models (trainer phases) ----
/// Policy log-probs of each token, with grad (the update's forward).
inline constexpr Key log_probs{"log_probs", "[B, T]", "float (compute dtype)", "policy forward (update)"};
/// Policy log-probs before the update (behaviour policy), detached.
inline constexpr Key old_log_probs{"old_log_probs", "[B, T]", "float32", "policy forward (old log-probs phase)"};
/// Frozen reference model log-probs.
inline constexpr Key ref_log_probs{"ref_log_probs", "[B, T]", "float32", "reference forward"};
/// Per-token entropy of the policy (entropy bonus).
inline constexpr Key entropy{"entropy", "[B, T]", "float (compute dtype)", "policy forward (update)"};
/// Critic values with grad (value update).
inline constexpr Key values{"values", "[B, T]", "float (compute dtype)", "critic forward (update)"};
/// Critic values before the update.
inline constexpr Key old_values{"old_values", "[B, T]", "float32", "critic forward (values phase)"};
/// Summed policy / reference log-probs of whole responses (DPO, KTO).
inline constexpr Key log_probs_sum{"log_probs_sum", "[B]", "float (compute dtype)", "policy forward (update)"};
inline constexpr Key ref_log_probs_sum{"ref_log_probs_sum", "[B]", "float32", "reference forward"};
inline constexpr Key chosen_log_probs_sum{"chosen_log_probs_sum", "[B]", "float (compute dtype)", "policy forward (update)"};
inline constexpr Key rejected_log_probs_sum{"rejected_log_probs_sum", "[B]", "float (compute dtype)", "policy forward (update)"};
inline constexpr Key ref_chosen_log_probs_sum{"ref_chosen_log_probs_sum", "[B]", "float32", "reference forward"};
inline constexpr Key ref_rejected_log_probs_sum{"ref_rejected_log_probs_sum", "[B]", "float32", "reference forward"};
inline constexpr Key kl_log_probs_sum{"kl_log_probs_sum", "[B]", "float (compute dtype)", "policy forward (KTO mismatched pairs)"};
inline constexpr Key ref_kl_log_probs_sum{"ref_kl_log_probs_sum", "[B]", "float32", "reference forward (KTO mismatched pairs)"};

// ---- rewards and advantages ----
/// Sequence-level reward of each response.
inline constexpr Key scores{"scores", "[B]", "float32", "reward function"};
/// Reward placed on response tokens (the score on the last valid token), before any KL penalty.
inline constexpr Key token_level_scores{"token_level_scores", "[B, R]", "float32", "reward function"};
/// Token rewards after the in-reward KL penalty (what GAE reads).
inline constexpr Key token_level_rewards{"token_level_rewards", "[B, R]", "float32",
                                         "Algorithm::compute_advantages (KL in reward)"};
inline constexpr Key advantages{"advantages", "[B, R]", "float32", "Algorithm::compute_advantages"};
inline constexpr Key returns{"returns", "[B, R]", "float32", "Algorithm::compute_advantages"};

// ---- non-tensor columns (one JSON value per row) ----
inline constexpr Key prompt_text{"prompt", "[B] column", "string", "Loader (dataset)"};
inline constexpr Key answer{"answer", "[B] column", "JSON", "Loader (dataset)"};
inline constexpr Key data_source{"data_source", "[B] column", "string", "Loader (dataset)"};
/// Stable id of the dataset sample a row came from; repeat_for_rollout turns it into group_ids.
inline constexpr Key uid{"uid", "[B] column", "string", "Loader (dataset)"};
inline constexpr Key extra{"extra", "[B] column", "JSON object", "Loader (dataset)"};
/// Decoded response text.
inline constexpr Key response_text{"response", "[B] column", "string", "Rollout (generate, when a tokenizer is given)"};

/// Every key above, for documentation tables and lookups of producers by name.
inline constexpr std::array all{
    input_ids, attention_mask, position_ids, response_mask, prompts, responses, rollout_log_probs,
    finish_reason, group_ids, sampling_seeds, segment_ids, cu_seqlens, chosen_input_ids, chosen_attention_mask,
    chosen_position_ids, chosen_response_mask, rejected_input_ids, rejected_attention_mask,
    rejected_position_ids, rejected_response_mask, kl_input_ids, kl_attention_mask, kl_position_ids,
    kl_response_mask, desirable, log_probs, old_log_probs, ref_log_probs, entropy, values,
    old_values, log_probs_sum, ref_log_probs_sum, chosen_log_probs_sum, rejected_log_probs_sum,
    ref_chosen_log_probs_sum, ref_rejected_log_probs_sum, kl_log_probs_sum, ref_kl_log_probs_sum,
    scores, token_level_scores, token_level_rewards, advantages, returns, prompt_text, answer,
    data_source, uid, extra, response_text};

/// The role prefixes of the sequences of one unit ("<role>input_ids"...), in the order packing and
/// token counting visit them: "" (the sequence), DPO's "chosen_" and "rejected_", KTO's "kl_".
inline constexpr std::array<std::string_view, 4> roles{"", "chosen_", "rejected_", "kl_"};

/// "<role><key>": with_role("chosen_", keys::input_ids) = "chosen_input_ids".
[[nodiscard]] inline std::string with_role(std::string_view role, const Key& key) {
  std::string out;
  out.reserve(role.size() + key.name.size());
  out.append(role);
  out.append(key.name);
  return out;
}

/// The Key named `name`, or nullptr for a name that is not a cross-axis key.
[[nodiscard]] constexpr const Key* find(std::string_view name) noexcept {
  for (const auto& k : all) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

}  // namespace keys
}  // namespace hybridrl
