// KTO on labelled completions, step by step: what `hybridrl train --config examples/kto/config.yaml`
// does. Each row is one completion marked desirable or not — no pairs needed. The rows come from
// the built-in `reverse` task (every second completion corrupted and labelled undesirable) or from
// data.train_files — JSONL with {"prompt", "completion", "label": true|false} per line.
//   example_kto --config examples/kto/config.yaml [key=value ...]
#include <hybridrl/hybridrl.hpp>
#include <hybridrl/trainer/run.hpp>

#include <cstdio>

using namespace hybridrl;

int main(int argc, char** argv) try {
  const auto sources = read_run_sources(argc, argv);  // --config FILE and key=value arguments
  sources.require("kto");
  const auto cfg = configure_run<KTOTrainer>(sources.sources);  // every key checked here

  auto tok = load_run_tokenizer(cfg.model());  // the data is read before the weights load
  auto rows = read_run_data<LabelledDataset>(cfg.task(), cfg.run().data().train_files(), tok.tokenizer,
                                             cfg.run().data().dataset());
  auto model = load_run_model(cfg.model(), cfg.run().trainer().seed(), std::move(tok));

  // The reference point z0 is the batch's KL to the frozen reference on mismatched pairs (TRL's
  // KTOTrainer); algorithm.desirable_weight and undesirable_weight rebalance unequal classes.
  FitParts parts;
  parts.tokenizer_files = model.tokenizer_files;
  parts.run_config = to_json(cfg);
  KTOTrainer trainer(cfg.run());
  std::fprintf(stderr, "%s\n", trainer.describe().c_str());
  const auto result = trainer.fit(model.policy, rows, parts);

  std::printf("done, %lld steps: loss %.4f; the model is under %s/model\n", static_cast<long long>(result.steps),
              result.last_metrics.at("loss"), cfg.run().trainer().output_dir().c_str());
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
