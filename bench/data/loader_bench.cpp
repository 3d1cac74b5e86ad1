// Data loading benchmarks: padding waste of pad-to-max vs Bucketed vs Packed on a long-tailed
// length distribution, packing plan speed (ours vs the textbook first-fit scan), and whether a
// slow consumer ever waits on the prefetch thread. Counters only; nothing asserts on time.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "hybridrl/data/data.hpp"

using namespace hybridrl;

namespace {

constexpr int64_t kRow = 4096;

// Lognormal lengths, median 200 tokens (mu = ln 200, sigma = 0.8), clipped to [1, 4096].
std::vector<int64_t> long_tail(size_t n, uint32_t seed = 42) {
  std::mt19937_64 g(seed);
  std::lognormal_distribution<double> d(std::log(200.0), 0.8);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = std::clamp<int64_t>(std::llround(d(g)), 1, kRow);
  return v;
}

void report_lengths(benchmark::State& state, const std::vector<int64_t>& l) {
  auto sorted = l;
  std::sort(sorted.begin(), sorted.end());
  state.counters["median_len"] = static_cast<double>(sorted[sorted.size() / 2]);
  state.counters["max_len"] = static_cast<double>(sorted.back());
}

// Random batches of 64, each padded to the configured maximum (4096): what a fixed-shape
// pad-to-max pipeline spends.
void BM_Data_PaddingWaste_PadToMax(benchmark::State& state) {
  const auto l = long_tail(100000);
  double waste = 0;
  for (auto _ : state) {
    int64_t real = 0;
    for (auto x : l) real += x;
    waste = 1.0 - static_cast<double>(real) / static_cast<double>(kRow * static_cast<int64_t>(l.size()));
    benchmark::DoNotOptimize(waste);
  }
  state.counters["waste"] = waste;
  report_lengths(state, l);
}
BENCHMARK(BM_Data_PaddingWaste_PadToMax)->Iterations(1);

// Random (unsorted) batches of 64, each padded to its own longest sample.
void BM_Data_PaddingWaste_PadToBatchMax(benchmark::State& state) {
  const auto l = long_tail(100000);
  double waste = 0;
  for (auto _ : state) {
    std::vector<std::vector<int64_t>> batches;
    for (size_t i = 0; i < l.size(); i += 64) {
      std::vector<int64_t> b;
      for (size_t j = i; j < std::min(l.size(), i + 64); ++j) b.push_back(static_cast<int64_t>(j));
      batches.push_back(std::move(b));
    }
    waste = bucketed_padding_fraction(batches, l);
    benchmark::DoNotOptimize(waste);
  }
  state.counters["waste"] = waste;
}
BENCHMARK(BM_Data_PaddingWaste_PadToBatchMax)->Iterations(1);

// Loader<Bucketed>'s plan: batches of 64, sorted inside windows of 64 batches.
void BM_Data_PaddingWaste_Bucketed(benchmark::State& state) {
  const auto l = long_tail(100000);
  double waste = 0;
  for (auto _ : state) {
    BucketPlanOptions o;
    o.batch_size = 64;
    o.window_batches = state.range(0);
    auto batches = bucket_batches(l, o, 7);
    waste = bucketed_padding_fraction(batches, l);
    benchmark::DoNotOptimize(batches.data());
  }
  state.counters["waste"] = waste;
}
BENCHMARK(BM_Data_PaddingWaste_Bucketed)->Arg(16)->Arg(64)->Arg(256)->Arg(1024)->Arg(0)->Unit(benchmark::kMillisecond);

// Loader<Bucketed> with a token budget (use_dynamic_bsz): 65536 padded tokens per batch.
void BM_Data_PaddingWaste_BucketedTokenBudget(benchmark::State& state) {
  const auto l = long_tail(100000);
  double waste = 0, batches_n = 0;
  for (auto _ : state) {
    BucketPlanOptions o;
    o.batch_size = 100000;
    o.max_tokens_per_batch = 65536;
    o.window_batches = 0;
    auto batches = bucket_batches(l, o, 7);
    waste = bucketed_padding_fraction(batches, l);
    batches_n = static_cast<double>(batches.size());
  }
  state.counters["waste"] = waste;
  state.counters["batches"] = batches_n;
}
BENCHMARK(BM_Data_PaddingWaste_BucketedTokenBudget)->Unit(benchmark::kMillisecond);

// Loader<Packed>: global batches of range(0) samples packed into 4096-token rows.
void BM_Data_PaddingWaste_Packed(benchmark::State& state) {
  const auto l = long_tail(100000);
  const auto batch = static_cast<size_t>(state.range(0));
  double waste = 0;
  for (auto _ : state) {
    int64_t used = 0, rows = 0;
    for (size_t i = 0; i < l.size(); i += batch) {
      std::span<const int64_t> part(l.data() + i, std::min(batch, l.size() - i));
      auto p = pack_rows(part, kRow);
      rows += p.rows();
      for (auto u : p.row_used) used += u;
    }
    waste = 1.0 - static_cast<double>(used) / static_cast<double>(rows * kRow);
  }
  state.counters["waste"] = waste;
}
BENCHMARK(BM_Data_PaddingWaste_Packed)->Arg(1024)->Arg(4096)->Arg(100000)->Unit(benchmark::kMillisecond);

// Planning speed: best-fit decreasing with the bit tree, O(n + row_length).
void BM_Data_PackPlan(benchmark::State& state) {
  const auto l = long_tail(static_cast<size_t>(state.range(0)));
  double rows = 0;
  for (auto _ : state) {
    auto p = pack_rows(l, kRow);
    rows = static_cast<double>(p.rows());
    benchmark::DoNotOptimize(p.items.data());
  }
  state.counters["rows"] = rows;
  state.counters["lengths_per_s"] =
      benchmark::Counter(static_cast<double>(l.size()), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Data_PackPlan)->Arg(10000)->Arg(100000)->Arg(1000000)->Unit(benchmark::kMillisecond);

// The peer: first-fit decreasing that scans rows from the first, O(n · rows).
void BM_Data_PackPlanFirstFitScan(benchmark::State& state) {
  const auto l = long_tail(static_cast<size_t>(state.range(0)));
  double rows = 0;
  for (auto _ : state) {
    auto p = hybridrl::detail::pack_rows_first_fit_scan(l, kRow);
    rows = static_cast<double>(p.rows());
    benchmark::DoNotOptimize(p.items.data());
  }
  state.counters["rows"] = rows;
  state.counters["lengths_per_s"] =
      benchmark::Counter(static_cast<double>(l.size()), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Data_PackPlanFirstFitScan)->Arg(10000)->Arg(100000)->Unit(benchmark::kMillisecond);

// Prefetch: Loader<Bucketed> over 20k prompts (batches of 64) and a consumer that spends
// range(0) µs per batch. Counters: waits after the first batch (should be 0), producer µs/batch.
void BM_Data_PrefetchSlowConsumer(benchmark::State& state) {
  std::mt19937_64 g(1);
  std::lognormal_distribution<double> d(std::log(200.0), 0.8);
  std::string text;
  for (int i = 0; i < 20000; ++i) {
    text += "{\"prompt\": \"" + std::string(static_cast<size_t>(std::clamp<int64_t>(std::llround(d(g)), 1, 2000)), 'x') + "\"}\n";
  }
  std::istringstream in(text);
  auto data = std::make_shared<const PromptDataset>(PromptDataset::from_stream(in, "bench", ByteTokenizer{}));
  const auto consumer_us = state.range(0);
  // producer cost alone, on the caller's thread
  double produce_us = 0;
  {
    auto sync = Loader<Bucketed>::make(data, BucketedOptions{}.batch_size(64).prefetch_factor(0));
    const auto t0 = std::chrono::steady_clock::now();
    int n = 0;
    for (; n < 50 && sync.next(); ++n) {
    }
    produce_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
  }
  double waits = 0, wait_ms = 0, batches = 0;
  for (auto _ : state) {
    auto loader = Loader<Bucketed>::make(data, BucketedOptions{}.batch_size(64).prefetch_factor(2));
    while (auto b = loader.next()) {
      benchmark::DoNotOptimize(b->tensor("input_ids").data_ptr());
      std::this_thread::sleep_for(std::chrono::microseconds(consumer_us));
    }
    const auto s = loader.statistics();
    waits = static_cast<double>(s.prefetch_waits);
    wait_ms = s.prefetch_wait_seconds * 1e3;
    batches = static_cast<double>(s.batches);
  }
  state.counters["producer_us_per_batch"] = produce_us;
  state.counters["waits_after_first"] = waits;
  state.counters["wait_ms"] = wait_ms;
  state.counters["batches"] = batches;
}
BENCHMARK(BM_Data_PrefetchSlowConsumer)->Arg(2000)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
