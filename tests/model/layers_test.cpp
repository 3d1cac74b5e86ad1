// Model building blocks and forward modes, against hand computations and against each other.
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <cmath>
#include <map>
#include <numbers>

#include "hybridrl/model/model.hpp"
#include "hybridrl/rollout/naive/dense_kv_cache.hpp"
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using namespace hybridrl::testing;

namespace {

ModelConfig tiny_config(bool tied = false, bool qkv_bias = false, std::optional<int64_t> window = std::nullopt) {
  ModelConfig c;
  c.vocab_size = 97;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  c.qkv_bias = qkv_bias;
  c.sliding_window = window;
  return c;
}

CausalLM tiny_model(const ModelConfig& c, uint64_t seed = 0, at::ScalarType dtype = at::kFloat) {
  torch::manual_seed(seed);
  CausalLM m(c);
  {
    torch::NoGradGuard g;
    for (auto& p : m->parameters()) p.normal_(0.0, 0.3);
  }
  m->to(dtype);
  m->eval();
  return m;
}


}  // namespace

TEST_SUITE("model/layers") {
  TEST_CASE("RMSNorm equals the formula") {
    RMSNorm n(4, 1e-6);
    {
      torch::NoGradGuard g;
      n->weight.copy_(torch::tensor({1.0f, 2.0f, 0.5f, -1.0f}));
    }
    auto x = torch::tensor({{1.0f, 2.0f, 3.0f, 4.0f}});
    const double rms = std::sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6);
    auto want = torch::tensor({{1 / rms, 2 * 2 / rms, 0.5 * 3 / rms, -4 / rms}}).to(at::kFloat);
    CHECK(max_diff(n(x), want) < 1e-6);
  }

  TEST_CASE("rotary frequencies: default and llama3 scaling by formula") {
    ModelConfig c = tiny_config();
    c.head_dim = 8;
    c.rope_theta = 100.0;
    auto inv = rope_inverse_frequencies(c);
    for (int i = 0; i < 4; ++i) CHECK(inv[i].item<double>() == doctest::Approx(std::pow(100.0, -2.0 * i / 8)).epsilon(1e-6));
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = 8;
    c.rope_scaling.low_freq_factor = 1;
    c.rope_scaling.high_freq_factor = 4;
    c.rope_scaling.original_max_position_embeddings = 16;  // low wavelen 16, high wavelen 4
    auto scaled = rope_inverse_frequencies(c);
    for (int i = 0; i < 4; ++i) {
      const double f = std::pow(100.0, -2.0 * i / 8), wl = 2 * std::numbers::pi / f;
      double want = f;
      if (wl > 16) {
        want = f / 8;
      } else if (wl >= 4) {
        const double s = (16 / wl - 1) / (4 - 1);
        want = (1 - s) * f / 8 + s * f;
      }
      CHECK(scaled[i].item<double>() == doctest::Approx(want).epsilon(1e-6));
    }
  }

  TEST_CASE("apply_rope rotates pairs (i, i + d/2) by position × frequency") {
    auto inv = torch::tensor({1.0f, 0.1f});
    auto pos = torch::tensor({{3}}, at::kLong);
    auto [cos, sin] = rope_cos_sin(inv, pos, at::kFloat);
    auto x = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 1, 1, 4});
    auto y = apply_rope(x, cos, sin).view({4});
    for (int i = 0; i < 2; ++i) {
      const double a = 3.0 * (i == 0 ? 1.0 : 0.1);
      const double x0 = 1.0 + i, x1 = 3.0 + i;
      CHECK(y[i].item<double>() == doctest::Approx(x0 * std::cos(a) - x1 * std::sin(a)).epsilon(1e-5));
      CHECK(y[i + 2].item<double>() == doctest::Approx(x1 * std::cos(a) + x0 * std::sin(a)).epsilon(1e-5));
    }
  }

  TEST_CASE("one attention head equals softmax(q k^T / sqrt(d)) v with causal mask") {
    ModelConfig c = tiny_config();
    c.hidden_size = 4;
    c.num_attention_heads = 1;
    c.num_key_value_heads = 1;
    c.head_dim = 4;
    torch::manual_seed(3);
    Attention a(c);
    auto x = torch::randn({1, 3, 4});
    auto pos = torch::arange(3).view({1, 3});
    auto [cos, sin] = rope_cos_sin(rope_inverse_frequencies(c), pos, at::kFloat);
    auto got = a->forward(x, LayerContext{cos, sin, {}, true});
    auto q = apply_rope(a->q_proj(x).view({1, 3, 1, 4}).transpose(1, 2), cos, sin)[0][0];
    auto k = apply_rope(a->k_proj(x).view({1, 3, 1, 4}).transpose(1, 2), cos, sin)[0][0];
    auto v = a->v_proj(x)[0];
    auto s = q.matmul(k.t()) / 2.0;
    s = s.masked_fill(torch::ones({3, 3}, at::kBool).triu(1), -INFINITY);
    auto want = a->o_proj(s.softmax(-1).matmul(v)).unsqueeze(0);
    CHECK(max_diff(got, want) < 1e-5);
  }
}

TEST_SUITE("model/forward_modes") {
  TEST_CASE("padded (left and right), packed and unpadded forwards agree") {
    for (auto window : {std::optional<int64_t>{}, std::optional<int64_t>{3}}) {
      CAPTURE(window.value_or(-1));
      auto c = tiny_config(/*tied=*/window.has_value(), /*qkv_bias=*/true, window);
      auto m = tiny_model(c, 1);
      torch::manual_seed(7);
      const int64_t T = 7;
      auto ids = torch::randint(0, c.vocab_size, {3, T});
      const std::vector<int64_t> len = {7, 4, 2};
      auto full = m->forward(ids);
      for (bool left : {true, false}) {
        auto pid = torch::zeros_like(ids);
        auto mask = torch::zeros_like(ids);
        for (int64_t b = 0; b < 3; ++b) {
          const auto off = left ? T - len[b] : 0;
          pid[b].narrow(0, off, len[b]).copy_(ids[b].narrow(0, 0, len[b]));
          mask[b].narrow(0, off, len[b]).fill_(1);
        }
        auto out = m->forward(pid, ForwardArgs{}.attention_mask(mask));
        for (int64_t b = 0; b < 3; ++b) {
          const auto off = left ? T - len[b] : 0;
          CHECK(max_diff(out[b].narrow(0, off, len[b]), full[b].narrow(0, 0, len[b])) < 1e-5);
        }
        CHECK(torch::isfinite(out).all().item<bool>());
      }
      // packed: the three sequences in one row of 16 (3 padding tokens), positions restarting
      const int64_t L = 16;
      auto packed = torch::zeros({1, L}, at::kLong);
      int64_t off = 0;
      for (int64_t b = 0; b < 3; ++b) {
        packed[0].narrow(0, off, len[b]).copy_(ids[b].narrow(0, 0, len[b]));
        off += len[b];
      }
      auto cu = torch::tensor({0, 7, 11, 13}, at::kInt);
      auto out = m->forward(packed, ForwardArgs{}.cu_seqlens(cu));
      off = 0;
      for (int64_t b = 0; b < 3; ++b) {
        CHECK(max_diff(out[0].narrow(0, off, len[b]), full[b].narrow(0, 0, len[b])) < 1e-5);
        off += len[b];
      }
      // the Loader<Packed> layout: [R, S+1] per-row boundaries padded by repeating the end
      auto rows = torch::zeros({2, 9}, at::kLong);
      rows[0].narrow(0, 0, 7).copy_(ids[0]);
      rows[1].narrow(0, 0, 4).copy_(ids[1].narrow(0, 0, 4));
      rows[1].narrow(0, 4, 2).copy_(ids[2].narrow(0, 0, 2));
      auto cu2 = torch::tensor({{0, 7, 7}, {0, 4, 6}}, at::kInt);
      auto out2 = m->forward(rows, ForwardArgs{}.cu_seqlens(cu2));
      CHECK(max_diff(out2[0].narrow(0, 0, 7), full[0]) < 1e-5);
      CHECK(max_diff(out2[1].narrow(0, 0, 4), full[1].narrow(0, 0, 4)) < 1e-5);
      CHECK(max_diff(out2[1].narrow(0, 4, 2), full[2].narrow(0, 0, 2)) < 1e-5);
    }
  }

  TEST_CASE("incremental decode with a dense KV cache equals the full forward") {
    for (auto window : {std::optional<int64_t>{}, std::optional<int64_t>{3}}) {
      auto c = tiny_config(false, false, window);
      auto m = tiny_model(c, 2);
      torch::NoGradGuard g;
      torch::manual_seed(8);
      const int64_t T = 8;
      auto ids = torch::randint(0, c.vocab_size, {2, T});
      auto full = m->forward(ids);
      auto cache = KVCache::allocate(c, 2, T, at::TensorOptions().dtype(at::kFloat));
      auto first = forward_decode(m, ids.narrow(1, 0, 3), cache);  // prefill 3
      CHECK(cache.length == 3);
      CHECK(max_diff(first, full.narrow(1, 0, 3)) < 1e-5);
      for (int64_t t = 3; t < T; ++t) {
        auto step = forward_decode(m, ids.narrow(1, t, 1), cache);
        CHECK(max_diff(step.squeeze(1), full.select(1, t)) < 1e-5);
      }
      // left-padded prompt: the mask covers cache + new tokens, positions follow the mask
      auto pid = torch::zeros({1, T}, at::kLong);
      pid[0].narrow(0, 2, T - 2).copy_(ids[0].narrow(0, 0, T - 2));
      auto mask = torch::zeros({1, T}, at::kLong);
      mask[0].narrow(0, 2, T - 2).fill_(1);
      auto c1 = KVCache::allocate(c, 1, T, at::TensorOptions().dtype(at::kFloat));
      forward_decode(m, pid.narrow(1, 0, 5), c1, ForwardArgs{}.attention_mask(mask.narrow(1, 0, 5)));
      for (int64_t t = 5; t < T; ++t) {
        auto step = forward_decode(m, pid.narrow(1, t, 1), c1, ForwardArgs{}.attention_mask(mask.narrow(1, 0, t + 1)));
        CHECK(max_diff(step[0][0], full[0][t - 2]) < 1e-5);
      }
    }
  }

  TEST_CASE("inference carries the residual stream across layers: the layer-by-layer values, bit for bit") {
    // the carried path (no grad, the plain runner: each layer's residual add done by the next
    // norm, one kernel with it on CUDA) against the same forward layer by layer (a runner
    // installed), through forward() and through forward_with_attention (the decode engines' entry)
    std::vector<std::pair<at::Device, at::ScalarType>> where{{at::kCPU, at::kFloat}};
    if (at::hasCUDA()) where.emplace_back(at::Device(at::kCUDA, 0), at::kBFloat16);
    for (auto [dev, dtype] : where) {
      for (auto window : {std::optional<int64_t>{}, std::optional<int64_t>{3}}) {
        CAPTURE(dev);
        auto c = tiny_config(false, true, window);
        c.num_hidden_layers = 3;
        auto m = tiny_model(c, 5);
        m->to(dev, dtype);
        m->model->fuse_projections();
        torch::NoGradGuard g;
        torch::manual_seed(9);
        const int64_t T = 7;
        auto ids = torch::randint(0, c.vocab_size, {2, T}).to(dev);
        auto pos = torch::arange(T, at::TensorOptions().dtype(at::kLong).device(dev)).view({1, T}).expand({2, T});
        int calls = 0;
        auto attn = [&](int64_t, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
          ++calls;  // causal attention over the call's own keys ([B, heads, T, D])
          const auto G = q.size(1) / k.size(1);
          auto kf = k.repeat_interleave(G, 1).to(at::kFloat), vf = v.repeat_interleave(G, 1).to(at::kFloat);
          auto s = at::matmul(q.to(at::kFloat), kf.transpose(-1, -2)) / std::sqrt(static_cast<double>(q.size(-1)));
          auto causal = at::ones({T, T}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(1);
          return at::matmul(s.masked_fill(causal, -INFINITY).softmax(-1), vf).to(q.scalar_type());
        };
        auto carried = m->forward(ids);
        auto carried_fn = m->model->forward_with_attention(ids, pos, attn);
        CHECK(calls == 3);
        m->model->set_layer_runner(default_layer_runner());  // installed: layer by layer
        auto plain = m->forward(ids);
        auto plain_fn = m->model->forward_with_attention(ids, pos, attn);
        m->model->set_layer_runner(nullptr);
        CHECK(at::equal(carried, plain));
        CHECK(at::equal(carried_fn, plain_fn));
        if (dev.is_cpu()) {
          if (!window) CHECK(max_diff(carried, m->logits(carried_fn)) < 1e-4);  // the test's attention is the model's (no window)
          // with grad the layers run one by one (training keeps forward()): the same eager ops here
          torch::AutoGradMode on(true);
          CHECK(at::equal(m->model->forward_with_attention(ids, pos, attn), plain_fn));
        }
      }
    }
  }

  TEST_CASE("chunked log-probs and entropy equal the full log-softmax, values and gradients") {
    auto c = tiny_config();
    auto m = tiny_model(c, 3, at::kDouble);
    m->train();
    torch::manual_seed(9);
    auto ids = torch::randint(0, c.vocab_size, {2, 9});
    auto lp = token_log_probs(m, ids, {}, LogProbOptions{}.chunk_size(3));
    REQUIRE((lp.log_probs.sizes() == ids.sizes()));  // aligned with input_ids, column 0 = 0
    CHECK(lp.log_probs.select(1, 0).abs().max().item<double>() == 0.0);
    CHECK(lp.entropy.select(1, 0).abs().max().item<double>() == 0.0);
    auto loss = lp.log_probs.sum() + 0.3 * lp.entropy.sum();
    loss.backward();
    std::vector<at::Tensor> g1;
    for (auto& p : m->parameters()) {
      g1.push_back(p.grad().clone());
      p.mutable_grad().zero_();
    }
    auto logits = m->forward(ids).narrow(1, 0, 8);
    auto logp = logits.log_softmax(-1);
    auto want = logp.gather(-1, ids.narrow(1, 1, 8).unsqueeze(-1)).squeeze(-1);
    auto ent = -(logp.exp() * logp).sum(-1);
    CHECK(max_diff(lp.log_probs.narrow(1, 1, 8), want) < 1e-10);
    CHECK(max_diff(lp.entropy.narrow(1, 1, 8), ent) < 1e-10);
    (want.sum() + 0.3 * ent.sum()).backward();
    auto params = m->parameters();
    for (size_t i = 0; i < params.size(); ++i) CHECK(max_diff(params[i].grad(), g1[i]) < 1e-10);
    // temperature divides the logits
    auto lt = token_log_probs(m, ids, {}, LogProbOptions{}.chunk_size(4).temperature(0.7).with_entropy(false));
    auto want_t = (logits / 0.7).log_softmax(-1).gather(-1, ids.narrow(1, 1, 8).unsqueeze(-1)).squeeze(-1);
    CHECK(max_diff(lt.log_probs.narrow(1, 1, 8), want_t) < 1e-10);
    CHECK_FALSE(lt.entropy.defined());
  }

  TEST_CASE("stacked_rows: parameters lying back to back as one tensor, no copy, the gradient split back") {
    auto base = torch::randn({5, 3}, at::kDouble);
    auto a = base.narrow(0, 0, 2).detach().requires_grad_(true);  // leaves sharing base's storage
    auto b = base.narrow(0, 2, 3).detach().requires_grad_(true);
    auto s = stacked_rows({a, b});
    REQUIRE(s.defined());
    CHECK(s.sizes() == at::IntArrayRef{5, 3});
    CHECK(s.data_ptr() == a.data_ptr());  // an alias, not a copy
    CHECK(at::equal(s, base));
    CHECK(s.requires_grad());
    auto w = torch::randn({5, 3}, at::kDouble);
    (s * w).sum().backward();
    CHECK(at::equal(a.grad(), w.narrow(0, 0, 2)));
    CHECK(at::equal(b.grad(), w.narrow(0, 2, 3)));
    {
      torch::NoGradGuard ng;
      CHECK_FALSE(stacked_rows({a, b}).requires_grad());
    }
    // not back to back: another order, separate tensors, a gap, another trailing shape, strided
    CHECK_FALSE(stacked_rows({b, a}).defined());
    CHECK_FALSE(stacked_rows({a, torch::randn({3, 3}, at::kDouble)}).defined());
    CHECK_FALSE(stacked_rows({base.narrow(0, 0, 2), base.narrow(0, 3, 2)}).defined());
    auto flat = torch::randn({12}, at::kDouble);
    CHECK_FALSE(stacked_rows({flat.narrow(0, 0, 6).view({2, 3}), flat.narrow(0, 6, 6).view({3, 2})}).defined());
    CHECK(stacked_rows({flat.narrow(0, 0, 6).view({2, 3}), flat.narrow(0, 6, 6).view({2, 3})}).defined());
    CHECK_FALSE(stacked_rows({base.t().narrow(0, 0, 1), base.t().narrow(0, 1, 1)}).defined());
  }

  TEST_CASE("one GEMM for q|k|v and one for gate|up in training: the separate projections' values and gradients") {
    // fuse_projections lays the weights back to back; the layers then run one GEMM each (split
    // and eager rotary on the CPU) with autograd through stacked_rows: the same forward and
    // gradients as the three and two GEMMs of the unfused model, to double rounding
    for (bool bias : {false, true}) {
      CAPTURE(bias);
      auto c = tiny_config(false, bias);
      auto plain = tiny_model(c, 6, at::kDouble), fused = tiny_model(c, 6, at::kDouble);
      fused->model->fuse_projections();
      for (auto* m : {&plain, &fused}) (*m)->train();
      auto& attn = fused->model->layer(0)->self_attn;
      auto& mlp = fused->model->layer(0)->mlp;
      CHECK(stacked_rows({attn->q_proj->weight, attn->k_proj->weight, attn->v_proj->weight}).defined());
      CHECK(stacked_rows({mlp->gate_proj->weight, mlp->up_proj->weight}).defined());
      auto& pattn = plain->model->layer(0)->self_attn;
      CHECK_FALSE(stacked_rows({pattn->q_proj->weight, pattn->k_proj->weight, pattn->v_proj->weight}).defined());
      torch::manual_seed(11);
      auto ids = torch::randint(0, c.vocab_size, {2, 7});
      auto mask = torch::ones({2, 7}, at::kLong);
      mask[0][0] = 0;
      auto run = [&](CausalLM& m) {
        auto out = m->forward(ids, ForwardArgs{}.attention_mask(mask));
        (out.pow(2).mean() + out.select(1, 6).sum()).backward();
        std::map<std::string, at::Tensor> g;
        for (const auto& item : m->named_parameters()) g[item.key()] = item.value().grad().clone();
        return std::make_pair(out.detach(), g);
      };
      auto [o0, g0] = run(plain);
      auto [o1, g1] = run(fused);
      CHECK(max_diff(o0, o1) < 1e-12);
      REQUIRE(g0.size() == g1.size());
      double worst = 0;
      for (const auto& [k, g] : g0) worst = std::max(worst, max_diff(g, g1.at(k)));
      CHECK(worst < 1e-12);
      CHECK(g1.at("model.layers.1.self_attn.k_proj.weight").abs().sum().item<double>() > 0);  // a gradient arrived
    }
  }

  TEST_CASE("activation checkpointing gives the gradients of the plain run") {
    for (bool tied : {false, true}) {
      auto c = tiny_config(tied, true);
      auto m = tiny_model(c, 4, at::kDouble);
      m->train();
      torch::manual_seed(10);
      auto ids = torch::randint(0, c.vocab_size, {2, 6});
      auto mask = torch::ones({2, 6}, at::kLong);
      mask[1][0] = 0;
      auto run = [&](bool ckpt) {
        m->model->set_layer_runner(ckpt ? activation_checkpoint_runner() : default_layer_runner());
        for (auto& p : m->parameters()) p.mutable_grad() = at::Tensor();
        auto out = m->forward(ids, ForwardArgs{}.attention_mask(mask));
        (out.pow(2).mean() + out.select(1, 5).sum()).backward();
        std::vector<at::Tensor> g;
        for (auto& p : m->parameters()) g.push_back(p.grad().clone());
        return std::make_pair(out.detach(), g);
      };
      auto [plain, g0] = run(false);
      auto [ckpt, g1] = run(true);
      CHECK(max_diff(plain, ckpt) == 0.0);
      double worst = 0;
      for (size_t i = 0; i < g0.size(); ++i) worst = std::max(worst, max_diff(g0[i], g1[i]));
      CHECK(worst < 1e-12);
    }
    // a single checkpointed function, input gradient too
    auto w = torch::randn({3, 3}, torch::requires_grad());
    auto x = torch::randn({2, 3}, torch::requires_grad());
    auto f = [w](const at::Tensor& v) { return torch::tanh(v.matmul(w)).pow(2); };
    auto y = activation_checkpoint(f, x, {w});
    y.sum().backward();
    auto gx = x.grad().clone(), gw = w.grad().clone();
    x.mutable_grad().zero_();
    w.mutable_grad().zero_();
    f(x).sum().backward();
    CHECK(max_diff(gx, x.grad()) < 1e-6);
    CHECK(max_diff(gw, w.grad()) < 1e-6);
  }

  TEST_CASE("value model: trunk from the policy, one value per token") {
    auto c = tiny_config();
    auto policy = tiny_model(c, 5);
    auto critic = make_value_model(policy);
    CHECK(critic->named_parameters().contains("score.weight"));
    CHECK(critic->named_parameters().contains("score.bias"));
    auto ids = torch::randint(0, c.vocab_size, {2, 5});
    auto v = critic->forward(ids);
    CHECK((v.sizes() == at::IntArrayRef({2, 5})));
    auto h = policy->hidden_states(ids);
    auto want = (h.matmul(critic->score->weight.t()) + critic->score->bias).squeeze(-1);
    CHECK(max_diff(v, want) < 1e-5);
  }

  TEST_CASE("reference model: frozen, eval, shares nothing with the policy") {
    auto c = tiny_config();
    auto policy = tiny_model(c, 6);
    policy->train();
    auto ref = make_reference(policy);
    CHECK_FALSE(ref->is_training());
    for (auto& p : ref->parameters()) CHECK_FALSE(p.requires_grad());
    auto ids = torch::randint(0, c.vocab_size, {1, 5});
    auto before = ref->forward(ids);
    CHECK(max_diff(before, policy->forward(ids)) == 0.0);
    {
      torch::NoGradGuard g;
      for (auto& p : policy->parameters()) p.add_(1.0);
    }
    CHECK(max_diff(ref->forward(ids), before) == 0.0);
    auto pp = policy->parameters();
    auto rp = ref->parameters();
    for (size_t i = 0; i < pp.size(); ++i) CHECK(pp[i].data_ptr() != rp[i].data_ptr());
  }

  TEST_CASE("parameter names are Hugging Face tensor names") {
    auto names = CausalLM(tiny_config(false, true))->named_parameters().keys();
    auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
    CHECK(has("model.embed_tokens.weight"));
    CHECK(has("model.layers.1.self_attn.q_proj.bias"));
    CHECK(has("model.layers.0.mlp.down_proj.weight"));
    CHECK(has("model.layers.0.post_attention_layernorm.weight"));
    CHECK(has("model.norm.weight"));
    CHECK(has("lm_head.weight"));
    CHECK_FALSE(has("model.layers.0.self_attn.o_proj.bias"));
    auto tied = CausalLM(tiny_config(true))->named_parameters().keys();
    CHECK(std::find(tied.begin(), tied.end(), "lm_head.weight") == tied.end());
  }
}
