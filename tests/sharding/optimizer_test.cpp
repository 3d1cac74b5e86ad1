// sharding/optimizer.hpp: the learning-rate schedules against values worked out by hand from their
// formulas, clipping by global norm against hand arithmetic (torch.nn.utils.clip_grad_norm_'s
// rule), AdamW steps against the update written out in double precision (PyTorch's decoupled
// weight decay and bias corrections), the skip of a non-finite step, exact resume from the state;
// on CUDA the multi-tensor AdamW and norm against LibTorch's per-parameter ones.

#include <hybridrl/sharding/optimizer.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using hybridrl::testing::contains;
using hybridrl::testing::error_of;

namespace hybridrl::testing {
inline at::Tensor leaf(std::vector<double> v) { return at::tensor(v, at::kDouble).requires_grad_(true); }
inline void set_grad(at::Tensor& p, std::vector<double> g) { p.mutable_grad() = at::tensor(g, at::kDouble); }
}  // namespace hybridrl::testing

using hybridrl::testing::leaf;
using hybridrl::testing::set_grad;

TEST_SUITE("sharding/optimizer") {
  TEST_CASE("schedules: warm-up, then constant, linear or half-cosine decay to min_lr_ratio") {
    const auto constant = OptimizerOptions{}.warmup_steps(4);
    const std::vector<double> want_c{0.0, 0.25, 0.5, 0.75, 1.0, 1.0};
    for (int64_t s = 0; s < 6; ++s) CHECK(lr_factor(constant, s, 10) == doctest::Approx(want_c[static_cast<size_t>(s)]));
    const auto linear = OptimizerOptions{}.schedule(LRSchedule::linear).warmup_steps(2);
    CHECK(lr_factor(linear, 1, 10) == doctest::Approx(0.5));
    CHECK(lr_factor(linear, 2, 10) == doctest::Approx(1.0));
    CHECK(lr_factor(linear, 6, 10) == doctest::Approx(0.5));  // 1 - 4/8
    CHECK(lr_factor(linear, 10, 10) == doctest::Approx(0.0));
    CHECK(lr_factor(linear, 12, 10) == doctest::Approx(0.0));  // held after the end
    const auto cosine = OptimizerOptions{}.schedule(LRSchedule::cosine).warmup_steps(2).min_lr_ratio(0.1);
    CHECK(lr_factor(cosine, 2, 10) == doctest::Approx(1.0));
    CHECK(lr_factor(cosine, 6, 10) == doctest::Approx(0.1 + 0.9 * 0.5));  // cos(pi/2) = 0
    CHECK(lr_factor(cosine, 4, 10) == doctest::Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 4))));
    CHECK(lr_factor(cosine, 10, 10) == doctest::Approx(0.1));
  }

  TEST_CASE("clipping by global norm: the norm over all gradients, scaled by max / (norm + 1e-6) when above") {
    auto a = leaf({0, 0}), b = leaf({0, 0}), c = leaf({1});  // c has no gradient: skipped
    set_grad(a, {3, 4});
    set_grad(b, {0, 12});
    auto norm = clip_grad_norm({a, b, c}, 1.3);
    CHECK(norm.item<double>() == doctest::Approx(13.0));
    const double coef = 1.3 / (13.0 + 1e-6);
    CHECK(a.grad()[0].item<double>() == doctest::Approx(3 * coef).epsilon(1e-12));
    CHECK(b.grad()[1].item<double>() == doctest::Approx(12 * coef).epsilon(1e-12));
    set_grad(a, {3, 4});
    set_grad(b, {0, 12});
    CHECK(clip_grad_norm({a, b}, 100.0).item<double>() == doctest::Approx(13.0));
    CHECK(a.grad()[1].item<double>() == 4.0);  // below the limit: untouched
    CHECK(clip_grad_norm({a, b}, 0.0).item<double>() == doctest::Approx(13.0));
    CHECK(b.grad()[1].item<double>() == 12.0);  // 0 = no clipping
    set_grad(a, {std::nan(""), 1});
    CHECK(std::isnan(clip_grad_norm({a, b}, 1.0).item<double>()));
    CHECK(b.grad()[1].item<double>() == 12.0);  // a non-finite norm scales nothing
  }

  TEST_CASE("AdamW steps equal the update written out (decoupled weight decay, bias corrections)") {
    auto p = leaf({1.0, -2.0});
    const auto o = OptimizerOptions{}.lr(0.1).weight_decay(0.01).max_grad_norm(0);
    Optimizer opt({p}, o, 10);
    double x[2] = {1.0, -2.0}, m[2] = {0, 0}, v[2] = {0, 0};
    const std::vector<std::vector<double>> grads{{0.5, 0.1}, {-0.2, 0.3}, {0.05, -1.0}};
    for (size_t t = 1; t <= grads.size(); ++t) {
      set_grad(p, grads[t - 1]);
      auto r = opt.step();
      CHECK(!r.skipped);
      CHECK(r.lr == doctest::Approx(0.1));
      const double bc1 = 1 - std::pow(0.9, static_cast<double>(t)), bc2 = 1 - std::pow(0.999, static_cast<double>(t));
      for (int i = 0; i < 2; ++i) {
        const double g = grads[t - 1][static_cast<size_t>(i)];
        x[i] *= 1 - 0.1 * 0.01;
        m[i] = 0.9 * m[i] + 0.1 * g;
        v[i] = 0.999 * v[i] + 0.001 * g * g;
        x[i] -= 0.1 / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + 1e-8);
        CHECK(p[i].item<double>() == doctest::Approx(x[i]).epsilon(1e-12));
      }
      CHECK((!p.grad().defined() || p.grad().abs().sum().item<double>() == 0.0));  // zeroed after the step
    }
    CHECK(opt.steps() == 3);
  }

  TEST_CASE("the schedule sets each step's learning rate; warm-up step 0 applies lr 0") {
    auto p = leaf({1.0});
    Optimizer opt({p}, OptimizerOptions{}.lr(0.5).warmup_steps(2).weight_decay(0).max_grad_norm(0), 4);
    set_grad(p, {1.0});
    auto r0 = opt.step();
    CHECK(r0.lr == 0.0);
    CHECK(p.item<double>() == 1.0);  // lr 0: nothing moves
    set_grad(p, {1.0});
    CHECK(opt.step().lr == doctest::Approx(0.25));
    CHECK(opt.next_lr() == doctest::Approx(0.5));
  }

  TEST_CASE("a non-finite gradient skips the step: parameters and moments untouched, counted") {
    auto p = leaf({1.0, 2.0});
    Optimizer opt({p}, OptimizerOptions{}.lr(0.1), 10);
    set_grad(p, {0.5, 0.5});
    opt.step();
    const auto before = p.detach().clone();
    const auto state = opt.state_dict();
    set_grad(p, {std::numeric_limits<double>::infinity(), 0.0});
    auto r = opt.step();
    CHECK(r.skipped);
    CHECK(std::isinf(r.grad_norm.item<double>()));
    CHECK(at::equal(p.detach(), before));
    const auto after = opt.state_dict();
    CHECK(at::equal(after.at("optimizer.0.exp_avg"), state.at("optimizer.0.exp_avg")));
    CHECK(at::equal(after.at("optimizer.0.exp_avg_sq"), state.at("optimizer.0.exp_avg_sq")));
    CHECK(opt.skipped() == 1);
    CHECK(opt.steps() == 2);
  }

  TEST_CASE("resume: an optimizer restored from state_dict continues bit for bit") {
    const auto o = OptimizerOptions{}.lr(0.05).schedule(LRSchedule::cosine).warmup_steps(1);
    auto a = leaf({0.3, -0.7, 1.1});
    Optimizer full({a}, o, 6);
    const std::vector<std::vector<double>> grads{{0.1, 0.2, -0.3}, {1.5, -0.2, 0.0}, {-0.4, 0.4, 2.0}, {0.3, 0.3, 0.3}};
    std::map<std::string, at::Tensor> saved;
    at::Tensor saved_params;
    for (size_t t = 0; t < grads.size(); ++t) {
      if (t == 2) {
        saved = full.state_dict();
        saved_params = a.detach().clone();
      }
      set_grad(a, grads[t]);
      full.step();
    }
    auto b = saved_params.clone().requires_grad_(true);
    Optimizer resumed({b}, o, 6);
    resumed.load_state_dict(saved);
    CHECK(resumed.steps() == 2);
    CHECK(resumed.next_lr() == doctest::Approx(0.05 * lr_factor(o, 2, 6)));
    for (size_t t = 2; t < grads.size(); ++t) {
      set_grad(b, grads[t]);
      resumed.step();
    }
    CHECK(at::equal(b.detach(), a.detach()));
    CHECK(contains(error_of([&] { resumed.load_state_dict({}); }), "the state has no 'optimizer.step'"));
  }

  TEST_CASE("on CUDA: the multi-tensor AdamW and norm equal the per-parameter ones; resume and skip as on the CPU") {
    if (!at::hasCUDA()) {
      MESSAGE("no CUDA device: the fused AdamW is not run");
      return;
    }
    at::manual_seed(3);
    const auto cuda = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
    const std::vector<std::vector<int64_t>> shapes{{37}, {5, 3}, {4}, {2, 2, 2}};
    std::vector<at::Tensor> init;
    for (const auto& sh : shapes) init.push_back(at::randn(sh, cuda));
    std::vector<std::vector<at::Tensor>> grads(5);  // parameter 2 never has a gradient
    for (auto& g : grads) {
      for (size_t i = 0; i < shapes.size(); ++i) g.push_back(i == 2 ? at::Tensor() : at::randn(shapes[i], cuda) * 3);
    }
    auto params_from = [&](const std::vector<at::Tensor>& v) {
      std::vector<at::Tensor> out;
      for (const auto& t : v) out.push_back(t.detach().clone().requires_grad_(true));
      return out;
    };
    auto set = [](std::vector<at::Tensor>& ps, const std::vector<at::Tensor>& gs) {
      for (size_t i = 0; i < ps.size(); ++i) ps[i].mutable_grad() = gs[i].defined() ? gs[i].clone() : at::Tensor();
    };
    // clipping engaged (norm ~ 3 * sqrt(58) >> 2), warm-up and cosine schedule, weight decay
    const auto o = OptimizerOptions{}.lr(0.01).weight_decay(0.1).max_grad_norm(2.0).schedule(LRSchedule::cosine).warmup_steps(1);
    auto a = params_from(init), b = params_from(init);
    Optimizer fused(a, o, 8), plain(b, o, 8);
    plain.set_fused(false);
    std::map<std::string, at::Tensor> saved;
    std::vector<at::Tensor> saved_params;
    for (size_t t = 0; t < 4; ++t) {
      if (t == 2) {
        saved = fused.state_dict();
        for (const auto& p : a) saved_params.push_back(p.detach().clone());
      }
      set(a, grads[t]);
      set(b, grads[t]);
      const auto ra = fused.step(), rb = plain.step();
      CHECK(ra.grad_norm.item<double>() == doctest::Approx(rb.grad_norm.item<double>()).epsilon(1e-6));
      for (size_t i = 0; i < a.size(); ++i) {
        const double scale = b[i].detach().abs().max().item<double>();
        CHECK((a[i].detach() - b[i].detach()).abs().max().item<double>() <= 1e-6 * scale);
      }
    }
    CHECK(at::equal(a[2].detach(), init[2]));  // no gradient, never stepped
    const auto sa = fused.state_dict(), sb = plain.state_dict();
    CHECK(sa.size() == sb.size());
    CHECK(sa.count("optimizer.2.exp_avg") == 0);
    CHECK(sa.at("optimizer.0.step").item<int64_t>() == 4);
    // the fused kernel computes in float: 1 − float(0.999) is 1.3e-5 off 0.001 (LibTorch's step uses
    // the double), so the second moments agree to that, not to 1e-6 (measured on the H200: 1.3e-5)
    CHECK((sa.at("optimizer.1.exp_avg_sq") - sb.at("optimizer.1.exp_avg_sq")).abs().max().item<double>() <=
          1e-4 * sb.at("optimizer.1.exp_avg_sq").abs().max().item<double>());
    // the first moments carry the clipped gradients at their scale (the fused step folds the clip
    // factor into the kernel; AdamW's update alone would hide a wrong factor)
    CHECK((sa.at("optimizer.1.exp_avg") - sb.at("optimizer.1.exp_avg")).abs().max().item<double>() <=
          1e-5 * sb.at("optimizer.1.exp_avg").abs().max().item<double>());
    // resume from step 2 in a fresh fused optimizer: the same bits as the run that went on
    auto c = params_from(saved_params);
    Optimizer resumed(c, o, 8);
    resumed.load_state_dict(saved);
    for (size_t t = 2; t < 4; ++t) {
      set(c, grads[t]);
      resumed.step();
    }
    for (size_t i = 0; i < a.size(); ++i) CHECK(at::equal(c[i].detach(), a[i].detach()));
    // a non-finite gradient skips the step: nothing moves, the step counts stay
    const auto before = a[0].detach().clone();
    auto bad = grads[4];
    bad[1] = bad[1].clone();
    bad[1].view(-1)[3].fill_(std::numeric_limits<float>::infinity());
    set(a, bad);
    CHECK(fused.step().skipped);
    CHECK(at::equal(a[0].detach(), before));
    CHECK(fused.state_dict().at("optimizer.0.step").item<int64_t>() == 4);
    // square weights (a tensor-parallel model's replicated norms): the norm of the CPU arithmetic
    auto x = at::full({4}, 3.0, cuda).requires_grad_(true), y = at::full({1}, 4.0, cuda).requires_grad_(true);
    x.mutable_grad() = at::full({4}, 3.0, cuda);
    y.mutable_grad() = at::full({1}, 4.0, cuda);
    CHECK(clip_grad_norm({x, y}, 0.0, nullptr, {0.25, 1.0}).item<double>() == doctest::Approx(std::sqrt(9.0 + 16.0)));
    // the cases above ran hybridrl's kernel (a few float32 tensors); many tensors take torch's
    // multi-tensor kernel, and bf16 parameters too: each equals the per-parameter step
    for (const auto& [count, dtype] : std::vector<std::pair<int, at::ScalarType>>{{70, at::kFloat}, {3, at::kBFloat16}}) {
      CAPTURE(count);
      std::vector<at::Tensor> many;
      for (int i = 0; i < count; ++i) many.push_back(at::randn({9, 4}, cuda).to(dtype));
      auto p1 = params_from(many), p2 = params_from(many);
      Optimizer f1(p1, o, 8), f2(p2, o, 8);
      f2.set_fused(false);
      for (int t = 0; t < 2; ++t) {
        for (size_t i = 0; i < p1.size(); ++i) {
          const auto g = (at::randn({9, 4}, cuda) * 3).to(dtype);
          p1[i].mutable_grad() = g.clone();
          p2[i].mutable_grad() = g.clone();
        }
        f1.step();
        f2.step();
      }
      double worst = 0;
      for (size_t i = 0; i < p1.size(); ++i) {
        worst = std::max(worst, ((p1[i].detach() - p2[i].detach()).abs().max() / p2[i].detach().abs().max()).item<double>());
      }
      CHECK(worst <= (dtype == at::kFloat ? 1e-6 : 1e-2));
    }
  }

  TEST_CASE("bad options name the field and the fix") {
    CHECK(contains(error_of([] { OptimizerOptions{}.lr(0).validate(); }), "lr = 0 is not a positive number"));
    CHECK(contains(error_of([] { OptimizerOptions{}.beta1(1.0).validate(); }), "beta1 = 1 is outside [0, 1)"));
    CHECK(contains(error_of([] { OptimizerOptions{}.min_lr_ratio(2).validate(); }), "min_lr_ratio = 2 is outside [0, 1]"));
    CHECK(contains(error_of([] { Optimizer({}, OptimizerOptions{}, 0); }), "total_steps = 0 is below 1"));
  }
}
