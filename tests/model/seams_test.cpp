// The model's seams: the per-layer runner hook (gather/free counted in forward and backward, with
// and without activation checkpointing; output bit-equal to the default runner), CPU autocast,
// log-prob alignment and sequence_log_probs against a scalar reference, and the error paths.
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <cmath>
#include <string>
#include <vector>

#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/model/model.hpp"
#include "hybridrl/rollout/naive/dense_kv_cache.hpp"
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using namespace hybridrl::testing;

namespace {

ModelConfig seam_config(int64_t layers = 3) {
  ModelConfig c;
  c.vocab_size = 53;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.qkv_bias = true;
  return c;
}

CausalLM seam_model(const ModelConfig& c, uint64_t seed, at::ScalarType dtype = at::kFloat) {
  torch::manual_seed(seed);
  CausalLM m(c);
  {
    torch::NoGradGuard g;
    for (auto& p : m->parameters()) p.normal_(0.0, 0.3);
  }
  m->to(dtype);
  return m;
}


/// What a sharding engine's runner would do around each layer, counted: gather before the forward
/// (and before the backward, via a hook on the output's gradient), free after (and after the
/// backward, via a hook on the input's gradient).
struct Counts {
  int gather = 0, free = 0, backward_gather = 0, backward_free = 0;
  std::vector<int64_t> backward_order;
};

LayerRunner counting_runner(Counts& n, LayerRunner inner = default_layer_runner()) {
  return [&n, inner](int64_t layer, DecoderLayerImpl& m, const at::Tensor& h, const LayerContext& ctx) {
    ++n.gather;
    auto x = h.view_as(h);
    if (x.requires_grad()) {
      x.register_hook([&n](const at::Tensor& g) {
        ++n.backward_free;
        return g;
      });
    }
    auto y = inner(layer, m, x, ctx);
    if (y.requires_grad()) {
      y.register_hook([&n, layer](const at::Tensor& g) {
        ++n.backward_gather;
        n.backward_order.push_back(layer);
        return g;
      });
    }
    ++n.free;
    return y;
  };
}

}  // namespace

TEST_SUITE("model/layer_runner") {
  TEST_CASE("a counting runner runs once per layer forward and backward; checkpointing shows the recompute") {
    const auto c = seam_config(3);
    auto m = seam_model(c, 11, at::kDouble);
    m->train();
    torch::manual_seed(12);
    auto ids = torch::randint(0, c.vocab_size, {2, 6});
    auto run = [&](const LayerRunner& runner) {
      m->model->set_layer_runner(runner);
      for (auto& p : m->parameters()) p.mutable_grad() = at::Tensor();
      auto out = m->forward(ids);
      (out.pow(2).mean()).backward();
      std::vector<at::Tensor> g;
      for (auto& p : m->parameters()) g.push_back(p.grad().clone());
      return std::make_pair(out.detach(), g);
    };
    auto [want, g0] = run(default_layer_runner());

    Counts plain;
    auto [out1, g1] = run(counting_runner(plain));
    CHECK(max_diff(out1, want) == 0.0);  // bit-equal to the default runner
    CHECK(plain.gather == 3);
    CHECK(plain.free == 3);
    CHECK(plain.backward_gather == 3);
    CHECK(plain.backward_free == 3);
    CHECK(plain.backward_order == std::vector<int64_t>{2, 1, 0});  // backward visits layers in reverse
    for (size_t i = 0; i < g0.size(); ++i) CHECK(max_diff(g1[i], g0[i]) == 0.0);

    // checkpointing outside the counter: forward runs the counter without grad (no hooks), and
    // backward recomputes each layer through it, so every gather/free is visible twice
    Counts ckpt;
    auto [out2, g2] = run(activation_checkpoint_runner(counting_runner(ckpt)));
    CHECK(max_diff(out2, want) == 0.0);
    CHECK(ckpt.gather == 6);
    CHECK(ckpt.free == 6);
    CHECK(ckpt.backward_gather == 3);
    CHECK(ckpt.backward_free == 3);
    CHECK(ckpt.backward_order == std::vector<int64_t>{2, 1, 0});
    double worst = 0;
    for (size_t i = 0; i < g0.size(); ++i) worst = std::max(worst, max_diff(g2[i], g0[i]));
    CHECK(worst < 1e-12);

    // no grad: forward only, no recompute, no hooks
    Counts eval;
    m->model->set_layer_runner(activation_checkpoint_runner(counting_runner(eval)));
    {
      torch::NoGradGuard g;
      CHECK(max_diff(m->forward(ids), want) == 0.0);
    }
    CHECK(eval.gather == 3);
    CHECK(eval.backward_gather == 0);
    m->model->set_layer_runner(nullptr);  // back to the default
    CHECK(max_diff(m->forward(ids).detach(), want) == 0.0);
  }

  TEST_CASE("autocast runner: CPU bf16 matmuls inside each layer, logits within bf16 noise") {
    const auto c = seam_config(2);
    auto m = seam_model(c, 13);
    m->eval();
    torch::NoGradGuard g;
    torch::manual_seed(14);
    auto ids = torch::randint(0, c.vocab_size, {2, 7});
    auto fp32 = m->forward(ids);
    std::vector<at::ScalarType> seen;
    auto probe = [&seen](int64_t layer, DecoderLayerImpl& mod, const at::Tensor& h, const LayerContext& ctx) {
      seen.push_back(mod.mlp->gate_proj(h).scalar_type());  // a linear under autocast
      return mod.forward(h, ctx, layer);
    };
    m->model->set_layer_runner(autocast_runner(at::kBFloat16, probe));
    auto mixed = m->forward(ids);
    REQUIRE(seen.size() == 2);
    CHECK((seen[0] == at::kBFloat16));
    CHECK((seen[1] == at::kBFloat16));
    CHECK((mixed.scalar_type() == at::kFloat));  // lm_head outside the runner: fp32 weights, fp32 logits
    const double d = max_diff(mixed, fp32), scale = fp32.abs().max().item<double>();
    CHECK(d > 0.0);              // autocast really ran in bf16
    CHECK(d < 0.05 * scale);     // ... and within bf16's noise (8 mantissa bits, a few layers)
    CHECK_FALSE(hybridrl::detail::compat::AutocastGuard::enabled(at::kCPU));  // the guard restored the state
  }
}

TEST_SUITE("model/log_probs") {
  TEST_CASE("token log-probs are aligned with input_ids; sequence_log_probs sums the response by prefix") {
    const auto c = seam_config(2);
    auto m = seam_model(c, 15, at::kDouble);
    m->eval();
    torch::NoGradGuard g;
    torch::manual_seed(16);
    const int64_t B = 2, T = 6;
    auto ids = torch::randint(0, c.vocab_size, {B, T});
    auto mask = torch::tensor({{0, 0, 0, 1, 1, 1}, {0, 0, 1, 1, 0, 0}}, at::kLong);  // response tokens
    auto lp = token_log_probs(m, ids, {}, LogProbOptions{}.chunk_size(4));
    auto logits = m->forward(ids);
    // scalar reference: entry t = log softmax(logits[t-1])[ids[t]], entry 0 = 0
    std::vector<double> want_sum(B, 0.0);
    for (int64_t b = 0; b < B; ++b) {
      CHECK(lp.log_probs[b][0].item<double>() == 0.0);
      for (int64_t t = 1; t < T; ++t) {
        auto row = logits[b][t - 1];
        const double lse = std::log(row.exp().sum().item<double>());
        const double want = row[ids[b][t].item<int64_t>()].item<double>() - lse;
        CHECK(lp.log_probs[b][t].item<double>() == doctest::Approx(want).epsilon(1e-9));
        if (mask[b][t].item<int64_t>() == 1) want_sum[static_cast<size_t>(b)] += want;
      }
    }
    for (const std::string prefix : {"", "chosen_", "rejected_", "kl_"}) {
      CAPTURE(prefix);
      TensorBatch batch;
      batch.set(prefix + "input_ids", ids).set(prefix + "response_mask", mask);
      auto s = sequence_log_probs(m, batch, prefix);
      REQUIRE(s.dim() == 1);
      for (int64_t b = 0; b < B; ++b) CHECK(s[b].item<double>() == doctest::Approx(want_sum[static_cast<size_t>(b)]).epsilon(1e-9));
    }
    // with attention_mask (left padding): the padded row's sum equals the unpadded row's
    auto pid = torch::zeros({1, T + 2}, at::kLong);
    pid[0].narrow(0, 2, T).copy_(ids[0]);
    auto am = torch::zeros({1, T + 2}, at::kLong);
    am[0].narrow(0, 2, T).fill_(1);
    auto pm = torch::zeros({1, T + 2}, at::kLong);
    pm[0].narrow(0, 2, T).copy_(mask[0]);
    TensorBatch padded;
    padded.set("chosen_input_ids", pid).set("chosen_attention_mask", am).set("chosen_response_mask", pm);
    CHECK(sequence_log_probs(m, padded, "chosen_")[0].item<double>() == doctest::Approx(want_sum[0]).epsilon(1e-9));
    // a missing key names key and prefix
    TensorBatch none;
    none.set("input_ids", ids);
    CHECK_THROWS_WITH_AS(sequence_log_probs(m, none, "rejected_"),
                         doctest::Contains("no tensor 'rejected_input_ids'"), Error);
  }

  TEST_CASE("explicit position_ids and attention_mask combined with cu_seqlens") {
    const auto c = seam_config(2);
    auto m = seam_model(c, 17);
    m->eval();
    torch::NoGradGuard g;
    torch::manual_seed(18);
    auto a = torch::randint(0, c.vocab_size, {1, 4});
    auto b = torch::randint(0, c.vocab_size, {1, 3});
    auto alone_a = m->forward(a), alone_b = m->forward(b);
    // one packed row [a a a a b b b x]: explicit positions equal to the restarting default
    auto row = torch::cat({a, b, torch::zeros({1, 1}, at::kLong)}, 1);
    auto cu = torch::tensor({0, 4, 7}, at::kLong);
    auto pos = torch::tensor({{0, 1, 2, 3, 0, 1, 2, 0}}, at::kLong);
    auto out = m->forward(row, ForwardArgs{}.cu_seqlens(cu).position_ids(pos));
    CHECK(max_diff(out[0].narrow(0, 0, 4), alone_a[0]) < 1e-5);
    CHECK(max_diff(out[0].narrow(0, 4, 3), alone_b[0]) < 1e-5);
    // one sequence as [T] with a [T] mask and positions
    auto flat = m->forward(a[0], ForwardArgs{}.attention_mask(torch::ones({4}, at::kLong)).position_ids(torch::arange(4)));
    CHECK(max_diff(flat, alone_a) < 1e-6);
    // a uniform shift leaves rotary attention unchanged (only relative positions matter), other
    // positions change the logits: so position_ids is really what the rotary tables use
    auto shifted = m->forward(a, ForwardArgs{}.position_ids(torch::arange(3, 7).view({1, 4})));
    CHECK(max_diff(shifted, alone_a) < 1e-4);
    auto spread = m->forward(a, ForwardArgs{}.position_ids(torch::tensor({{0, 2, 5, 6}}, at::kLong)));
    CHECK(max_diff(spread.select(1, 0), alone_a.select(1, 0)) < 1e-5);  // the first token sees only itself
    CHECK(max_diff(spread, alone_a) > 1e-3);
    // attention_mask on top of cu_seqlens: masking b's middle token equals b without it attended
    auto am = torch::ones({1, 8}, at::kLong);
    am[0][5] = 0;
    auto masked = m->forward(row, ForwardArgs{}.cu_seqlens(cu).attention_mask(am));
    CHECK(max_diff(masked[0].narrow(0, 0, 4), alone_a[0]) < 1e-5);  // a untouched
    // b's last token with its middle token masked = a 2-token sequence [b0, b2] at positions 0, 2
    auto b02 = torch::stack({b[0][0], b[0][2]}).view({1, 2});
    auto want = m->forward(b02, ForwardArgs{}.position_ids(torch::tensor({{0, 2}}, at::kLong)));
    CHECK(max_diff(masked[0][6], want[0][1]) < 1e-5);
  }

  TEST_CASE("error paths: token ids, options, decode cache") {
    const auto c = seam_config(2);
    auto m = seam_model(c, 19);
    m->eval();
    torch::NoGradGuard g;
    auto bad = torch::tensor({{1, 2, 60}}, at::kLong);
    CHECK_THROWS_WITH_AS(m->forward(bad), doctest::Contains("token id 60 >= vocab_size 53"), Error);
    CHECK_THROWS_WITH_AS(m->forward(torch::tensor({{1, -100}}, at::kLong)), doctest::Contains("token id -100 is negative"),
                         Error);
    auto ids = torch::tensor({{1, 2, 3}}, at::kLong);
    CHECK_THROWS_WITH_AS(token_log_probs(m, ids, {}, LogProbOptions{}.chunk_size(0)),
                         doctest::Contains("chunk_size = 0 must be >= 1"), Error);
    CHECK_THROWS_WITH_AS(token_log_probs(m, ids, {}, LogProbOptions{}.temperature(0.0)),
                         doctest::Contains("temperature = 0 must be > 0"), Error);
    CHECK_THROWS_WITH_AS(token_log_probs(m, ids, {}, LogProbOptions{}.temperature(-1.0)),
                         doctest::Contains("temperature = -1 must be > 0"), Error);
    CHECK_THROWS_WITH_AS(m->forward(ids, ForwardArgs{}.attention_mask(torch::ones({1, 4}, at::kLong))),
                         doctest::Contains("attention_mask has shape 1x4 but input_ids has 1x3"), Error);
    CHECK_THROWS_WITH_AS(m->forward(ids, ForwardArgs{}.position_ids(torch::zeros({2, 3}, at::kLong))),
                         doctest::Contains("position_ids has shape 2x3"), Error);
    // decode
    auto opts = at::TensorOptions().dtype(at::kFloat);
    auto cache = KVCache::allocate(c, 1, 4, opts);
    CHECK_THROWS_WITH_AS(forward_decode(m, torch::tensor({{1, 2, 3, 4, 5}}, at::kLong), cache),
                         doctest::Contains("0 cached + 5 new tokens for 1 rows exceed the cache ([1 rows, 4 positions])"),
                         Error);
    CHECK_THROWS_WITH_AS(forward_decode(m, torch::tensor({{1}, {2}}, at::kLong), cache),
                         doctest::Contains("for 2 rows exceed the cache"), Error);
    CHECK_THROWS_WITH_AS(forward_decode(m, torch::tensor({1, 2}, at::kLong), cache),
                         doctest::Contains("input_ids has shape 2"), Error);
    auto other = seam_config(3);
    auto wrong_layers = KVCache::allocate(other, 1, 4, opts);
    CHECK_THROWS_WITH_AS(forward_decode(m, ids, wrong_layers), doctest::Contains("the cache has 3 layers, the model 2"),
                         Error);
    other = seam_config(2);
    other.num_key_value_heads = 4;
    auto wrong_heads = KVCache::allocate(other, 1, 4, opts);
    CHECK_THROWS_WITH_AS(forward_decode(m, ids, wrong_heads), doctest::Contains("the cache holds 4 kv heads"), Error);
    CHECK_THROWS_WITH_AS(forward_decode(m, ids, cache, ForwardArgs{}.attention_mask(torch::ones({1, 2}, at::kLong))),
                         doctest::Contains("attention_mask has shape 1x2, expected 1x3"), Error);
    CHECK_THROWS_WITH_AS(forward_decode(m, ids, cache, ForwardArgs{}.position_ids(torch::zeros({1, 2}, at::kLong))),
                         doctest::Contains("position_ids has shape 1x2, expected 1x3"), Error);
    CHECK(cache.length == 0);  // failed calls leave the cache as it was
    CHECK_THROWS_WITH_AS(KVCache::allocate(c, 0, 4, opts), doctest::Contains("batch = 0"), Error);
  }
}

TEST_SUITE("model/attention_backends") {
  TEST_CASE("the cuDNN shape budget admits the first `limit` distinct shapes, always again, and no new one after") {
    using hybridrl::detail::compat::ShapeBudget;
    ShapeBudget b(2);
    const ShapeBudget::Shape x{16, 1024, 12, 12, 64, 15, 1, 0}, y{8, 1024, 12, 12, 64, 15, 1, 0},
        z{16, 1024, 12, 12, 64, 15, 0, 0};  // z: x without gradients, another plan
    CHECK(b.admit(x));
    CHECK(b.admit(x));
    CHECK(b.admitted() == 1);
    CHECK(b.admit(y));
    CHECK_FALSE(b.admit(z));  // a third shape: FlashAttention-2
    CHECK_FALSE(b.admit(z));
    CHECK(b.admit(x));        // the admitted ones keep cuDNN
    CHECK(b.admit(y));
    CHECK(b.admitted() == 2);
    CHECK(hybridrl::detail::compat::cudnn_shape_budget().limit() == 64);
  }
}
