// ShardedFrozen: a frozen model (the reference policy, a reward model) sharded over 2 and 4 ranks
// (threads over hybridrl's thread group and over c10d Gloo where LibTorch ships it) computes what
// the whole model computes on one process — log-probs of rows of varied lengths, reward scores
// equal to transformers' — while a rank stores 1/shards of its weights (and none of them outside
// run()); Sharding<FSDP>'s make_reference() is a frozen copy of the trained weights as they stand
// and stays put while the policy trains on; adopt_reference() shards a given model; errors.

#include <hybridrl/hybridrl.hpp>

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "../support/gloo.hpp"
#include "../support/sharding.hpp"
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using namespace hybridrl::testing;

namespace {
// this model's parameter elements that are stored now (sharded, outside run(): none)
int64_t stored_elements(const CausalLM& m) {
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  return n;
}
at::Tensor log_probs_of(const ShardedFrozen<CausalLM>& f, const TensorBatch& rows) {
  return hybridrl::detail::frozen_forward(f, LogProbOptions{})(rows).tensor(keys::log_probs);
}
double max_abs(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }
}  // namespace

TEST_SUITE("sharding/frozen") {
  TEST_CASE("a reference sharded over 2 and 4 ranks gives the whole model's log-probs; a rank stores 1/shards") {
    const auto full = sharded_fixture();
    const auto total = [&] {
      int64_t n = 0;
      for (const auto& p : full->parameters()) n += p.numel();
      return n;
    }();
    // every row's log-probs on one process, from the model as loaded
    const auto want = hybridrl::detail::frozen_forward(full, LogProbOptions{})(sharded_rows(0, 8)).tensor(keys::log_probs);
    for (const auto& backend : backends()) {
      for (const auto& [world, group] : std::vector<std::pair<int, int64_t>>{{2, -1}, {4, -1}, {4, 2}}) {
        CAPTURE(backend);
        CAPTURE(world);
        CAPTURE(group);
        std::mutex m;
        std::vector<at::Tensor> got(static_cast<size_t>(world));
        std::vector<int64_t> local(static_cast<size_t>(world)), totals(static_cast<size_t>(world)),
            stored(static_cast<size_t>(world));
        std::vector<bool> sharded(static_cast<size_t>(world));
        run_on(backend, world, [&](Communicator& comm) {
          ShardedFrozen<CausalLM> ref(sharded_fixture(), borrowed(comm), at::kFloat, group);
          // rank r scores rows [2r, 2r + 2) in two micro-batches of one row: run() is collective,
          // each rank with its own rows
          const int64_t share = 8 / world;
          std::vector<at::Tensor> parts;
          for (int64_t i = 0; i < share; ++i) parts.push_back(log_probs_of(ref, sharded_rows(comm.rank() * share + i, 1)));
          std::lock_guard<std::mutex> lock(m);
          const auto r = static_cast<size_t>(comm.rank());
          got[r] = at::cat(parts);
          local[r] = ref.local_parameter_elements();
          totals[r] = ref.total_parameter_elements();
          stored[r] = stored_elements(ref.model());
          sharded[r] = ref.sharded();
        });
        const int64_t shards = group < 0 ? world : group;
        for (int r = 0; r < world; ++r) {
          CAPTURE(r);
          const auto share = 8 / world;
          CHECK(max_abs(got[static_cast<size_t>(r)], want.narrow(0, r * share, share)) <= 1e-6);
          CHECK(sharded[static_cast<size_t>(r)]);
          CHECK(totals[static_cast<size_t>(r)] == total);
          // each unit padded to a multiple of the shard count: L layers + the root
          const int64_t units = full->config().num_hidden_layers + 1;
          CHECK(local[static_cast<size_t>(r)] * shards >= total);
          CHECK(local[static_cast<size_t>(r)] * shards <= total + units * shards);
          CHECK(stored[static_cast<size_t>(r)] == 0);  // the gathered weights are freed after run()
        }
      }
    }
  }

  TEST_CASE("one process: the model as given, its weights cast to param_dtype when it differs") {
    ShardedFrozen<CausalLM> ref(sharded_fixture(), nullptr, at::kFloat);
    CHECK_FALSE(ref.sharded());
    CHECK(ref.local_parameter_elements() == ref.total_parameter_elements());
    const auto rows = sharded_rows(0, 4);
    const auto want = hybridrl::detail::frozen_forward(sharded_fixture(), LogProbOptions{})(rows).tensor(keys::log_probs);
    CHECK(max_abs(log_probs_of(ref, rows), want) <= 1e-6);
    for (const auto& p : ref.model()->parameters()) CHECK_FALSE(p.requires_grad());
    // bf16: what the policy's one-process engine computes (on bf16 copies of its weights), not
    // what fp32 gives: a reference equal to the policy scores as it does
    ShardedFrozen<CausalLM> bf(sharded_fixture(), nullptr, at::kBFloat16);
    auto engine = Sharding<FSDP>::make(sharded_fixture(), FSDPOptions{}.param_dtype(at::kBFloat16), OptimizerOptions{}, 1);
    at::Tensor want_bf;
    {
      c10::NoGradGuard ng;
      want_bf = engine.forward(rows).tensor(keys::log_probs);
    }
    CHECK(max_abs(log_probs_of(bf, rows), want_bf) == 0.0);
    CHECK(max_abs(want_bf, want) > 1e-4);  // bf16 is in effect
    for (const auto& p : bf.model()->parameters()) CHECK((p.scalar_type() == at::kBFloat16));
    CHECK(contains(error_of([] { ShardedFrozen<CausalLM>(sharded_fixture(), nullptr, at::kFloat, 3); }),
                   "shard_group_size = 3 does not divide"));
  }

  TEST_CASE("FSDP make_reference copies the trained weights as they stand and stays put; adopt_reference shards a given model") {
    const auto optim = OptimizerOptions{}.lr(1e-2);
    const auto rows = sharded_rows(0, 2);
    std::mutex m;
    std::vector<double> at_copy(2), after(2), moved(2), adopted(2);
    std::vector<int64_t> local(2), engine_local(2);
    // the given reference: the model as loaded, on one process
    const auto want_given = hybridrl::detail::frozen_forward(sharded_fixture(), LogProbOptions{})(rows).tensor(keys::log_probs);
    run_on("thread", 2, [&](Communicator& comm) {
      FSDPEngine e(sharded_fixture(), FSDPOptions{}.param_dtype(at::kFloat), optim, 10, borrowed(comm));
      (void)train_three(e, comm.rank() * 4, 4);
      auto policy_lp = [&] {
        c10::NoGradGuard ng;
        return e.forward(rows).tensor(keys::log_probs).detach().clone();
      };
      const auto trained = policy_lp();
      const auto ref = e.make_reference();
      const auto ref_lp = log_probs_of(ref, rows);
      (void)train_three(e, comm.rank() * 4, 4);  // the policy moves on; the reference must not
      const auto ref_lp_after = log_probs_of(ref, rows);
      const auto policy_after = policy_lp();
      const auto given = e.adopt_reference(sharded_fixture());
      const auto given_lp = log_probs_of(given, rows);
      std::lock_guard<std::mutex> lock(m);
      const auto r = static_cast<size_t>(comm.rank());
      at_copy[r] = max_abs(ref_lp, trained);
      after[r] = max_abs(ref_lp_after, ref_lp);
      moved[r] = max_abs(policy_after, trained);
      adopted[r] = max_abs(given_lp, want_given);
      local[r] = ref.local_parameter_elements();
      engine_local[r] = e.local_parameter_elements();
    });
    for (size_t r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(at_copy[r] <= 1e-6);
      CHECK(after[r] == 0.0);
      CHECK(moved[r] > 1e-3);  // the policy did train
      CHECK(adopted[r] <= 1e-6);
      CHECK(local[r] == engine_local[r]);  // the reference takes what the policy's parameters take
    }
  }

  TEST_CASE("a reward model sharded over 2 ranks scores as transformers does; unequal shares or a bad input on one rank are refused on every rank") {
    const auto dir = std::string(HYBRIDRL_FIXTURES_DIR) + "/models/llama_rm";
    const auto ref = load_safetensors(dir + "/hf_scores.safetensors");
    const auto ids = ref.at("right.input_ids"), mask = ref.at("right.attention_mask");
    const auto want = ref.at("right.scores");
    // four inputs: the three reference rows (3 prompt tokens, the rest the response) and the first again
    std::vector<RewardInput> in(4);
    std::vector<std::vector<int64_t>> prompt(4), response(4);
    for (int64_t i = 0; i < 4; ++i) {
      const auto b = i % 3, n = mask[b].sum().item<int64_t>();
      for (int64_t j = 0; j < n; ++j) (j < 3 ? prompt : response)[static_cast<size_t>(i)].push_back(ids[b][j].item<int64_t>());
      in[static_cast<size_t>(i)].prompt_ids = prompt[static_cast<size_t>(i)];
      in[static_cast<size_t>(i)].response_ids = response[static_cast<size_t>(i)];
    }
    for (const auto& backend : backends()) {
      CAPTURE(backend);
      std::mutex m;
      std::vector<std::vector<double>> got(2);
      std::vector<std::string> unequal(2), unscorable(2);
      std::vector<int64_t> local(2), total(2);
      run_on(backend, 2, [&](Communicator& comm) {
        auto rm = std::make_shared<ShardedFrozen<RewardModel>>(load_reward_model(dir), borrowed(comm), at::kFloat);
        const auto score = reward_model_reward(rm, /*micro_batch_size=*/1, borrowed(comm));
        const auto r = static_cast<size_t>(comm.rank());
        auto mine = score(std::span<const RewardInput>(in).subspan(r * 2, 2));
        // rank 0 one input, rank 1 two: both ranks refuse before any forward
        auto err = error_of([&] { (void)score(std::span<const RewardInput>(in).subspan(0, r + 1)); });
        // rank 1's second input has no tokens: it says so, rank 0 is told another rank cannot go on
        std::vector<RewardInput> odd(in.begin(), in.begin() + 2);
        if (r == 1) odd[1] = RewardInput{};
        auto err_empty = error_of([&] { (void)score(odd); });
        std::lock_guard<std::mutex> lock(m);
        got[r] = mine;
        unequal[r] = err;
        unscorable[r] = err_empty;
        local[r] = rm->local_parameter_elements();
        total[r] = rm->total_parameter_elements();
      });
      for (size_t r = 0; r < 2; ++r) {
        CAPTURE(r);
        REQUIRE(got[r].size() == 2);
        for (size_t i = 0; i < 2; ++i) {
          const auto b = static_cast<int64_t>((r * 2 + i) % 3);
          CHECK(got[r][i] == doctest::Approx(want[b].item<double>()).epsilon(1e-5));
        }
        CHECK(contains(unequal[r], "the ranks score between 1 and 2 responses"));
        CHECK(contains(unscorable[r], r == 1 ? "input 1 has neither prompt nor response tokens"
                                             : "another rank's responses cannot be scored"));
        CHECK(local[r] * 2 < total[r] + 64);
        CHECK(local[r] * 2 >= total[r]);
      }
    }
  }
}
