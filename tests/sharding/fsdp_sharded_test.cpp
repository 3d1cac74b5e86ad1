// Sharding<FSDP> over several ranks (threads of this process, over hybridrl's thread group and
// over c10d Gloo where LibTorch ships it): training on each rank's share of the batch equals one
// process training on the whole batch (fp32, the same steps: gradient norms, the weights after
// three steps with two micro-batches each, with and without recompute, full and hybrid
// sharding); a rank stores 1/world of the parameters and of the AdamW state; export_weights hands
// every rank the full weights bit for bit; state_dict resumes bit for bit; a sharded checkpoint
// (each rank its pieces, nothing gathered) reads back bit for bit and resumes on 1, 2 and 4 ranks
// (full and hybrid sharding); damaged shards and a rank that cannot write are named; errors.

#include <hybridrl/model/pretrained.hpp>
#include <hybridrl/sharding/fsdp.hpp>
#include <hybridrl/trainer/checkpoint.hpp>

#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
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

TEST_SUITE("sharding/fsdp_sharded") {
  TEST_CASE("FSDP over 2 and 4 ranks trains as one process does (thread group and Gloo; recompute or not; hybrid)") {
    const auto optim = OptimizerOptions{}.lr(1e-2).max_grad_norm(0.5).weight_decay(0.1);
    const int64_t rows = 8;
    for (const bool recompute : {true, false}) {
      CAPTURE(recompute);
      const auto opts = FSDPOptions{}.param_dtype(at::kFloat).activation_checkpointing(recompute);
      FSDPEngine one(sharded_fixture(), opts, optim, 10);
      const auto ref_norms = train_three(one, 0, rows);
      const auto ref = exported(one);
      for (const auto& backend : backends()) {
        for (const auto& [world, group] : std::vector<std::pair<int, int64_t>>{{2, -1}, {4, -1}, {4, 2}}) {
          CAPTURE(backend);
          CAPTURE(world);
          CAPTURE(group);
          std::mutex m;
          std::vector<std::vector<double>> norms(static_cast<size_t>(world));
          std::vector<std::map<std::string, at::Tensor>> weights(static_cast<size_t>(world));
          std::vector<int64_t> local(static_cast<size_t>(world)), total(static_cast<size_t>(world));
          run_on(backend, world, [&](Communicator& comm) {
            FSDPEngine e(sharded_fixture(), FSDPOptions(opts).shard_group_size(group), optim, 10, borrowed(comm));
            const int64_t share = rows / world;
            auto n = train_three(e, comm.rank() * share, share);
            auto w = exported(e);
            std::lock_guard<std::mutex> lock(m);
            norms[static_cast<size_t>(comm.rank())] = n;
            weights[static_cast<size_t>(comm.rank())] = std::move(w);
            local[static_cast<size_t>(comm.rank())] = e.local_parameter_elements();
            total[static_cast<size_t>(comm.rank())] = e.total_parameter_elements();
          });
          for (int r = 0; r < world; ++r) {
            CAPTURE(r);
            for (size_t s = 0; s < 3; ++s) CHECK(norms[static_cast<size_t>(r)][s] == doctest::Approx(ref_norms[s]).epsilon(1e-5));
            REQUIRE(weights[static_cast<size_t>(r)].size() == ref.size());
            double worst = 0;
            // per tensor ||a - b|| / ||b||: the fp32 sums run in another order, and AdamW's m / sqrt(v)
            // magnifies the rounding of near-zero gradient elements (max |a - b| ~ 4e-5 at lr 1e-2)
            std::string worst_name;
            for (const auto& [name, t] : ref) {
              const auto d = norm_rel(weights[static_cast<size_t>(r)].at(name), t);
              if (d > worst) worst = d, worst_name = name;
            }
            CAPTURE(worst_name);
            CHECK(worst <= 1e-5);
            // a rank stores 1/shards of the parameters (each unit padded to a multiple of the shard count)
            const int64_t shards = group < 0 ? world : group;
            CHECK(total[static_cast<size_t>(r)] == one.total_parameter_elements());
            CHECK(local[static_cast<size_t>(r)] * shards >= total[static_cast<size_t>(r)]);
            CHECK(local[static_cast<size_t>(r)] * shards <= total[static_cast<size_t>(r)] + 3 * shards);  // 3 units
          }
          // the weights moved (the comparison is not of untrained models)
          CHECK(norm_rel(ref.at("model.layers.0.mlp.up_proj.weight"),
                        sharded_fixture()->named_parameters()["model.layers.0.mlp.up_proj.weight"]) > 1e-3);
        }
      }
    }
  }

  TEST_CASE("sharded state: a rank's AdamW share; export in buckets; materialize; the state resumes on 1, 2 or 4 ranks") {
    const auto optim = OptimizerOptions{}.lr(1e-2);
    const auto opts = FSDPOptions{}.param_dtype(at::kFloat);
    // one process: 3 steps, its state, 3 more steps
    FSDPEngine one(sharded_fixture(), opts, optim, 10);
    (void)train_three(one, 0, 8);
    const auto one_state = one.state_dict();
    (void)train_three(one, 0, 8);
    const auto one_after = exported(one);
    auto close_to_one = [&](const std::map<std::string, at::Tensor>& w) {
      double worst = 0;
      for (const auto& [name, t] : one_after) worst = std::max(worst, norm_rel(w.at(name), t));
      return worst;
    };
    StateDict two_state;
    std::mutex m;
    run_on("thread", 2, [&](Communicator& comm) {
      FSDPEngine e(sharded_fixture(), opts, optim, 10, borrowed(comm), int64_t{16} << 10);  // 16 KiB buckets
      (void)train_three(e, comm.rank() * 4, 4);
      int64_t adam = 0;
      for (const auto& t : e.optimizer().state_dict("")) {
        if (t.first.size() > 8 && t.first.substr(t.first.size() - 8) == ".exp_avg") adam += t.second.numel();
      }
      CHECK(adam == e.local_parameter_elements());  // AdamW's moments are this rank's share
      auto state = e.state_dict();  // collective: the one-process layout
      // export: many small buckets, the full weights in the end; materialize fills the model
      int64_t buckets = 0;
      const auto full = exported(e, &buckets);
      CHECK(buckets >= 3);
      e.materialize();
      for (const auto& p : e.model()->named_parameters()) CHECK(at::equal(p.value(), full.at(p.key())));
      e.reshard();
      CHECK(e.model()->named_parameters()["model.layers.1.self_attn.q_proj.weight"].numel() == 0);
      // a fresh sharded engine loaded from the state continues bit for bit as this one
      FSDPEngine f(sharded_fixture(), opts, optim, 10, borrowed(comm));
      f.load_state_dict(state);
      (void)train_three(e, comm.rank() * 4, 4);
      (void)train_three(f, comm.rank() * 4, 4);
      const auto a = exported(e), b = exported(f);
      for (const auto& [name, t] : a) CHECK(at::equal(t, b.at(name)));
      CHECK(close_to_one(a) <= 1e-5);
      std::lock_guard<std::mutex> lock(m);
      if (comm.rank() == 0) two_state = std::move(state);
    });
    // the same keys and shapes as one process's state, and close to its values
    REQUIRE(two_state.size() == one_state.size());
    for (const auto& [k, v] : one_state) {
      CAPTURE(k);
      REQUIRE(two_state.count(k) == 1);
      CHECK(two_state.at(k).sizes() == v.sizes());
    }
    CHECK(norm_rel(two_state.at("model.model.embed_tokens.weight"), one_state.at("model.model.embed_tokens.weight")) <= 1e-5);
    // written by 2 ranks, resumed by 1 and by 4: the same run
    FSDPEngine resumed(sharded_fixture(), opts, optim, 10);
    resumed.load_state_dict(two_state);
    (void)train_three(resumed, 0, 8);
    CHECK(close_to_one(exported(resumed)) <= 1e-5);
    std::vector<std::map<std::string, at::Tensor>> four(4);
    run_on("thread", 4, [&](Communicator& comm) {
      FSDPEngine e(sharded_fixture(), opts, optim, 10, borrowed(comm));
      e.load_state_dict(two_state);
      (void)train_three(e, comm.rank() * 2, 2);
      auto w = exported(e);
      std::lock_guard<std::mutex> lock(m);
      four[static_cast<size_t>(comm.rank())] = std::move(w);
    });
    for (const auto& w : four) CHECK(close_to_one(w) <= 1e-5);
    // errors: another model's state, before anything changes
    auto bad = two_state;
    bad["model.model.norm.weight"] = at::zeros({3});
    CHECK(contains(error_of([&] { resumed.load_state_dict(bad); }), "'model.model.norm.weight' has shape [3]"));
    CHECK(contains(error_of([] { FSDPEngine(sharded_fixture(), FSDPOptions{}, OptimizerOptions{}, 10, 2); }),
                   "a group of 2 ranks needs their Communicator"));
  }

  TEST_CASE("sharded checkpoint: 2 ranks write their pieces, nothing gathered; read back bit for bit; resumed on 1, 2 and 4 ranks") {
    namespace fs = std::filesystem;
    const auto dir = (fs::temp_directory_path() / ("hybridrl_shards_" + std::to_string(::getpid()))).string();
    io::detail::remove_tree(dir);
    struct Cleanup {
      std::string d;
      ~Cleanup() { io::detail::remove_tree(d); }
    } cleanup{dir};
    const auto optim = OptimizerOptions{}.lr(1e-2);
    const auto opts = FSDPOptions{}.param_dtype(at::kFloat);
    FSDPEngine one(sharded_fixture(), opts, optim, 10);
    (void)train_three(one, 0, 8);
    (void)train_three(one, 0, 8);
    const auto one_after = exported(one);
    StateDict two_state;  // the 2-rank state gathered, to compare with what the pieces give back
    std::vector<int64_t> piece_elements(2), local(2);
    std::string path;
    std::mutex m;
    run_on("thread", 2, [&](Communicator& comm) {
      FSDPEngine e(sharded_fixture(), opts, optim, 10, borrowed(comm));
      (void)train_three(e, comm.rank() * 4, 4);
      auto full = e.state_dict();
      const auto mine = e.sharded_state();  // no collective: this rank's slices, cut at parameter bounds
      int64_t n = 0;
      for (const auto& [k, t] : mine.pieces) {
        if (k.first.rfind("model.", 0) == 0) n += t.numel();
      }
      std::optional<CheckpointManager> lead;
      if (comm.rank() == 0) lead.emplace(dir, 2);
      const auto p = CheckpointManager::save_sharded(lead ? &*lead : nullptr, &comm, at::kCPU, 3, mine, mine.whole,
                                                     nlohmann::json{{"note", "test"}});
      std::lock_guard<std::mutex> lock(m);
      piece_elements[static_cast<size_t>(comm.rank())] = n;
      local[static_cast<size_t>(comm.rank())] = e.local_parameter_elements();
      CHECK(p == dir + "/step_00000003");
      if (comm.rank() == 0) two_state = std::move(full), path = p;
    });
    // one file per rank, each the rank's share of the weights (its slices without the padding)
    CHECK(fs::exists(path + "/shard_00000-of-00002.safetensors"));
    CHECK(fs::exists(path + "/shard_00001-of-00002.safetensors"));
    CHECK_FALSE(fs::exists(path + "/model.safetensors"));
    CHECK(piece_elements[0] + piece_elements[1] == one.total_parameter_elements());
    for (size_t r = 0; r < 2; ++r) {
      CHECK(piece_elements[r] <= local[r]);
      CHECK(piece_elements[r] >= local[r] - 3);  // 3 units, each padded by at most 1 element
    }
    const auto d = CheckpointManager::load(path);
    REQUIRE(d.sharded != nullptr);
    CHECK(d.step == 3);
    CHECK(d.meta["note"] == "test");
    CHECK(d.sharded->files() == 2);
    const auto src = d.source();
    // every tensor of the gathered state, bit for bit, read across the two files
    for (const auto& [k, v] : two_state) {
      CAPTURE(k);
      CHECK(at::equal(src->full(k), v));
    }
    CHECK(src->keys().size() == two_state.size());
    // a range across the files' boundary: the embedding's elements around rank 1's first one
    const auto emb = two_state.at("model.model.embed_tokens.weight").reshape({-1});
    CHECK(at::equal(src->read("model.model.embed_tokens.weight", 5, emb.numel() - 10), emb.narrow(0, 5, emb.numel() - 10)));
    auto close_to_one = [&](const std::map<std::string, at::Tensor>& w) { return worst_rel(w, one_after); };
    // resumed on one process, on 4 ranks and on 4 ranks sharded in groups of 2: the same run
    FSDPEngine resumed(sharded_fixture(), opts, optim, 10);
    resumed.load_state(*src);
    (void)train_three(resumed, 0, 8);
    CHECK(close_to_one(exported(resumed)) <= 1e-5);
    for (const int64_t group : {int64_t{-1}, int64_t{2}}) {
      CAPTURE(group);
      std::vector<double> rel(4, 1.0);
      std::vector<size_t> files(4, 0);
      const auto again = dir + "/g" + std::to_string(group);
      run_on("thread", 4, [&](Communicator& comm) {
        FSDPEngine e(sharded_fixture(), FSDPOptions(opts).shard_group_size(group), optim, 10, borrowed(comm));
        e.load_state(*src);
        // written again by these 4 ranks: sharded in groups of 2, the first replica alone writes
        std::optional<CheckpointManager> lead;
        if (comm.rank() == 0) lead.emplace(again, 1);
        const auto mine = e.sharded_state();
        const auto p = CheckpointManager::save_sharded(lead ? &*lead : nullptr, &comm, at::kCPU, 3, mine, mine.whole, {});
        const auto back = CheckpointManager::load(p);
        (void)train_three(e, comm.rank() * 2, 2);
        const auto w = close_to_one(exported(e));
        std::lock_guard<std::mutex> lock(m);
        rel[static_cast<size_t>(comm.rank())] = w;
        files[static_cast<size_t>(comm.rank())] = back.sharded->files();
      });
      for (size_t r = 0; r < 4; ++r) {
        CHECK(rel[r] <= 1e-5);
        CHECK(files[r] == (group == 2 ? 2u : 4u));
      }
      const auto back = CheckpointManager::load(again + "/step_00000003");
      for (const auto& [k, v] : two_state) CHECK(at::equal(back.source()->full(k), v));
    }

    // damage: each is an Error naming the file or tensor, before anything loads
    auto damaged = [&](const std::string& name, const std::function<void(const std::string&)>& harm) {
      const auto copy = dir + "/" + name + "/step_00000003";
      fs::create_directories(dir + "/" + name);
      fs::copy(path, copy, fs::copy_options::recursive);
      harm(copy);
      return error_of([&] { (void)CheckpointManager::load(copy); });
    };
    CHECK(contains(damaged("missing", [](const std::string& c) { fs::remove(c + "/shard_00001-of-00002.safetensors"); }),
                   "has no shard_00001-of-00002.safetensors"));
    CHECK(contains(damaged("truncated",
                           [](const std::string& c) {
                             fs::resize_file(c + "/shard_00000-of-00002.safetensors",
                                             fs::file_size(c + "/shard_00000-of-00002.safetensors") - 8);
                           }),
                   "shard_00000-of-00002.safetensors"));
    CHECK(contains(damaged("grown",
                           [](const std::string& c) {
                             auto j = nlohmann::json::parse(std::ifstream(c + "/trainer_state.json"));
                             j["shards"]["shapes"]["model.model.norm.weight"] = {65};
                             CheckpointManager::write_state_json(c, j);  // re-stamped: the index is checked
                           }),
                   "elements [64, 65) of 'model.model.norm.weight' are in none of its 2 shard files"));
    CHECK(contains(damaged("unlisted",
                           [](const std::string& c) {
                             auto j = nlohmann::json::parse(std::ifstream(c + "/trainer_state.json"));
                             j["shards"]["shapes"].erase("model.model.norm.weight");
                             CheckpointManager::write_state_json(c, j);  // re-stamped: the index is checked
                           }),
                   "a piece of 'model.model.norm.weight', which the index does not list"));
    // another model's shapes: the engine refuses before anything changes
    CHECK(contains(error_of([&] {
                     FSDPEngine e(sharded_fixture(), opts, optim, 10);
                     StateDict s = two_state;
                     s["model.model.norm.weight"] = at::zeros({3});
                     e.load_state(StateDictSource(s));
                   }),
                   "'model.model.norm.weight' has shape [3] in the state, the model [64]"));

    // a rank that cannot write its part: every rank throws, no step is written, no temporary stays
    std::vector<std::string> errors(2);
    run_on("thread", 2, [&](Communicator& comm) {
      ShardedState mine;
      mine.shapes["x"] = {4};
      mine.pieces[{"x", comm.rank() * 2}] =
          comm.rank() == 1 ? at::zeros({2}, at::kComplexFloat) : at::zeros({2});  // no safetensors dtype
      std::optional<CheckpointManager> lead;
      if (comm.rank() == 0) lead.emplace(dir, 2);
      const auto e = error_of([&] { (void)CheckpointManager::save_sharded(lead ? &*lead : nullptr, &comm, at::kCPU, 4, mine, {}, {}); });
      std::lock_guard<std::mutex> lock(m);
      errors[static_cast<size_t>(comm.rank())] = e;
    });
    CHECK(contains(errors[0], "checkpoint step 4 was not written: rank(s) 1 could not write their part"));
    CHECK_FALSE(errors[1].empty());
    CHECK_FALSE(fs::exists(dir + "/step_00000004"));
    for (const auto& e : fs::directory_iterator(dir)) CHECK(e.path().filename().string().find(io::kTempMarker) == std::string::npos);
    CHECK(CheckpointManager(dir, 2).latest() == std::optional<std::string>(path));
  }

  TEST_CASE("a gathered unit holds q|k|v's and gate|up's weights, then their biases, back to back: one GEMM each (Qwen2)") {
    const auto dir = std::string(HYBRIDRL_FIXTURES_DIR) + "/models/qwen2";
    auto m = load_causal_lm(dir), plain = load_causal_lm(dir);
    REQUIRE(m->model->layer(0)->self_attn->q_proj->bias.defined());
    torch::NoGradGuard ng;
    const auto ids = at::randint(0, m->model->config().vocab_size, {2, 9});
    const auto want = plain->forward(ids);  // the separate projections
    hybridrl::detail::fsdp::Groups g;
    auto units = hybridrl::detail::fsdp::make_units(m->named_parameters(), m->model->config().num_hidden_layers, g,
                                          /*trainable=*/true, "test");
    for (auto& u : units) hybridrl::detail::fsdp::gather(u, g, at::kFloat);
    for (int64_t l = 0; l < m->model->config().num_hidden_layers; ++l) {
      auto layer = m->model->layer(l);
      auto& a = layer->self_attn;
      auto& f = layer->mlp;
      CHECK(stacked_rows({a->q_proj->weight, a->k_proj->weight, a->v_proj->weight}).defined());
      CHECK(stacked_rows({a->q_proj->bias, a->k_proj->bias, a->v_proj->bias}).defined());
      CHECK(stacked_rows({f->gate_proj->weight, f->up_proj->weight}).defined());
    }
    CHECK(max_diff(m->forward(ids), want) < 1e-5);
    // the weights come first in a unit, then the biases, each kept with its name and optimizer index
    const auto& u0 = units.front();
    const auto first_bias = std::find_if(u0.names.begin(), u0.names.end(), [](const std::string& n) {
      return n.find(".bias") != std::string::npos;
    });
    CHECK(std::all_of(first_bias, u0.names.end(), [](const std::string& n) { return n.find(".bias") != std::string::npos; }));
    CHECK(u0.names.size() == u0.index.size());
  }

  TEST_CASE("cpu_offload: master slices, gradients and AdamW state on the CPU; training as without it (1 and 2 ranks); on CUDA the GPU holds none of them") {
    const auto optim = OptimizerOptions{}.lr(1e-2).max_grad_norm(0.5).weight_decay(0.1);
    const auto opts = FSDPOptions{}.param_dtype(at::kFloat);
    FSDPEngine plain(sharded_fixture(), opts, optim, 10);
    const auto ref_norms = train_three(plain, 0, 8);
    const auto ref = exported(plain);
    // one process: the units' machinery with a group of one, the slices on the CPU
    FSDPEngine one(sharded_fixture(), FSDPOptions(opts).cpu_offload(true), optim, 10);
    CHECK(one.shard_count() == 1);
    const auto norms = train_three(one, 0, 8);
    for (size_t s = 0; s < 3; ++s) CHECK(norms[s] == doctest::Approx(ref_norms[s]).epsilon(1e-5));
    CHECK(worst_rel(exported(one), ref) <= 1e-5);
    CHECK(one.local_parameter_elements() == plain.local_parameter_elements());
    // its state is the plain engine's layout: it resumes there, and the other way round
    FSDPEngine back(sharded_fixture(), opts, optim, 10);
    back.load_state_dict(one.state_dict());
    CHECK(worst_rel(exported(back), ref) <= 1e-5);
    FSDPEngine forth(sharded_fixture(), FSDPOptions(opts).cpu_offload(true), optim, 10);
    forth.load_state_dict(plain.state_dict());
    (void)train_three(forth, 0, 8);
    (void)train_three(plain, 0, 8);
    CHECK(worst_rel(exported(forth), exported(plain)) <= 1e-5);
    // two ranks offloading: as one process
    std::mutex m;
    std::vector<double> rel(2, 1.0);
    run_on("thread", 2, [&](Communicator& comm) {
      FSDPEngine e(sharded_fixture(), FSDPOptions(opts).cpu_offload(true), optim, 10, borrowed(comm));
      const auto n = train_three(e, comm.rank() * 4, 4);
      const auto w = worst_rel(exported(e), ref);
      std::lock_guard<std::mutex> lock(m);
      rel[static_cast<size_t>(comm.rank())] = w;
      for (size_t s = 0; s < 3; ++s) CHECK(n[s] == doctest::Approx(ref_norms[s]).epsilon(1e-5));
    });
    for (const auto r : rel) CHECK(r <= 1e-5);
    if (!at::hasCUDA()) {
      MESSAGE("no CUDA device: the GPU memory half of this case runs on GPU machines");
      return;
    }
    // on CUDA: what a trained engine keeps allocated on the GPU beyond the model it was given —
    // without offload AdamW's two moments (8 bytes a parameter; LibTorch 2.x's zero_grad frees the
    // gradients after each step), with offload nothing (the model's parameters are emptied: 4
    // bytes a parameter fewer), so offloading takes the master slice and both moments off the GPU
    const auto cuda = at::Device(at::kCUDA, 0);
    auto held = [&](bool offload, std::map<std::string, at::Tensor>* weights) {
      auto model = sharded_fixture();
      model->to(cuda);
      const auto before = hybridrl::detail::compat::cuda_memory(0).allocated;
      FSDPEngine e(model, FSDPOptions(opts).cpu_offload(offload), optim, 10);
      (void)train_three(e, 0, 8);
      const auto after = hybridrl::detail::compat::cuda_memory(0).allocated;
      *weights = exported(e);
      for (auto& [k, t] : *weights) t = t.cpu();
      return static_cast<int64_t>(after) - static_cast<int64_t>(before);
    };
    std::map<std::string, at::Tensor> on_gpu, offloaded;
    // a first engine pays the process's one-time CUDA allocations (cuBLAS's workspace at its
    // first GEMM), which would otherwise be counted as the measured engine's
    (void)held(false, &on_gpu);
    const auto plain_bytes = held(false, &on_gpu), offload_bytes = held(true, &offloaded);
    const auto params = plain.total_parameter_elements();
    CAPTURE(plain_bytes);
    CAPTURE(offload_bytes);
    CHECK(plain_bytes >= 8 * params);
    CHECK(offload_bytes <= 0);
    CHECK(plain_bytes - offload_bytes >= 12 * params);
    CHECK(worst_rel(offloaded, on_gpu) <= 1e-5);
  }
}
