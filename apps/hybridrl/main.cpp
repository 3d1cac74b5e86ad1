// hybridrl — the command-line program. Subcommands (DESIGN.md, "The command line"):
//   hybridrl info [--json]     the device report: LibTorch, CUDA devices, NCCL, fused attention
//   hybridrl generate --input in.jsonl --output out.jsonl [key=value ...]   offline generation
//   hybridrl train [--config run.yaml] [--print-config] [key=value ...]   one training run
//   hybridrl tokenize --model DIR --input in.jsonl --output out.jsonl [--decode]   check a tokenizer
//   hybridrl launch --nproc-per-node N -- train ...   N ranks on this machine, as torchrun --no-python
// Exit codes: 0 ok, 1 a hybridrl::Error (bad input: the message says the problem and the fix),
// 2 a command-line usage error, 3 any other failure.
#include <hybridrl/core/device.hpp>
#include <hybridrl/core/error.hpp>
#include <hybridrl/version.hpp>

#include <CLI/CLI.hpp>

#include "generate.hpp"
#include "launch.hpp"
#include "tokenize.hpp"
#include "train.hpp"

#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  CLI::App app{"hybridrl: reinforcement-learning post-training of LLMs on LibTorch", "hybridrl"};
  app.set_version_flag("--version", std::string("hybridrl ") + hybridrl::version());
  app.require_subcommand(1);

  auto* info = app.add_subcommand("info", "print the device report (CUDA, NCCL, fused attention)");
  bool json = false;
  info->add_flag("--json", json, "print the report as JSON");
  info->callback([&] {
    const auto report = hybridrl::device_info();
    std::cout << (json ? report.to_json().dump(2) : report.to_string()) << '\n';
  });

  auto* generate = app.add_subcommand(
      "generate", "offline batch generation from a Hugging Face checkpoint (keys: model.path, rollout.n, "
                  "rollout.max_new_tokens, rollout.temperature, rollout.top_k, rollout.top_p, rollout.seed, ...)");
  std::string input, output;
  std::vector<std::string> overrides;
  generate->add_option("--input", input, "JSONL: one {\"prompt_ids\": [...]} or {\"prompt\": \"...\"} per line")->required();
  generate->add_option("--output", output, "JSONL: one line per sample, in input order")->required();
  generate->add_option("overrides", overrides, "key=value settings, e.g. model.path=DIR rollout.n=4");
  int exit_code = 0;
  generate->callback([&] { exit_code = hybridrl::app::run_generate(input, output, overrides); });

  auto* train = app.add_subcommand(
      "train", "one training run (PPO, GRPO, DPO, KTO, SFT) from a configuration file and key=value overrides; precedence "
               "defaults < --config file < HYBRIDRL_* environment < command line");
  std::string config_file;
  bool print_config = false;
  std::vector<std::string> train_overrides;
  train->add_option("--config", config_file, "YAML or JSON configuration file");
  train->add_flag("--print-config", print_config, "print the effective configuration and exit");
  train->add_option("overrides", train_overrides, "key=value settings, e.g. task.name=reverse model.init=tiny");
  {  // --help lists the keys of the trainer type the command line names (default: GRPO, Rollout<Paged>)
    const auto type = hybridrl::app::train_type_of(argc, argv);
    try {
      train->footer(hybridrl::app::trainers().help(type.algorithm, type.rollout, type.sharding));
    } catch (const hybridrl::Error&) {  // an unknown name: the run reports it; help shows the default's keys
      train->footer(hybridrl::app::trainers().help());
    }
  }
  train->callback([&] { exit_code = hybridrl::app::run_train(config_file, train_overrides, print_config); });

  auto* tokenize = app.add_subcommand(
      "tokenize", "encode each JSONL line's \"text\" to \"ids\" with a checkpoint's tokenizer (tokenizer.json or "
                  "tokenizer.model; no special tokens), or --decode \"ids\" to \"text\"");
  std::string tok_model, tok_input, tok_output;
  bool tok_decode = false, tok_special = false;
  tokenize->add_option("--model", tok_model, "checkpoint directory holding tokenizer.json or tokenizer.model")->required();
  tokenize->add_option("--input", tok_input, "JSONL: {\"text\": ...} per line ({\"ids\": [...]} with --decode)")->required();
  tokenize->add_option("--output", tok_output, "JSONL: each input line with \"ids\" (or \"text\") added")->required();
  tokenize->add_flag("--decode", tok_decode, "decode \"ids\" to \"text\" (special tokens skipped)");
  tokenize->add_flag("--add-special", tok_special, "encode with the post-processor's special tokens (Llama-3's BOS)");
  tokenize->callback([&] { exit_code = hybridrl::app::run_tokenize(tok_model, tok_input, tok_output, tok_decode, tok_special); });

  auto* launch = app.add_subcommand(
      "launch", "run a subcommand as N ranks of this machine, as `torchrun --no-python --nproc-per-node N` does "
                "(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); one rank failing stops the others");
  int nproc = 1, master_port = 0;
  std::vector<std::string> launch_args;
  launch->add_option("--nproc-per-node", nproc, "ranks to start")->required();
  launch->add_option("--master-port", master_port, "the rendezvous port on 127.0.0.1 (default: a free one)");
  launch->add_option("command", launch_args, "the subcommand and its arguments, after --, e.g. -- train task.name=reverse")
      ->required();
  launch->callback([&] { exit_code = hybridrl::app::run_launch(nproc, master_port, launch_args); });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const hybridrl::Error& e) {
    std::cerr << e.what() << '\n';
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "hybridrl: unexpected failure: " << e.what() << '\n';
    return 3;
  }
  return exit_code;
}
