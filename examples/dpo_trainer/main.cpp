// DPO on preference pairs, step by step: what `hybridrl train --config
// examples/dpo_trainer/config.yaml` does (TRL users: this is DPOTrainer). The pairs come from the
// built-in `reverse` task (chosen: the right answer; rejected: one digit wrong) or from
// data.train_files — JSONL with {"prompt", "chosen", "rejected"} per line.
//   example_dpo_trainer --config examples/dpo_trainer/config.yaml [key=value ...]
#include <hybridrl/hybridrl.hpp>
#include <hybridrl/trainer/run.hpp>

#include <cstdio>

using namespace hybridrl;

int main(int argc, char** argv) try {
  const auto sources = read_run_sources(argc, argv);  // --config FILE and key=value arguments
  sources.require("dpo");
  const auto cfg = configure_run<DPOTrainer>(sources.sources);  // every key checked here

  auto tok = load_run_tokenizer(cfg.model());  // the data is read before the weights load
  auto pairs = read_run_data<PreferenceDataset>(cfg.task(), cfg.run().data().train_files(), tok.tokenizer,
                                                cfg.run().data().dataset());
  auto model = load_run_model(cfg.model(), cfg.run().trainer().seed(), std::move(tok));

  // The frozen reference: by default a copy of the policy as fit() receives it (FitParts::reference
  // takes another model). Its summed log-probs of every chosen and rejected response are computed
  // once per batch; the loss is algorithm.loss_type (sigmoid, ipo, hinge) at algorithm.beta.
  FitParts parts;
  parts.tokenizer_files = model.tokenizer_files;
  parts.run_config = to_json(cfg);
  DPOTrainer trainer(cfg.run());  // DPOTrainer = Trainer<Algorithm<DPO>, Sharding<FSDP>, Loader<Packed>>
  std::fprintf(stderr, "%s\n", trainer.describe().c_str());
  const auto result = trainer.fit(model.policy, pairs, parts);

  const auto& m = result.last_metrics;
  std::printf("done, %lld steps: loss %.4f (ln 2 = 0.6931 at the start), rewards/accuracies %.3f\n",
              static_cast<long long>(result.steps), m.at("loss"), m.at("rewards/accuracies"));
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
