// The engine convention: a descriptor whose engine_type models rollout_engine / sharded_model. The two
// test engines below really implement the concepts (single rank, greedy full-recompute generation),
// so the contract is exercised end to end: export → load in buckets → generate, and the rollout's
// sampling log-probs agree with the sharded model's forward on the same tokens.

#include <hybridrl/hybridrl.hpp>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;

namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  return c;
}

CausalLM tiny_model(uint64_t seed) {
  torch::manual_seed(seed);
  CausalLM m(tiny_config());
  torch::NoGradGuard g;
  for (auto& p : m->parameters()) p.normal_(0.0, 0.3);
  return m;
}

/// positions of a left-padded mask: cumsum(mask) - 1, 0 on padding.
at::Tensor positions_of(const at::Tensor& mask) { return (mask.cumsum(1) - 1).clamp_min(0); }

/// A single-rank sharded_model: the whole CausalLM on this rank, SGD with momentum (state kept here,
/// so it is part of the checkpoint).
class TestShardedModel {
 public:
  TestShardedModel(uint64_t seed, double lr, int64_t bucket_bytes) : model_(tiny_model(seed)), lr_(lr), bucket_bytes_(bucket_bytes) {}

  /// log_probs [B, T] (entry t: log p(token t | tokens < t); 0 at t = 0) and entropy, with grad.
  TensorBatch forward(const TensorBatch& batch) {
    const auto ids = batch.tensor(keys::input_ids);
    const auto mask = batch.tensor(keys::attention_mask);
    // Aligned as core/keys.hpp says: [B, T], column 0 = 0.
    auto lp = token_log_probs(model_, ids, ForwardArgs{}.attention_mask(mask).position_ids(positions_of(mask)));
    return TensorBatch({{keys::log_probs.str(), lp.log_probs}, {keys::entropy.str(), lp.entropy}});
  }
  void backward(const at::Tensor& loss) { loss.backward(); }
  at::Tensor step() {
    torch::NoGradGuard g;
    at::Tensor sq = at::zeros({});
    for (const auto& p : model_->named_parameters()) {
      if (!p.value().grad().defined()) continue;
      sq += p.value().grad().pow(2).sum();
      auto& v = momentum_[p.key()];
      if (!v.defined()) v = at::zeros_like(p.value());
      v.mul_(0.9).add_(p.value().grad());
      p.value().add_(v, -lr_);
      p.value().mutable_grad().zero_();
    }
    steps_ += 1;
    return sq.sqrt();
  }
  [[nodiscard]] StateDict state_dict() const {
    StateDict s;
    for (const auto& p : model_->named_parameters()) s["model." + p.key()] = p.value().detach().clone();
    for (const auto& [k, v] : momentum_) s["momentum." + k] = v.clone();
    s["steps"] = at::tensor(steps_);
    return s;
  }
  void load_state_dict(const StateDict& s) {
    torch::NoGradGuard g;
    for (auto& p : model_->named_parameters()) p.value().copy_(s.at("model." + p.key()));
    momentum_.clear();
    for (const auto& [k, v] : s)
      if (k.rfind("momentum.", 0) == 0) momentum_[k.substr(9)] = v.clone();
    steps_ = s.at("steps").item<int64_t>();
  }
  void export_weights(const WeightSpec& spec, const WeightSink& sink) const {
    hybridrl::export_weights(model_->named_parameters(), spec, bucket_bytes_, sink);
  }
  CausalLM& model() { return model_; }

 private:
  CausalLM model_;
  double lr_;
  int64_t bucket_bytes_;
  std::map<std::string, at::Tensor> momentum_;
  int64_t steps_ = 0;
};

/// A rollout_engine: greedy decoding by full recompute from its own CausalLM (weights loaded by name),
/// with a workspace standing in for the KV cache (released and resumed).
class TestRollout {
 public:
  explicit TestRollout(SamplingOptions sampling) : model_(tiny_model(1234)), sampling_(std::move(sampling)) { resume_memory(); }

  TensorBatch generate(const TensorBatch& prompts) { return generate(prompts, sampling_); }
  TensorBatch generate(const TensorBatch& prompts, const SamplingOptions& s) {
    HYBRIDRL_CHECK(workspace_.defined(), "TestRollout: generate() after release_memory()", "call resume_memory() first");
    torch::NoGradGuard g;
    const auto prompt_ids = prompts.tensor(keys::input_ids);
    const auto prompt_mask = prompts.tensor(keys::attention_mask);
    const int64_t B = prompt_ids.size(0);
    auto ids = prompt_ids.clone();
    auto mask = prompt_mask.clone();
    auto alive = at::ones({B}, at::kLong);
    std::vector<at::Tensor> toks, lps, live;
    for (int64_t t = 0; t < s.max_new_tokens(); ++t) {
      auto logits = model_->forward(ids, ForwardArgs{}.attention_mask(mask).position_ids(positions_of(mask)));
      auto logp = at::log_softmax(logits.select(1, -1).to(at::kFloat), -1);
      auto next = logp.argmax(-1);
      toks.push_back(next * alive);
      lps.push_back(logp.gather(-1, next.unsqueeze(-1)).squeeze(-1) * alive);
      live.push_back(alive.clone());
      for (auto stop : s.stop_token_ids()) alive = alive * (next != stop).to(at::kLong);
      ids = at::cat({ids, next.unsqueeze(1)}, 1);
      mask = at::cat({mask, live.back().unsqueeze(1)}, 1);
    }
    auto responses = at::stack(toks, 1);
    auto response_mask = at::stack(live, 1);
    TensorBatch out({{keys::prompts, prompt_ids},
                     {keys::responses, responses},
                     {keys::response_mask, response_mask},
                     {keys::rollout_log_probs, at::stack(lps, 1)},
                     {keys::finish_reason, 1 - alive},  // 1 stop token, 0 length
                     {keys::input_ids, at::cat({prompt_ids, responses}, 1)},
                     {keys::attention_mask, mask},
                     {keys::position_ids, positions_of(mask)},
                     {keys::group_ids, prompts.has_tensor(keys::group_ids) ? prompts.tensor(keys::group_ids) : at::arange(B)}});
    stats_ = RolloutStats{};
    stats_.sequences = B;
    stats_.prompt_tokens = prompt_mask.sum().item<int64_t>();
    stats_.generated_tokens = response_mask.sum().item<int64_t>();
    stats_.kv_cache_bytes = static_cast<int64_t>(workspace_.numel() * workspace_.element_size());
    return out;
  }
  [[nodiscard]] WeightSpec weight_spec() const { return WeightSpec{1, 0, at::kFloat}; }
  void load_weights(const WeightBucket& bucket) {
    torch::NoGradGuard g;
    auto params = model_->named_parameters();
    for (const auto& t : bucket) {
      auto* p = params.find(t.name);
      HYBRIDRL_CHECK(p != nullptr, "TestRollout: no parameter " + t.name, "export with Hugging Face names");
      p->copy_(t.tensor);
      ++tensors_loaded_;
    }
    ++buckets_loaded_;
  }
  void release_memory() { workspace_ = at::Tensor(); }
  void resume_memory() { workspace_ = at::zeros({4, 128}, at::kLong); }
  [[nodiscard]] RolloutStats stats() const { return stats_; }

  CausalLM& model() { return model_; }
  int64_t buckets_loaded_ = 0;
  int64_t tensors_loaded_ = 0;

 private:
  CausalLM model_;
  SamplingOptions sampling_;
  at::Tensor workspace_;
  RolloutStats stats_;
};

// ---- engines with a hook missing (the concepts must reject them) ----
struct NoStats : TestRollout {
  using TestRollout::TestRollout;
  void stats() const = delete;
};
struct NoExport {
  TensorBatch forward(const TensorBatch& b) { return b; }
  void backward(const at::Tensor&) {}
  at::Tensor step() { return {}; }
  [[nodiscard]] StateDict state_dict() const { return {}; }
  void load_state_dict(const StateDict&) {}
};

// ---- descriptors of the test engines, as a user writes them ----
struct TestRolloutTag {};
struct TestShardingTag {};
struct BrokenRolloutTag {};
struct NoOptionsToCheck {
  void validate() const {}
};

}  // namespace

template <>
struct hybridrl::Rollout<TestRolloutTag> {
  using tag = TestRolloutTag;
  using options_type = SamplingOptions;
  using engine_type = TestRollout;
  static constexpr std::string_view name = "TestRollout";
  static constexpr bool accepts_tensor_parallel_weights = false;
  static engine_type make(const options_type& o) { return engine_type(o); }
};
template <>
struct hybridrl::Sharding<TestShardingTag> {
  using tag = TestShardingTag;
  using options_type = NoOptionsToCheck;
  using engine_type = TestShardedModel;
  static constexpr std::string_view name = "TestSharding";
  static constexpr bool produces_tensor_parallel_shards = false;
  static engine_type make(uint64_t seed) { return engine_type(seed, 0.05, 4096); }
};
template <>
struct hybridrl::Rollout<BrokenRolloutTag> : hybridrl::Rollout<TestRolloutTag> {
  using tag = BrokenRolloutTag;
  using engine_type = NoStats;
};

static_assert(rollout_engine<TestRollout>);
static_assert(sharded_model<TestShardedModel>);
static_assert(!rollout_engine<NoStats> && !reports_rollout_stats<NoStats> && generates_batches<NoStats>);
static_assert(!sharded_model<NoExport> && !exports_weights<NoExport> && has_checkpoint_state<NoExport>);
static_assert(rollout_policy<Rollout<TestRolloutTag>> && sharding_policy<Sharding<TestShardingTag>>);
static_assert(rollout_traits<Rollout<BrokenRolloutTag>> && !rollout_policy<Rollout<BrokenRolloutTag>>);
static_assert(trainer_config<Algorithm<GRPO>, Sharding<TestShardingTag>, Rollout<TestRolloutTag>, Loader<Bucketed>>);
static_assert(!trainer_config<Algorithm<GRPO>, Sharding<TestShardingTag>, Rollout<BrokenRolloutTag>, Loader<Bucketed>>);
static_assert(hybridrl::detail::first_broken_rule<Algorithm<GRPO>, Sharding<FSDP>, Rollout<BrokenRolloutTag>, Loader<Bucketed>>() ==
              hybridrl::detail::TrainerRule::rollout_stats);
// a Trainer composes the user's engines' descriptors
static_assert(std::is_same_v<Trainer<Algorithm<GRPO>, Sharding<TestShardingTag>, Rollout<TestRolloutTag>, Loader<Bucketed>>::rollout_options,
                             SamplingOptions>);

namespace {
TensorBatch prompt_batch() {
  // two left-padded prompts: [pad, 5, 9, 3] and [7, 2, 8, 1]
  auto ids = at::tensor(std::vector<int64_t>{0, 5, 9, 3, 7, 2, 8, 1}).reshape({2, 4});
  auto mask = at::tensor(std::vector<int64_t>{0, 1, 1, 1, 1, 1, 1, 1}).reshape({2, 4});
  return TensorBatch({{keys::input_ids, ids}, {keys::attention_mask, mask}, {keys::group_ids, at::tensor(std::vector<int64_t>{4, 9})}});
}
}  // namespace

TEST_SUITE("trainer/engines") {
  TEST_CASE("hand-off: the sharded model's export, loaded in buckets, makes the rollout's weights equal; generation agrees with the trained model") {
    auto model = Sharding<TestShardingTag>::make(7);
    auto rollout = Rollout<TestRolloutTag>::make(SamplingOptions{}.max_new_tokens(5));
    auto params = [](CausalLM& m) { return m->named_parameters(); };
    CHECK_FALSE(params(rollout.model())["lm_head.weight"].equal(params(model.model())["lm_head.weight"]));

    model.export_weights(rollout.weight_spec(), [&](const WeightBucket& b) { rollout.load_weights(b); });
    CHECK(rollout.buckets_loaded_ > 1);  // 4096-byte buckets: the weights travel in several
    CHECK(rollout.tensors_loaded_ == static_cast<int64_t>(params(model.model()).size()));
    for (const auto& p : params(model.model())) CHECK(params(rollout.model())[p.key()].equal(p.value()));

    const auto out = rollout.generate(prompt_batch());
    for (const auto& k : rollout_output_keys) CHECK_MESSAGE(out.has_tensor(k), k.name);
    CHECK(out.tensor(keys::responses).sizes().vec() == std::vector<int64_t>{2, 5});
    CHECK(out.tensor(keys::input_ids).sizes().vec() == std::vector<int64_t>{2, 9});
    CHECK(out.tensor(keys::group_ids).equal(at::tensor(std::vector<int64_t>{4, 9})));

    // The trained model scores the generated tokens as the rollout sampled them (same weights, same
    // positions): forward's log_probs on the response columns equal rollout_log_probs.
    at::Tensor lp;
    {
      torch::NoGradGuard g;
      lp = model.forward(out).tensor(keys::log_probs).narrow(1, 4, 5);
    }
    CHECK((lp - out.tensor(keys::rollout_log_probs)).abs().max().item<double>() < 1e-4);
    // greedy: every sampled log-prob is the row's maximum, so it is ≥ log(1/V)
    CHECK(out.tensor(keys::rollout_log_probs).min().item<double>() >= std::log(1.0 / 64) - 1e-5);

    const auto st = rollout.stats();
    CHECK(st.sequences == 2);
    CHECK(st.prompt_tokens == 7);
    CHECK(st.generated_tokens == 10);  // no stop token: 2 × 5
  }

  TEST_CASE("a stop token ends a sequence: mask, finish_reason and stats follow") {
    auto rollout = Rollout<TestRolloutTag>::make(SamplingOptions{}.max_new_tokens(4));
    const auto free_run = rollout.generate(prompt_batch());
    const int64_t first = free_run.tensor(keys::responses)[0][0].item<int64_t>();
    const auto out = rollout.generate(prompt_batch(), SamplingOptions{}.max_new_tokens(4).stop_token_ids({first}));
    // row 0 stops at its first token: the stop token is kept, nothing after it
    CHECK(out.tensor(keys::response_mask)[0].equal(at::tensor(std::vector<int64_t>{1, 0, 0, 0})));
    CHECK(out.tensor(keys::finish_reason)[0].item<int64_t>() == 1);
    CHECK(rollout.stats().generated_tokens == out.tensor(keys::response_mask).sum().item<int64_t>());
  }

  TEST_CASE("release_memory frees the KV workspace; generate needs resume_memory first") {
    auto rollout = Rollout<TestRolloutTag>::make(SamplingOptions{}.max_new_tokens(2));
    rollout.release_memory();
    try {
      (void)rollout.generate(prompt_batch());
      FAIL("generate after release_memory must throw");
    } catch (const Error& e) {
      CHECK(e.fix() == "call resume_memory() first");
    }
    rollout.resume_memory();
    CHECK(rollout.generate(prompt_batch()).size() == 2);
    CHECK(rollout.stats().kv_cache_bytes == 4 * 128 * 8);
  }

  TEST_CASE("checkpoint state: a model restored from state_dict continues exactly like the original") {
    auto a = Sharding<TestShardingTag>::make(11);
    auto batch = prompt_batch();
    auto train_step = [&](TestShardedModel& m) {
      auto lp = m.forward(batch).tensor(keys::log_probs);
      m.backward(-(lp * batch.tensor(keys::attention_mask)).sum());
      return m.step();
    };
    const auto norm = train_step(a);
    CHECK(norm.dim() == 0);
    CHECK(norm.item<double>() > 0);
    auto b = Sharding<TestShardingTag>::make(99);  // other weights, no momentum
    b.load_state_dict(a.state_dict());
    CHECK(train_step(a).item<double>() == train_step(b).item<double>());
    const auto sa = a.state_dict();
    const auto sb = b.state_dict();
    REQUIRE(sa.size() == sb.size());
    for (const auto& [k, v] : sa) CHECK_MESSAGE(sb.at(k).equal(v), k);
    CHECK(sa.at("steps").item<int64_t>() == 2);
  }
}
