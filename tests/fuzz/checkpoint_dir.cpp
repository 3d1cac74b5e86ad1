// libFuzzer target: a training checkpoint directory (trainer/checkpoint.hpp) and a Hugging Face
// model directory (model/pretrained.hpp: model.safetensors or model.safetensors.index.json and its
// shards, config.json). The input is an archive of files, each introduced by a line
// `%%FILE <name>` (names of [A-Za-z0-9._-] only; the newline before the next such line is not
// part of the file). They are written into <scratch>/checkpoints/step_00000007/, which is then
// found by CheckpointManager::latest() and read as a resumed run reads it: CheckpointManager::load
// (trainer_state.json, trainer_state.safetensors, model.safetensors or a sharded state), the loader
// position and algorithm state of trainer_state.json, every tensor of a sharded state; then the
// same directory as a model: PretrainedReader (every tensor) and load_config.
#include <hybridrl/data/loader.hpp>
#include <hybridrl/model/config.hpp>
#include <hybridrl/model/pretrained.hpp>
#include <hybridrl/trainer/checkpoint.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.hpp"

namespace {

constexpr std::string_view kMarker = "%%FILE ";

/// The archive's files, (name, content), at most 8; entries with a name that is not a plain file
/// name are dropped.
std::vector<std::pair<std::string, std::string_view>> files_of(std::string_view in) {
  std::vector<std::pair<std::string, std::string_view>> out;
  if (in.substr(0, kMarker.size()) != kMarker) return out;
  size_t at = 0;
  while (at != std::string_view::npos && out.size() < 8) {
    const size_t name_at = at + kMarker.size();
    const size_t nl = in.find('\n', name_at);
    if (nl == std::string_view::npos) break;
    const auto next = in.find(std::string("\n").append(kMarker), nl);
    const std::string name(in.substr(name_at, nl - name_at));
    const auto content = in.substr(nl + 1, next == std::string_view::npos ? std::string_view::npos : next - nl - 1);
    at = next == std::string_view::npos ? next : next + 1;
    const bool plain = !name.empty() && name.size() <= 64 && name != "." && name != ".." &&
                       name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") ==
                           std::string::npos;
    if (plain) out.emplace_back(name, content);
  }
  return out;
}

/// Touches every byte of `t` (a tensor read from the files).
unsigned touch(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return 0;
  const auto c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  unsigned sum = 0;
  for (size_t i = 0, n = static_cast<size_t>(c.numel()) * c.element_size(); i < n; ++i) sum += p[i];
  return sum;
}

/// As Trainer::fit reads a checkpoint when it resumes.
unsigned resume_from(const std::string& path) {
  const auto d = hybridrl::CheckpointManager::load(path);
  unsigned sum = static_cast<unsigned>(d.step);
  for (const auto& [k, t] : d.tensors) sum += touch(t);
  if (d.meta.contains("loader")) {
    const auto s = d.meta["loader"].get<hybridrl::LoaderState>();
    sum += static_cast<unsigned>(s.epoch + s.batch_in_epoch);
  }
  for (const auto& [k, v] : d.algorithm_state()) sum += static_cast<unsigned>(k.size());
  const auto source = d.source();
  for (const auto& key : source->keys()) {
    const auto shape = source->shape(key);
    if (!shape) continue;
    int64_t numel = 1;
    for (const auto n : *shape) numel *= n;
    sum += touch(source->read(key, 0, numel));
  }
  return sum;
}

/// As load_causal_lm reads a model directory, before it builds the model.
unsigned load_model_dir(const std::string& dir) {
  unsigned sum = 0;
  const hybridrl::PretrainedReader reader(dir);
  for (const auto& name : reader.names()) {
    (void)reader.entry(name);
    sum += touch(reader.get(name));
  }
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  namespace fuzz = hybridrl::fuzz;
  const auto root = fuzz::scratch_dir() / "checkpoints";
  const auto step = root / "step_00000007";
  fs::create_directories(step);
  fuzz::clear_dir(step);
  for (const auto& [name, content] : files_of(fuzz::bytes_of(data, size))) fuzz::write_file(step / name, content);
  unsigned sum = 0;
  try {
    const hybridrl::CheckpointManager manager(root.string(), 3);
    if (const auto latest = manager.latest()) sum += resume_from(*latest);
  } catch (const hybridrl::Error&) {
  }
  try {
    sum += load_model_dir(step.string());
  } catch (const hybridrl::Error&) {
  }
  try {
    if (fs::exists(step / "config.json")) sum += static_cast<unsigned>(hybridrl::load_config(step.string()).vocab_size);
  } catch (const hybridrl::Error&) {
  }
  volatile unsigned keep = sum;
  (void)keep;
  return 0;
}
