// Sharding<FSDP>'s single-process engine on the llama fixture: forward's log-probs equal
// token_log_probs (aligned to input_ids offline, to responses in a rollout batch); steps lower an
// SFT loss; activation checkpointing gives the same gradients; bf16 stays close to fp32; mixed
// precision computes exactly as the model cast to bf16 and steps fp32 master weights; a state restored from state_dict continues bit for bit; the
// export loads into Rollout<Naive>, which then generates as the trained model does; errors.

#include <hybridrl/model/log_probs.hpp>
#include <hybridrl/model/pretrained.hpp>
#include <hybridrl/rollout/naive.hpp>
#include <hybridrl/sharding/fsdp.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <string>
#include <vector>

#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using hybridrl::testing::contains;
using hybridrl::testing::error_of;

namespace hybridrl::testing {
inline CausalLM fsdp_fixture() { return load_causal_lm(std::string(HYBRIDRL_FIXTURES_DIR) + "/models/llama"); }
// Two rows, the second left-padded by 2; the last 3 tokens of each are the "response".
inline TensorBatch fsdp_batch() {
  auto ids = at::tensor(std::vector<int64_t>{1, 17, 23, 99, 5, 61, 7, 0, 0, 1, 40, 41, 42, 43}, at::kLong).view({2, 7});
  auto mask = at::tensor(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1}, at::kLong).view({2, 7});
  auto rmask = at::zeros({2, 7}, at::kLong);
  rmask.narrow(1, 4, 3).fill_(1);
  return TensorBatch({{keys::input_ids.str(), ids},
                      {keys::attention_mask.str(), mask},
                      {keys::position_ids.str(), (mask.cumsum(1) - 1).clamp_min(0)},
                      {keys::response_mask.str(), rmask}});
}
// The SFT loss of a batch: mean negative log-prob of the response tokens.
inline at::Tensor sft_loss(FSDPEngine& e, const TensorBatch& b) {
  auto lp = e.forward(b).tensor(keys::log_probs);
  auto m = b.tensor(keys::response_mask).to(lp.dtype());
  return -(lp * m).sum() / m.sum();
}
}  // namespace hybridrl::testing

using hybridrl::testing::fsdp_batch;
using hybridrl::testing::fsdp_fixture;
using hybridrl::testing::sft_loss;

TEST_SUITE("sharding/fsdp_engine") {
  TEST_CASE("forward: log-probs and entropy equal token_log_probs, aligned to input_ids or to responses") {
    auto m = fsdp_fixture();
    const auto fp32 = FSDPOptions{}.param_dtype(at::kFloat);
    FSDPEngine e(m, fp32, OptimizerOptions{}, 10);
    const auto b = fsdp_batch();
    auto out = e.forward(b);
    auto ref = token_log_probs(m, b.tensor(keys::input_ids),
                               ForwardArgs{}.attention_mask(b.tensor(keys::attention_mask))
                                   .position_ids(b.tensor(keys::position_ids)));
    CHECK(at::allclose(out.tensor(keys::log_probs), ref.log_probs));
    CHECK(at::allclose(out.tensor(keys::entropy), ref.entropy));
    CHECK(out.tensor(keys::log_probs).requires_grad());
    auto online = b;
    online.set(keys::responses, b.tensor(keys::input_ids).narrow(1, 4, 3));
    auto r = e.forward(online);
    CHECK(r.tensor(keys::log_probs).sizes() == at::IntArrayRef({2, 3}));
    CHECK(at::allclose(r.tensor(keys::log_probs), ref.log_probs.narrow(1, 4, 3)));
  }

  TEST_CASE("steps lower an SFT loss; the step reports a finite gradient norm and the schedule's lr") {
    auto m = fsdp_fixture();
    FSDPEngine e(m, FSDPOptions{}.param_dtype(at::kFloat), OptimizerOptions{}.lr(1e-2).weight_decay(0), 20);
    const auto b = fsdp_batch();
    const double first = sft_loss(e, b).item<double>();
    double last = first;
    for (int i = 0; i < 8; ++i) {
      auto loss = sft_loss(e, b);
      e.backward(loss);
      auto norm = e.step();
      CHECK(std::isfinite(norm.item<double>()));
      CHECK(norm.item<double>() > 0.0);
      CHECK(e.last_step().lr == doctest::Approx(1e-2));
      last = loss.item<double>();
    }
    CHECK(last < 0.5 * first);
    CHECK(e.optimizer().steps() == 8);
  }

  TEST_CASE("activation checkpointing gives the same gradients; bf16 is close to fp32") {
    const auto b = fsdp_batch();
    auto grads_of = [&](FSDPOptions o) {
      auto m = fsdp_fixture();
      FSDPEngine e(m, o, OptimizerOptions{}, 10);
      e.backward(sft_loss(e, b));
      std::vector<at::Tensor> g;
      for (const auto& p : m->parameters()) g.push_back(p.grad().clone());
      return g;
    };
    const auto plain = grads_of(FSDPOptions{}.param_dtype(at::kFloat));
    const auto ckpt = grads_of(FSDPOptions{}.param_dtype(at::kFloat).activation_checkpointing(true));
    REQUIRE(plain.size() == ckpt.size());
    for (size_t i = 0; i < plain.size(); ++i) CHECK(at::allclose(plain[i], ckpt[i], 1e-5, 1e-7));
    auto m = fsdp_fixture();
    FSDPEngine bf16(m, FSDPOptions{}.param_dtype(at::kBFloat16), OptimizerOptions{}, 10);
    FSDPEngine fp32(fsdp_fixture(), FSDPOptions{}.param_dtype(at::kFloat), OptimizerOptions{}, 10);
    auto a = bf16.forward(b).tensor(keys::log_probs), c = fp32.forward(b).tensor(keys::log_probs);
    CHECK((a.to(at::kFloat) - c).abs().max().item<double>() < 0.1);
    CHECK((a.to(at::kFloat) - c).abs().max().item<double>() > 0.0);  // bf16 matmuls really ran
  }

  TEST_CASE("mixed precision computes on bf16 copies as a bf16 model does and steps fp32 masters") {
    const auto b = fsdp_batch();
    auto max_abs = [](const at::Tensor& x, const at::Tensor& y) { return (x - y).abs().max().item<double>(); };
    const double lr = 1e-3, eps = 1e-8;
    const auto optim = OptimizerOptions{}.lr(lr).eps(eps).weight_decay(0).max_grad_norm(0);
    auto master = fsdp_fixture();
    const auto before = master->named_parameters().pairs();
    std::vector<std::pair<std::string, at::Tensor>> w0;
    for (const auto& [k, v] : before) w0.emplace_back(k, v.detach().clone());
    FSDPEngine e(master, FSDPOptions{}.param_dtype(at::kBFloat16), optim, 10);
    // the same model cast to bf16, trained by hand: the engine must compute exactly this
    auto m16 = fsdp_fixture();
    m16->to(at::kBFloat16);
    m16->model->fuse_projections();  // one GEMM for q|k|v and gate|up, as the engine's units run them
    auto lp16 = token_log_probs(m16, b.tensor(keys::input_ids),
                                ForwardArgs{}.attention_mask(b.tensor(keys::attention_mask))
                                    .position_ids(b.tensor(keys::position_ids)))
                    .log_probs;
    auto lp = e.forward(b).tensor(keys::log_probs);
    CHECK(max_abs(lp, lp16) == 0.0);
    auto mask = b.tensor(keys::response_mask).to(at::kFloat);
    (-(lp16 * mask).sum() / mask.sum()).backward();
    e.backward(-(lp * mask).sum() / mask.sum());
    double sq = 0;
    for (const auto& p : m16->parameters()) sq += p.grad().to(at::kFloat).pow(2).sum().item<double>();
    CHECK(e.step().item<double>() == doctest::Approx(std::sqrt(sq)).epsilon(1e-5));
    // AdamW's first step from the bf16 gradient, applied to the fp32 master: w - lr g / (|g| + eps)
    const auto s = e.state_dict();
    auto g16 = m16->named_parameters();
    for (const auto& [k, w] : w0) {
      CAPTURE(k);
      const auto& now = s.at("model." + k);
      CHECK((now.scalar_type() == at::kFloat));
      const auto g = g16[k].grad().to(at::kFloat);
      CHECK(max_abs(now, w - lr * g / (g.abs() + eps)) <= 1e-7);
    }
    // between uses the model's parameters are empty and still say the master dtype
    CHECK((master->parameters().front().scalar_type() == at::kFloat));
    // activation checkpointing on the bf16 copies: the same step, bit for bit
    auto ck = fsdp_fixture();
    FSDPEngine c(ck, FSDPOptions{}.param_dtype(at::kBFloat16).activation_checkpointing(true), optim, 10);
    c.backward(sft_loss(c, b));
    c.step();
    const auto sc = c.state_dict();
    for (const auto& [k, w] : w0) CHECK(max_abs(sc.at("model." + k), s.at("model." + k)) == 0.0);
  }

  TEST_CASE("the kept bf16 copy (keep_param_copy): the steps of a cast at every gather, bit for bit; a loaded state is read, not the old copy") {
    std::vector<at::Device> devices{at::kCPU};  // the CPU: LibTorch's AdamW, the copy cast again after each step
    if (at::hasCUDA()) devices.emplace_back(at::kCUDA, 0);  // CUDA: the AdamW kernel writes the copy
    const auto optim = OptimizerOptions{}.lr(1e-3).weight_decay(0.01);
    for (const auto& dev : devices) {
      CAPTURE(dev.str());
      const auto b = fsdp_batch().to(dev);
      auto log_probs = [&](FSDPEngine& e) {
        c10::NoGradGuard ng;
        return e.forward(b).tensor(keys::log_probs).cpu();
      };
      auto make = [&](bool keep) {
        auto m = fsdp_fixture();
        m->to(dev);
        return FSDPEngine(m, FSDPOptions{}.param_dtype(at::kBFloat16).keep_param_copy(keep), optim, 10);
      };
      auto kept = make(true), cast = make(false);
      StateDict after_one;
      for (int i = 0; i < 3; ++i) {
        kept.backward(sft_loss(kept, b));
        kept.step();
        cast.backward(sft_loss(cast, b));
        cast.step();
        if (i == 0) after_one = cast.state_dict();
        CHECK(at::equal(log_probs(kept), log_probs(cast)));
      }
      const auto sk = kept.state_dict(), sc = cast.state_dict();
      for (const auto& [k, v] : sc) {
        CAPTURE(k);
        CHECK(at::equal(sk.at(k).cpu(), v.cpu()));
      }
      // a state loaded over the stepped engine: the next forward computes on the loaded weights
      kept.load_state_dict(after_one);
      auto fresh = make(false);
      fresh.load_state_dict(after_one);
      CHECK(at::equal(log_probs(kept), log_probs(fresh)));
      CHECK_FALSE(at::equal(log_probs(kept), log_probs(cast)));  // the two states really differ
    }
  }

  TEST_CASE("resume: an engine restored from state_dict continues bit for bit") {
    const auto b = fsdp_batch();
    const auto o = OptimizerOptions{}.lr(5e-3).schedule(LRSchedule::cosine).warmup_steps(1);
    const auto fo = FSDPOptions{}.param_dtype(at::kFloat);
    FSDPEngine a(fsdp_fixture(), fo, o, 6);
    StateDict saved;
    for (int i = 0; i < 4; ++i) {
      if (i == 2) saved = a.state_dict();
      a.backward(sft_loss(a, b));
      a.step();
    }
    auto other = fsdp_fixture();
    {
      c10::NoGradGuard g;
      for (auto& p : other->parameters()) p.add_(0.5);  // a different starting point, overwritten
    }
    FSDPEngine r(other, fo, o, 6);
    r.load_state_dict(saved);
    for (int i = 2; i < 4; ++i) {
      r.backward(sft_loss(r, b));
      r.step();
    }
    auto pa = a.model()->named_parameters(), pr = r.model()->named_parameters();
    for (const auto& p : pa) CHECK(at::equal(p.value(), pr[p.key()]));
    CHECK(r.optimizer().steps() == 4);
    StateDict broken = saved;
    broken.erase("model.model.norm.weight");
    CHECK(contains(error_of([&] { r.load_state_dict(broken); }), "the state has no 'model.model.norm.weight'"));
  }

  TEST_CASE("export_weights loads into Rollout<Naive>, which then generates as the trained model") {
    const auto b = fsdp_batch();
    FSDPEngine e(fsdp_fixture(), FSDPOptions{}.param_dtype(at::kFloat), OptimizerOptions{}.lr(1e-2), 10);
    e.backward(sft_loss(e, b));
    e.step();
    auto rollout = Rollout<Naive>::make(e.model()->config(), NaiveOptions{});
    int64_t buckets = 0;
    e.export_weights(rollout.weight_spec(), [&](const WeightBucket& bucket) {
      rollout.load_weights(bucket);
      ++buckets;
    });
    CHECK(buckets >= 1);
    const auto s = SamplingOptions{}.temperature(0).max_new_tokens(6).ignore_eos(true);
    const auto prompts = left_padded_prompts({{1, 2, 3}, {1, 9, 9, 9}});
    NaiveEngine direct(e.model(), NaiveOptions{});
    CHECK(at::equal(rollout.generate(prompts, s).tensor(keys::responses), direct.generate(prompts, s).tensor(keys::responses)));
  }

  TEST_CASE("a group without its Communicator, and bad options, are errors naming the fix") {
    CHECK(contains(error_of([] { FSDPEngine(fsdp_fixture(), FSDPOptions{}, OptimizerOptions{}, 10, 2); }),
                   "a group of 2 ranks needs their Communicator"));
    CHECK(contains(error_of([] { FSDPEngine(fsdp_fixture(), FSDPOptions{}.shard_group_size(3), OptimizerOptions{}, 10, 2); }),
                   "shard_group_size = 3 does not divide world_size 2"));
    CHECK(contains(error_of([] { FSDPEngine(fsdp_fixture(), FSDPOptions{}, OptimizerOptions{}.lr(-1), 10); }),
                   "lr = -1 is not a positive number"));
    auto e = Sharding<FSDP>::make(fsdp_fixture(), FSDPOptions{}, OptimizerOptions{}, 10);
    CHECK(contains(error_of([&] { e.forward(TensorBatch({{"x", at::zeros({1})}})); }), "the batch has no 'input_ids'"));
  }
}
