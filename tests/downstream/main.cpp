// A downstream program: composes a trainer type and uses a TensorBatch through the public API.
// Against the installed package it includes the umbrella header (so every installed header must be
// there and compile); through add_subdirectory (HYBRIDRL_DOWNSTREAM_LIGHT) it includes one
// header, since that mode checks the wiring (targets, include paths, definitions, helpers), and
// the headers are the same files the parent build compiles.
#ifdef HYBRIDRL_DOWNSTREAM_LIGHT
#include <hybridrl/core/tensor_batch.hpp>
#include <hybridrl/version.hpp>
#else
#include <hybridrl/hybridrl.hpp>
#endif

#include <iostream>

int main() {
  using namespace hybridrl;
  TensorBatch batch({{"x", at::arange(4)}});
  if (batch.repeat(2).size() != 8) return 1;
#ifndef HYBRIDRL_DOWNSTREAM_LIGHT
  using MyTrainer = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
  static_assert(MyTrainer::has_rollout);
  MyTrainer::Options opts;
  opts.static_batch(StaticBatch<8, 4, 2, 4, 2>::geometry());
  MyTrainer trainer(opts);
  std::cout << trainer.describe() << "\n";
#endif
  std::cout << "hybridrl " << version() << "\ndownstream ok\n";
  return 0;
}
