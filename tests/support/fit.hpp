#pragma once
// Test support for the fit loop (tests/trainer): a temporary output directory, the fixture
// model, prompt files, a reward with a learnable band, and metrics.jsonl without its timings.
#include <hybridrl/hybridrl.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace hybridrl::testing {

/// A fresh directory under /tmp, removed with its contents at scope exit.
struct FitTempDir {
  std::string path;
  explicit FitTempDir(const std::string& tag)
      : path((std::filesystem::temp_directory_path() / ("hybridrl_fit_" + tag + "_" + std::to_string(::getpid()))).string()) {
    io::detail::remove_tree(path);
    std::filesystem::create_directories(path);
  }
  ~FitTempDir() { io::detail::remove_tree(path); }
};

/// The tiny Llama fixture (tests/fixtures/models/llama), loaded fresh.
inline CausalLM fit_fixture_model() { return load_causal_lm(std::string(HYBRIDRL_FIXTURES_DIR) + "/models/llama"); }

/// The lines of metrics.jsonl without the keys that measure time or memory (time/*, memory/*,
/// tokens_per_s and rollout/tokens_per_s).
inline std::vector<nlohmann::json> reproducible_metrics(const std::string& dir) {
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) {
    const auto all = nlohmann::json::parse(line);
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : all.items()) {
      if (k.rfind("time/", 0) != 0 && k.rfind("memory/", 0) != 0 && k != "tokens_per_s" &&
          k != "rollout/tokens_per_s") {
        j[k] = v;
      }
    }
    out.push_back(j);
  }
  return out;
}

/// `n` prompts (with an answer field the reward may read).
inline std::string write_prompts(const std::string& dir, int n) {
  const auto path = dir + "/prompts.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < n; ++i) {
    out << nlohmann::json{{"prompt", "count " + std::to_string(i)}, {"answer", std::to_string(i)}}.dump() << "\n";
  }
  return path;
}

/// `n` prompts of write_prompts under `dir`, read with the byte tokenizer (prompts of up to 32 tokens).
inline std::shared_ptr<const PromptDataset> fixture_prompts(const std::string& dir, int n = 8) {
  const ByteTokenizer tok;
  return std::make_shared<const PromptDataset>(
      PromptDataset::from_jsonl(write_prompts(dir, n), tok, DatasetOptions{}.max_prompt_length(32)));
}

/// The fraction of a response's tokens in [lo, lo + 10): about 3% for the fixture's random model.
inline double share_in_band(const RewardInput& x, int64_t lo) {
  if (x.response_ids.empty()) return 0.0;
  double hits = 0;
  for (auto id : x.response_ids) hits += (id >= lo && id < lo + 10) ? 1.0 : 0.0;
  return hits / static_cast<double>(x.response_ids.size());
}

/// A tokenizer of written-out ids: "250 82 23" → {250, 82, 23} (BOS 1 first when asked, EOS 2,
/// PAD 0, 320 ids as the fixture models): data whose tokens a Python fixture fixed.
struct IdTokenizer {
  [[nodiscard]] std::vector<int64_t> encode(std::string_view text, bool add_bos = true) const {
    std::vector<int64_t> ids;
    if (add_bos) ids.push_back(bos_id());
    std::istringstream in{std::string(text)};
    for (int64_t id = 0; in >> id;) ids.push_back(id);
    return ids;
  }
  [[nodiscard]] std::string decode(const std::vector<int64_t>& ids) const {
    std::string out;
    for (auto id : ids) out += (out.empty() ? "" : " ") + std::to_string(id);
    return out;
  }
  [[nodiscard]] int64_t vocab_size() const { return 320; }
  [[nodiscard]] int64_t bos_id() const { return 1; }
  [[nodiscard]] int64_t eos_id() const { return 2; }
  [[nodiscard]] int64_t pad_id() const { return 0; }
};

/// Options of an online trainer `T` (Rollout<Naive>) on the fixture: 4 prompts × 8 samples of 6
/// tokens per step, one mini-batch, fp32, lr 1e-2, an endless loader; `seed` is trainer.seed.
template <class T>
typename T::Options online_fit_options(int64_t steps, uint64_t seed) {
  typename T::Options o;
  o.trainer().total_steps(steps).seed(seed);
  o.data().train_batch_size(4);
  o.rollout().n(8);
  if constexpr (requires { o.rollout().max_batch_size(int64_t{32}); }) o.rollout().max_batch_size(32);  // Naive
  if constexpr (requires { o.rollout().kv_cache_tokens(int64_t{1}); }) o.rollout().kv_cache_tokens(4096);  // Paged
  o.rollout().sampling().max_new_tokens(6).ignore_eos(true).temperature(1.0);
  o.geometry().ppo_mini_batch_size(4).micro_batch_size_per_gpu(16);
  o.optim().lr(1e-2).weight_decay(0.0).schedule(LRSchedule::constant);
  o.sharding().param_dtype(at::kFloat);
  o.loader().epochs(0).prefetch_factor(0);
  return o;
}

}  // namespace hybridrl::testing
