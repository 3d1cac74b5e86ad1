// SFT on (prompt, completion) pairs, step by step: what `hybridrl train --config
// examples/sft/config.yaml` does — the warm-up before RL (scripts/demo.sh runs it before GRPO).
// The pairs come from the built-in `reverse` task or from data.train_files — JSONL with
// {"prompt", "completion"} per line; the loss is the completion tokens' cross-entropy
// (algorithm.loss_agg: token_mean, as transformers computes it, or seq_mean_token_mean).
//   example_sft --config examples/sft/config.yaml [key=value ...]
#include <hybridrl/hybridrl.hpp>
#include <hybridrl/trainer/run.hpp>

#include <cstdio>

using namespace hybridrl;

int main(int argc, char** argv) try {
  const auto sources = read_run_sources(argc, argv);  // --config FILE and key=value arguments
  sources.require("sft");
  const auto cfg = configure_run<SFTTrainer>(sources.sources);  // every key checked here

  auto tok = load_run_tokenizer(cfg.model());  // the data is read before the weights load
  auto pairs = read_run_data<CompletionDataset>(cfg.task(), cfg.run().data().train_files(), tok.tokenizer,
                                                cfg.run().data().dataset());
  auto model = load_run_model(cfg.model(), cfg.run().trainer().seed(), std::move(tok));

  FitParts parts;
  parts.tokenizer_files = model.tokenizer_files;  // copied next to the final model
  parts.run_config = to_json(cfg);
  SFTTrainer trainer(cfg.run());  // SFTTrainer = Trainer<Algorithm<SFT>, Sharding<FSDP>, Loader<Packed>>
  std::fprintf(stderr, "%s\n", trainer.describe().c_str());
  const auto result = trainer.fit(model.policy, pairs, parts);

  // output_dir/model is a Hugging Face directory: transformers loads it, and so does the next run
  // (model.path=<output_dir>/model, e.g. GRPO from the tuned model).
  std::printf("done, %lld steps: loss %.4f; next: model.path=%s/model\n", static_cast<long long>(result.steps),
              result.last_metrics.at("loss"), cfg.run().trainer().output_dir().c_str());
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
