#pragma once
/// \file
/// Turns a list of dataset units into a TensorBatch: padded rows (Loader<Bucketed>, and prompt
/// batches of either loader) or packed rows (Loader<Packed> for DPO/KTO). The keys are listed in
/// docs/data.md; in short:
/// - prompts: "input_ids", "attention_mask", "position_ids" ([B, T], left-padded by default).
/// - DPO pairs (padded): "chosen_*" and "rejected_*" versions of input_ids / attention_mask /
///   position_ids / loss_mask, [B, T], right-padded to one T.
/// - KTO (padded): "input_ids", "attention_mask", "position_ids", "loss_mask", "kl_*" for the
///   mismatched pair (prompt i with the completion of sample (i+1) mod B), and "label" [B] bool.
/// - packed: "input_ids", "position_ids" (restarting per sequence), "attention_mask", "loss_mask",
///   "segment_ids" (sequence index, -1 on padding), [R, row_length], and "cu_seqlens"
///   [R, S+1] int32 (per-row boundaries, padded by repeating the row's end); meta
///   "sequence_unit", "sequence_role", "sequence_label" (KTO) map sequences to units.
/// Non-tensor columns: "prompt", "answer", "data_source", "uid", "extra" (remaining fields);
/// in packed batches each column entry is the array of its row's sequences' values.
/// Integer tensors are int64 (masks are 0/1 int64, as verl's attention_mask).

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "hybridrl/core/options.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/data/dataset.hpp"
#include "hybridrl/data/planning.hpp"

namespace hybridrl {

/// Where padding goes in a padded row.
enum class PaddingSide { left, right };
HYBRIDRL_ENUM_NAMES(PaddingSide, left, right);

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
    const auto& partner = d[units[(u + 1) % b]];
    const auto pl = static_cast<int64_t>(s.prompt_ids.size());
    out.push_back({s.ids, pl, static_cast<int64_t>(u), "completion"});
    std::vector<int64_t> kl = s.prompt_ids;
    kl.insert(kl.end(), partner.completion_ids.begin(), partner.completion_ids.end());
    out.push_back({std::move(kl), pl, static_cast<int64_t>(u), "kl"});
  }
  return out;
}

template <class D>
std::map<std::string, Column> unit_columns(const D& d, std::span<const int64_t> units) {
  std::map<std::string, Column> cols;
  for (auto i : units) {
    const auto& s = d[i];
    const auto& r = s.record;
    cols["prompt"].push_back(r.value("prompt", std::string{}));
    cols["answer"].push_back(r.contains("answer") ? r["answer"] : nlohmann::json());
    cols["data_source"].push_back(s.data_source);
    cols["uid"].push_back(s.uid);
    nlohmann::json extra = nlohmann::json::object();
    for (const auto& [k, v] : r.items()) {
      if (k != "prompt" && k != "answer" && k != "data_source" && k != "uid" && k != "id" &&
          k != "chosen" && k != "rejected" && k != "completion" && k != "label") {
        extra[k] = v;
      }
    }
    cols["extra"].push_back(std::move(extra));
    if constexpr (std::is_same_v<D, PreferenceDataset>) {
      cols["chosen"].push_back(r["chosen"]);
      cols["rejected"].push_back(r["rejected"]);
    }
    if constexpr (std::is_same_v<D, LabelledDataset>) cols["completion"].push_back(r["completion"]);
  }
  return cols;
}

/// Pads the given sequences to `width` columns; writes "<prefix>input_ids", "attention_mask",
/// "position_ids" and (when `with_loss_mask`) "loss_mask" into `batch`.
inline void put_padded(TensorBatch& batch, const std::vector<const BatchSequence*>& seqs,
                       int64_t width, int64_t pad_id, PaddingSide side, const std::string& prefix,
                       bool with_loss_mask) {
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
  batch.set(prefix + "input_ids", ids);
  batch.set(prefix + "attention_mask", mask);
  batch.set(prefix + "position_ids", pos);
  if (with_loss_mask) batch.set(prefix + "loss_mask", loss);
}

inline int64_t longest(const std::vector<BatchSequence>& seqs) {
  int64_t m = 0;
  for (const auto& s : seqs) m = std::max(m, static_cast<int64_t>(s.ids.size()));
  return m;
}

}  // namespace detail

/// A padded batch of the given units (prompts are padded on `prompt_side`, full sequences on the
/// right). Meta: "num_tokens" (real tokens) and "padded_tokens" (all positions).
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
  } else {
    detail::put_padded(batch, pick("completion"), width, d.pad_id(), PaddingSide::right, "", true);
    detail::put_padded(batch, pick("kl"), width, d.pad_id(), PaddingSide::right, "kl_", true);
    std::vector<uint8_t> labels;
    for (auto i : units) labels.push_back(d[i].label ? 1 : 0);
    batch.set("label", at::tensor(labels, at::kByte).to(at::kBool));
  }
  int64_t real = 0;
  for (const auto& s : seqs) real += static_cast<int64_t>(s.ids.size());
  batch.set_meta("num_tokens", real);
  batch.set_meta("padded_tokens", width * static_cast<int64_t>(seqs.size()));
  return batch;
}

/// A packed batch: every sequence of the given units placed into rows of `row_length` tokens by
/// pack_rows (best-fit decreasing). Each sequence must fit in one row.
template <class D>
[[nodiscard]] TensorBatch collate_packed(const D& d, std::span<const int64_t> units,
                                         int64_t row_length) {
  const auto seqs = detail::batch_sequences(d, units);
  std::vector<int64_t> lengths;
  lengths.reserve(seqs.size());
  for (const auto& s : seqs) lengths.push_back(static_cast<int64_t>(s.ids.size()));
  const auto plan = pack_rows(lengths, row_length);
  const int64_t rows = plan.rows();
  int64_t max_segments = 0;
  for (int64_t r = 0; r < rows; ++r) max_segments = std::max<int64_t>(max_segments, static_cast<int64_t>(plan.row(r).size()));
  const int64_t pad_id = d.pad_id();
  at::Tensor ids = at::full({rows, row_length}, pad_id, at::kLong);
  auto mask = at::zeros({rows, row_length}, at::kLong);
  auto pos = at::zeros({rows, row_length}, at::kLong);
  auto loss = at::zeros({rows, row_length}, at::kLong);
  auto seg = at::full({rows, row_length}, -1, at::kLong);
  auto cu = at::zeros({rows, max_segments + 1}, at::kInt);
  auto* pi = ids.data_ptr<int64_t>();
  auto* pm = mask.data_ptr<int64_t>();
  auto* pp = pos.data_ptr<int64_t>();
  auto* pl = loss.data_ptr<int64_t>();
  auto* ps = seg.data_ptr<int64_t>();
  auto* pc = cu.data_ptr<int32_t>();
  const auto unit_cols = detail::unit_columns(d, units);
  std::map<std::string, Column> row_cols;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = 0;
    int64_t k = 0;
    std::map<std::string, nlohmann::json> per_row;
    for (const auto& [name, col] : unit_cols) per_row[name] = nlohmann::json::array();
    // Sequences inside a row in batch order, so segment order is stable and readable.
    std::vector<int64_t> members(plan.row(r).begin(), plan.row(r).end());
    std::sort(members.begin(), members.end());
    for (auto si : members) {
      const auto& s = seqs[static_cast<size_t>(si)];
      const auto n = static_cast<int64_t>(s.ids.size());
      const int64_t base = r * row_length + off;
      for (int64_t t = 0; t < n; ++t) {
        pi[base + t] = s.ids[static_cast<size_t>(t)];
        pm[base + t] = 1;
        pp[base + t] = t;
        pl[base + t] = t >= s.prompt_length ? 1 : 0;
        ps[base + t] = si;
      }
      pc[r * (max_segments + 1) + k] = static_cast<int32_t>(off);
      off += n;
      ++k;
      for (const auto& [name, col] : unit_cols) per_row[name].push_back(col[static_cast<size_t>(s.unit)]);
    }
    for (int64_t j = k; j <= max_segments; ++j) pc[r * (max_segments + 1) + j] = static_cast<int32_t>(off);
    for (auto& [name, v] : per_row) row_cols[name].push_back(std::move(v));
  }
  TensorBatch batch({{"input_ids", ids}, {"attention_mask", mask}, {"position_ids", pos},
                     {"loss_mask", loss}, {"segment_ids", seg}, {"cu_seqlens", cu}},
                    std::move(row_cols));
  nlohmann::json seq_unit = nlohmann::json::array(), seq_role = nlohmann::json::array(),
                 seq_len = nlohmann::json::array();
  for (const auto& s : seqs) {
    seq_unit.push_back(s.unit);
    seq_role.push_back(s.role);
    seq_len.push_back(s.ids.size());
  }
  batch.set_meta("sequence_unit", std::move(seq_unit));
  batch.set_meta("sequence_role", std::move(seq_role));
  batch.set_meta("sequence_length", std::move(seq_len));
  if constexpr (std::is_same_v<D, LabelledDataset>) {
    nlohmann::json labels = nlohmann::json::array();
    for (auto i : units) labels.push_back(d[i].label);
    batch.set_meta("unit_label", std::move(labels));
  }
  int64_t real = 0;
  for (auto l : lengths) real += l;
  batch.set_meta("num_units", static_cast<int64_t>(units.size()));
  batch.set_meta("num_tokens", real);
  batch.set_meta("padded_tokens", rows * row_length);
  return batch;
}

}  // namespace hybridrl
