// Composes the user-written RLOO policy (rloo.hpp) into a trainer type and runs its hooks on a
// tiny hand-made batch: 2 prompts x 3 samples, responses of up to 4 tokens.
#include "rloo.hpp"

#include <iostream>
#include <vector>

using namespace hybridrl;

using RlooTrainer = Trainer<Algorithm<RLOO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;

int main() {
  auto rloo = RLOOOptions{}.policy_loss(PolicyLossOptions{}.clip_low(0.2).clip_high(0.28));
  RlooTrainer trainer(RlooTrainer::Options{}.algorithm(rloo));  // validates every option
  std::cout << trainer.describe() << "\n";

  // Outcome rewards of 6 samples: samples 0-2 answer prompt 0, samples 3-5 prompt 1.
  auto mask = at::ones({6, 4});
  mask[1][3] = 0;  // sample 1 stopped after 3 tokens
  auto old_log_probs = -at::linspace(0.5, 2.0, 24).reshape({6, 4});
  auto log_probs = (old_log_probs + 0.1).set_requires_grad(true);  // "the policy moved a bit"
  TensorBatch batch({{"scores", at::tensor(std::vector<float>{1, 0, 0, 1, 1, 0})},
                     {"group_ids", at::tensor(std::vector<int64_t>{0, 0, 0, 1, 1, 1})},
                     {"response_mask", mask},
                     {"old_log_probs", old_log_probs},
                     {"log_probs", log_probs}});

  // The two hooks the trainer calls: advantages once per batch, the loss per micro-batch.
  Algorithm<RLOO>::compute_advantages(batch, trainer.options().algorithm());
  auto out = Algorithm<RLOO>::loss(batch, trainer.options().algorithm(),
                                   LossCounts{mask.sum().item<int64_t>(), 6, 1});
  out.loss.backward();

  std::cout << "advantages (first token):";
  for (int64_t i = 0; i < 6; ++i) std::cout << ' ' << batch.tensor("advantages")[i][0].item<float>();
  std::cout << "\nloss " << out.loss.item<float>()
            << "  clipfrac " << out.metrics.at("actor/pg_clipfrac").item<float>()
            << "  grad norm " << log_probs.grad().norm().item<float>() << "\n";
  return 0;
}
