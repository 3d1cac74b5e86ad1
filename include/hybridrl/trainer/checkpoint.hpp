#pragma once
/// \file
/// Training checkpoints: `<output_dir>/checkpoints/step_<8 digits>/` holds
/// - `model.safetensors` — the model's weights under their Hugging Face names (with `config.json`
///   beside it when the caller gives one, so the directory loads in transformers as it is);
/// - `trainer_state.safetensors` — every other tensor of the state (optimizer moments and counts,
///   RNG states);
/// - `trainer_state.json` — the step, the loader's position, the algorithm's state, the effective
///   configuration.
/// Each is built in a temporary sibling directory, every file fsynced, and renamed into place: a
/// run killed while writing leaves the previous checkpoint whole (and a temporary directory that
/// the next CheckpointManager removes). Older checkpoints beyond keep_last are removed after a
/// newer one is complete.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/io/atomic_file.hpp"
#include "hybridrl/io/json.hpp"
#include "hybridrl/model/safetensors.hpp"

namespace hybridrl {

/// A checkpoint read back.
struct CheckpointData {
  std::string path;
  int64_t step = 0;
  std::map<std::string, at::Tensor> tensors;  ///< "model.<HF name>" and the rest, as given to save()
  nlohmann::json meta;                        ///< trainer_state.json
};

/// The checkpoints of one run directory (see the file comment).
class CheckpointManager {
 public:
  /// Prefix of the model's tensors in a state dict (FSDPEngine::state_dict writes it).
  static constexpr const char* kModelPrefix = "model.";

  /// Manages `dir` (created), keeping the newest `keep_last` checkpoints; removes temporaries of
  /// interrupted saves.
  CheckpointManager(std::string dir, int64_t keep_last) : dir_(std::move(dir)), keep_last_(keep_last) {
    HYBRIDRL_CHECK(keep_last_ >= 1, fmt::format("keep_last = {} keeps no checkpoint", keep_last_),
                   "keep at least one (trainer.keep_last >= 1)");
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    HYBRIDRL_CHECK(!ec, fmt::format("cannot create the checkpoint directory '{}': {}", dir_, ec.message()),
                   "choose a writable trainer.output_dir");
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      if (e.path().filename().string().find(io::kTempMarker) != std::string::npos) {
        io::detail::remove_tree(e.path().string());
      }
    }
  }

  /// Directory name of step `step`.
  static std::string name_of(int64_t step) { return fmt::format("step_{:08d}", step); }

  /// Step of a checkpoint directory name (`step_00000012` → 12), or nullopt for another name.
  static std::optional<int64_t> step_of(const std::string& name) {
    if (name.size() != 13 || name.rfind("step_", 0) != 0) return std::nullopt;
    int64_t v = 0;
    for (size_t i = 5; i < name.size(); ++i) {
      if (name[i] < '0' || name[i] > '9') return std::nullopt;
      v = v * 10 + (name[i] - '0');
    }
    return v;
  }

  /// The complete checkpoints, oldest first.
  [[nodiscard]] std::vector<std::pair<int64_t, std::string>> list() const {
    std::vector<std::pair<int64_t, std::string>> out;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      const auto step = step_of(e.path().filename().string());
      if (step && e.is_directory() && std::filesystem::exists(e.path() / "trainer_state.json")) {
        out.emplace_back(*step, e.path().string());
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  /// The newest complete checkpoint, or nullopt.
  [[nodiscard]] std::optional<std::string> latest() const {
    const auto l = list();
    if (l.empty()) return std::nullopt;
    return l.back().second;
  }

  /// Writes the checkpoint of `step`: tensors under kModelPrefix to model.safetensors (prefix
  /// dropped: Hugging Face names), the others to trainer_state.safetensors, `meta` (with "step"
  /// added) to trainer_state.json, and `hf_config` as config.json when given; then removes the
  /// checkpoints beyond keep_last. Returns the directory.
  std::string save(int64_t step, const std::map<std::string, at::Tensor>& tensors, nlohmann::json meta,
                   const std::optional<nlohmann::json>& hf_config = std::nullopt) {
    namespace fs = std::filesystem;
    const auto path = (fs::path(dir_) / name_of(step)).string();
    std::map<std::string, at::Tensor> model, rest;
    const std::string prefix = kModelPrefix;
    for (const auto& [k, t] : tensors) {
      if (k.rfind(prefix, 0) == 0) {
        model.emplace(k.substr(prefix.size()), t);
      } else {
        rest.emplace(k, t);
      }
    }
    meta["step"] = step;
    meta["format"] = 1;
    {
      io::AtomicDirectory out(path);
      const fs::path tmp = out.temp_path();
      save_safetensors((tmp / "model.safetensors").string(), model, {{"format", "pt"}});
      save_safetensors((tmp / "trainer_state.safetensors").string(), rest);
      if (hf_config) io::write_file_atomic((tmp / "config.json").string(), hf_config->dump(2));
      io::write_file_atomic((tmp / "trainer_state.json").string(), meta.dump(2));
      out.commit();
    }
    auto all = list();
    while (static_cast<int64_t>(all.size()) > keep_last_) {
      io::detail::remove_tree(all.front().second);
      all.erase(all.begin());
    }
    return path;
  }

  /// Reads the checkpoint at `path` (a step_… directory); an incomplete or unreadable one is an
  /// Error naming the file.
  static CheckpointData load(const std::string& path) {
    namespace fs = std::filesystem;
    CheckpointData d;
    d.path = path;
    for (const char* f : {"trainer_state.json", "model.safetensors", "trainer_state.safetensors"}) {
      HYBRIDRL_CHECK(fs::exists(fs::path(path) / f),
                     fmt::format("checkpoint '{}' has no {}", path, f),
                     "resume from a complete checkpoint directory (checkpoints/step_…), or set trainer.resume=never");
    }
    const auto state_file = (fs::path(path) / "trainer_state.json").string();
    d.meta = io::read_json_file(state_file, "trainer state",
                                "resume from another checkpoint (the file was not written by hybridrl or is damaged)",
                                size_t{64} << 20);
    try {
      d.step = d.meta.at("step").get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("checkpoint '{}': trainer_state.json is not valid ({})", path, e.what()),
                  "resume from another checkpoint (the file was not written by hybridrl or is damaged)");
    }
    for (auto& [k, t] : load_safetensors((fs::path(path) / "model.safetensors").string())) {
      d.tensors.emplace(std::string(kModelPrefix) + k, std::move(t));
    }
    for (auto& [k, t] : load_safetensors((fs::path(path) / "trainer_state.safetensors").string())) {
      d.tensors.emplace(k, std::move(t));
    }
    return d;
  }

  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }

 private:
  std::string dir_;
  int64_t keep_last_;
};

}  // namespace hybridrl
