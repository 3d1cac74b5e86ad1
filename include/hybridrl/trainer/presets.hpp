#pragma once
/// \file
/// Named trainer types for the common combinations (ensmallen's `using StandardSGD = SGD<...>`):
/// `PPOTrainer`, `GRPOTrainer` (online: FSDP training, Paged generation, length-bucketed prompts),
/// `NaivePPOTrainer`, `NaiveGRPOTrainer` (the same with the reference Rollout<Naive>),
/// `DPOTrainer`, `KTOTrainer`, `SFTTrainer` (offline: FSDP training, packed rows),
/// `TP3DGRPOTrainer`, `TP3DPPOTrainer` (online with Sharding<TP3D>: tensor-parallel training,
/// Paged generation). These are the types `hybridrl train` runs.
///
/// With `HYBRIDRL_EXTERN_PRESETS` defined (the optional `hybridrl::presets` CMake target defines it
/// for its users), each preset and its fit loop on its algorithm's dataset is declared
/// `extern template`: a user's translation units do not instantiate them again (the fit loop is
/// most of a trainer's compile time), and src/presets/*.cpp, compiled once into
/// `hybridrl::presets`, hold the explicit instantiations.

#include "hybridrl/algorithm/algorithm.hpp"
#include "hybridrl/data/bucketed.hpp"
#include "hybridrl/data/dataset.hpp"
#include "hybridrl/data/packed.hpp"
#include "hybridrl/rollout/naive.hpp"
#include "hybridrl/rollout/paged.hpp"
#include "hybridrl/sharding/fsdp.hpp"
#include "hybridrl/sharding/tp3d.hpp"
#include "hybridrl/trainer/trainer.hpp"

#include <type_traits>

namespace hybridrl {

/// PPO with a critic and GAE: FSDP training, Paged generation, length-bucketed prompts.
using PPOTrainer = Trainer<Algorithm<PPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
/// GRPO (group-relative advantages, no critic): FSDP training, Paged generation, bucketed prompts.
using GRPOTrainer = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>;
/// PPOTrainer with the reference generation engine (Rollout<Naive>: no KV pool, no graphs).
using NaivePPOTrainer = Trainer<Algorithm<PPO>, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>;
/// GRPOTrainer with the reference generation engine (Rollout<Naive>).
using NaiveGRPOTrainer = Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>;
/// GRPOTrainer trained over a data × tensor mesh (Sharding<TP3D>: heads and MLP split over
/// sharding.tensor_parallel_size ranks); generation gets the weights in its own layout.
using TP3DGRPOTrainer = Trainer<Algorithm<GRPO>, Sharding<TP3D>, Rollout<Paged>, Loader<Bucketed>>;
/// PPOTrainer trained over a data × tensor mesh (Sharding<TP3D>; the critic split alike).
using TP3DPPOTrainer = Trainer<Algorithm<PPO>, Sharding<TP3D>, Rollout<Paged>, Loader<Bucketed>>;
/// DPO on preference pairs: FSDP training on packed rows.
using DPOTrainer = Trainer<Algorithm<DPO>, Sharding<FSDP>, Loader<Packed>>;
/// KTO on labelled completions: FSDP training on packed rows.
using KTOTrainer = Trainer<Algorithm<KTO>, Sharding<FSDP>, Loader<Packed>>;
/// SFT on (prompt, completion) pairs: FSDP training on packed rows.
using SFTTrainer = Trainer<Algorithm<SFT>, Sharding<FSDP>, Loader<Packed>>;

/// The dataset type of an algorithm's data kind: prompts (online), preference pairs (DPO),
/// labelled completions (KTO), completions (SFT).
template <DataKind K>
using dataset_for = std::conditional_t<
    K == DataKind::prompts, PromptDataset,
    std::conditional_t<K == DataKind::preference_pairs, PreferenceDataset,
                       std::conditional_t<K == DataKind::labelled_completions, LabelledDataset, CompletionDataset>>>;

/// The dataset a trainer type T's fit() reads.
template <class T>
using dataset_of = dataset_for<T::algorithm_type::data_kind>;

}  // namespace hybridrl

/// The explicit instantiation declarations (`prefix` extern) or definitions (`prefix` empty, in
/// src/presets) of trainer type `Alias` — spelled out as the trailing arguments — and of its fit
/// loop on dataset_of<Alias>, inside namespace hybridrl. (Explicit instantiation may name the
/// private fit_impl.)
#define HYBRIDRL_PRESET_INSTANTIATION(prefix, Alias, ...)                                                  \
  prefix template class __VA_ARGS__;                                                                       \
  prefix template FitResult Alias::fit_impl<dataset_of<Alias>>(CausalLM, std::shared_ptr<const dataset_of<Alias>>, \
                                                                BatchRewardFn, FitParts);

/// Every preset, as HYBRIDRL_PRESET_INSTANTIATION's (Alias, type) arguments.
#define HYBRIDRL_PRESET_PPO(prefix)                                                                        \
  HYBRIDRL_PRESET_INSTANTIATION(prefix, PPOTrainer, Trainer<Algorithm<PPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>) \
  HYBRIDRL_PRESET_INSTANTIATION(prefix, NaivePPOTrainer, Trainer<Algorithm<PPO>, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>)
#define HYBRIDRL_PRESET_GRPO(prefix)                                                                       \
  HYBRIDRL_PRESET_INSTANTIATION(prefix, GRPOTrainer, Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Paged>, Loader<Bucketed>>) \
  HYBRIDRL_PRESET_INSTANTIATION(prefix, NaiveGRPOTrainer, Trainer<Algorithm<GRPO>, Sharding<FSDP>, Rollout<Naive>, Loader<Bucketed>>)
#define HYBRIDRL_PRESET_OFFLINE(prefix)                                                                    \
  HYBRIDRL_PRESET_INSTANTIATION(prefix, DPOTrainer, Trainer<Algorithm<DPO>, Sharding<FSDP>, Loader<Packed>>) \
  HYBRIDRL_PRESET_INSTANTIATION(prefix, KTOTrainer, Trainer<Algorithm<KTO>, Sharding<FSDP>, Loader<Packed>>) \
  HYBRIDRL_PRESET_INSTANTIATION(prefix, SFTTrainer, Trainer<Algorithm<SFT>, Sharding<FSDP>, Loader<Packed>>)
#define HYBRIDRL_PRESET_TP3D(prefix)                                                                       \
  HYBRIDRL_PRESET_INSTANTIATION(prefix, TP3DGRPOTrainer, Trainer<Algorithm<GRPO>, Sharding<TP3D>, Rollout<Paged>, Loader<Bucketed>>) \
  HYBRIDRL_PRESET_INSTANTIATION(prefix, TP3DPPOTrainer, Trainer<Algorithm<PPO>, Sharding<TP3D>, Rollout<Paged>, Loader<Bucketed>>)

#if defined(HYBRIDRL_EXTERN_PRESETS)
namespace hybridrl {
HYBRIDRL_PRESET_PPO(extern)
HYBRIDRL_PRESET_GRPO(extern)
HYBRIDRL_PRESET_OFFLINE(extern)
HYBRIDRL_PRESET_TP3D(extern)
}  // namespace hybridrl
#endif
