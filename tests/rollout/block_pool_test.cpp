// Rollout<Paged>'s block accounting: allocation and release, forks sharing blocks with
// copy-on-write of the last partial one, the prefix cache (hits, token-checked misses, lazy
// eviction, reset), the eviction order, and no leak over 10^4 random requests.
#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <vector>

#include "hybridrl/core/rng.hpp"
#include "hybridrl/rollout/paged/block_pool.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;

TEST_SUITE("rollout/block_pool") {
  TEST_CASE("allocate takes free blocks or nothing; release gives them back") {
    BlockPool pool(8, 16);
    auto a = pool.allocate(5);
    REQUIRE(a.has_value());
    CHECK(pool.num_free() == 3);
    CHECK(!pool.allocate(4).has_value());
    CHECK(pool.num_free() == 3);  // a failed allocation takes nothing
    for (auto b : *a) CHECK(pool.ref_count(b) == 1);
    pool.release(*a);
    CHECK(pool.num_free() == 8);
    for (auto b : *a) CHECK(pool.ref_count(b) == 0);
  }

  TEST_CASE("a table grows by blocks; a fork shares them, and the first write to a shared partial block copies it") {
    BlockPool pool(10, 4);
    BlockTable prompt;
    std::vector<BlockCopy> copies;
    REQUIRE(prompt.append(pool, 10, copies));  // 10 tokens: blocks of 4 + 4 + 2
    CHECK(prompt.blocks().size() == 3);
    CHECK(copies.empty());
    CHECK(pool.num_free() == 7);
    // n = 3 samples of the prompt: the siblings hold the same three blocks (memory counted once)
    auto s1 = prompt.fork(pool), s2 = prompt.fork(pool);
    CHECK(pool.num_free() == 7);
    for (auto b : prompt.blocks()) CHECK(pool.ref_count(b) == 3);
    // s1 writes its first response token into the shared partial block: it gets a private copy
    const auto partial = prompt.blocks().back();
    CHECK(s1.blocks_needed(pool, 1) == 1);
    REQUIRE(s1.append(pool, 1, copies));
    REQUIRE(copies.size() == 1);
    CHECK(copies[0].src == partial);
    CHECK(copies[0].dst == s1.blocks().back());
    CHECK(s1.blocks().back() != partial);
    CHECK(pool.ref_count(partial) == 2);
    CHECK(s1.blocks()[0] == prompt.blocks()[0]);  // full blocks stay shared
    CHECK(pool.ref_count(prompt.blocks()[0]) == 3);
    // s1's block is now private: its next token needs no copy; 2 more fill it, the next opens a block
    copies.clear();
    REQUIRE(s1.append(pool, 1, copies));
    CHECK(copies.empty());
    CHECK(s1.num_tokens() == 12);
    CHECK(s1.blocks_needed(pool, 1) == 1);
    REQUIRE(s1.append(pool, 1, copies));
    CHECK(s1.blocks().size() == 4);
    // freeing everything returns every block
    for (auto* t : {&prompt, &s1, &s2}) t->free(pool);
    CHECK(pool.num_free() == 10);
  }

  TEST_CASE("append fails without changing anything when the pool is short (the scheduler preempts)") {
    BlockPool pool(3, 4);
    BlockTable t;
    std::vector<BlockCopy> copies;
    REQUIRE(t.append(pool, 8, copies));
    CHECK(!t.append(pool, 5, copies));  // needs 2 more blocks, 1 is free
    CHECK(t.num_tokens() == 8);
    CHECK(t.blocks().size() == 2);
    CHECK(pool.num_free() == 1);
  }

  TEST_CASE("prefix cache: a full block is found by hash and tokens, stays findable after release, until evicted or reset") {
    BlockPool pool(4, 2);
    const std::vector<int64_t> toks{5, 6};
    const auto h = block_hash(0, toks);
    auto a = pool.allocate(1);
    pool.cache(a->front(), h, toks);
    CHECK(pool.num_cached() == 1);
    pool.release(*a);
    CHECK(pool.num_free() == 4);
    // a hit takes the freed block back out of the free list
    auto hit = pool.lookup(h, toks);
    REQUIRE(hit.has_value());
    CHECK(*hit == a->front());
    CHECK(pool.ref_count(*hit) == 1);
    CHECK(pool.num_free() == 3);
    // same hash, other tokens: a miss (a collision cannot alias)
    const std::vector<int64_t> other{5, 7};
    CHECK(!pool.lookup(h, other).has_value());
    CHECK(block_hash(0, toks) != block_hash(0, other));
    CHECK(block_hash(0, toks) != block_hash(1, toks));  // chained: the parent matters
    pool.release(std::vector<int32_t>{*hit});
    // handing every free block out evicts it
    auto all = pool.allocate(4);
    REQUIRE(all.has_value());
    CHECK(pool.num_cached() == 0);
    pool.release(*all);
    CHECK(!pool.lookup(h, toks).has_value());
    // reset after new weights: nothing is found
    auto b = pool.allocate(1);
    pool.cache(b->front(), h, toks);
    pool.reset_prefix_cache();
    CHECK(!pool.lookup(h, toks).has_value());
    pool.release(*b);
  }

  TEST_CASE("eviction order: freed blocks queue behind the never-used ones, a table's last block first") {
    BlockPool pool(6, 1);
    auto t = pool.allocate(3);  // blocks 0, 1, 2; free: 3, 4, 5
    pool.release(*t);           // free: 3, 4, 5, 2, 1, 0
    auto next = pool.allocate(6);
    CHECK(*next == std::vector<int32_t>{3, 4, 5, 2, 1, 0});
  }

  TEST_CASE("no leak after 10^4 random requests with forks, copy-on-write and prefix hits") {
    BlockPool pool(64, 4);
    hybridrl::detail::SplitMix64 rng(2026);
    std::map<int64_t, BlockTable> live;
    int64_t next_id = 0, requests = 0, refused = 0;
    std::vector<BlockCopy> copies;
    while (requests < 10000) {
      const auto op = rng.next() % 4;
      if (op == 0 || live.empty()) {  // a new request with a prompt of 1..12 tokens, n = 1..3 samples
        BlockTable t;
        const auto len = static_cast<int64_t>(1 + rng.next() % 12);
        ++requests;
        if (!t.append(pool, len, copies)) {
          ++refused;
          continue;
        }
        const auto n = static_cast<int64_t>(1 + rng.next() % 3);
        for (int64_t s = 1; s < n; ++s) live.emplace(next_id++, t.fork(pool));
        live.emplace(next_id++, std::move(t));
      } else if (op == 1 || op == 2) {  // a decode step of a random live sequence
        auto it = std::next(live.begin(), static_cast<long>(rng.next() % live.size()));
        if (!it->second.append(pool, 1, copies)) {
          it->second.free(pool);  // preempted
          live.erase(it);
        }
      } else {  // a sequence finishes
        auto it = std::next(live.begin(), static_cast<long>(rng.next() % live.size()));
        it->second.free(pool);
        live.erase(it);
      }
      // invariant: the pool's reference counts are the tables' holdings
      if (requests % 1000 == 0) {
        std::map<int32_t, int32_t> held;
        for (auto& [id, t] : live)
          for (auto b : t.blocks()) ++held[b];
        int64_t in_use = 0;
        for (int32_t b = 0; b < 64; ++b) {
          CHECK(pool.ref_count(b) == held[b]);
          in_use += held[b] > 0 ? 1 : 0;
        }
        CHECK(pool.num_free() == 64 - in_use);
      }
    }
    for (auto& [id, t] : live) t.free(pool);
    CHECK(pool.num_free() == 64);
    for (int32_t b = 0; b < 64; ++b) CHECK(pool.ref_count(b) == 0);
    CHECK(refused < requests);
    CHECK(!copies.empty());  // copy-on-write happened along the way
  }
}
