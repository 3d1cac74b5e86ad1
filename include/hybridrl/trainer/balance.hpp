#pragma once
/// \file
/// Balancing a global batch over data-parallel ranks — verl's seqlen_balancing and the trainer's
/// `_balance_batch`: split rows into near-equal token sums (Karmarkar–Karp largest differencing,
/// or greedy), as a reversible reordering of the TensorBatch. The trainer runs it after rollout,
/// before chunk(world).

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <queue>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/tensor_batch.hpp"

namespace hybridrl {


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
                                               const std::string& mask_key = keys::attention_mask.str(),
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
