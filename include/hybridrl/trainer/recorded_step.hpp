#pragma once
/// \file
/// Recorded rollout steps: an online step's batch after generation and scoring — prompts,
/// responses, masks, the engine's log-probs, the rewards, the dataset's columns — written by
/// `trainer.record_rollouts_every` to `<output_dir>/rollouts/step_<8 digits>_rank_<r>.safetensors`,
/// with the step, the sampling seed, the world size and the weights' fingerprint in its metadata
/// (and every tensor's checksum where xxHash is built in). `FitParts::replay_dir` makes a run take
/// each step's batch from these files instead of generating and scoring: resumed from the
/// checkpoint before a recorded step, the step replays to the same loss bit for bit
/// (tests/trainer/determinism_test.cpp), whatever the rollout engine or its seed would draw now.
/// verl's counterpart is `trainer.rollout_data_dir` (JSONL text, not replayable).

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/io/json.hpp"
#include "hybridrl/model/safetensors.hpp"

namespace hybridrl {

/// What a recorded step's metadata holds besides its tensors.
struct RecordedStepInfo {
  int64_t step = 0;               ///< the training step (1-based)
  int rank = 0;                   ///< the rank that wrote it
  int world = 1;                  ///< ranks of the run
  uint64_t sampling_seed = 0;     ///< the seed the step's sampler drew with (rollout.seed per step)
  double weights_fingerprint = 0; ///< rollout/weights_fingerprint of the step (0: not measured)
};

/// The file of step `step`, rank `rank`, under `dir` (a run's output_dir/rollouts).
[[nodiscard]] inline std::string recorded_step_path(const std::string& dir, int64_t step, int rank) {
  return (std::filesystem::path(dir) / fmt::format("step_{:08d}_rank_{}.safetensors", step, rank)).string();
}

/// Writes `batch`'s tensors (on the CPU, contiguous) and columns with `info` to
/// recorded_step_path(dir, info.step, info.rank), atomically; creates `dir`.
inline void record_step(const std::string& dir, const TensorBatch& batch, const RecordedStepInfo& info) {
  std::filesystem::create_directories(dir);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [k, t] : batch.tensors()) tensors.emplace(k, t.detach().to(at::kCPU).contiguous());
  nlohmann::json columns = nlohmann::json::object();
  for (const auto& [k, c] : batch.columns()) columns[k] = c;
  const std::map<std::string, std::string> meta{
      {"format", "hybridrl-rollout"},
      {"step", std::to_string(info.step)},
      {"rank", std::to_string(info.rank)},
      {"world", std::to_string(info.world)},
      {"sampling_seed", std::to_string(info.sampling_seed)},
      {"weights_fingerprint", fmt::format("{}", info.weights_fingerprint)},
      {"columns", columns.dump()},
      {"batch_meta", batch.meta().dump()}};
  save_safetensors(recorded_step_path(dir, info.step, info.rank), tensors, meta, /*checksums=*/true);
}

/// Reads what record_step wrote for `step` and `rank` (tensors to `device`), checking that it is a
/// recorded step of a run of `world` ranks. A missing or foreign file is an Error naming it.
[[nodiscard]] inline TensorBatch read_recorded_step(const std::string& dir, int64_t step, int rank, int world,
                                                    const at::Device& device, RecordedStepInfo* info = nullptr) {
  const auto path = recorded_step_path(dir, step, rank);
  HYBRIDRL_CHECK(std::filesystem::is_regular_file(path),
                 fmt::format("replay: step {} has no recording '{}'", step, path),
                 "replay the steps a run recorded (trainer.record_rollouts_every), resuming from the checkpoint "
                 "before the first of them, with as many steps as were recorded");
  const SafetensorsFile file(path);
  const auto& meta = file.metadata();
  const auto field = [&](const char* key) -> const std::string& {
    const auto it = meta.find(key);
    HYBRIDRL_CHECK(it != meta.end(), fmt::format("replay: '{}' has no \"{}\" in its metadata", path, key),
                   "pass a directory of rollouts recorded by trainer.record_rollouts_every");
    return it->second;
  };
  HYBRIDRL_CHECK(field("format") == "hybridrl-rollout",
                 fmt::format("replay: '{}' is not a recorded rollout (format \"{}\")", path, field("format")),
                 "pass a directory of rollouts recorded by trainer.record_rollouts_every");
  RecordedStepInfo got;
  try {
    got.step = std::stoll(field("step"));
    got.rank = std::stoi(field("rank"));
    got.world = std::stoi(field("world"));
    got.sampling_seed = std::stoull(field("sampling_seed"));
    got.weights_fingerprint = std::stod(field("weights_fingerprint"));
  } catch (const std::logic_error&) {  // std::invalid_argument, std::out_of_range
    throw Error(fmt::format("replay: '{}' has a step, rank, world or seed that is not a number", path),
                "pass a directory of rollouts recorded by trainer.record_rollouts_every");
  }
  HYBRIDRL_CHECK(got.step == step && got.rank == rank,
                 fmt::format("replay: '{}' holds step {} of rank {}, not step {} of rank {}", path, got.step, got.rank,
                             step, rank),
                 "do not rename recorded rollouts");
  HYBRIDRL_CHECK(got.world == world,
                 fmt::format("replay: '{}' was recorded by a run of {} rank(s); this one has {}", path, got.world, world),
                 fmt::format("replay on {} rank(s), as the run was recorded", got.world));
  auto columns_json = io::parse_json(field("columns"));
  auto batch_meta = io::parse_json(field("batch_meta"));
  HYBRIDRL_CHECK(columns_json && columns_json.value.is_object() && batch_meta,
                 fmt::format("replay: '{}' has columns or batch metadata that are not JSON", path),
                 "pass a directory of rollouts recorded by trainer.record_rollouts_every");
  std::map<std::string, at::Tensor> tensors;
  for (const auto& name : file.names()) tensors.emplace(name, file.get(name).clone().to(device));
  std::map<std::string, Column> columns;
  for (const auto& [k, v] : columns_json.value.items()) {
    HYBRIDRL_CHECK(v.is_array(), fmt::format("replay: '{}': column '{}' is not a list", path, k),
                   "pass a directory of rollouts recorded by trainer.record_rollouts_every");
    columns.emplace(k, v.get<Column>());
  }
  if (info != nullptr) *info = got;
  return TensorBatch(std::move(tensors), std::move(columns), std::move(batch_meta.value));
}

}  // namespace hybridrl
