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
#include "../support/sharding.hpp"
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using hybridrl::testing::contains;
using hybridrl::testing::error_of;
using namespace hybridrl::testing;

TEST_SUITE("sharding/tp3d") {
  TEST_CASE("TP3D: tensor 2 and data 2 × tensor 2 train as one process does (log-probs, norms, weights; thread and Gloo)") {
    // The gradients agree to ~6e-7 (another matmul blocking per shard). AdamW's eps = 1e-8 would
    // turn that into steps of ±lr / 10 for the few q_proj elements whose gradient is ~1e-8 (seen:
    // max |a - b| 6e-4 after three steps); eps 1e-6 keeps the comparison about the sharding.
    const auto optim = OptimizerOptions{}.lr(1e-2).max_grad_norm(0.5).weight_decay(0.1).eps(1e-6);
    const auto fsdp = FSDPOptions{}.param_dtype(at::kFloat);
    FSDPEngine one(sharded_fixture(), fsdp, optim, 10);
    const auto lp0 = one.forward(sharded_rows(0, 8)).tensor(keys::log_probs).detach().clone();
    const auto ref_norms = train_three(one, 0, 8);
    const auto ref = exported(one);
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
          TP3DEngine e(sharded_fixture(), TP3DOptions{}.tensor_parallel_size(2).param_dtype(at::kFloat), optim, 10,
                       borrowed(comm));
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
            const auto lp = e.forward(sharded_rows(first, share)).tensor(keys::log_probs);
            diff = (lp - lp0.narrow(0, first, share)).abs().max().item<double>();
          }
          auto n = train_three(e, first, share);
          auto w = exported(e);
          std::lock_guard<std::mutex> lock(m);
          lp_diff[static_cast<size_t>(comm.rank())] = diff;
          norms[static_cast<size_t>(comm.rank())] = n;
          weights[static_cast<size_t>(comm.rank())] = std::move(w);
          local[static_cast<size_t>(comm.rank())] = e.local_parameter_elements();
          total[static_cast<size_t>(comm.rank())] = e.total_parameter_elements();
        });
        int64_t replicated = 0;  // the norms: 64 per layer norm, 2 layers × 2 + the final one
        for (const auto& p : sharded_fixture()->named_parameters()) {
          if (!tensor_parallel_dim(p.key())) replicated += p.value().numel();
        }
        for (int r = 0; r < world; ++r) {
          CAPTURE(r);
          CHECK(lp_diff[static_cast<size_t>(r)] <= 1e-5);
          for (size_t s = 0; s < 3; ++s) CHECK(norms[static_cast<size_t>(r)][s] == doctest::Approx(ref_norms[s]).epsilon(1e-5));
          REQUIRE(weights[static_cast<size_t>(r)].size() == ref.size());
          CHECK(worst_rel(weights[static_cast<size_t>(r)], ref) <= 1e-5);
          // a rank stores half of the split tensors and the replicated ones whole
          CHECK(total[static_cast<size_t>(r)] == one.total_parameter_elements());
          CHECK(local[static_cast<size_t>(r)] * 2 == total[static_cast<size_t>(r)] + replicated);
        }
        CHECK(norm_rel(ref.at("model.layers.0.mlp.up_proj.weight"),
                     sharded_fixture()->named_parameters()["model.layers.0.mlp.up_proj.weight"]) > 1e-3);  // trained
      }
    }
  }

  TEST_CASE("TP3D critic: values and training equal the one-process critic's") {
    const auto optim = OptimizerOptions{}.lr(1e-2);
    const auto fsdp = FSDPOptions{}.param_dtype(at::kFloat);
    auto critic_of = [] {
      at::manual_seed(7);  // the same score head on every rank and in the reference
      return make_value_model(sharded_fixture());
    };
    auto value_loss = [](auto& e, const TensorBatch& b) {
      auto v = e.forward(b).tensor(keys::values);
      auto mask = b.tensor(keys::response_mask).to(v.dtype());
      return ((v - 0.5).pow(2) * mask).sum() / mask.sum();
    };
    FSDPCriticEngine one(critic_of(), fsdp, optim, 10);
    const auto v0 = one.forward(sharded_rows(0, 8)).tensor(keys::values).detach().clone();
    one.backward(value_loss(one, sharded_rows(0, 8)));
    const double ref_norm = one.step().item<double>();
    const auto v1 = one.forward(sharded_rows(0, 8)).tensor(keys::values).detach().clone();
    std::vector<double> diffs(4, 1.0);
    std::vector<ValueModel> critics{critic_of(), critic_of()};  // drawn here: threads would race on the seed
    std::mutex m;
    run_on("thread", 2, [&](Communicator& comm) {
      TP3DCriticEngine e(critics[static_cast<size_t>(comm.rank())], TP3DOptions{}.tensor_parallel_size(2).param_dtype(at::kFloat), optim, 10,
                         borrowed(comm));
      const auto a = (e.forward(sharded_rows(0, 8)).tensor(keys::values) - v0).abs().max().item<double>();
      e.backward(value_loss(e, sharded_rows(0, 8)));
      const double n = e.step().item<double>();
      const auto b = (e.forward(sharded_rows(0, 8)).tensor(keys::values) - v1).abs().max().item<double>();
      std::lock_guard<std::mutex> lock(m);
      diffs[static_cast<size_t>(comm.rank()) * 2] = a;
      diffs[static_cast<size_t>(comm.rank()) * 2 + 1] = b;
      CHECK(n == doctest::Approx(ref_norm).epsilon(1e-5));
    });
    for (const auto d : diffs) CHECK(d <= 1e-5);
  }

  TEST_CASE("TP3D export: TP = 1 gets the full weights bit for bit (bytes counted), TP = 2 its own shards, in buckets") {
    const auto full = sharded_fixture()->named_parameters();
    int64_t sharded_bytes = 0;  // what a rank of 2 receives to rebuild the split tensors
    for (const auto& p : full) {
      if (tensor_parallel_dim(p.key())) sharded_bytes += p.value().numel() * 4 / 2;
    }
    run_on("thread", 2, [&](Communicator& comm) {
      TP3DEngine e(sharded_fixture(), TP3DOptions{}.tensor_parallel_size(2), OptimizerOptions{}, 10, borrowed(comm),
                   int64_t{16} << 10);  // 16 KiB buckets
      int64_t buckets = 0;
      const auto whole = exported(e, &buckets);
      CHECK(buckets >= 3);
      REQUIRE(whole.size() == full.size());
      for (const auto& p : full) CHECK(at::equal(whole.at(p.key()), p.value()));
      CHECK(e.last_export_bytes() == sharded_bytes);
      // the rollout's own layout: this rank's shards, nothing received
      const WeightSpec mine{2, comm.rank(), at::kBFloat16};
      const auto shards = exported(e, nullptr, mine);
      for (const auto& p : full) {
        CAPTURE(p.key());
        CHECK(at::equal(shards.at(p.key()), export_shard(p.key(), p.value(), mine)));
      }
      CHECK(e.last_export_bytes() == 0);
      // the other rank's shards (a rollout laid out differently): gathered and cut
      const WeightSpec other{2, 1 - comm.rank()};
      const auto theirs = exported(e, nullptr, other);
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
    FSDPEngine one(sharded_fixture(), fsdp, optim, 10);
    (void)train_three(one, 0, 8);
    const auto one_state = one.state_dict();
    (void)train_three(one, 0, 8);
    const auto one_after = exported(one);
    StateDict tp_state;
    std::vector<double> worst(2, 1.0), from_one(2, 1.0);
    std::mutex m;
    run_on("thread", 2, [&](Communicator& comm) {
      TP3DEngine e(sharded_fixture(), tp, optim, 10, borrowed(comm));
      (void)train_three(e, 0, 8);
      auto state = e.state_dict();
      (void)train_three(e, 0, 8);
      const double w = worst_rel(exported(e), one_after);
      // a tensor-parallel engine resumed from one process's state continues as that process did
      TP3DEngine f(sharded_fixture(), tp, optim, 10, borrowed(comm));
      f.load_state_dict(one_state);
      (void)train_three(f, 0, 8);
      const double g = worst_rel(exported(f), one_after);
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
    FSDPEngine resumed(sharded_fixture(), fsdp, optim, 10);
    resumed.load_state_dict(tp_state);
    (void)train_three(resumed, 0, 8);
    CHECK(worst_rel(exported(resumed), one_after) <= 1e-5);
    // a wrong shape is refused before anything changes
    auto bad = tp_state;
    bad["model.model.norm.weight"] = at::zeros({3});
    run_on("thread", 2, [&](Communicator& comm) {
      TP3DEngine e(sharded_fixture(), tp, optim, 10, borrowed(comm));
      const auto before = exported(e);
      CHECK(contains(error_of([&] { e.load_state_dict(bad); }), "'model.model.norm.weight' has shape [3], the model [64]"));
      CHECK(worst_rel(exported(e), before) == 0.0);
    });
  }

  TEST_CASE("TP3D errors: heads that do not split, a mesh that does not tile the world, pipeline/sequence parallel") {
    // the fixture has 2 KV heads: 4-way tensor parallelism cannot split them
    run_on("thread", 4, [&](Communicator& comm) {
      const auto msg = error_of([&] {
        TP3DEngine e(sharded_fixture(), TP3DOptions{}.tensor_parallel_size(4), OptimizerOptions{}, 10, borrowed(comm));
      });
      CHECK(contains(msg, "num_key_value_heads = 2 is not divisible by tensor_parallel_size = 4"));
      CHECK(contains(msg, "(here: 1, 2)"));
    });
    CHECK(contains(error_of([] { TP3DOptions{}.tensor_parallel_size(3).check_world(4); }),
                   "tensor_parallel_size × pipeline_parallel_size = 3 × 1 = 3 does not divide world_size 4"));
    CHECK(contains(error_of([] { TP3DOptions{}.pipeline_parallel_size(2).validate(); }),
                   "pipeline_parallel_size = 2: pipeline parallelism is not implemented yet"));
    CHECK(contains(error_of([] { TP3DOptions{}.sequence_parallel(true).validate(); }), "sequence_parallel = true"));
    CHECK(contains(error_of([] { TP3DEngine e(sharded_fixture(), TP3DOptions{}.tensor_parallel_size(2), OptimizerOptions{}, 10); }),
                   "does not divide world_size 1"));
  }
}
