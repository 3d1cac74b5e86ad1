#pragma once
/// \file
/// Batch planning on lengths alone (no tensors): the seeded, portable shuffle; length-bucketed
/// batches by count or token budget; packing lengths into fixed-length rows (best-fit decreasing,
/// O(n + row_length)); and balancing a global batch over data-parallel ranks (Karmarkar–Karp or
/// greedy) with a reversible reordering — verl's seqlen_balancing, written for C++.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <numeric>
#include <queue>
#include <span>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/tensor_batch.hpp"

namespace hybridrl {

namespace detail {

/// SplitMix64: a tiny, fully specified generator, so a seed gives the same order on every
/// platform and standard library (std::shuffle's algorithm is implementation-defined).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) noexcept : state_(seed) {}
  uint64_t next() noexcept {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n), without modulo bias (rejection sampling).
  uint64_t below(uint64_t n) noexcept {
    const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % n;
    uint64_t x = next();
    while (x >= limit) x = next();
    return x % n;
  }

 private:
  uint64_t state_;
};

/// The seed of one epoch's shuffle, derived from the run's seed (a different stream per epoch).
inline uint64_t epoch_seed(uint64_t seed, int64_t epoch, uint64_t stream = 0) noexcept {
  SplitMix64 g(seed ^ (0xD1B54A32D192ED03ULL * (static_cast<uint64_t>(epoch) + 1)) ^
               (stream * 0x8CB92BA72F3D8DD7ULL));
  return g.next();
}

/// Fisher–Yates with SplitMix64.
template <class T>
void shuffle(std::vector<T>& v, uint64_t seed) {
  SplitMix64 g(seed);
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[g.below(i)]);
}

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
  /// Padded tokens ÷ all tokens (rows × row_length).
  [[nodiscard]] double padding_waste() const noexcept {
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

/// Padded tokens ÷ all tokens when each batch is padded to its longest unit.
[[nodiscard]] inline double padding_waste(const std::vector<std::vector<int64_t>>& batches,
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

// ---- balancing across data-parallel ranks ----------------------------------------------------

/// How to split a global batch over ranks.
enum class BalanceMethod {
  karmarkar_karp,  ///< largest differencing method (verl's default)
  greedy,          ///< longest first onto the lightest rank
};

/// Splits items (by token count) into `k` parts of near-equal sum. With `equal_size`, every part
/// gets exactly n / k items (n must divide by k). Each part lists item indices in increasing order.
[[nodiscard]] inline std::vector<std::vector<int64_t>> partition_lengths(
    std::span<const int64_t> lengths, int64_t k, bool equal_size,
    BalanceMethod method = BalanceMethod::karmarkar_karp) {
  const auto n = static_cast<int64_t>(lengths.size());
  HYBRIDRL_CHECK(k >= 1, fmt::format("balance: {} partitions requested", k),
                 "pass the data-parallel world size, at least 1");
  HYBRIDRL_CHECK(!equal_size || n % k == 0,
                 fmt::format("balance: {} samples do not split equally over {} ranks ({} % {} = {})",
                             n, k, n, k, n % k),
                 "pad the batch to a multiple of the world size (TensorBatch::pad_to_divisor), or "
                 "balance without equal_size");
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return lengths[static_cast<size_t>(a)] > lengths[static_cast<size_t>(b)];
  });
  std::vector<std::vector<int64_t>> parts(static_cast<size_t>(k));
  if (method == BalanceMethod::greedy) {
    std::vector<int64_t> sums(static_cast<size_t>(k), 0);
    const int64_t cap = equal_size ? n / k : n;
    for (auto item : order) {
      size_t best = 0;
      bool found = false;
      for (size_t p = 0; p < parts.size(); ++p) {
        if (static_cast<int64_t>(parts[p].size()) >= cap) continue;
        if (!found || sums[p] < sums[best]) best = p, found = true;
      }
      parts[best].push_back(item);
      sums[best] += lengths[static_cast<size_t>(item)];
    }
  } else {
    // Each state is k subsets, sorted by sum descending. Repeatedly take the two states of largest
    // spread and merge them, pairing the heaviest subset of one with the lightest of the other.
    struct Subset {
      int64_t sum = 0;
      std::vector<int64_t> items;
    };
    struct State {
      std::vector<Subset> sets;
      int64_t id = 0;
      [[nodiscard]] int64_t spread() const { return sets.front().sum - sets.back().sum; }
    };
    auto sort_sets = [](State& s) {
      std::stable_sort(s.sets.begin(), s.sets.end(),
                       [](const Subset& a, const Subset& b) { return a.sum > b.sum; });
    };
    auto cmp = [](const State& a, const State& b) {
      if (a.spread() != b.spread()) return a.spread() < b.spread();
      return a.id > b.id;  // older first on ties, deterministic
    };
    std::priority_queue<State, std::vector<State>, decltype(cmp)> heap(cmp);
    int64_t next_id = 0;
    const int64_t group = equal_size ? k : 1;
    for (int64_t g = 0; g < n; g += group) {
      State s;
      s.sets.resize(static_cast<size_t>(k));
      for (int64_t j = 0; j < group; ++j) {
        const auto item = order[static_cast<size_t>(g + j)];
        s.sets[static_cast<size_t>(j)].sum = lengths[static_cast<size_t>(item)];
        s.sets[static_cast<size_t>(j)].items.push_back(item);
      }
      sort_sets(s);
      s.id = next_id++;
      heap.push(std::move(s));
    }
    while (heap.size() > 1) {
      State a = heap.top();
      heap.pop();
      State b = heap.top();
      heap.pop();
      for (size_t j = 0; j < a.sets.size(); ++j) {
        auto& dst = a.sets[j];
        auto& src = b.sets[a.sets.size() - 1 - j];
        dst.sum += src.sum;
        dst.items.insert(dst.items.end(), src.items.begin(), src.items.end());
      }
      sort_sets(a);
      a.id = next_id++;
      heap.push(std::move(a));
    }
    if (!heap.empty()) {
      const auto& final_state = heap.top();
      for (size_t j = 0; j < parts.size(); ++j) parts[j] = final_state.sets[j].items;
    }
  }
  for (auto& p : parts) std::sort(p.begin(), p.end());
  return parts;
}

/// A reordering of a global batch so that rank r owns rows [rank_offsets[r], rank_offsets[r+1]).
/// `permutation[i]` is the original row placed at position i; `inverse` undoes it
/// (`balanced.reorder(inverse)` gives the original order back).
struct BalancedOrder {
  std::vector<int64_t> permutation;
  std::vector<int64_t> inverse;
  std::vector<int64_t> rank_offsets;  ///< world + 1 offsets
  std::vector<int64_t> rank_tokens;   ///< token sum per rank
};

/// Balances rows with the given token counts over `world` ranks (see partition_lengths).
[[nodiscard]] inline BalancedOrder balance_order(std::span<const int64_t> lengths, int64_t world,
                                                 bool equal_size = true,
                                                 BalanceMethod method = BalanceMethod::karmarkar_karp) {
  const auto parts = partition_lengths(lengths, world, equal_size, method);
  BalancedOrder o;
  o.rank_offsets.push_back(0);
  for (const auto& p : parts) {
    int64_t tokens = 0;
    for (auto i : p) {
      o.permutation.push_back(i);
      tokens += lengths[static_cast<size_t>(i)];
    }
    o.rank_offsets.push_back(static_cast<int64_t>(o.permutation.size()));
    o.rank_tokens.push_back(tokens);
  }
  o.inverse.assign(o.permutation.size(), 0);
  for (size_t i = 0; i < o.permutation.size(); ++i) {
    o.inverse[static_cast<size_t>(o.permutation[i])] = static_cast<int64_t>(i);
  }
  return o;
}

/// verl's balance_batch: reorders a global batch so that consecutive equal chunks (one per rank,
/// `chunk(world)`) carry near-equal token counts, measured as the row sums of `mask_key`
/// (default "attention_mask"). Returns the reordered batch; `order` receives the reordering so
/// `result.reorder(tensor of order.inverse)` restores the original rows.
[[nodiscard]] inline TensorBatch balance_batch(const TensorBatch& batch, int64_t world,
                                               BalancedOrder* order = nullptr,
                                               const std::string& mask_key = "attention_mask",
                                               BalanceMethod method = BalanceMethod::karmarkar_karp) {
  const auto mask = batch.tensor(mask_key);
  const auto sums = mask.reshape({mask.size(0), -1}).to(at::kLong).sum(1).to(at::kCPU).contiguous();
  std::span<const int64_t> lengths(sums.data_ptr<int64_t>(), static_cast<size_t>(sums.numel()));
  auto o = balance_order(lengths, world, true, method);
  auto out = batch.reorder(at::tensor(o.permutation, at::kLong));
  if (order != nullptr) *order = std::move(o);
  return out;
}

}  // namespace hybridrl
