// reward_model_reward: a frozen reward model as a batched reward — each input scored as its prompt
// ids then its response ids, in micro-batches, equal to transformers' sequence-classification
// scores of the same tokens (tests/fixtures/models/llama_rm, make_model_fixtures.py
// --reward-model); and score_rollout hands it the prompt ids without their padding.
#include <hybridrl/hybridrl.hpp>

#include <span>
#include <string>
#include <vector>

#include "../support/fit.hpp"
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"

using namespace hybridrl;
using namespace hybridrl::testing;

TEST_SUITE("trainer/reward_model") {
  TEST_CASE("reward_model_reward scores prompt + response tokens as transformers does, in micro-batches") {
    const auto dir = std::string(HYBRIDRL_FIXTURES_DIR) + "/models/llama_rm";
    const auto ref = load_safetensors(dir + "/hf_scores.safetensors");
    const auto ids = ref.at("right.input_ids"), mask = ref.at("right.attention_mask");
    const auto want = ref.at("right.scores");
    // the right-padded rows (12, 9 and 5 tokens), cut into 3 prompt tokens and the rest as the response
    std::vector<std::vector<int64_t>> prompt(3), response(3);
    for (int64_t b = 0; b < 3; ++b) {
      const auto n = mask[b].sum().item<int64_t>();
      for (int64_t j = 0; j < n; ++j) (j < 3 ? prompt : response)[static_cast<size_t>(b)].push_back(ids[b][j].item<int64_t>());
    }
    std::vector<RewardInput> in(3);
    for (size_t b = 0; b < 3; ++b) {
      in[b].response_ids = response[b];
      in[b].prompt_ids = prompt[b];
    }
    for (int64_t micro : {1, 2, 16}) {
      CAPTURE(micro);
      const auto got = reward_model_reward(load_reward_model(dir), micro)(in);
      REQUIRE(got.size() == 3);
      for (int64_t b = 0; b < 3; ++b) CHECK(got[static_cast<size_t>(b)] == doctest::Approx(want[b].item<double>()).epsilon(1e-5));
    }
    std::vector<RewardInput> empty(1);
    CHECK(contains(error_of([&] { (void)reward_model_reward(load_reward_model(dir))(empty); }),
                   "has neither prompt nor response tokens"));
    CHECK(contains(error_of([&] { (void)reward_model_reward(load_reward_model(dir), 0); }), "micro_batch_size = 0"));
  }

  TEST_CASE("score_rollout gives each reward its prompt ids without the left padding") {
    // two rows: prompts left-padded to 4 ([0 0 7 8], [5 6 7 8]), responses of 2 and 1 tokens
    const auto prompts = at::tensor(std::vector<int64_t>{0, 0, 7, 8, 5, 6, 7, 8}).reshape({2, 4});
    const auto responses = at::tensor(std::vector<int64_t>{9, 10, 11, 0}).reshape({2, 2});
    const auto attention = at::tensor(std::vector<int64_t>{0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0}).reshape({2, 6});
    const auto rmask = at::tensor(std::vector<int64_t>{1, 1, 1, 0}).reshape({2, 2});
    TensorBatch batch({{keys::prompts.str(), prompts}, {keys::responses.str(), responses},
                       {keys::attention_mask.str(), attention}, {keys::response_mask.str(), rmask}});
    std::vector<std::vector<int64_t>> seen_prompts, seen_responses;
    auto reward = [&](std::span<const RewardInput> in) {
      for (const auto& x : in) {
        seen_prompts.emplace_back(x.prompt_ids.begin(), x.prompt_ids.end());
        seen_responses.emplace_back(x.response_ids.begin(), x.response_ids.end());
      }
      return std::vector<double>(in.size(), 0.5);
    };
    const auto scores = hybridrl::detail::score_rollout(batch, reward, {});
    CHECK(at::equal(scores, at::full({2}, 0.5f)));
    REQUIRE(seen_prompts.size() == 2);
    CHECK(seen_prompts[0] == std::vector<int64_t>{7, 8});
    CHECK(seen_prompts[1] == std::vector<int64_t>{5, 6, 7, 8});
    CHECK(seen_responses[0] == std::vector<int64_t>{9, 10});
    CHECK(seen_responses[1] == std::vector<int64_t>{11});
  }
}
