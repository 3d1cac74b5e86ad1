// Sharding<TP3D> over several ranks (threads of this process, over hybridrl's thread group and over
// c10d Gloo where LibTorch ships it): a tensor-parallel group of 2 (and a 2 × 2 data × tensor
// mesh) trains as one process does (fp32: log-probs, gradient norms, the weights after three
// steps); the critic's values too; export_weights hands a TP = 1 rollout the full weights bit for
// bit and a TP = 2 rollout its own shards without communication; the state is the one-process
// layout and resumes under Sharding<FSDP> on one process, and back; errors before any work.

#include <hybridrl/model/pretrained.hpp>
#include <hybridrl/sharding/fsdp.hpp>
#include <hybridrl/sharding/tp3d.hpp>

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../support/gloo.hpp"
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using hybridrl::testing::contains;
using hybridrl::testing::error_of;

namespace hybridrl::testing {
inline CausalLM tp_fixture() { return load_causal_lm(std::string(HYBRIDRL_FIXTURES_DIR) + "/models/llama"); }

// Eight rows of varied lengths (right padding), the last three tokens of each the "response".
inline TensorBatch tp_rows(int64_t first, int64_t count) {
  const int64_t T = 9;
  auto ids = at::zeros({count, T}, at::kLong), mask = at::zeros({count, T}, at::kLong), rmask = at::zeros({count, T}, at::kLong);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = first + i, len = 5 + row % 5;
    for (int64_t t = 0; t < len; ++t) ids[i][t] = (row * 37 + t * 11) % 300 + 3;
    mask[i].narrow(0, 0, len).fill_(1);
    rmask[i].narrow(0, len - 3, 3).fill_(1);
  }
  return TensorBatch({{keys::input_ids.str(), ids}, {keys::attention_mask.str(), mask}, {keys::response_mask.str(), rmask}});
}
// A rank's loss over its share: the mean over rows of each row's mean response log-prob, negated.
template <class E>
at::Tensor tp_loss(E& e, const TensorBatch& b) {
  auto lp = e.forward(b).tensor(keys::log_probs);
  auto m = b.tensor(keys::response_mask).to(lp.dtype());
  return -((lp * m).sum(1) / m.sum(1)).mean();
}
// Three steps of two micro-batches over the share [first, first + rows): the gradient norms.
template <class E>
std::vector<double> tp_train_three(E& e, int64_t first, int64_t rows) {
  std::vector<double> norms;
  for (int step = 0; step < 3; ++step) {
    for (int m = 0; m < 2; ++m) e.backward(tp_loss(e, tp_rows(first + m * rows / 2, rows / 2)) / 2);
    norms.push_back(e.step().template item<double>());
  }
  return norms;
}
template <class E>
std::map<std::string, at::Tensor> tp_exported(const E& e, const WeightSpec& spec = {}, int64_t* buckets = nullptr) {
  std::map<std::string, at::Tensor> out;
  int64_t n = 0;
  e.export_weights(spec, [&](const WeightBucket& b) {
    ++n;
    for (const auto& t : b) out[t.name] = t.tensor.clone();
  });
  if (buckets != nullptr) *buckets = n;
  return out;
}
inline std::shared_ptr<Communicator> tp_borrowed(Communicator& c) {
  return std::shared_ptr<Communicator>(&c, [](Communicator*) {});
}
inline double tp_rel(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).norm() / b.norm().clamp_min(1e-12)).item<double>();
}
inline double tp_worst(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  double worst = 0;
  for (const auto& [name, t] : b) worst = std::max(worst, tp_rel(a.at(name), t));
  return worst;
}
}  // namespace hybridrl::testing

using namespace hybridrl::testing;

TEST_SUITE("sharding/tp3d") {
  TEST_CASE("TP3D: tensor 2 and data 2 × tensor 2 train as one process does (log-probs, norms, weights; thread and Gloo)") {
    // The gradients agree to ~6e-7 (another matmul blocking per shard). AdamW's eps = 1e-8 would
    // turn that into steps of ±lr / 10 for the few q_proj elements whose gradient is ~1e-8 (seen:
    // max |a - b| 6e-4 after three steps); eps 1e-6 keeps the comparison about the sharding.
    const auto optim = OptimizerOptions{}.lr(1e-2).max_grad_norm(0.5).weight_decay(0.1).eps(1e-6);
    const auto fsdp = FSDPOptions{}.param_dtype(at::kFloat);
    FSDPEngine one(tp_fixture(), fsdp, optim, 10);
    const auto lp0 = one.forward(tp_rows(0, 8)).tensor(keys::log_probs).detach().clone();
    const auto ref_norms = tp_train_three(one, 0, 8);
    const auto ref = tp_exported(one);
    for (const auto& backend : backends()) {
      for (const int world : {2, 4}) {
        CAPTURE(backend);
        CAPTURE(world);
        std::mutex m;
        std::vector<std::vector<double>> norms(static_cast<size_t>(world));
        std::vector<std::map<std::string, at::Tensor>> weights(static_cast<size_t>(world));
        std::vector<double> lp_diff(static_cast<size_t>(world), 1.0);
        std::vector<int64_t> local(static_cast<size_t>(world)), total(static_cast<size_t>(world));
        run_on(backend, world, [&](Communicator& comm) {
          TP3DEngine e(tp_fixture(), TP3DOptions{}.tensor_parallel_size(2).param_dtype(at::kFloat), optim, 10,
                       tp_borrowed(comm));
          const int64_t dp = world / 2, share = 8 / dp, first = e.mesh().coordinates().data * share;
          CHECK(e.data_parallel_group()->size() == dp);
          CHECK(e.tensor_parallel_group()->size() == 2);
          CHECK(e.mesh().coordinates().tensor == comm.rank() % 2);  // tensor is the inner axis
          // the sharded model holds half of every split tensor
          const auto shard = e.model_shard()->named_parameters();
          CHECK(shard["model.layers.0.self_attn.q_proj.weight"].size(0) == 32);  // 64 / 2
          CHECK(shard["model.layers.0.mlp.down_proj.weight"].size(1) == 64);     // 128 / 2
          CHECK(shard["model.embed_tokens.weight"].size(0) == 160);             // vocabulary 320 / 2
          CHECK(shard["model.norm.weight"].size(0) == 64);                      // replicated
          double diff = 1.0;
          {
            c10::NoGradGuard ng;
            const auto lp = e.forward(tp_rows(first, share)).tensor(keys::log_probs);
            diff = (lp - lp0.narrow(0, first, share)).abs().max().item<double>();
          }
          auto n = tp_train_three(e, first, share);
          auto w = tp_exported(e);
          std::lock_guard<std::mutex> lock(m);
          lp_diff[static_cast<size_t>(comm.rank())] = diff;
          norms[static_cast<size_t>(comm.rank())] = n;
          weights[static_cast<size_t>(comm.rank())] = std::move(w);
          local[static_cast<size_t>(comm.rank())] = e.local_parameter_elements();
          total[static_cast<size_t>(comm.rank())] = e.total_parameter_elements();
        });
        int64_t replicated = 0;  // the norms: 64 per layer norm, 2 layers × 2 + the final one
        for (const auto& p : tp_fixture()->named_parameters()) {
          if (!tensor_parallel_dim(p.key())) replicated += p.value().numel();
        }
        for (int r = 0; r < world; ++r) {
          CAPTURE(r);
          CHECK(lp_diff[static_cast<size_t>(r)] <= 1e-5);
          for (size_t s = 0; s < 3; ++s) CHECK(norms[static_cast<size_t>(r)][s] == doctest::Approx(ref_norms[s]).epsilon(1e-5));
          REQUIRE(weights[static_cast<size_t>(r)].size() == ref.size());
          CHECK(tp_worst(weights[static_cast<size_t>(r)], ref) <= 1e-5);
          // a rank stores half of the split tensors and the replicated ones whole
          CHECK(total[static_cast<size_t>(r)] == one.total_parameter_elements());
          CHECK(local[static_cast<size_t>(r)] * 2 == total[static_cast<size_t>(r)] + replicated);
        }
        CHECK(tp_rel(ref.at("model.layers.0.mlp.up_proj.weight"),
                     tp_fixture()->named_parameters()["model.layers.0.mlp.up_proj.weight"]) > 1e-3);  // trained
      }
    }
  }

  TEST_CASE("TP3D critic: values and training equal the one-process critic's") {
    const auto optim = OptimizerOptions{}.lr(1e-2);
    const auto fsdp = FSDPOptions{}.param_dtype(at::kFloat);
    auto critic_of = [] {
      at::manual_seed(7);  // the same score head on every rank and in the reference
      return make_value_model(tp_fixture());
    };
    auto value_loss = [](auto& e, const TensorBatch& b) {
      auto v = e.forward(b).tensor(keys::values);
      auto mask = b.tensor(keys::response_mask).to(v.dtype());
      return ((v - 0.5).pow(2) * mask).sum() / mask.sum();
    };
    FSDPCriticEngine one(critic_of(), fsdp, optim, 10);
    const auto v0 = one.forward(tp_rows(0, 8)).tensor(keys::values).detach().clone();
    one.backward(value_loss(one, tp_rows(0, 8)));
    const double ref_norm = one.step().item<double>();
    const auto v1 = one.forward(tp_rows(0, 8)).tensor(keys::values).detach().clone();
    std::vector<double> diffs(4, 1.0);
    std::vector<ValueModel> critics{critic_of(), critic_of()};  // drawn here: threads would race on the seed
    std::mutex m;
    run_on("thread", 2, [&](Communicator& comm) {
      TP3DCriticEngine e(critics[static_cast<size_t>(comm.rank())], TP3DOptions{}.tensor_parallel_size(2).param_dtype(at::kFloat), optim, 10,
                         tp_borrowed(comm));
      const auto a = (e.forward(tp_rows(0, 8)).tensor(keys::values) - v0).abs().max().item<double>();
      e.backward(value_loss(e, tp_rows(0, 8)));
      const double n = e.step().item<double>();
      const auto b = (e.forward(tp_rows(0, 8)).tensor(keys::values) - v1).abs().max().item<double>();
      std::lock_guard<std::mutex> lock(m);
      diffs[static_cast<size_t>(comm.rank()) * 2] = a;
      diffs[static_cast<size_t>(comm.rank()) * 2 + 1] = b;
      CHECK(n == doctest::Approx(ref_norm).epsilon(1e-5));
    });
    for (const auto d : diffs) CHECK(d <= 1e-5);
  }

  TEST_CASE("TP3D export: TP = 1 gets the full weights bit for bit (bytes counted), TP = 2 its own shards, in buckets") {
    const auto full = tp_fixture()->named_parameters();
    int64_t sharded_bytes = 0;  // what a rank of 2 receives to rebuild the split tensors
    for (const auto& p : full) {
      if (tensor_parallel_dim(p.key())) sharded_bytes += p.value().numel() * 4 / 2;
    }
    run_on("thread", 2, [&](Communicator& comm) {
      TP3DEngine e(tp_fixture(), TP3DOptions{}.tensor_parallel_size(2), OptimizerOptions{}, 10, tp_borrowed(comm),
                   int64_t{16} << 10);  // 16 KiB buckets
      int64_t buckets = 0;
      const auto whole = tp_exported(e, WeightSpec{}, &buckets);
      CHECK(buckets >= 3);
      REQUIRE(whole.size() == full.size());
      for (const auto& p : full) CHECK(at::equal(whole.at(p.key()), p.value()));
      CHECK(e.last_export_bytes() == sharded_bytes);
      // the rollout's own layout: this rank's shards, nothing received
      const WeightSpec mine{2, comm.rank(), at::kBFloat16};
      const auto shards = tp_exported(e, mine);
      for (const auto& p : full) {
        CAPTURE(p.key());
        CHECK(at::equal(shards.at(p.key()), export_shard(p.key(), p.value(), mine)));
      }
      CHECK(e.last_export_bytes() == 0);
      // the other rank's shards (a rollout laid out differently): gathered and cut
      const WeightSpec other{2, 1 - comm.rank()};
      const auto theirs = tp_exported(e, other);
      for (const auto& p : full) CHECK(at::equal(theirs.at(p.key()), export_shard(p.key(), p.value(), other)));
      // materialize fills the full model with the (here untrained) weights; reshard frees them
      CHECK(e.model()->named_parameters()["model.layers.0.self_attn.q_proj.weight"].numel() == 0);
      e.materialize();
      for (const auto& p : e.model()->named_parameters()) CHECK(at::equal(p.value(), full[p.key()]));
      e.reshard();
      CHECK(e.model()->named_parameters()["model.layers.0.self_attn.q_proj.weight"].numel() == 0);
    });
  }

  TEST_CASE("TP3D state: the one-process layout; resumes under one-process FSDP and back, as the uninterrupted run") {
    const auto optim = OptimizerOptions{}.lr(1e-2).eps(1e-6);  // eps: see the first test case
    const auto tp = TP3DOptions{}.tensor_parallel_size(2).param_dtype(at::kFloat);
    const auto fsdp = FSDPOptions{}.param_dtype(at::kFloat);
    FSDPEngine one(tp_fixture(), fsdp, optim, 10);
    (void)tp_train_three(one, 0, 8);
    const auto one_state = one.state_dict();
    (void)tp_train_three(one, 0, 8);
    const auto one_after = tp_exported(one);
    StateDict tp_state;
    std::vector<double> worst(2, 1.0), from_one(2, 1.0);
    std::mutex m;
    run_on("thread", 2, [&](Communicator& comm) {
      TP3DEngine e(tp_fixture(), tp, optim, 10, tp_borrowed(comm));
      (void)tp_train_three(e, 0, 8);
      auto state = e.state_dict();
      (void)tp_train_three(e, 0, 8);
      const double w = tp_worst(tp_exported(e), one_after);
      // a tensor-parallel engine resumed from one process's state continues as that process did
      TP3DEngine f(tp_fixture(), tp, optim, 10, tp_borrowed(comm));
      f.load_state_dict(one_state);
      (void)tp_train_three(f, 0, 8);
      const double g = tp_worst(tp_exported(f), one_after);
      std::lock_guard<std::mutex> lock(m);
      worst[static_cast<size_t>(comm.rank())] = w;
      from_one[static_cast<size_t>(comm.rank())] = g;
      if (comm.rank() == 0) tp_state = std::move(state);
    });
    for (int r = 0; r < 2; ++r) {
      CHECK(worst[static_cast<size_t>(r)] <= 1e-5);
      CHECK(from_one[static_cast<size_t>(r)] <= 1e-5);
    }
    REQUIRE(tp_state.size() == one_state.size());
    for (const auto& [k, v] : one_state) {
      CAPTURE(k);
      REQUIRE(tp_state.count(k) == 1);
      CHECK(tp_state.at(k).sizes() == v.sizes());
    }
    // written by the tensor-parallel pair, resumed by one FSDP process: the same run
    FSDPEngine resumed(tp_fixture(), fsdp, optim, 10);
    resumed.load_state_dict(tp_state);
    (void)tp_train_three(resumed, 0, 8);
    CHECK(tp_worst(tp_exported(resumed), one_after) <= 1e-5);
    // a wrong shape is refused before anything changes
    auto bad = tp_state;
    bad["model.model.norm.weight"] = at::zeros({3});
    run_on("thread", 2, [&](Communicator& comm) {
      TP3DEngine e(tp_fixture(), tp, optim, 10, tp_borrowed(comm));
      const auto before = tp_exported(e);
      CHECK(contains(error_of([&] { e.load_state_dict(bad); }), "'model.model.norm.weight' has shape [3], the model [64]"));
      CHECK(tp_worst(tp_exported(e), before) == 0.0);
    });
  }

  TEST_CASE("TP3D errors: heads that do not split, a mesh that does not tile the world, pipeline/sequence parallel") {
    // the fixture has 2 KV heads: 4-way tensor parallelism cannot split them
    run_on("thread", 4, [&](Communicator& comm) {
      const auto msg = error_of([&] {
        TP3DEngine e(tp_fixture(), TP3DOptions{}.tensor_parallel_size(4), OptimizerOptions{}, 10, tp_borrowed(comm));
      });
      CHECK(contains(msg, "num_key_value_heads = 2 is not divisible by tensor_parallel_size = 4"));
      CHECK(contains(msg, "(here: 1, 2)"));
    });
    CHECK(contains(error_of([] { TP3DOptions{}.tensor_parallel_size(3).check_world(4); }),
                   "tensor_parallel_size × pipeline_parallel_size = 3 × 1 = 3 does not divide world_size 4"));
    CHECK(contains(error_of([] { TP3DOptions{}.pipeline_parallel_size(2).validate(); }),
                   "pipeline_parallel_size = 2: pipeline parallelism is not implemented yet"));
    CHECK(contains(error_of([] { TP3DOptions{}.sequence_parallel(true).validate(); }), "sequence_parallel = true"));
    CHECK(contains(error_of([] { TP3DEngine e(tp_fixture(), TP3DOptions{}.tensor_parallel_size(2), OptimizerOptions{}, 10); }),
                   "does not divide world_size 1"));
  }
}
