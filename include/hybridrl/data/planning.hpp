#pragma once
/// \file
/// Batch planning on lengths alone (no tensors): length-bucketed batches by count or token
/// budget, and packing lengths into fixed-length rows (best-fit decreasing, O(n + row_length)).
/// The seeded shuffle lives in core/rng.hpp; balancing over data-parallel ranks in
/// trainer/balance.hpp.

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/rng.hpp"

namespace hybridrl {

namespace detail {

/// A bit set over [0, n) that finds the smallest set index >= i in O(log64 n): one bit per word
/// summarises a word of the level below.
class BitTree {
 public:
  static constexpr size_t npos = std::numeric_limits<size_t>::max();
  explicit BitTree(size_t n) {
    size_t m = std::max<size_t>(n, 1);
    do {
      const size_t w = (m + 63) / 64;
      levels_.emplace_back(w, 0);
      m = w;
    } while (m > 1);
  }
  void set(size_t i) {
    for (auto& l : levels_) {
      const bool was = l[i / 64] != 0;
      l[i / 64] |= uint64_t{1} << (i % 64);
      if (was) break;
      i /= 64;
    }
  }
  void reset(size_t i) {
    for (auto& l : levels_) {
      l[i / 64] &= ~(uint64_t{1} << (i % 64));
      if (l[i / 64] != 0) break;
      i /= 64;
    }
  }
  /// Smallest set index >= i, or npos.
  [[nodiscard]] size_t next(size_t i) const { return next_at(0, i); }

 private:
  [[nodiscard]] size_t next_at(size_t level, size_t i) const {
    const auto& l = levels_[level];
    size_t w = i / 64;
    if (w >= l.size()) return npos;
    const uint64_t bits = l[w] & (~uint64_t{0} << (i % 64));
    if (bits != 0) return w * 64 + static_cast<size_t>(std::countr_zero(bits));
    if (level + 1 == levels_.size()) {
      for (++w; w < l.size(); ++w) {
        if (l[w] != 0) return w * 64 + static_cast<size_t>(std::countr_zero(l[w]));
      }
      return npos;
    }
    const size_t nw = next_at(level + 1, w + 1);
    if (nw == npos) return npos;
    return nw * 64 + static_cast<size_t>(std::countr_zero(l[nw]));
  }
  std::vector<std::vector<uint64_t>> levels_;
};

}  // namespace detail

// ---- packing ---------------------------------------------------------------------------------

/// Items packed into rows: row r holds items[row_offsets[r] .. row_offsets[r+1]) (indices into
/// the input lengths) and uses row_used[r] tokens of row_length.
struct PackPlan {
  int64_t row_length = 0;            ///< capacity of every row
  std::vector<int64_t> row_offsets;  ///< rows() + 1 offsets into `items`
  std::vector<int64_t> items;        ///< item indices, row by row
  std::vector<int64_t> row_used;     ///< tokens used per row

  /// Number of rows.
  [[nodiscard]] int64_t rows() const noexcept {
    return row_offsets.empty() ? 0 : static_cast<int64_t>(row_offsets.size()) - 1;
  }
  /// Item indices of row `r`.
  [[nodiscard]] std::span<const int64_t> row(int64_t r) const {
    return {items.data() + row_offsets[static_cast<size_t>(r)],
            static_cast<size_t>(row_offsets[static_cast<size_t>(r) + 1] -
                                row_offsets[static_cast<size_t>(r)])};
  }
  /// Unused positions ÷ all positions (rows × row_length): the padding a packed layout keeps.
  [[nodiscard]] double unused_fraction() const noexcept {
    if (rows() == 0) return 0.0;
    int64_t used = 0;
    for (auto u : row_used) used += u;
    return 1.0 - static_cast<double>(used) / static_cast<double>(rows() * row_length);
  }
};

namespace detail {

inline void check_pack_inputs(std::span<const int64_t> lengths, int64_t row_length) {
  HYBRIDRL_CHECK(row_length >= 1, fmt::format("packing: row_length = {} is below 1", row_length),
                 "use a row length at least as long as the longest sample");
  for (size_t i = 0; i < lengths.size(); ++i) {
    HYBRIDRL_CHECK(lengths[i] >= 1 && lengths[i] <= row_length,
                   fmt::format("packing: item {} has length {}, outside [1, row_length = {}]", i,
                               lengths[i], row_length),
                   "raise loader.row_length to at least the longest sample, or lower the "
                   "dataset's max_length so longer lines are rejected");
  }
}

/// Builds the PackPlan from each item's row, keeping the given placement order inside a row.
inline PackPlan plan_from_rows(std::span<const int64_t> order, const std::vector<int32_t>& row_of,
                               std::vector<int64_t> row_used, int64_t row_length) {
  PackPlan p;
  p.row_length = row_length;
  const size_t rows = row_used.size();
  p.row_offsets.assign(rows + 1, 0);
  for (auto item : order) ++p.row_offsets[static_cast<size_t>(row_of[static_cast<size_t>(item)]) + 1];
  for (size_t r = 0; r < rows; ++r) p.row_offsets[r + 1] += p.row_offsets[r];
  p.items.resize(order.size());
  std::vector<int64_t> fill(p.row_offsets.begin(), p.row_offsets.end() - 1);
  for (auto item : order) {
    p.items[static_cast<size_t>(fill[static_cast<size_t>(row_of[static_cast<size_t>(item)])]++)] = item;
  }
  p.row_used = std::move(row_used);
  return p;
}

/// Item indices by decreasing length, ties by index (counting sort: lengths <= row_length).
inline std::vector<int64_t> decreasing_order(std::span<const int64_t> lengths, int64_t row_length) {
  std::vector<int64_t> start(static_cast<size_t>(row_length) + 2, 0);
  for (auto l : lengths) ++start[static_cast<size_t>(row_length - l) + 1];
  for (size_t i = 1; i < start.size(); ++i) start[i] += start[i - 1];
  std::vector<int64_t> order(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    order[static_cast<size_t>(start[static_cast<size_t>(row_length - lengths[i])]++)] =
        static_cast<int64_t>(i);
  }
  return order;
}

/// The textbook first-fit decreasing: scan rows from the first for each item, O(n · rows).
/// Kept as the planning-speed peer in bench/data and as an oracle in tests.
inline PackPlan pack_rows_first_fit_scan(std::span<const int64_t> lengths, int64_t row_length) {
  check_pack_inputs(lengths, row_length);
  const auto order = decreasing_order(lengths, row_length);
  std::vector<int32_t> row_of(lengths.size());
  std::vector<int64_t> used;
  for (auto item : order) {
    const int64_t l = lengths[static_cast<size_t>(item)];
    size_t r = 0;
    while (r < used.size() && used[r] + l > row_length) ++r;
    if (r == used.size()) used.push_back(0);
    used[r] += l;
    row_of[static_cast<size_t>(item)] = static_cast<int32_t>(r);
  }
  return plan_from_rows(order, row_of, std::move(used), row_length);
}

}  // namespace detail

/// Packs items of the given lengths into rows of `row_length` tokens by best-fit decreasing:
/// longest first, each into the open row with the least room that still fits it. Rows are kept
/// in buckets by remaining room and the smallest fitting bucket is found through a bit tree, so
/// the cost is O(n + row_length) (10^6 items in a few tens of ms). Every length must lie in
/// [1, row_length]; otherwise hybridrl::Error.
[[nodiscard]] inline PackPlan pack_rows(std::span<const int64_t> lengths, int64_t row_length) {
  detail::check_pack_inputs(lengths, row_length);
  const auto order = detail::decreasing_order(lengths, row_length);
  // head[c]: a row with exactly c tokens free (intrusive stack through next_row); -1 when none.
  std::vector<int32_t> head(static_cast<size_t>(row_length) + 1, -1);
  std::vector<int32_t> next_row;
  std::vector<int64_t> used;
  std::vector<int32_t> row_of(lengths.size());
  detail::BitTree free_rooms(static_cast<size_t>(row_length) + 1);
  for (auto item : order) {
    const int64_t l = lengths[static_cast<size_t>(item)];
    const size_t c = free_rooms.next(static_cast<size_t>(l));
    int32_t r;
    if (c == detail::BitTree::npos) {
      r = static_cast<int32_t>(used.size());
      used.push_back(0);
      next_row.push_back(-1);
    } else {
      r = head[c];
      head[c] = next_row[static_cast<size_t>(r)];
      if (head[c] < 0) free_rooms.reset(c);
    }
    used[static_cast<size_t>(r)] += l;
    row_of[static_cast<size_t>(item)] = r;
    const auto room = static_cast<size_t>(row_length - used[static_cast<size_t>(r)]);
    if (room > 0) {
      next_row[static_cast<size_t>(r)] = head[room];
      if (head[room] < 0) free_rooms.set(room);
      head[room] = r;
    }
  }
  return detail::plan_from_rows(order, row_of, std::move(used), row_length);
}

// ---- bucketing -------------------------------------------------------------------------------

/// How Loader<Bucketed> cuts one epoch into batches.
struct BucketPlanOptions {
  int64_t batch_size = 8;             ///< units per batch (an upper bound when a budget is set)
  int64_t max_tokens_per_batch = 0;   ///< cap on padded tokens (units × seqs × longest); 0 = none
  int64_t sequences_per_unit = 1;     ///< 2 for DPO pairs and KTO (matched + mismatched)
  int64_t window_batches = 256;       ///< batches per sorting window; 0 = the whole epoch
  bool shuffle = true;                ///< seeded shuffle of units and of batch order
  bool drop_last = false;             ///< drop a final short batch (count mode only)
};

/// Groups unit indices into batches of similar length: shuffle (seeded), sort each window of
/// `window_batches × batch_size` units by length, cut by count or by token budget, then shuffle the
/// batch order. Every unit appears in exactly one batch (unless drop_last drops the short tail).
[[nodiscard]] inline std::vector<std::vector<int64_t>> bucket_batches(
    std::span<const int64_t> unit_lengths, const BucketPlanOptions& o, uint64_t seed) {
  const auto n = static_cast<int64_t>(unit_lengths.size());
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (o.shuffle) detail::shuffle(order, seed);
  const int64_t window = o.window_batches == 0 ? std::max<int64_t>(n, 1) : o.window_batches * o.batch_size;
  std::vector<std::vector<int64_t>> batches;
  for (int64_t w0 = 0; w0 < n; w0 += window) {
    const auto first = order.begin() + w0;
    const auto last = order.begin() + std::min(n, w0 + window);
    std::stable_sort(first, last, [&](int64_t a, int64_t b) {
      return unit_lengths[static_cast<size_t>(a)] > unit_lengths[static_cast<size_t>(b)];
    });
    std::vector<int64_t> cur;
    int64_t longest = 0;
    for (auto it = first; it != last; ++it) {
      const int64_t l = unit_lengths[static_cast<size_t>(*it)];
      const int64_t count = static_cast<int64_t>(cur.size()) + 1;
      const bool over_count = count > o.batch_size;
      const bool over_budget = o.max_tokens_per_batch > 0 &&
                               count * o.sequences_per_unit * std::max(longest, l) > o.max_tokens_per_batch;
      if (!cur.empty() && (over_count || over_budget)) {
        batches.push_back(std::move(cur));
        cur.clear();
        longest = 0;
      }
      cur.push_back(*it);
      longest = std::max(longest, l);
    }
    if (!cur.empty()) batches.push_back(std::move(cur));
  }
  if (o.drop_last && o.max_tokens_per_batch == 0 && !batches.empty()) {
    // The only short batch in count mode is the last one of the last window.
    auto it = std::find_if(batches.begin(), batches.end(),
                           [&](const auto& b) { return static_cast<int64_t>(b.size()) < o.batch_size; });
    if (it != batches.end()) batches.erase(it);
  }
  if (o.shuffle) detail::shuffle(batches, seed ^ 0xA5A5A5A5A5A5A5A5ULL);
  return batches;
}

/// Padding positions ÷ all positions when each batch is padded to its longest unit (the
/// planning-time estimate; LoaderStatistics::padding_waste counts the batches actually returned).
[[nodiscard]] inline double bucketed_padding_fraction(const std::vector<std::vector<int64_t>>& batches,
                                          std::span<const int64_t> lengths) {
  int64_t real = 0, all = 0;
  for (const auto& b : batches) {
    int64_t longest = 0;
    for (auto i : b) {
      real += lengths[static_cast<size_t>(i)];
      longest = std::max(longest, lengths[static_cast<size_t>(i)]);
    }
    all += longest * static_cast<int64_t>(b.size());
  }
  return all == 0 ? 0.0 : 1.0 - static_cast<double>(real) / static_cast<double>(all);
}

}  // namespace hybridrl
