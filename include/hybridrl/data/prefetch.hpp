#pragma once
/// \file
/// Prefetcher<T>: a background thread that calls a producer and keeps up to `depth` ready items
/// in a bounded queue. An exception thrown by the producer reaches the consumer (after the items
/// produced before it); destroying the Prefetcher stops and joins the thread without hanging, even
/// when the consumer stops early and the producer is blocked on a full queue.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace hybridrl {

/// Bounded single-producer, single-consumer prefetch queue with its own worker thread.
template <class T>
class Prefetcher {
 public:
  /// A producer returns the next item, or std::nullopt when there are no more.
  using Producer = std::function<std::optional<T>()>;

  /// Starts the worker at once; it fills the queue up to `depth` (>= 1) items.
  Prefetcher(Producer produce, int64_t depth)
      : produce_(std::move(produce)), depth_(depth < 1 ? 1 : static_cast<size_t>(depth)) {
    worker_ = std::thread([this] { run(); });
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  /// Stops and joins the worker.
  ~Prefetcher() { stop(); }

  /// The next item (waiting for it if needed), std::nullopt at the end; rethrows the producer's
  /// exception once the items produced before it are consumed.
  std::optional<T> next() {
    std::unique_lock lk(mu_);
    if (queue_.empty() && !done_ && consumed_ > 0) {
      ++waits_;
      const auto t0 = std::chrono::steady_clock::now();
      has_item_.wait(lk, [&] { return !queue_.empty() || done_ || stop_; });
      wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      has_item_.wait(lk, [&] { return !queue_.empty() || done_ || stop_; });
    }
    if (!queue_.empty()) {
      T item = std::move(queue_.front());
      queue_.pop_front();
      ++consumed_;
      has_room_.notify_one();
      return item;
    }
    if (error_) std::rethrow_exception(error_);
    return std::nullopt;
  }

  /// Times next() found the queue empty after the first item (the consumer waited on the producer).
  [[nodiscard]] int64_t waits() const {
    std::lock_guard lk(mu_);
    return waits_;
  }
  /// Seconds spent in those waits.
  [[nodiscard]] double wait_seconds() const {
    std::lock_guard lk(mu_);
    return wait_seconds_;
  }

  /// Asks the worker to stop and joins it. Idempotent.
  void stop() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    has_room_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

 private:
  void run() {
    for (;;) {
      {
        std::unique_lock lk(mu_);
        has_room_.wait(lk, [&] { return stop_ || queue_.size() < depth_; });
        if (stop_) return;
      }
      std::optional<T> item;
      try {
        item = produce_();
      } catch (...) {
        std::lock_guard lk(mu_);
        error_ = std::current_exception();
        done_ = true;
        has_item_.notify_all();
        return;
      }
      std::lock_guard lk(mu_);
      if (!item) {
        done_ = true;
        has_item_.notify_all();
        return;
      }
      queue_.push_back(std::move(*item));
      has_item_.notify_one();
    }
  }

  Producer produce_;
  size_t depth_;
  mutable std::mutex mu_;
  std::condition_variable has_item_;
  std::condition_variable has_room_;
  std::deque<T> queue_;
  bool stop_ = false;
  bool done_ = false;
  std::exception_ptr error_;
  int64_t consumed_ = 0;
  int64_t waits_ = 0;
  double wait_seconds_ = 0.0;
  std::thread worker_;
};

}  // namespace hybridrl
