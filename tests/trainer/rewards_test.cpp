// trainer/rewards.hpp: the built-in rewards on hand-written responses — GSM8K's strict and
// flexible extraction, \boxed{} answers and their normalisation, exact match — the per-row ground
// truth lookup, batching, and the errors.

#include <hybridrl/trainer/rewards.hpp>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using hybridrl::testing::contains;
using hybridrl::testing::error_of;

TEST_SUITE("trainer/rewards") {
  TEST_CASE("GSM8K: strict takes the number after '#### ', flexible the last number") {
    CHECK(gsm8k_answer("3 + 4 = 7 apples\n#### 1,234") == std::optional<std::string>("1234"));
    CHECK(gsm8k_answer("#### -12.5 dollars") == std::optional<std::string>("-12.5"));
    CHECK(!gsm8k_answer("the answer is 7").has_value());
    CHECK(gsm8k_answer("I had 3 apples and ate 2, so 1.", GSM8KExtraction::flexible) == std::optional<std::string>("1"));
    CHECK(!gsm8k_answer("no digits here.", GSM8KExtraction::flexible).has_value());
    // only the last 300 characters are searched
    const std::string early = "#### 7 " + std::string(400, 'x');
    CHECK(!gsm8k_answer(early).has_value());
    // the score against a GSM8K "answer" field (a full solution ending in #### N)
    const std::string truth = "Natalia sold 48/2 = 24 clips in May.\n#### 72";
    CHECK(gsm8k_score("so 48 + 24 = 72\n#### 72", truth) == 1.0);
    CHECK(gsm8k_score("#### 70", truth) == 0.0);
    CHECK(gsm8k_score("#### 70", truth, GSM8KExtraction::strict, 0.1) == 0.1);  // a well-formed wrong answer
    CHECK(gsm8k_score("72", truth, GSM8KExtraction::strict, 0.1) == 0.0);       // no answer at all
    CHECK(gsm8k_score("the total is 72.", truth, GSM8KExtraction::flexible) == 1.0);
    CHECK(gsm8k_score("#### 1,000", "1000") == 1.0);
  }

  TEST_CASE("boxed answers: the last \\boxed{} with balanced braces, normalised LaTeX") {
    CHECK(last_boxed("so x = \\boxed{\\frac{1}{2}}.") == std::optional<std::string>("\\frac{1}{2}"));
    CHECK(last_boxed("\\boxed{1} then \\boxed{2}") == std::optional<std::string>("2"));
    CHECK(last_boxed("\\fbox{3}") == std::optional<std::string>("3"));
    CHECK(!last_boxed("\\boxed{1").has_value());
    CHECK(!last_boxed("no box").has_value());
    CHECK(normalize_math_answer("\\dfrac{1}{2}") == "\\frac{1}{2}");
    CHECK(normalize_math_answer(" 2.50 ") == "2.5");
    CHECK(normalize_math_answer("3.0") == "3");
    CHECK(normalize_math_answer("90^\\circ") == "90");
    CHECK(normalize_math_answer(".5") == "0.5");
    CHECK(normalize_math_answer("\\left( 1, 2 \\right)") == "(1,2)");
    CHECK(normalize_math_answer("$100$") == "100");
    CHECK(boxed_math_score("thus \\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}") == 1.0);
    CHECK(boxed_math_score("thus \\boxed{0.75}", "\\boxed{\\frac{3}{4}}") == 0.0);  // no symbolic equivalence
    CHECK(boxed_math_score("\\boxed{2.50}", "2.5") == 1.0);
    CHECK(boxed_math_score("2.5", "2.5") == 0.0);  // no box, no answer
  }

  TEST_CASE("built-ins read the row's ground truth; batched keeps the order; errors name the fix") {
    const auto gsm = nlohmann::json::parse(R"({"prompt": "q", "answer": "work\n#### 5"})");
    const auto verl = nlohmann::json::parse(R"({"prompt": "q", "reward_model": {"ground_truth": "5"}})");
    const auto num = nlohmann::json::parse(R"({"prompt": "q", "answer": 5})");
    auto gsm8k = builtin_reward("gsm8k");
    CHECK(gsm8k(RewardInput{&gsm, "q", "#### 5", {}}) == 1.0);
    CHECK(gsm8k(RewardInput{&verl, "q", "#### 5", {}}) == 1.0);
    CHECK(builtin_reward("exact_match")(RewardInput{&num, "q", " 5\n", {}}) == 1.0);
    CHECK(builtin_reward("gsm8k_flexible")(RewardInput{&gsm, "q", "it is 5.", {}}) == 1.0);
    CHECK(builtin_reward("boxed_math")(RewardInput{&num, "q", "\\boxed{5}", {}}) == 1.0);
    const std::vector<RewardInput> in{{&gsm, "q", "#### 5", {}}, {&gsm, "q", "#### 4", {}}, {&gsm, "q", "", {}}};
    CHECK(batched(gsm8k)(in) == std::vector<double>{1.0, 0.0, 0.0});
    CHECK(contains(error_of([] { builtin_reward("gsm8"); }), "reward \"gsm8\" is not a built-in reward"));
    const auto bare = nlohmann::json::parse(R"({"prompt": "q"})");
    CHECK(contains(error_of([&] { gsm8k(RewardInput{&bare, "q", "#### 5", {}}); }), "the sample has no \"answer\""));
  }
}
