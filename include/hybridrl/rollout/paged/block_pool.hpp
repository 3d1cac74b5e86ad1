#pragma once
/// \file
/// Rollout<Paged>'s block accounting, on the host: a pool of fixed-size KV blocks with reference
/// counts, a free list, and a prefix cache of full blocks; and the per-sequence block table that
/// grows as tokens are appended and forks for the n samples of a prompt (the full prompt blocks
/// shared, the last partial one copied on write). No tensors here: the engine owns the KV pool
/// tensor and copies the blocks this code tells it to.
///
/// The design follows vLLM v1's KV-cache manager (block_pool.py, kv_cache_utils.py): an intrusive
/// doubly-linked free list, so a freed block that a prefix lookup hits is taken back out in O(1);
/// eviction is lazy (a freed full block keeps its hash until the pool hands it out again); blocks
/// of a finished sequence are freed last block first, so the tail of a chain is evicted first. A
/// hit also compares the block's tokens (as nano-vllm does), so a hash collision cannot alias.

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/rng.hpp"

namespace hybridrl {

/// The chained hash of a full block: its parent's hash and its tokens (SplitMix64 mixing).
constexpr uint64_t block_hash(uint64_t parent, std::span<const int64_t> tokens) noexcept {
  uint64_t h = detail::SplitMix64(parent ^ 0x6A09E667F3BCC908ull).next();
  for (auto t : tokens) h = detail::SplitMix64(h ^ static_cast<uint64_t>(t)).next();
  return h;
}

/// A pool of `num_blocks` KV blocks of `block_size` tokens each.
class BlockPool {
 public:
  BlockPool(int64_t num_blocks, int64_t block_size)
      : block_size_(block_size), ref_(static_cast<size_t>(num_blocks), 0),
        prev_(static_cast<size_t>(num_blocks), -1), next_(static_cast<size_t>(num_blocks), -1),
        hash_(static_cast<size_t>(num_blocks)), tokens_(static_cast<size_t>(num_blocks)) {
    HYBRIDRL_CHECK(num_blocks >= 1 && block_size >= 1,
                   fmt::format("BlockPool: {} blocks of {} tokens", num_blocks, block_size),
                   "give the KV cache at least one block of at least one token");
    for (int32_t b = 0; b < static_cast<int32_t>(num_blocks); ++b) push_back(b);
  }

  [[nodiscard]] int64_t num_blocks() const noexcept { return static_cast<int64_t>(ref_.size()); }
  [[nodiscard]] int64_t block_size() const noexcept { return block_size_; }
  /// Blocks no sequence holds (cached or not).
  [[nodiscard]] int64_t num_free() const noexcept { return free_count_; }
  /// Sequences holding block `b`.
  [[nodiscard]] int32_t ref_count(int32_t b) const { return ref_.at(static_cast<size_t>(b)); }
  /// Full blocks registered in the prefix cache (held or free).
  [[nodiscard]] int64_t num_cached() const noexcept { return static_cast<int64_t>(cached_.size()); }

  /// `n` fresh blocks (reference count 1), evicting cached ones from the free list's head, or
  /// nullopt (nothing taken) when fewer than `n` are free: the scheduler preempts then.
  std::optional<std::vector<int32_t>> allocate(int64_t n) {
    if (n > free_count_) return std::nullopt;
    std::vector<int32_t> out;
    out.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const auto b = head_;
      unlink(b);
      evict(b);
      ref_[static_cast<size_t>(b)] = 1;
      out.push_back(b);
    }
    return out;
  }

  /// One more holder of `b` (a forked sequence sharing it, or a prefix hit on a held block).
  void retain(int32_t b) {
    auto& r = ref_.at(static_cast<size_t>(b));
    if (r == 0) unlink(b);  // a cached block back from the free list
    ++r;
  }

  /// Drops one holder of each block, last first; a block nobody holds goes to the free list's
  /// tail, keeping its prefix-cache entry until it is handed out again.
  void release(std::span<const int32_t> blocks) {
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      auto& r = ref_.at(static_cast<size_t>(*it));
      HYBRIDRL_CHECK(r > 0, fmt::format("BlockPool: block {} released more often than held", *it),
                     "release each block table once (this is a bug in the caller)");
      if (--r == 0) push_back(*it);
    }
  }

  /// Registers full block `b` (holding `tokens`, chained hash `hash`) in the prefix cache.
  void cache(int32_t b, uint64_t hash, std::span<const int64_t> tokens) {
    if (cached_.count(hash) != 0) return;  // an identical block is cached already: keep that one
    evict(b);
    hash_[static_cast<size_t>(b)] = hash;
    tokens_[static_cast<size_t>(b)].assign(tokens.begin(), tokens.end());
    cached_.emplace(hash, b);
  }

  /// The cached block with `hash` and exactly `tokens`, retained for the caller; nullopt on a miss.
  std::optional<int32_t> lookup(uint64_t hash, std::span<const int64_t> tokens) {
    auto it = cached_.find(hash);
    if (it == cached_.end()) return std::nullopt;
    const auto& held = tokens_[static_cast<size_t>(it->second)];
    if (!std::equal(held.begin(), held.end(), tokens.begin(), tokens.end())) return std::nullopt;
    retain(it->second);
    return it->second;
  }

  /// Forgets every cached block (new weights make cached KV stale). Held blocks stay held.
  void reset_prefix_cache() {
    for (auto& [h, b] : cached_) {
      hash_[static_cast<size_t>(b)].reset();
      tokens_[static_cast<size_t>(b)].clear();
    }
    cached_.clear();
  }

 private:
  void push_back(int32_t b) {
    prev_[static_cast<size_t>(b)] = tail_;
    next_[static_cast<size_t>(b)] = -1;
    if (tail_ >= 0) next_[static_cast<size_t>(tail_)] = b;
    else head_ = b;
    tail_ = b;
    ++free_count_;
  }
  void unlink(int32_t b) {
    const auto p = prev_[static_cast<size_t>(b)], n = next_[static_cast<size_t>(b)];
    if (p >= 0) next_[static_cast<size_t>(p)] = n;
    else head_ = n;
    if (n >= 0) prev_[static_cast<size_t>(n)] = p;
    else tail_ = p;
    prev_[static_cast<size_t>(b)] = next_[static_cast<size_t>(b)] = -1;
    --free_count_;
  }
  void evict(int32_t b) {
    auto& h = hash_[static_cast<size_t>(b)];
    if (!h) return;
    auto it = cached_.find(*h);
    if (it != cached_.end() && it->second == b) cached_.erase(it);
    h.reset();
    tokens_[static_cast<size_t>(b)].clear();
  }

  int64_t block_size_;
  std::vector<int32_t> ref_, prev_, next_;
  std::vector<std::optional<uint64_t>> hash_;
  std::vector<std::vector<int64_t>> tokens_;
  std::unordered_map<uint64_t, int32_t> cached_;
  int32_t head_ = -1, tail_ = -1;
  int64_t free_count_ = 0;
};

/// A block copy the engine must do before a write (copy-on-write of a shared partial block).
struct BlockCopy {
  int32_t src = 0, dst = 0;
};

/// One sequence's blocks and token count. Tokens are appended through `append`; `fork` gives a
/// sibling that shares every block (the engine copies the last, partial one on the first write).
class BlockTable {
 public:
  [[nodiscard]] const std::vector<int32_t>& blocks() const noexcept { return blocks_; }
  [[nodiscard]] int64_t num_tokens() const noexcept { return num_tokens_; }

  /// Free blocks needed to hold `n` more tokens (a copy-on-write block included).
  [[nodiscard]] int64_t blocks_needed(const BlockPool& pool, int64_t n) const {
    const auto total = (num_tokens_ + n + pool.block_size() - 1) / pool.block_size();
    return total - static_cast<int64_t>(blocks_.size()) + (needs_copy_on_write(pool, n) ? 1 : 0);
  }

  /// Makes room for `n` more tokens: a shared partial last block is replaced by a private copy
  /// (returned, for the engine to copy), and new blocks are allocated. False (nothing changed)
  /// when the pool is short: the scheduler preempts then.
  bool append(BlockPool& pool, int64_t n, std::vector<BlockCopy>& copies) {
    const auto bs = pool.block_size();
    if (blocks_needed(pool, n) > pool.num_free()) return false;
    if (needs_copy_on_write(pool, n)) {
      auto fresh = pool.allocate(1);
      const auto old = blocks_.back();
      copies.push_back({old, fresh->front()});
      pool.release(std::span<const int32_t>(&old, 1));
      blocks_.back() = fresh->front();
    }
    const auto total = (num_tokens_ + n + bs - 1) / bs;
    const auto more = total - static_cast<int64_t>(blocks_.size());
    if (more > 0) {
      auto fresh = pool.allocate(more);
      blocks_.insert(blocks_.end(), fresh->begin(), fresh->end());
    }
    num_tokens_ += n;
    return true;
  }

  /// Starts the table with cached blocks (a prefix hit of `tokens` full blocks, already retained).
  void adopt_prefix(std::vector<int32_t> blocks, int64_t tokens) {
    blocks_ = std::move(blocks);
    num_tokens_ = tokens;
  }

  /// A sibling holding the same blocks (each retained once more).
  [[nodiscard]] BlockTable fork(BlockPool& pool) const {
    for (auto b : blocks_) pool.retain(b);
    BlockTable t;
    t.blocks_ = blocks_;
    t.num_tokens_ = num_tokens_;
    return t;
  }

  /// Gives every block back to the pool (last first) and empties the table.
  void free(BlockPool& pool) {
    pool.release(blocks_);
    blocks_.clear();
    num_tokens_ = 0;
  }

 private:
  // the next write lands in a partial last block that another sequence also holds
  [[nodiscard]] bool needs_copy_on_write(const BlockPool& pool, int64_t n) const {
    return n > 0 && !blocks_.empty() && num_tokens_ % pool.block_size() != 0 && pool.ref_count(blocks_.back()) > 1;
  }

  std::vector<int32_t> blocks_;
  int64_t num_tokens_ = 0;
};

}  // namespace hybridrl
