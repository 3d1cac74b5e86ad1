#pragma once
/// \file
/// Packing at the micro-batch boundary (verl's remove-padding): a per-sequence TensorBatch (one
/// row per unit, padded) is laid out as rows of `row_length` tokens with several sequences per row,
/// position ids restarting per sequence and no attention across sequences (cu_seqlens), and
/// per-token results of the packed forward are scattered back to the per-sequence [B, T] layout
/// (or summed per sequence). The batch stays per-sequence through the pipeline, so slice, chunk,
/// reorder and concat never see packed rows; only the forward passes do.
///
/// Roles: a batch may hold several sequences per unit, told apart by a key prefix
/// (core/keys.hpp): "" (input_ids...), "chosen_" and "rejected_" (DPO), "" and "kl_" (KTO). pack()
/// packs every role present (a role is present when "<role>input_ids" is), so one forward scores
/// chosen and rejected sequences together.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/data/planning.hpp"

namespace hybridrl {

/// A micro-batch packed into rows, and the map from its sequences back to the per-sequence batch.
/// Sequence s (s = unit × roles.size() + role index) is unit sequence_unit[s] of role
/// roles[sequence_role[s]]; its tokens are packed row sequence_row[s], columns
/// [sequence_offset[s], + sequence_length[s]), and came from columns [sequence_start[s], + length)
/// of that role's [B, T] tensors.
struct PackedMicroBatch {
  /// [R, L] int64: input_ids, position_ids (restart at 0 per sequence), attention_mask (1 on
  /// tokens), segment_ids (sequence index, −1 on padding), response_mask (when the batch has
  /// one); cu_seqlens [R, S_max + 1] int32 (per-row boundaries, padded by repeating the row's end).
  TensorBatch rows;
  at::Tensor sequence_row;     ///< [S] int64
  at::Tensor sequence_offset;  ///< [S] int64, column of the first token in its packed row
  at::Tensor sequence_length;  ///< [S] int64, tokens of the sequence
  at::Tensor sequence_unit;    ///< [S] int64, row of the per-sequence batch
  at::Tensor sequence_role;    ///< [S] int64, index into `roles`
  at::Tensor sequence_start;   ///< [S] int64, column of the first token in the per-sequence batch
  std::vector<std::string> roles;  ///< role prefixes present, in keys::roles order
  std::vector<int64_t> widths;     ///< T of each role's per-sequence tensors
  int64_t units = 0;               ///< B, rows of the per-sequence batch
  int64_t row_length = 0;          ///< L: the fullest row's tokens (at most the row length packed to)

  /// Number of packed sequences S.
  [[nodiscard]] int64_t sequences() const { return sequence_row.defined() ? sequence_row.numel() : 0; }
  /// Real (non-padding) tokens in the packed rows.
  [[nodiscard]] int64_t real_tokens() const {
    return sequence_length.defined() ? sequence_length.sum().item<int64_t>() : 0;
  }
  /// Unused positions ÷ all positions of the packed rows.
  [[nodiscard]] double unused_fraction() const {
    const int64_t all = rows.size() * row_length;
    return all == 0 ? 0.0 : 1.0 - static_cast<double>(real_tokens()) / static_cast<double>(all);
  }
  /// Index of `role` in `roles`; throws naming the roles present.
  [[nodiscard]] int64_t role_index(std::string_view role) const {
    for (size_t i = 0; i < roles.size(); ++i) {
      if (roles[i] == role) return static_cast<int64_t>(i);
    }
    throw Error(fmt::format("packed micro-batch has no role '{}' (roles: [{}])", role, fmt::join(roles, ", ")),
                "pass a role prefix whose <role>input_ids was in the packed batch (\"\", \"chosen_\", "
                "\"rejected_\", \"kl_\")");
  }
};

namespace detail {

inline std::vector<int64_t> host_longs(const at::Tensor& t) {
  auto c = t.to(at::kCPU, at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Flat indices of every token of `role` in the packed rows (src) and in a [B, width] tensor
// right-aligned to the role's T (dst); tokens left of a narrower tensor's first column are skipped.
struct TokenMap {
  std::vector<int64_t> packed;    // r * L + offset + t
  std::vector<int64_t> sequence;  // b * width + column
  std::vector<int64_t> unit;      // b
};

inline TokenMap token_map(const PackedMicroBatch& p, int64_t role, int64_t width) {
  const auto row = host_longs(p.sequence_row), off = host_longs(p.sequence_offset),
             len = host_longs(p.sequence_length), unit = host_longs(p.sequence_unit),
             rl = host_longs(p.sequence_role), start = host_longs(p.sequence_start);
  const int64_t shift = p.widths[static_cast<size_t>(role)] - width;  // > 0: response-only tensor
  TokenMap m;
  for (size_t s = 0; s < row.size(); ++s) {
    if (rl[s] != role) continue;
    for (int64_t t = 0; t < len[s]; ++t) {
      const int64_t col = start[s] + t - shift;
      if (col < 0) continue;
      m.packed.push_back(row[s] * p.row_length + off[s] + t);
      m.sequence.push_back(unit[s] * width + col);
      m.unit.push_back(unit[s]);
    }
  }
  return m;
}

inline at::Tensor index_tensor(const std::vector<int64_t>& v, const at::Device& device) {
  return at::tensor(v, at::kLong).to(device);
}

}  // namespace detail

/// Packs every sequence of a per-sequence batch into rows of `row_length` tokens (best-fit
/// decreasing, pack_rows). The real tokens of each row of "<role>attention_mask" must be one
/// contiguous run (left-, right- or both-side padding); each must fit in one row. A [B, R]
/// response_mask narrower than input_ids is right-aligned to it (the online layout: prompt
/// columns first, response columns last).
[[nodiscard]] inline PackedMicroBatch pack(const TensorBatch& per_sequence, int64_t row_length) {
  HYBRIDRL_CHECK(row_length >= 1, fmt::format("pack: row_length = {} is below 1", row_length),
                 "use a row length at least as long as the longest sequence");
  PackedMicroBatch p;
  p.row_length = row_length;
  p.units = per_sequence.size();
  for (auto r : keys::roles) {
    if (per_sequence.has_tensor(keys::with_role(r, keys::input_ids))) p.roles.emplace_back(r);
  }
  HYBRIDRL_CHECK(!p.roles.empty(),
                 fmt::format("pack: the batch has no input_ids of any role (tensors: [{}])",
                             fmt::join(per_sequence.tensor_keys(), ", ")),
                 "pack a per-sequence batch from a loader or a rollout (input_ids, or chosen_/"
                 "rejected_/kl_input_ids, with their attention_mask)");
  const auto nroles = static_cast<int64_t>(p.roles.size());
  const bool with_response_mask = per_sequence.has_tensor(keys::with_role(p.roles[0], keys::response_mask));
  std::vector<std::vector<int64_t>> ids(p.roles.size()), resp(p.roles.size());
  std::vector<std::vector<int64_t>> mask(p.roles.size());
  for (size_t k = 0; k < p.roles.size(); ++k) {
    const auto& role = p.roles[k];
    const auto& in = per_sequence.tensor(keys::with_role(role, keys::input_ids));
    HYBRIDRL_CHECK(in.dim() == 2, fmt::format("pack: {}input_ids has {} dims, expected [B, T]", role, in.dim()),
                   "pack per-sequence batches (one row per unit)");
    p.widths.push_back(in.size(1));
    ids[k] = detail::host_longs(in);
    mask[k] = detail::host_longs(per_sequence.tensor(keys::with_role(role, keys::attention_mask)));
    HYBRIDRL_CHECK(per_sequence.has_tensor(keys::with_role(role, keys::response_mask)) == with_response_mask,
                   fmt::format("pack: {}response_mask is {} but {}response_mask is {}", role,
                               with_response_mask ? "missing" : "present", p.roles[0],
                               with_response_mask ? "present" : "missing"),
                   "give every role a response_mask, or none");
    if (with_response_mask) {
      auto rm = per_sequence.tensor(keys::with_role(role, keys::response_mask));
      const int64_t shift = in.size(1) - rm.size(1);
      HYBRIDRL_CHECK(rm.dim() == 2 && shift >= 0,
                     fmt::format("pack: {}response_mask is wider than {}input_ids ({} vs {})", role,
                                 role, rm.size(-1), in.size(1)),
                     "use a response_mask of shape [B, T] (offline) or [B, R] with R <= T (online)");
      if (shift > 0) rm = at::cat({at::zeros({rm.size(0), shift}, rm.options()), rm}, 1);
      resp[k] = detail::host_longs(rm);
    }
  }
  // Sequences unit-major: s = b * nroles + k.
  const int64_t nseq = p.units * nroles;
  std::vector<int64_t> start(static_cast<size_t>(nseq)), length(static_cast<size_t>(nseq));
  for (int64_t b = 0; b < p.units; ++b) {
    for (int64_t k = 0; k < nroles; ++k) {
      const int64_t w = p.widths[static_cast<size_t>(k)];
      const auto* m = mask[static_cast<size_t>(k)].data() + b * w;
      int64_t first = -1, last = -1, count = 0;
      for (int64_t t = 0; t < w; ++t) {
        if (m[t] == 0) continue;
        if (first < 0) first = t;
        last = t;
        ++count;
      }
      HYBRIDRL_CHECK(count >= 1 && last - first + 1 == count,
                     fmt::format("pack: row {} of {}attention_mask has {}", b, p.roles[static_cast<size_t>(k)],
                                 count == 0 ? "no tokens" : "padding between its tokens"),
                     "pack batches whose rows are one run of real tokens (as the loaders and "
                     "rollouts write them); drop empty rows first");
      const auto s = static_cast<size_t>(b * nroles + k);
      start[s] = first;
      length[s] = count;
    }
  }
  const auto plan = pack_rows(length, row_length);
  const int64_t rows = plan.rows();
  // The rows are as wide as the fullest one, not row_length: a batch that fills its rows only
  // partly (short sequences, a small micro-batch) carries no padding columns — on the CPU's
  // masked attention, whose cost grows with the square of the width, that is most of the time.
  if (!plan.row_used.empty()) {
    row_length = std::max<int64_t>(1, *std::max_element(plan.row_used.begin(), plan.row_used.end()));
  }
  p.row_length = row_length;
  int64_t max_segments = 0;
  for (int64_t r = 0; r < rows; ++r) max_segments = std::max<int64_t>(max_segments, static_cast<int64_t>(plan.row(r).size()));
  auto out_ids = at::zeros({rows, row_length}, at::kLong);
  auto out_mask = at::zeros({rows, row_length}, at::kLong);
  auto out_pos = at::zeros({rows, row_length}, at::kLong);
  auto out_resp = at::zeros({rows, row_length}, at::kLong);
  auto out_seg = at::full({rows, row_length}, -1, at::kLong);
  auto out_cu = at::zeros({rows, max_segments + 1}, at::kInt);
  auto* pi = out_ids.data_ptr<int64_t>();
  auto* pm = out_mask.data_ptr<int64_t>();
  auto* pp = out_pos.data_ptr<int64_t>();
  auto* pr = out_resp.data_ptr<int64_t>();
  auto* ps = out_seg.data_ptr<int64_t>();
  auto* pc = out_cu.data_ptr<int32_t>();
  std::vector<int64_t> seq_row(static_cast<size_t>(nseq)), seq_off(static_cast<size_t>(nseq));
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> members(plan.row(r).begin(), plan.row(r).end());
    std::sort(members.begin(), members.end());  // batch order inside a row: stable, readable
    int64_t off = 0, k = 0;
    for (auto si : members) {
      const auto s = static_cast<size_t>(si);
      const int64_t b = si / nroles, role = si % nroles, w = p.widths[static_cast<size_t>(role)];
      const int64_t base = r * row_length + off;
      for (int64_t t = 0; t < length[s]; ++t) {
        const auto src = static_cast<size_t>(b * w + start[s] + t);
        pi[base + t] = ids[static_cast<size_t>(role)][src];
        pm[base + t] = 1;
        pp[base + t] = t;
        if (with_response_mask) pr[base + t] = resp[static_cast<size_t>(role)][src];
        ps[base + t] = si;
      }
      seq_row[s] = r;
      seq_off[s] = off;
      pc[r * (max_segments + 1) + k++] = static_cast<int32_t>(off);
      off += length[s];
    }
    for (int64_t j = k; j <= max_segments; ++j) pc[r * (max_segments + 1) + j] = static_cast<int32_t>(off);
  }
  const auto device = per_sequence.tensor(keys::with_role(p.roles[0], keys::input_ids)).device();
  p.rows.set(keys::input_ids, out_ids.to(device));
  p.rows.set(keys::attention_mask, out_mask.to(device));
  p.rows.set(keys::position_ids, out_pos.to(device));
  p.rows.set(keys::segment_ids, out_seg.to(device));
  p.rows.set(keys::cu_seqlens, out_cu.to(device));
  if (with_response_mask) p.rows.set(keys::response_mask, out_resp.to(device));
  std::vector<int64_t> seq_unit(static_cast<size_t>(nseq)), seq_role(static_cast<size_t>(nseq));
  for (int64_t s = 0; s < nseq; ++s) {
    seq_unit[static_cast<size_t>(s)] = s / nroles;
    seq_role[static_cast<size_t>(s)] = s % nroles;
  }
  p.sequence_row = at::tensor(seq_row, at::kLong);
  p.sequence_offset = at::tensor(seq_off, at::kLong);
  p.sequence_length = at::tensor(length, at::kLong);
  p.sequence_unit = at::tensor(seq_unit, at::kLong);
  p.sequence_role = at::tensor(seq_role, at::kLong);
  p.sequence_start = at::tensor(start, at::kLong);
  return p;
}

/// Packs a per-token tensor of the per-sequence batch (e.g. advantages, old_log_probs) of role
/// `role` into the packed layout: [B, T] or a right-aligned [B, R] → [R_rows, L], 0 on positions
/// of other roles and padding. Differentiable in `values`.
[[nodiscard]] inline at::Tensor pack_values(const PackedMicroBatch& p, const at::Tensor& values,
                                            std::string_view role = "") {
  const int64_t k = p.role_index(role);
  HYBRIDRL_CHECK(values.dim() == 2 && values.size(0) == p.units &&
                     values.size(1) <= p.widths[static_cast<size_t>(k)],
                 fmt::format("pack_values: values of shape [{}] do not match role '{}' of the packed "
                             "batch ([{}, <= {}])",
                             fmt::join(values.sizes().vec(), ", "), role, p.units,
                             p.widths[static_cast<size_t>(k)]),
                 "pass a per-token tensor of the per-sequence batch the micro-batch was packed from");
  const auto m = detail::token_map(p, k, values.size(1));
  const auto dev = values.device();
  auto flat = at::zeros({p.rows.size() * p.row_length}, values.options());
  flat = flat.index_copy(0, detail::index_tensor(m.packed, dev),
                         values.reshape({-1}).index_select(0, detail::index_tensor(m.sequence, dev)));
  return flat.view({p.rows.size(), p.row_length});
}

/// Scatters per-token values of the packed rows ([R, L], e.g. log-probs of the packed forward)
/// back to role `role` of the per-sequence layout: [B, T] with the role's T and padding, 0 on
/// padding. Differentiable in `packed`.
[[nodiscard]] inline at::Tensor unpack(const PackedMicroBatch& p, const at::Tensor& packed,
                                       std::string_view role = "") {
  const int64_t k = p.role_index(role);
  HYBRIDRL_CHECK(packed.dim() == 2 && packed.size(0) == p.rows.size() && packed.size(1) == p.row_length,
                 fmt::format("unpack: values of shape [{}], the packed rows are [{}, {}]",
                             fmt::join(packed.sizes().vec(), ", "), p.rows.size(), p.row_length),
                 "pass a per-token result of the forward over PackedMicroBatch::rows");
  const int64_t w = p.widths[static_cast<size_t>(k)];
  const auto m = detail::token_map(p, k, w);
  const auto dev = packed.device();
  auto flat = at::zeros({p.units * w}, packed.options());
  flat = flat.index_copy(0, detail::index_tensor(m.sequence, dev),
                         packed.reshape({-1}).index_select(0, detail::index_tensor(m.packed, dev)));
  return flat.view({p.units, w});
}

/// Per-sequence sums of packed per-token values for role `role`: [B] (e.g. the summed response
/// log-prob of each chosen sequence, with the values multiplied by the packed response_mask
/// first). Differentiable in `packed`.
[[nodiscard]] inline at::Tensor unpack_sum(const PackedMicroBatch& p, const at::Tensor& packed,
                                           std::string_view role = "") {
  const int64_t k = p.role_index(role);
  HYBRIDRL_CHECK(packed.dim() == 2 && packed.size(0) == p.rows.size() && packed.size(1) == p.row_length,
                 fmt::format("unpack_sum: values of shape [{}], the packed rows are [{}, {}]",
                             fmt::join(packed.sizes().vec(), ", "), p.rows.size(), p.row_length),
                 "pass a per-token result of the forward over PackedMicroBatch::rows");
  const auto m = detail::token_map(p, k, p.widths[static_cast<size_t>(k)]);
  const auto dev = packed.device();
  return at::zeros({p.units}, packed.options())
      .index_add(0, detail::index_tensor(m.unit, dev),
                 packed.reshape({-1}).index_select(0, detail::index_tensor(m.packed, dev)));
}

}  // namespace hybridrl
