// Composes the user-written RLOO policy (rloo.hpp) into a trainer type and runs its hooks on a
// tiny hand-made batch, as the trainer does: 2 prompts x 3 samples, responses of up to 4 tokens.
#include "rloo.hpp"

#include <cmath>
#include <iostream>
#include <vector>

using namespace hybridrl;

using RLOOTrainer = Trainer<Algorithm<RLOO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
using A = Algorithm<RLOO>;

int main() {
  auto rloo = RLOOOptions{};
  rloo.actor().clip_low(0.2).clip_high(0.28);
  RLOOTrainer trainer(RLOOTrainer::Options{}.algorithm(rloo));  // validates every option
  std::cout << trainer.describe() << "\n";
  const auto& opts = trainer.options().algorithm();

  // Outcome rewards of 6 samples: samples 0-2 answer prompt 0, samples 3-5 prompt 1.
  auto mask = at::ones({6, 4});
  mask[1][3] = 0;  // sample 1 stopped after 3 tokens
  auto old_log_probs = -at::linspace(0.5, 2.0, 24).reshape({6, 4});
  auto log_probs = (old_log_probs + 0.1).set_requires_grad(true);  // "the policy moved a bit"
  TensorBatch batch({{keys::scores, at::tensor(std::vector<float>{1, 0, 0, 1, 1, 0})},
                     {keys::group_ids, at::tensor(std::vector<int64_t>{0, 0, 0, 1, 1, 1})},
                     {keys::response_mask, mask},
                     {keys::old_log_probs, old_log_probs},
                     {keys::log_probs, log_probs}});

  // The hooks the trainer calls, in order: state once; advantages once per batch; per mini-batch
  // prepare, then the loss per micro-batch (here 2), metrics aggregated; after_step at the end.
  auto state = A::make_state(opts);
  A::compute_advantages(batch, opts, state);
  A::prepare_mini_batch(batch, opts, state, nullptr);
  const LossCounts counts{mask.sum().item<int64_t>(), 6, 1};
  MetricAggregator metrics;
  at::Tensor total = at::zeros({});
  for (const auto& micro : batch.chunk(2)) {
    auto out = A::loss(micro, opts, state, counts);
    out.loss.backward();
    total = total + out.loss.detach();
    metrics.add(out);
  }
  A::after_step(batch, opts, state, nullptr);

  std::cout << "advantages (first token):";
  for (int64_t i = 0; i < 6; ++i) std::cout << ' ' << batch.tensor(keys::advantages)[i][0].item<float>();
  const auto m = metrics.result();
  const double loss = total.item<double>(), grad = log_probs.grad().norm().item<double>();
  std::cout << "\nloss " << loss << "  clipfrac " << m.at("actor/pg_clipfrac")
            << "  grad norm " << grad << "\n";
  if (!std::isfinite(loss) || !std::isfinite(grad)) {
    std::cerr << "non-finite loss or gradient\n";
    return 1;
  }
  return 0;
}
