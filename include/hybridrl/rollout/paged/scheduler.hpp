#pragma once
/// \file
/// Rollout<Paged>'s scheduler, on the host: which tokens of which sequences one step computes.
///
/// As in vLLM v1 there is no separate prefill and decode phase: each sequence has tokens (prompt
/// plus what it has drawn) and a count of them already in the KV cache, and a step gives each
/// scheduled sequence a chunk of its uncomputed tokens: the rest of its prompt (chunked when the
/// step's token budget is short), or the one token it just drew. Running sequences come first,
/// oldest first; a finished sequence's slot is refilled from the waiting queue in the same step
/// (continuous batching). When a running sequence needs a block and none is free, the newest
/// running sequence is preempted: its blocks are freed and it goes back to the head of the queue,
/// to be recomputed (prompt and drawn tokens) when blocks are free again. Nothing is admitted in a
/// step that preempted.
///
/// Prefix sharing: a prompt's n samples are one leader and n - 1 followers. Only the leader is
/// queued and prefilled; when its prompt is in the cache the followers fork its block table (the
/// full blocks shared, the partial last one copied on first write), so the prompt is computed
/// once. Full blocks also enter the pool's prefix cache, so a later sequence whose tokens start the
/// same way (a recomputed one, or another prompt with the same preamble) takes them instead of
/// computing them.

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <span>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/rollout/paged/block_pool.hpp"

namespace hybridrl {

/// One sequence of a Rollout<Paged> call.
struct PagedSequence {
  enum class State { waiting, following, running, finished };
  std::vector<int64_t> tokens;  ///< prompt, then the tokens drawn so far
  int64_t prompt_len = 0;
  int64_t num_computed = 0;     ///< leading tokens whose keys and values are in the cache
  BlockTable table;
  int64_t registered = 0;       ///< leading full blocks entered in the prefix cache
  uint64_t chain = 0;           ///< hash of the last registered block
  std::vector<int64_t> followers;
  State state = State::waiting;
  /// A token is to be drawn: every token is in the cache.
  [[nodiscard]] bool ready() const noexcept { return num_computed == static_cast<int64_t>(tokens.size()); }
};

/// The tokens [start, start + count) of sequence `seq`, computed in one step.
struct ScheduledChunk {
  int64_t seq = 0, start = 0, count = 0;
};

/// What one step computes: chunks in order, and block copies to make before (copy-on-write).
struct ScheduledStep {
  std::vector<ScheduledChunk> chunks;
  std::vector<BlockCopy> copies;
  int64_t num_tokens = 0;   ///< sum of chunk counts
  int64_t preempted = 0;    ///< sequences preempted while scheduling it
  [[nodiscard]] bool empty() const noexcept { return chunks.empty(); }
};

/// Limits of the scheduler (PagedOptions' fields of the same names).
struct PagedSchedulerLimits {
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 8192;
  bool prefix_sharing = true;
};

/// Schedules the sequences of one generate() call over a BlockPool (which outlives it: its prefix
/// cache carries over to the next call).
class PagedScheduler {
 public:
  PagedScheduler(BlockPool& pool, PagedSchedulerLimits limits) : pool_(&pool), limits_(limits) {
    HYBRIDRL_CHECK(limits.max_num_seqs >= 1 && limits.max_num_batched_tokens >= 1,
                   fmt::format("PagedScheduler: max_num_seqs = {}, max_num_batched_tokens = {}", limits.max_num_seqs,
                               limits.max_num_batched_tokens),
                   "allow at least one sequence and one token per step");
  }
  PagedScheduler(const PagedScheduler&) = delete;
  PagedScheduler& operator=(const PagedScheduler&) = delete;
  ~PagedScheduler() {
    for (auto& s : seqs_) s.table.free(*pool_);  // an exception mid-call must not leak blocks
  }

  /// Queues a sequence with `prompt`; returns its id (0, 1, ... in call order).
  int64_t add(std::vector<int64_t> prompt) {
    PagedSequence s;
    s.prompt_len = static_cast<int64_t>(prompt.size());
    s.tokens = std::move(prompt);
    seqs_.push_back(std::move(s));
    const auto id = static_cast<int64_t>(seqs_.size()) - 1;
    waiting_.push_back(id);
    return id;
  }

  /// Adds a sequence with the same prompt as waiting sequence `leader` that forks it once the
  /// prompt is in the cache (fork_followers) instead of computing it again. A leader's group
  /// (itself and its followers) must fit max_num_seqs.
  int64_t add_follower(int64_t leader) {
    auto& l = seqs_.at(static_cast<size_t>(leader));
    HYBRIDRL_CHECK(l.state == PagedSequence::State::waiting && l.num_computed == 0,
                   fmt::format("PagedScheduler: sequence {} is not a fresh waiting sequence", leader),
                   "add followers right after their leader, before scheduling");
    HYBRIDRL_CHECK(static_cast<int64_t>(l.followers.size()) + 2 <= limits_.max_num_seqs,
                   fmt::format("PagedScheduler: a group of {} sequences exceeds max_num_seqs = {}", l.followers.size() + 2,
                               limits_.max_num_seqs),
                   "split the samples of a prompt into groups of at most max_num_seqs");
    PagedSequence s;
    s.prompt_len = l.prompt_len;
    s.tokens = l.tokens;
    s.state = PagedSequence::State::following;
    seqs_.push_back(std::move(s));
    const auto id = static_cast<int64_t>(seqs_.size()) - 1;
    seqs_[static_cast<size_t>(leader)].followers.push_back(id);
    return id;
  }

  /// The next step: running sequences (oldest first) get their next chunk, preempting the newest
  /// when blocks run out; then, if nothing was preempted, waiting sequences are admitted while the
  /// token budget, max_num_seqs and the free blocks allow. Empty only when nothing is left.
  ScheduledStep schedule() {
    ScheduledStep step;
    int64_t budget = limits_.max_num_batched_tokens;
    for (size_t i = 0; i < running_.size() && budget > 0;) {
      const auto id = running_[i];
      auto& s = seq(id);
      const auto n = std::min(static_cast<int64_t>(s.tokens.size()) - s.num_computed, budget);
      bool ok = s.table.append(*pool_, n, step.copies);
      while (!ok) {
        const auto victim = running_.back();
        preempt(victim);
        ++step.preempted;
        if (victim == id) break;
        ok = s.table.append(*pool_, n, step.copies);
      }
      if (!ok) break;  // the sequence itself was the newest
      step.chunks.push_back({id, s.num_computed, n});
      budget -= n;
      ++i;
    }
    while (step.preempted == 0 && budget > 0 && !waiting_.empty()) {
      const auto id = waiting_.front();
      auto& s = seq(id);
      const auto group = 1 + static_cast<int64_t>(s.followers.size());
      if (static_cast<int64_t>(running_.size()) + group > limits_.max_num_seqs) break;
      if (limits_.prefix_sharing) take_cached_prefix(s);
      const auto n = std::min(static_cast<int64_t>(s.tokens.size()) - s.num_computed, budget);
      if (!s.table.append(*pool_, n, step.copies)) {
        forget_blocks(s);
        break;
      }
      waiting_.pop_front();
      s.state = PagedSequence::State::running;
      running_.push_back(id);
      step.chunks.push_back({id, s.num_computed, n});
      budget -= n;
    }
    for (const auto& c : step.chunks) step.num_tokens += c.count;
    preemptions_ += step.preempted;
    return step;
  }

  /// Records that `step`'s chunks are in the cache, and enters newly full blocks in the prefix
  /// cache. A sequence finished since the step was scheduled (a stop token read while the step
  /// ran, under asynchronous scheduling) is skipped: its blocks are gone.
  void computed(const ScheduledStep& step) {
    for (const auto& c : step.chunks) {
      auto& s = seq(c.seq);
      if (s.state == PagedSequence::State::finished) continue;
      s.num_computed = c.start + c.count;
      if (limits_.prefix_sharing) register_full_blocks(s);
    }
  }

  /// Starts the followers of `leader` (whose prompt is in the cache) on a fork of its block table;
  /// returns their ids. Call it before the leader's first drawn token is appended.
  std::vector<int64_t> fork_followers(int64_t leader) {
    auto& l = seq(leader);
    std::vector<int64_t> out = std::move(l.followers);
    l.followers.clear();
    for (auto id : out) {
      auto& f = seq(id);
      auto& ld = seq(leader);  // (seqs_ does not grow here; re-read for clarity)
      f.table = ld.table.fork(*pool_);
      f.num_computed = ld.num_computed;
      f.registered = ld.registered;
      f.chain = ld.chain;
      f.state = PagedSequence::State::running;
      running_.push_back(id);
      cached_tokens_ += f.num_computed;
    }
    return out;
  }

  /// Appends the token `seq` drew (computed in a later step).
  void append(int64_t id, int64_t token) { seq(id).tokens.push_back(token); }
  /// Replaces the last token of `id`: a placeholder appended before the drawn token was read
  /// (asynchronous scheduling), written before the step that computes it is marked computed.
  void set_last_token(int64_t id, int64_t token) {
    auto& s = seq(id);
    HYBRIDRL_CHECK(!s.tokens.empty() && s.num_computed < static_cast<int64_t>(s.tokens.size()),
                   fmt::format("PagedScheduler: sequence {} has no uncomputed last token to replace", id),
                   "this is a bug: please report it");
    s.tokens.back() = token;
  }
  /// The state of sequence `id`.
  [[nodiscard]] bool finished(int64_t id) const { return sequence(id).state == PagedSequence::State::finished; }

  /// Ends sequence `id`: its blocks go back to the pool.
  void finish(int64_t id) {
    auto& s = seq(id);
    s.table.free(*pool_);
    s.state = PagedSequence::State::finished;
    running_.erase(std::find(running_.begin(), running_.end(), id));
  }

  /// True when every sequence has finished.
  [[nodiscard]] bool done() const noexcept { return running_.empty() && waiting_.empty(); }
  [[nodiscard]] const PagedSequence& sequence(int64_t id) const { return seqs_.at(static_cast<size_t>(id)); }
  [[nodiscard]] int64_t num_running() const noexcept { return static_cast<int64_t>(running_.size()); }
  [[nodiscard]] int64_t num_waiting() const noexcept { return static_cast<int64_t>(waiting_.size()); }
  /// Preemptions so far.
  [[nodiscard]] int64_t preemptions() const noexcept { return preemptions_; }
  /// Tokens taken from the prefix cache or a leader's fork instead of computed.
  [[nodiscard]] int64_t cached_tokens() const noexcept { return cached_tokens_; }

 private:
  PagedSequence& seq(int64_t id) { return seqs_.at(static_cast<size_t>(id)); }

  void preempt(int64_t id) {
    auto& s = seq(id);
    forget_blocks(s);
    s.state = PagedSequence::State::waiting;
    running_.pop_back();
    waiting_.push_front(id);
  }

  void forget_blocks(PagedSequence& s) {
    s.table.free(*pool_);
    s.num_computed = 0;
    s.registered = 0;
    s.chain = 0;
  }

  // full blocks of the tokens, the last token excepted (it must be computed to draw from it)
  void take_cached_prefix(PagedSequence& s) {
    if (!s.table.blocks().empty()) return;
    const auto bs = pool_->block_size();
    const auto most = (static_cast<int64_t>(s.tokens.size()) - 1) / bs;
    std::vector<int32_t> hit;
    uint64_t chain = 0;
    for (int64_t b = 0; b < most; ++b) {
      auto span = std::span<const int64_t>(s.tokens).subspan(static_cast<size_t>(b * bs), static_cast<size_t>(bs));
      const auto h = block_hash(chain, span);
      auto found = pool_->lookup(h, span);
      if (!found) break;
      hit.push_back(*found);
      chain = h;
    }
    if (hit.empty()) return;
    const auto n = static_cast<int64_t>(hit.size());
    s.table.adopt_prefix(std::move(hit), n * bs);
    s.num_computed = n * bs;
    s.registered = n;
    s.chain = chain;
    cached_tokens_ += n * bs;
  }

  void register_full_blocks(PagedSequence& s) {
    const auto bs = pool_->block_size();
    const auto full = s.num_computed / bs;
    for (; s.registered < full; ++s.registered) {
      auto span = std::span<const int64_t>(s.tokens).subspan(static_cast<size_t>(s.registered * bs),
                                                             static_cast<size_t>(bs));
      s.chain = block_hash(s.chain, span);
      pool_->cache(s.table.blocks()[static_cast<size_t>(s.registered)], s.chain, span);
    }
  }

  BlockPool* pool_;
  PagedSchedulerLimits limits_;
  std::vector<PagedSequence> seqs_;
  std::deque<int64_t> waiting_;
  std::vector<int64_t> running_;
  int64_t preemptions_ = 0;
  int64_t cached_tokens_ = 0;
};

}  // namespace hybridrl
