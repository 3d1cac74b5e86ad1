#pragma once
/// \file
/// Turns a list of dataset units into a per-sequence TensorBatch (one row per unit), with the keys
/// of core/keys.hpp; the table is in docs/data.md. In short:
/// - prompts: input_ids, attention_mask, position_ids ([B, T], left-padded by default).
/// - DPO pairs: chosen_* and rejected_* versions of input_ids / attention_mask / position_ids /
///   response_mask, [B, T], right-padded to one T.
/// - KTO: input_ids, attention_mask, position_ids, response_mask; kl_* for the mismatched pair
///   (prompt i with the completion of row (i − 1) mod B, TRL's `_get_kl_dataset` rotation); and
///   desirable [B] bool.
/// response_mask has the shape of its input_ids and is 1 on response tokens (EOS included), 0 on
/// the prompt (so column 0, the BOS, is always 0) and on padding.
/// Non-tensor columns: prompt, answer, data_source, uid, extra (remaining fields), and the raw
/// chosen / rejected / completion text. Integer tensors are int64 (masks 0/1, as verl's).
/// Batches carry no metadata: every fact about a row lives in a tensor or a column, so slice,
/// chunk, reorder and concat keep them true. Packing for the forward passes is data/packing.hpp.

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/data/dataset.hpp"

namespace hybridrl {

namespace detail {

/// One sequence of a batch: prompt + response tokens, the unit it belongs to and its role.
struct BatchSequence {
  std::vector<int64_t> ids;
  int64_t prompt_length = 0;
  int64_t unit = 0;      ///< index of the unit inside the batch
  std::string role;      ///< "prompt", "chosen", "rejected", "completion", "kl"
};

inline std::vector<BatchSequence> batch_sequences(const PromptDataset& d, std::span<const int64_t> units) {
  std::vector<BatchSequence> out;
  for (size_t u = 0; u < units.size(); ++u) {
    const auto& s = d[units[u]];
    out.push_back({s.prompt_ids, static_cast<int64_t>(s.prompt_ids.size()), static_cast<int64_t>(u), "prompt"});
  }
  return out;
}

inline std::vector<BatchSequence> batch_sequences(const PreferenceDataset& d,
                                                  std::span<const int64_t> units) {
  std::vector<BatchSequence> out;
  for (size_t u = 0; u < units.size(); ++u) {
    const auto& s = d[units[u]];
    out.push_back({s.chosen_ids, s.prompt_length, static_cast<int64_t>(u), "chosen"});
    out.push_back({s.rejected_ids, s.prompt_length, static_cast<int64_t>(u), "rejected"});
  }
  return out;
}

inline std::vector<BatchSequence> batch_sequences(const LabelledDataset& d,
                                                  std::span<const int64_t> units) {
  std::vector<BatchSequence> out;
  const size_t b = units.size();
  for (size_t u = 0; u < b; ++u) {
    const auto& s = d[units[u]];
    const auto& partner = d[units[(u + b - 1) % b]];  // TRL: [c[-1]] + c[:-1]
    const auto pl = static_cast<int64_t>(s.prompt_ids.size());
    out.push_back({s.ids, pl, static_cast<int64_t>(u), "completion"});
    std::vector<int64_t> kl = s.prompt_ids;
    kl.insert(kl.end(), partner.completion_ids.begin(), partner.completion_ids.end());
    out.push_back({std::move(kl), pl, static_cast<int64_t>(u), "kl"});
  }
  return out;
}

inline std::vector<BatchSequence> batch_sequences(const CompletionDataset& d, std::span<const int64_t> units) {
  std::vector<BatchSequence> out;
  for (size_t u = 0; u < units.size(); ++u) {
    const auto& s = d[units[u]];
    out.push_back({s.ids, static_cast<int64_t>(s.prompt_ids.size()), static_cast<int64_t>(u), "completion"});
  }
  return out;
}

template <class D>
std::map<std::string, Column> unit_columns(const D& d, std::span<const int64_t> units) {
  std::map<std::string, Column> cols;
  for (auto i : units) {
    const auto& s = d[i];
    const auto& r = s.record;
    cols[keys::prompt_text.str()].push_back(r.value("prompt", std::string{}));
    cols[keys::answer.str()].push_back(r.contains("answer") ? r["answer"] : nlohmann::json());
    cols[keys::data_source.str()].push_back(s.data_source);
    cols[keys::uid.str()].push_back(s.uid);
    nlohmann::json extra = nlohmann::json::object();
    for (const auto& [k, v] : r.items()) {
      if (k != "prompt" && k != "answer" && k != "data_source" && k != "uid" && k != "id" &&
          k != "chosen" && k != "rejected" && k != "completion" && k != "label") {
        extra[k] = v;
      }
    }
    cols[keys::extra.str()].push_back(std::move(extra));
    if constexpr (std::is_same_v<D, PreferenceDataset>) {
      cols["chosen"].push_back(r["chosen"]);
      cols["rejected"].push_back(r["rejected"]);
    }
    if constexpr (std::is_same_v<D, LabelledDataset> || std::is_same_v<D, CompletionDataset>) {
      cols["completion"].push_back(r["completion"]);
    }
  }
  return cols;
}

/// Pads the given sequences to `width` columns; writes "<prefix>input_ids", "attention_mask",
/// "position_ids" and (when `with_response_mask`) "response_mask" into `batch`.
inline void put_padded(TensorBatch& batch, const std::vector<const BatchSequence*>& seqs,
                       int64_t width, int64_t pad_id, PaddingSide side, const std::string& prefix,
                       bool with_response_mask) {
  const auto b = static_cast<int64_t>(seqs.size());
  auto ids = at::full({b, width}, pad_id, at::kLong);
  auto mask = at::zeros({b, width}, at::kLong);
  auto pos = at::zeros({b, width}, at::kLong);
  auto loss = at::zeros({b, width}, at::kLong);
  auto* pi = ids.data_ptr<int64_t>();
  auto* pm = mask.data_ptr<int64_t>();
  auto* pp = pos.data_ptr<int64_t>();
  auto* pl = loss.data_ptr<int64_t>();
  for (int64_t r = 0; r < b; ++r) {
    const auto& s = *seqs[static_cast<size_t>(r)];
    const auto n = static_cast<int64_t>(s.ids.size());
    const int64_t off = r * width + (side == PaddingSide::left ? width - n : 0);
    for (int64_t t = 0; t < n; ++t) {
      pi[off + t] = s.ids[static_cast<size_t>(t)];
      pm[off + t] = 1;
      pp[off + t] = t;
      pl[off + t] = t >= s.prompt_length ? 1 : 0;
    }
  }
  batch.set(keys::with_role(prefix, keys::input_ids), ids);
  batch.set(keys::with_role(prefix, keys::attention_mask), mask);
  batch.set(keys::with_role(prefix, keys::position_ids), pos);
  if (with_response_mask) batch.set(keys::with_role(prefix, keys::response_mask), loss);
}

inline int64_t longest(const std::vector<BatchSequence>& seqs) {
  int64_t m = 0;
  for (const auto& s : seqs) m = std::max(m, static_cast<int64_t>(s.ids.size()));
  return m;
}

}  // namespace detail

/// Real (attention_mask 1) and all positions over every role's token tensors of a batch.
struct TokenCounts {
  int64_t real = 0;    ///< non-padding tokens
  int64_t padded = 0;  ///< all positions (real + padding)
};

/// Counts the tokens of a per-sequence batch from its masks ("<role>attention_mask" of every role
/// in keys::roles), so the counts of a slice or a concat are always its own.
[[nodiscard]] inline TokenCounts token_counts(const TensorBatch& batch) {
  TokenCounts c;
  for (auto role : keys::roles) {
    const auto key = keys::with_role(role, keys::attention_mask);
    if (!batch.has_tensor(key)) continue;
    const auto& m = batch.tensor(key);
    c.real += m.sum().item<int64_t>();
    c.padded += m.numel();
  }
  return c;
}

/// A padded per-sequence batch of the given units (prompts are padded on `prompt_side`, full
/// sequences on the right); no metadata.
template <class D>
[[nodiscard]] TensorBatch collate_padded(const D& d, std::span<const int64_t> units,
                                         PaddingSide prompt_side = PaddingSide::left) {
  const auto seqs = detail::batch_sequences(d, units);
  const int64_t width = detail::longest(seqs);
  TensorBatch batch({}, detail::unit_columns(d, units));
  auto pick = [&](const std::string& role) {
    std::vector<const detail::BatchSequence*> out;
    for (const auto& s : seqs) {
      if (s.role == role) out.push_back(&s);
    }
    return out;
  };
  if constexpr (std::is_same_v<D, PromptDataset>) {
    detail::put_padded(batch, pick("prompt"), width, d.pad_id(), prompt_side, "", false);
  } else if constexpr (std::is_same_v<D, PreferenceDataset>) {
    detail::put_padded(batch, pick("chosen"), width, d.pad_id(), PaddingSide::right, "chosen_", true);
    detail::put_padded(batch, pick("rejected"), width, d.pad_id(), PaddingSide::right, "rejected_", true);
  } else if constexpr (std::is_same_v<D, CompletionDataset>) {
    detail::put_padded(batch, pick("completion"), width, d.pad_id(), PaddingSide::right, "", true);
  } else {
    detail::put_padded(batch, pick("completion"), width, d.pad_id(), PaddingSide::right, "", true);
    detail::put_padded(batch, pick("kl"), width, d.pad_id(), PaddingSide::right, "kl_", true);
    std::vector<uint8_t> labels;
    for (auto i : units) labels.push_back(d[i].label ? 1 : 0);
    batch.set(keys::desirable, at::tensor(labels, at::kByte).to(at::kBool));
  }
  return batch;
}

}  // namespace hybridrl
