// DPO by hand: the library's pieces composed into a training loop without the Trainer — a Hugging
// Face checkpoint, its frozen reference, preference pairs through Loader<Bucketed>, summed
// response log-probs, Algorithm<DPO>'s loss, AdamW, and save_pretrained + reload.
//   example_dpo_by_hand [fixtures_dir] [output_dir]
// The loader's response_mask is aligned with token_log_probs (core/keys.hpp), so
// sequence_log_probs(model, batch, "chosen_") is the summed response log-prob with no shift to get
// wrong. Exits non-zero when training does not lower the loss or the reload differs.
#include <hybridrl/hybridrl.hpp>

#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

using namespace hybridrl;

int main(int argc, char** argv) try {
  const std::string fixtures = argc > 1 ? argv[1] : "tests/fixtures";
  const std::string out_dir =
      argc > 2 ? argv[2] : (std::filesystem::temp_directory_path() / "hybridrl-dpo-by-hand").string();
  torch::manual_seed(0);

  // The tiny llama fixture has a 320-token vocabulary and no tokenizer.model: its tokenizer is
  // ByteTokenizer (check_vocabulary says so if they disagree).
  auto policy = load_causal_lm(fixtures + "/models/llama");
  auto reference = make_reference(policy);
  const ByteTokenizer tokenizer;
  check_vocabulary(tokenizer, policy->config());
  auto pairs = PreferenceDataset::from_jsonl(fixtures + "/data/pairs.jsonl", tokenizer,
                                             DatasetOptions{}.max_length(512));
  auto loader = Loader<Bucketed>::make(
      std::move(pairs), BucketedOptions{}.batch_size(2).epochs(10).seed(1).prefetch_factor(0));

  using DPO_ = Algorithm<DPO>;
  const auto options = DPOOptions{}.beta(0.1);
  auto state = DPO_::make_state(options);
  torch::optim::AdamW opt(policy->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.0));

  double first = NAN, last = NAN;
  int step = 0;
  while (auto batch = loader.next()) {
    // The four summed log-probs Algorithm<DPO>::loss reads (DPO_::loss_reads lists them).
    batch->set(keys::chosen_log_probs_sum, sequence_log_probs(policy, *batch, "chosen_"));
    batch->set(keys::rejected_log_probs_sum, sequence_log_probs(policy, *batch, "rejected_"));
    {
      torch::NoGradGuard no_grad;
      batch->set(keys::ref_chosen_log_probs_sum, sequence_log_probs(reference, *batch, "chosen_"));
      batch->set(keys::ref_rejected_log_probs_sum, sequence_log_probs(reference, *batch, "rejected_"));
    }
    batch->require(DPO_::loss_reads(options), "DPO loss");
    const auto out = DPO_::loss(*batch, options, state, LossCounts{});
    opt.zero_grad();
    out.loss.backward();
    opt.step();
    last = out.loss.item<double>();
    if (step == 0) first = last;
    std::printf("step %2d  loss %.4f  accuracy %.2f\n", step, last,
                out.metrics.at("rewards/accuracies").value.item<double>());
    ++step;
  }
  std::printf("%d steps: loss %.4f -> %.4f\n", step, first, last);

  save_pretrained(policy, out_dir);
  auto back = load_causal_lm(out_dir);
  const auto ids = at::arange(1, 17, at::kLong).unsqueeze(0);
  torch::NoGradGuard no_grad;
  const bool same = at::equal(policy->forward(ids), back->forward(ids));
  std::printf("saved to %s; reloaded logits equal: %s\n", out_dir.c_str(), same ? "yes" : "no");
  return std::isfinite(last) && last < first && same ? 0 : 1;
} catch (const Error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 2;
}
