// PPO with a critic on the built-in `reverse` task, step by step: what `hybridrl train --config
// examples/ppo/config.yaml` does. PPO's parts beyond GRPO's: the critic (a value model trained
// beside the policy: critic.* keys), GAE advantages (algorithm.gamma, algorithm.lam) and the
// optional KL penalty in the reward (algorithm.use_kl_in_reward, fixed or adaptive).
//   example_ppo --config examples/ppo/config.yaml [key=value ...]
#include <hybridrl/hybridrl.hpp>
#include <hybridrl/trainer/run.hpp>

#include <cstdio>

using namespace hybridrl;

int main(int argc, char** argv) try {
  const auto sources = read_run_sources(argc, argv);  // --config FILE and key=value arguments
  sources.require("ppo", "paged");
  const auto cfg = configure_run<PPOTrainer>(sources.sources);  // every key checked here

  auto tok = load_run_tokenizer(cfg.model());  // the data is read before the weights load
  auto prompts = read_run_data<PromptDataset>(cfg.task(), cfg.run().data().train_files(), tok.tokenizer,
                                              cfg.run().data().dataset());
  auto model = load_run_model(cfg.model(), cfg.run().trainer().seed(), std::move(tok));

  FitParts parts;
  // The critic: a ...ForTokenClassification checkpoint (model.critic_path), or by default the
  // policy's trunk with a fresh score head drawn from trainer.seed (verl's critic init).
  if (!cfg.model().critic_path().empty()) {
    parts.critic = load_value_model(cfg.model().critic_path(), LoadOptions{}.dtype(cfg.model().dtype()));
  }
  parts.decode = run_decode(model.tokenizer);
  parts.tokenizer_files = model.tokenizer_files;
  parts.run_config = to_json(cfg);

  // The update, per mini-batch: the critic's value loss (clipped by algorithm.cliprange_value),
  // then — after critic.warmup_steps — the policy's clipped surrogate on the GAE advantages.
  PPOTrainer trainer(cfg.run());
  std::fprintf(stderr, "%s\n", trainer.describe().c_str());
  const auto result = trainer.fit(model.policy, prompts, batched(task_reward()), parts);

  const auto& m = result.last_metrics;
  std::printf("done, %lld steps: reward_mean %.3f, critic/vf_loss %.4f; the critic is saved under %s/critic\n",
              static_cast<long long>(result.steps), m.at("reward_mean"), m.at("critic/vf_loss"),
              cfg.run().trainer().output_dir().c_str());
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
