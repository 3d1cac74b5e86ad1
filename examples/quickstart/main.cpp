// The README's example: compose a trainer type, set options, validate, describe.
#include <hybridrl/hybridrl.hpp>
#include <iostream>

using namespace hybridrl;

// GRPO, fully sharded, paged-KV generation, length-bucketed batches: one concrete type.
using MyTrainer = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
// Offline algorithms take no Rollout:
using MyDpo = Trainer<Algorithm<DPO>, Sharding<FSDP>, Loader<Packed>>;

int main() {
  MyTrainer::Options opts;
  opts.static_batch(StaticBatch<64, 8, 8, 16, 4>::geometry());  // divisibility checked at compile time
  opts.algorithm().actor().clip_high(0.28);                          // runtime numbers: Options setters
  opts.rollout().sampling().temperature(1.0).top_p(0.95);
  MyTrainer trainer(opts);                                   // every option validated here
  std::cout << trainer.describe() << '\n' << device_info().to_string() << '\n';
}
