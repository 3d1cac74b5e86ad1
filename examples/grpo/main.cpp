// GRPO on the built-in `reverse` task, written out step by step: what `hybridrl train --config
// examples/grpo/config.yaml` does, with the library's calls in view — swap any step for your own
// (a checkpoint and JSONL prompts, your reward function, your trainer type).
//   example_grpo --config examples/grpo/config.yaml [key=value ...]
#include <hybridrl/hybridrl.hpp>
#include <hybridrl/trainer/run.hpp>

#include <cstdio>

using namespace hybridrl;

int main(int argc, char** argv) try {
  // 1. The configuration: config.yaml < HYBRIDRL_* environment < key=value arguments. Every key
  //    is checked here, before anything is loaded; a mistyped one names the nearest spelling.
  const auto sources = read_run_sources(argc, argv);
  sources.require("grpo", "paged");
  const auto cfg = configure_run<GRPOTrainer>(sources.sources);

  // 2. The tokenizer (model.path's tokenizer.json or tokenizer.model; the byte tokenizer for
  //    model.init=tiny) and the prompts: the built-in task's, or data.train_files (JSONL with a
  //    "prompt" per line, or data.prompt_key's field). Both before the weights: a bad line fails fast.
  auto tok = load_run_tokenizer(cfg.model());
  auto prompts = read_run_data<PromptDataset>(cfg.task(), cfg.run().data().train_files(), tok.tokenizer,
                                              cfg.run().data().dataset());

  // 3. The policy: model.path (a Hugging Face checkpoint) or model.init=tiny.
  auto model = load_run_model(cfg.model(), cfg.run().trainer().seed(), std::move(tok));

  // 4. The reward: any callable on (sample, response text and ids) -> score. The task's checks
  //    the reversed digits; builtin_reward("gsm8k") and friends read a dataset's "answer".
  RewardFn reward = task_reward();

  // 5. Train: the trainer type is fixed at compile time (GRPOTrainer = Trainer<Algorithm<GRPO>,
  //    Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>), its numbers come from the configuration.
  GRPOTrainer trainer(cfg.run());
  std::fprintf(stderr, "%s\n", trainer.describe().c_str());
  FitParts parts;
  parts.decode = run_decode(model.tokenizer);  // the reward reads response text
  parts.tokenizer_files = model.tokenizer_files;
  parts.run_config = to_json(cfg);
  const auto result = trainer.fit(model.policy, prompts, batched(reward), parts);

  std::printf("done, %lld steps: reward_mean %.3f; metrics, plot and model under %s\n",
              static_cast<long long>(result.steps), result.last_metrics.at("reward_mean"),
              cfg.run().trainer().output_dir().c_str());
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
