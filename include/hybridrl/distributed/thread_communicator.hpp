#pragma once
/// \file
/// ThreadCommunicator: the ranks of a group are threads of one process. Every collective of
/// Communicator, split() included, so a user unit-tests a multi-rank component (an all-reduced
/// gradient, a sharded optimizer, a TensorBatch gather) in one process without c10d:
///
///     hybridrl::run_ranks(4, [](hybridrl::Communicator& comm) {
///       auto t = at::full({2}, double(comm.rank()));
///       comm.all_reduce(t);  // 0 + 1 + 2 + 3 on every rank
///     });
///
/// Ranks exchange clones of their tensors through shared slots guarded by one mutex per world;
/// a mismatch between ranks (shapes, dtypes, the list given to split) is detected by every rank and
/// thrown by all of them together. A rank that throws inside run_ranks aborts the others' waits
/// (they throw too) instead of leaving them blocked; a wait longer than the timeout throws.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/distributed/communicator.hpp"

namespace hybridrl {

namespace detail {

/// State shared by every group of one thread world: one lock, one wake-up, the abort flag.
struct ThreadWorld {
  std::mutex mutex;
  std::condition_variable changed;
  bool aborted = false;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

/// State of one group (the world or a split of it): a generation barrier, one slot per rank,
/// the mailboxes of send/recv, and the sub-groups made by split.
struct ThreadGroupState {
  ThreadGroupState(std::shared_ptr<ThreadWorld> w, int n)
      : world(std::move(w)), size(n), slots(static_cast<size_t>(n)), lists(static_cast<size_t>(n)) {}
  std::shared_ptr<ThreadWorld> world;
  int size;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<at::Tensor> slots;
  std::vector<std::vector<int>> lists;  // split(): each rank's list, to check they agree
  std::map<std::tuple<int, int, int>, std::deque<at::Tensor>> mail;  // (src, dst, tag) -> queue
  std::map<std::pair<uint64_t, std::vector<int>>, std::shared_ptr<ThreadGroupState>> children;
};

/// "Double 2x3": a tensor's dtype and shape, for messages.
inline std::string describe(const at::Tensor& t) {
  return fmt::format("{} {}", c10::toString(t.scalar_type()), fmt::join(t.sizes(), "x"));
}

}  // namespace detail

/// A rank of an in-process group whose ranks are threads. Build a world with
/// `ThreadCommunicator::world(n)` (one per thread) or let run_ranks do it.
class ThreadCommunicator final : public Communicator {
 public:
  /// `n` communicators of one new world; give element r to thread r. `timeout`: longest wait for
  /// the other ranks before a collective throws (a rank that never makes the call).
  static std::vector<std::shared_ptr<ThreadCommunicator>> world(
      int n, std::chrono::milliseconds timeout = std::chrono::minutes(5)) {
    HYBRIDRL_CHECK(n >= 1, fmt::format("ThreadCommunicator::world: n = {} must be >= 1", n),
                   "give the number of ranks (threads), at least 1");
    auto w = std::make_shared<detail::ThreadWorld>();
    w->timeout = timeout;
    auto state = std::make_shared<detail::ThreadGroupState>(w, n);
    std::vector<std::shared_ptr<ThreadCommunicator>> out;
    for (int r = 0; r < n; ++r) out.push_back(std::make_shared<ThreadCommunicator>(state, r));
    return out;
  }

  /// Rank `rank` of the group `state` (use world() instead).
  ThreadCommunicator(std::shared_ptr<detail::ThreadGroupState> state, int rank)
      : state_(std::move(state)), rank_(rank) {}

  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return state_->size; }
  [[nodiscard]] std::string backend() const override { return "thread"; }

  /// Wakes every rank of this world waiting in a collective; they throw. run_ranks calls it when a
  /// rank throws, so the others do not wait for a call that never comes.
  void abort() {
    std::lock_guard<std::mutex> lock(state_->world->mutex);
    state_->world->aborted = true;
    state_->world->changed.notify_all();
  }

  void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::sum) override {
    check_reduce_dtype(t, op, "all_reduce");
    auto result = exchange(t, "all_reduce", [&](const std::vector<at::Tensor>& all) {
      return reduce(all, op);
    });
    t.copy_(result);
  }

  void all_gather_into(at::Tensor& out, const at::Tensor& in) override {
    HYBRIDRL_CHECK(in.dim() >= 1 && out.dim() == in.dim() && out.size(0) == size() * in.size(0) &&
                       out.sizes().slice(1) == in.sizes().slice(1),
                   fmt::format("all_gather_into: out is {}, in is {} on rank {}; out needs {} times "
                               "in's rows and in's trailing shape",
                               detail::describe(out), detail::describe(in), rank_, size()),
                   "allocate out with size(0) = size() * in.size(0)");
    auto result = exchange(in, "all_gather_into", [](const std::vector<at::Tensor>& all) {
      return at::cat(all, 0);
    });
    out.copy_(result);
  }

  void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op = ReduceOp::sum) override {
    HYBRIDRL_CHECK(in.dim() >= 1 && in.size(0) == size() * out.size(0),
                   fmt::format("reduce_scatter: in is {}, out is {} on rank {}; in needs {} times "
                               "out's rows", detail::describe(in), detail::describe(out), rank_, size()),
                   "allocate in with size(0) = size() * out.size(0)");
    check_reduce_dtype(in, op, "reduce_scatter");
    auto result = exchange(in, "reduce_scatter", [&](const std::vector<at::Tensor>& all) {
      return reduce(all, op).chunk(size(), 0)[static_cast<size_t>(rank_)].clone();
    });
    out.copy_(result);
  }

  void broadcast(at::Tensor& t, int root) override {
    check_rank(root, "broadcast root");
    auto result = exchange(t, "broadcast", [&](const std::vector<at::Tensor>& all) {
      return all[static_cast<size_t>(root)].clone();
    });
    t.copy_(result);
  }

  void barrier() override {
    std::unique_lock<std::mutex> lock(state_->world->mutex);
    arrive_and_wait(lock, "barrier");
  }

  /// Buffered: returns once `t` is queued for `dst` (a c10d send may block until received).
  void send(const at::Tensor& t, int dst, int tag = 0) override {
    check_rank(dst, "send destination");
    std::lock_guard<std::mutex> lock(state_->world->mutex);
    state_->mail[{rank_, dst, tag}].push_back(t.detach().clone());
    state_->world->changed.notify_all();
  }

  void recv(at::Tensor& t, int src, int tag = 0) override {
    check_rank(src, "recv source");
    std::unique_lock<std::mutex> lock(state_->world->mutex);
    auto& queue = state_->mail[{src, rank_, tag}];
    wait(lock, fmt::format("recv from rank {} (tag {})", src, tag), [&] { return !queue.empty(); });
    auto got = std::move(queue.front());
    queue.pop_front();
    lock.unlock();
    HYBRIDRL_CHECK(got.sizes() == t.sizes() && got.scalar_type() == t.scalar_type(),
                   fmt::format("recv on rank {}: rank {} sent {}, the receiving tensor is {}", rank_,
                               src, detail::describe(got), detail::describe(t)),
                   "receive into a tensor of the sent shape and dtype");
    t.copy_(got);
  }

  [[nodiscard]] std::shared_ptr<Communicator> split(const std::vector<int>& ranks) override {
    const bool member = validate_split(ranks, size(), rank_);
    std::unique_lock<std::mutex> lock(state_->world->mutex);
    const auto seq = splits_++;
    state_->lists[static_cast<size_t>(rank_)] = ranks;
    arrive_and_wait(lock, "split");  // every rank has published its list
    bool same = true;
    for (const auto& l : state_->lists) same = same && l == state_->lists[0];
    std::shared_ptr<ThreadGroupState> child;
    if (same && member) {
      auto& slot = state_->children[{seq, ranks}];
      if (!slot) slot = std::make_shared<ThreadGroupState>(state_->world, static_cast<int>(ranks.size()));
      child = slot;
    }
    const auto first = state_->lists[0];
    arrive_and_wait(lock, "split");  // every rank has read the lists
    if (!same) {
      throw Error(fmt::format("split: the ranks gave different lists (rank 0: [{}], rank {}: [{}])",
                              fmt::join(first, ", "), rank_, fmt::join(ranks, ", ")),
                  "call split with the same list of ranks on every rank of the group");
    }
    if (!member) return nullptr;
    int sub_rank = 0;
    while (ranks[static_cast<size_t>(sub_rank)] != rank_) ++sub_rank;
    return std::make_shared<ThreadCommunicator>(child, sub_rank);
  }

  /// Checks a split() list: non-empty, ascending, ranks of the group; true if `rank` is in it.
  static bool validate_split(const std::vector<int>& ranks, int size, int rank) {
    bool ok = !ranks.empty();
    for (size_t i = 0; i < ranks.size(); ++i) {
      ok = ok && ranks[i] >= 0 && ranks[i] < size && (i == 0 || ranks[i] > ranks[i - 1]);
    }
    HYBRIDRL_CHECK(ok,
                   fmt::format("split: ranks [{}] must be a non-empty ascending list of ranks in "
                               "[0, {})", fmt::join(ranks, ", "), size),
                   "list each member once, in ascending order, as ranks of the group being split");
    return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
  }

 private:
  using ThreadGroupState = detail::ThreadGroupState;

  void check_rank(int r, const char* what) const {
    HYBRIDRL_CHECK(r >= 0 && r < size(),
                   fmt::format("{} = {} is not a rank of this group of {}", what, r, size()),
                   "give a rank in [0, size())");
  }

  static void check_reduce_dtype(const at::Tensor& t, ReduceOp op, const char* what) {
    HYBRIDRL_CHECK(op != ReduceOp::avg || at::isFloatingType(t.scalar_type()),
                   fmt::format("{}: ReduceOp::avg of a {} tensor", what, c10::toString(t.scalar_type())),
                   "average floating-point tensors, or sum integers and divide yourself");
  }

  static at::Tensor reduce(const std::vector<at::Tensor>& all, ReduceOp op) {
    auto acc = all[0].clone();
    for (size_t r = 1; r < all.size(); ++r) {
      if (acc.scalar_type() == at::kBool) {  // sum and max: or; min: and
        acc = op == ReduceOp::min ? acc.logical_and(all[r]) : acc.logical_or(all[r]);
        continue;
      }
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg: acc = acc.add(all[r]); break;
        case ReduceOp::max: acc = at::maximum(acc, all[r]); break;
        case ReduceOp::min: acc = at::minimum(acc, all[r]); break;
      }
    }
    if (op == ReduceOp::avg) acc = acc.div(static_cast<double>(all.size()));
    return acc;
  }

  /// Publishes `mine`, waits for every rank, checks they agree in shape and dtype, computes
  /// `combine(all ranks' tensors)`, waits until every rank has read, returns the result.
  template <class F>
  at::Tensor exchange(const at::Tensor& mine, const char* what, F&& combine) {
    std::unique_lock<std::mutex> lock(state_->world->mutex);
    state_->slots[static_cast<size_t>(rank_)] = mine.detach().clone();
    arrive_and_wait(lock, what);
    std::string mismatch;
    for (int r = 1; r < size() && mismatch.empty(); ++r) {
      const auto& a = state_->slots[0];
      const auto& b = state_->slots[static_cast<size_t>(r)];
      if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) {
        mismatch = fmt::format("{}: rank {} gave {}, rank 0 gave {}", what, r, detail::describe(b),
                               detail::describe(a));
      }
    }
    at::Tensor result;
    if (mismatch.empty()) result = combine(state_->slots);
    arrive_and_wait(lock, what);
    HYBRIDRL_CHECK(mismatch.empty(), mismatch,
                   "give every rank a tensor of the same shape and dtype in each collective");
    return result;
  }

  void arrive_and_wait(std::unique_lock<std::mutex>& lock, const char* what) {
    const auto gen = state_->generation;
    if (++state_->arrived == state_->size) {
      state_->arrived = 0;
      ++state_->generation;
      state_->world->changed.notify_all();
      return;
    }
    wait(lock, what, [&] { return state_->generation != gen; });
  }

  template <class Pred>
  void wait(std::unique_lock<std::mutex>& lock, const std::string& what, Pred ready) {
    auto& w = *state_->world;
    const bool done = w.changed.wait_for(lock, w.timeout, [&] { return w.aborted || ready(); });
    HYBRIDRL_CHECK(!w.aborted, fmt::format("{} on rank {}: another rank failed", what, rank_),
                   "see the first rank's error (run_ranks rethrows it)");
    HYBRIDRL_CHECK(done,
                   fmt::format("{} on rank {}: the other ranks did not join within {} ms", what,
                               rank_, w.timeout.count()),
                   "make every rank of the group call the same collectives in the same order");
  }

  std::shared_ptr<ThreadGroupState> state_;
  int rank_;
  uint64_t splits_ = 0;
};

/// Runs fn(comm) on `world` threads, one ThreadCommunicator rank each, joins them and rethrows the
/// first exception a rank threw (the other ranks' waits are aborted, so nothing hangs).
inline void run_ranks(int world, const std::function<void(Communicator&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::minutes(5)) {
  auto comms = ThreadCommunicator::world(world, timeout);
  std::exception_ptr error;
  std::mutex error_mutex;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world));
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        fn(*comms[static_cast<size_t>(rank)]);
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
        }
        comms[static_cast<size_t>(rank)]->abort();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace hybridrl
