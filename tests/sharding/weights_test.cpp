// sharding/weights.hpp: the tensor-parallel rule by Hugging Face name and the export of weights for a
// WeightSpec. Expected shapes are written by hand from the tiny config; the functional checks rebuild
// the full MLP and the full logits from per-rank shards with plain at:: math (Megatron's identities:
// a column-parallel layer's outputs concatenate, a row-parallel layer's partial sums add up).

#include <hybridrl/model/causal_lm.hpp>
#include <hybridrl/sharding/weights.hpp>

#include <map>
#include <string>
#include <vector>
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using namespace hybridrl::testing;

namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 96;  // divisible by 1, 2, 4
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.head_dim = 8;
  c.qkv_bias = true;
  return c;
}

CausalLM tiny_model(uint64_t seed = 0) {
  torch::manual_seed(seed);
  CausalLM m(tiny_config());
  torch::NoGradGuard g;
  for (auto& p : m->parameters()) p.normal_(0.0, 0.3);
  return m;
}


std::map<std::string, at::Tensor> by_name(const std::vector<NamedTensor>& v) {
  std::map<std::string, at::Tensor> m;
  for (const auto& t : v) m[t.name] = t.tensor;
  return m;
}

}  // namespace

TEST_SUITE("sharding/weights") {
  TEST_CASE("tensor_parallel_dim: column-parallel dim 0, row-parallel dim 1, vocabulary dim 0, norms whole") {
    CHECK((tensor_parallel_dim("model.layers.0.self_attn.q_proj.weight") == 0));
    CHECK((tensor_parallel_dim("model.layers.0.self_attn.k_proj.weight") == 0));
    CHECK((tensor_parallel_dim("model.layers.3.self_attn.v_proj.weight") == 0));
    CHECK((tensor_parallel_dim("model.layers.0.self_attn.q_proj.bias") == 0));
    CHECK((tensor_parallel_dim("model.layers.0.self_attn.v_proj.bias") == 0));
    CHECK((tensor_parallel_dim("model.layers.0.mlp.gate_proj.weight") == 0));
    CHECK((tensor_parallel_dim("model.layers.0.mlp.up_proj.weight") == 0));
    CHECK((tensor_parallel_dim("model.layers.0.self_attn.o_proj.weight") == 1));
    CHECK((tensor_parallel_dim("model.layers.0.mlp.down_proj.weight") == 1));
    CHECK((tensor_parallel_dim("model.layers.0.self_attn.o_proj.bias") == std::nullopt));
    CHECK((tensor_parallel_dim("model.embed_tokens.weight") == 0));
    CHECK((tensor_parallel_dim("lm_head.weight") == 0));
    CHECK((tensor_parallel_dim("model.layers.0.input_layernorm.weight") == std::nullopt));
    CHECK((tensor_parallel_dim("model.layers.0.post_attention_layernorm.weight") == std::nullopt));
    CHECK((tensor_parallel_dim("model.norm.weight") == std::nullopt));
    CHECK((tensor_parallel_dim("score.weight") == std::nullopt));  // the critic's value head
    CHECK(contains(error_of([] { (void)tensor_parallel_dim("model.layers.0.mlp.experts.0.w1.weight"); }),
                   "no tensor-parallel rule for the parameter 'model.layers.0.mlp.experts.0.w1.weight'"));
  }

  TEST_CASE("tp_size 1: the export is the full state dict, dtype converted when asked") {
    auto m = tiny_model();
    const auto params = m->named_parameters();
    const auto out = export_weights(params, WeightSpec{});
    REQUIRE(out.size() == params.size());
    for (size_t i = 0; i < out.size(); ++i) {
      CHECK(out[i].name == params[i].key());
      CHECK(out[i].tensor.equal(params[i].value()));
      CHECK_FALSE(out[i].tensor.requires_grad());
    }
    const auto bf16 = export_weights(params, WeightSpec{1, 0, at::kBFloat16});
    for (size_t i = 0; i < bf16.size(); ++i) {
      CHECK((bf16[i].tensor.scalar_type() == at::kBFloat16));
      CHECK(bf16[i].tensor.equal(params[i].value().to(at::kBFloat16)));
    }
  }

  TEST_CASE("tp 2 and 4: shard shapes by hand, and the shards concatenated along the rule's dim are the full tensors") {
    auto m = tiny_model();
    const auto params = m->named_parameters();
    for (int64_t tp : {2, 4}) {
      CAPTURE(tp);
      std::vector<std::map<std::string, at::Tensor>> shards;
      for (int64_t r = 0; r < tp; ++r) shards.push_back(by_name(export_weights(params, WeightSpec{tp, r})));
      // hand shapes: q_proj [32, 32] → [32/tp, 32]; q bias [32] → [32/tp]; o_proj [32, 32] → [32, 32/tp];
      // down_proj [32, 48] → [32, 48/tp]; gate_proj [48, 32] → [48/tp, 32]; embed and lm_head [96, 32] → [96/tp, 32].
      const auto& s0 = shards[0];
      CHECK(s0.at("model.layers.0.self_attn.q_proj.weight").sizes().vec() == std::vector<int64_t>{32 / tp, 32});
      CHECK(s0.at("model.layers.0.self_attn.q_proj.bias").sizes().vec() == std::vector<int64_t>{32 / tp});
      CHECK(s0.at("model.layers.0.self_attn.o_proj.weight").sizes().vec() == std::vector<int64_t>{32, 32 / tp});
      CHECK(s0.at("model.layers.1.mlp.down_proj.weight").sizes().vec() == std::vector<int64_t>{32, 48 / tp});
      CHECK(s0.at("model.layers.1.mlp.gate_proj.weight").sizes().vec() == std::vector<int64_t>{48 / tp, 32});
      CHECK(s0.at("model.embed_tokens.weight").sizes().vec() == std::vector<int64_t>{96 / tp, 32});
      CHECK(s0.at("lm_head.weight").sizes().vec() == std::vector<int64_t>{96 / tp, 32});
      CHECK(s0.at("model.norm.weight").sizes().vec() == std::vector<int64_t>{32});
      for (const auto& item : params) {
        CAPTURE(item.key());
        std::vector<at::Tensor> parts;
        for (const auto& s : shards) parts.push_back(s.at(item.key()));
        if (const auto dim = tensor_parallel_dim(item.key())) {
          CHECK(at::cat(parts, *dim).equal(item.value()));
        } else {
          for (const auto& p : parts) CHECK(p.equal(item.value()));
        }
      }
    }
  }

  TEST_CASE("the rule is Megatron's: partial MLP outputs of the ranks sum to the full MLP, vocabulary shards of the logits concatenate") {
    auto m = tiny_model(3);
    torch::NoGradGuard g;
    const auto params = m->named_parameters();
    const auto x = at::randn({5, 32});
    auto full = [&](const std::string& n) { return params[n]; };
    const std::string l = "model.layers.1.mlp.";
    const auto want = at::linear(at::silu(at::linear(x, full(l + "gate_proj.weight"))) * at::linear(x, full(l + "up_proj.weight")),
                                 full(l + "down_proj.weight"));
    const auto want_logits = at::linear(x, full("lm_head.weight"));
    for (int64_t tp : {2, 4}) {
      at::Tensor sum = at::zeros_like(want);
      std::vector<at::Tensor> logits;
      for (int64_t r = 0; r < tp; ++r) {
        auto s = by_name(export_weights(params, WeightSpec{tp, r}));
        sum += at::linear(at::silu(at::linear(x, s.at(l + "gate_proj.weight"))) * at::linear(x, s.at(l + "up_proj.weight")),
                          s.at(l + "down_proj.weight"));
        logits.push_back(at::linear(x, s.at("lm_head.weight")));
      }
      CHECK((sum - want).abs().max().item<double>() < 1e-4);
      CHECK(at::cat(logits, -1).allclose(want_logits));
    }
  }

  TEST_CASE("a bad spec, or a size the tensor-parallel degree does not divide, is an error with the fix") {
    auto m = tiny_model();
    const auto params = m->named_parameters();
    CHECK(contains(error_of([&] { (void)export_weights(params, WeightSpec{2, 2}); }), "tp_rank = 2 must lie in [0, tp_size = 2)"));
    CHECK(contains(error_of([&] { (void)export_weights(params, WeightSpec{0, 0}); }), "tp_size = 0 must be >= 1"));
    // hidden 32 does not split over 3: the first split tensor (embed_tokens [96, 32] splits its 96 rows fine,
    // q_proj's 32 rows do not)
    CHECK(contains(error_of([&] { (void)export_weights(params, WeightSpec{3, 0}); }),
                   "size 32 on dim 0, which does not split over tp_size 3 (32 % 3 = 2)"));
  }

  TEST_CASE("bucketed export: buckets fill up to bucket_bytes, a large tensor travels alone, content and order are kept") {
    torch::OrderedDict<std::string, at::Tensor> named;
    named.insert("model.layers.0.input_layernorm.weight", at::ones({100}));    // 400 bytes
    named.insert("model.layers.0.post_attention_layernorm.weight", at::ones({100}) * 2);  // 400 bytes
    named.insert("model.norm.weight", at::ones({200}) * 3);                    // 800 bytes
    named.insert("model.embed_tokens.weight", at::arange(600, at::kFloat).reshape({6, 100}));  // 2400 bytes
    std::vector<WeightBucket> buckets;
    const int64_t n = export_weights(named, WeightSpec{}, 1000, [&](const WeightBucket& b) { buckets.push_back(b); });
    // 400 + 400 = 800 ≤ 1000, + 800 > 1000 → flush; 800 alone; 2400 alone (larger than a bucket)
    CHECK(n == 3);
    REQUIRE(buckets.size() == 3);
    CHECK(buckets[0].size() == 2);
    CHECK(buckets[1].size() == 1);
    CHECK(buckets[1][0].name == "model.norm.weight");
    CHECK(buckets[2].size() == 1);
    CHECK(buckets[2][0].tensor.equal(at::arange(600, at::kFloat).reshape({6, 100})));
    // with tp 2 the embedding shard is rows 3..5 (1200 bytes), still alone
    buckets.clear();
    export_weights(named, WeightSpec{2, 1}, 1000, [&](const WeightBucket& b) { buckets.push_back(b); });
    REQUIRE(buckets.size() == 3);
    CHECK(buckets[2][0].tensor.equal(at::arange(300, 600, at::kFloat).reshape({3, 100})));
    CHECK(contains(error_of([&] { export_weights(named, WeightSpec{}, 0, [](const WeightBucket&) {}); }), "bucket_bytes = 0"));
  }
}
