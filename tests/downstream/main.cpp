// A downstream program: composes a trainer type and uses a TensorBatch through the public API.
#include <hybridrl/hybridrl.hpp>

#include <iostream>

int main() {
  using namespace hybridrl;
  using MyTrainer = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
  static_assert(MyTrainer::has_rollout);
  MyTrainer::Options opts;
  opts.geometry(StaticBatch<8, 4, 2, 4, 2>::geometry());
  MyTrainer trainer(opts);
  TensorBatch batch({{"x", at::arange(4)}});
  if (batch.repeat(2).size() != 8) return 1;
  std::cout << trainer.describe() << "\nhybridrl " << version() << "\ndownstream ok\n";
  return 0;
}
