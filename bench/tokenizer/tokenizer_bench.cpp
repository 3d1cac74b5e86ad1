// Encode throughput of tokenizer.json (HFTokenizer) on one core, on mixed text: the 10⁴ strings of
// each fixture style's conformance set (scripts and languages, code, emoji, numbers, whitespace
// runs, special tokens inside text: ~0.9 MB). The peer, Hugging Face tokenizers on the same files
// and core, is bench/tokenizer/hf_tokenizer_peer.py; docs/benchmarks.md has both.
//   ./build/bench/bench_tokenizer --benchmark_filter=Encode
// BM_Tokenizer_Encode: warm (the per-word cache filled by earlier iterations, as in a long run);
// BM_Tokenizer_EncodeCold: a fresh tokenizer each iteration (its load not timed).
#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <hybridrl/tokenizer/hf_tokenizer.hpp>

namespace {

const char* kStyles[] = {"qwen2", "llama3", "fallback"};

std::string fixture(int style) { return std::string(HYBRIDRL_BENCH_FIXTURES) + "/tokenizers/" + kStyles[style]; }

const std::vector<std::string>& texts(int style) {
  static std::vector<std::string> cache[3];
  auto& t = cache[style];
  if (t.empty()) {
    std::ifstream in(fixture(style) + "/conformance.jsonl");
    std::string line;
    while (std::getline(in, line)) t.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
  }
  return t;
}

void encode_all(const hybridrl::HFTokenizer& tok, const std::vector<std::string>& t, benchmark::State& state,
                int64_t& bytes, int64_t& tokens) {
  for (const auto& s : t) {
    auto ids = tok.encode(s, false);
    tokens += static_cast<int64_t>(ids.size());
    bytes += static_cast<int64_t>(s.size());
    benchmark::DoNotOptimize(ids.data());
  }
  (void)state;
}

void BM_Tokenizer_Encode(benchmark::State& state) {
  const auto style = static_cast<int>(state.range(0));
  const hybridrl::HFTokenizer tok(fixture(style));
  const auto& t = texts(style);
  int64_t bytes = 0, tokens = 0;
  for (auto _ : state) encode_all(tok, t, state, bytes, tokens);
  state.SetBytesProcessed(bytes);
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.SetLabel(kStyles[style]);
}
BENCHMARK(BM_Tokenizer_Encode)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_Tokenizer_EncodeCold(benchmark::State& state) {
  const auto style = static_cast<int>(state.range(0));
  const auto& t = texts(style);
  int64_t bytes = 0, tokens = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto tok = std::make_unique<hybridrl::HFTokenizer>(fixture(style));
    state.ResumeTiming();
    encode_all(*tok, t, state, bytes, tokens);
    state.PauseTiming();
    tok.reset();
    state.ResumeTiming();
  }
  state.SetBytesProcessed(bytes);
  state.SetLabel(kStyles[style]);
}
BENCHMARK(BM_Tokenizer_EncodeCold)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace
