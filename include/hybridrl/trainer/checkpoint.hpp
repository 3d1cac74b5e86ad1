#pragma once
/// \file
/// Training checkpoints: `<output_dir>/checkpoints/step_<8 digits>/` holds
/// - `model.safetensors` — the model's weights under their Hugging Face names (with `config.json`
///   beside it when the caller gives one, so the directory loads in transformers as it is);
/// - `trainer_state.safetensors` — every other tensor of the state (optimizer moments and counts,
///   RNG states);
/// - `trainer_state.json` — the step, the loader's position, the algorithm's state, the effective
///   configuration.
/// Every tensor carries its XXH3 checksum in its file's metadata, and trainer_state.json's is in
/// trainer_state.safetensors (builds with xxHash): a damaged byte is an Error naming the file and
/// the tensor when the checkpoint loads, never a wrong resume.
/// Each is built in a temporary sibling directory, every file fsynced, and renamed into place: a
/// run killed while writing leaves the previous checkpoint whole (and a temporary directory that
/// the next CheckpointManager removes). Older checkpoints beyond keep_last are removed after a
/// newer one is complete.
///
/// A sharded checkpoint (trainer.checkpoint_format=sharded; save_sharded) gathers nothing: every
/// rank writes the pieces of the full tensors it holds (ShardedState) to
/// `shard_<rank>-of-<ranks>.safetensors` (tensors named `<key>@<first flat element>`), rank 0
/// the tensors every rank holds alike to trainer_state.safetensors and the index — every key's
/// full shape and the shard files — to trainer_state.json (and model.safetensors, the full
/// weights under Hugging Face names, when asked). Rank 0 builds the temporary directory, the
/// ranks write into it (a file system every rank sees), and rank 0 renames it into place once
/// every rank reports its file durable; a rank that fails makes every rank throw and leaves the
/// previous checkpoint as it was. It loads at any world size: ShardedCheckpointReader reads any
/// flat range of any key from whichever files hold it.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/distributed/batch_collectives.hpp"
#include "hybridrl/distributed/communicator.hpp"
#include "hybridrl/io/atomic_file.hpp"
#include "hybridrl/io/json.hpp"
#include "hybridrl/model/safetensors.hpp"
#include "hybridrl/sharding/sharded_state.hpp"

namespace hybridrl {

namespace detail {
/// The problem of a checkpoint file whose checksums are gone though trainer_state.json says they were written.
inline std::string missing_checksums(const std::string& file) {
  return fmt::format("'{}' holds no checksums, but trainer_state.json says the checkpoint was written with them: "
                     "the file is damaged", file);
}
}  // namespace detail

/// The state of a sharded checkpoint (see the file comment), read by flat ranges from the shard
/// files (memory-mapped: a rank touches only the bytes it reads). Opening checks the index and
/// every file: a missing or damaged shard, a piece of an unknown key, or elements of a key in
/// no file (or in two) is an Error naming the file and the tensor, before anything loads.
class ShardedCheckpointReader final : public StateSource {
 public:
  /// Opens the shards `index` (trainer_state.json's "shards") lists in `dir`; `whole` holds the
  /// tensors of trainer_state.safetensors.
  /// With `require_checksums` (trainer_state.json says they were written) a shard without them
  /// is an Error: a damaged metadata key would otherwise turn the check off.
  ShardedCheckpointReader(std::string dir, const nlohmann::json& index, StateDict whole, bool require_checksums = false)
      : dir_(std::move(dir)), whole_(std::move(whole)) {
    namespace fs = std::filesystem;
    const std::string fix = "resume from another checkpoint (this one is incomplete or damaged)";
    const auto bad = [&](const std::string& what) {
      return Error(fmt::format("checkpoint '{}': trainer_state.json's shards entry {}", dir_, what), fix);
    };
    if (!index.is_object() || !index.contains("files") || !index["files"].is_array() || !index.contains("shapes") ||
        !index["shapes"].is_object()) {
      throw bad("is not an object with a files list and a shapes object");
    }
    for (const auto& [k, v] : index["shapes"].items()) {
      if (!v.is_array()) throw bad(fmt::format("gives '{}' a shape that is not a list", k));
      std::vector<int64_t> shape;
      uint64_t numel = 1;  // at most SafetensorsFile::kMaxElements, so the sums below cannot overflow
      for (const auto& d : v) {
        if (!d.is_number_unsigned()) throw bad(fmt::format("gives '{}' a dimension that is not a count", k));
        const auto n = d.get<uint64_t>();
        if (n > SafetensorsFile::kMaxElements || (n > 0 && numel > SafetensorsFile::kMaxElements / n)) {
          throw bad(fmt::format("gives '{}' the impossibly large shape {}", k, io::brief(v)));
        }
        numel *= n;
        shape.push_back(static_cast<int64_t>(n));
      }
      shapes_.emplace(k, std::move(shape));
    }
    for (const auto& f : index["files"]) {
      if (!f.is_string()) throw bad("lists a file name that is not a string");
      const auto name = f.get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
        throw bad(fmt::format("lists '{}', which is not a file name inside the checkpoint", name));
      }
      const auto path = (fs::path(dir_) / name).string();
      HYBRIDRL_CHECK(fs::is_regular_file(path), fmt::format("checkpoint '{}' has no {} (a rank's shard)", dir_, name),
                     fix);
      files_.emplace_back(path);  // validates the file
      HYBRIDRL_CHECK(!require_checksums || files_.back().has_checksums(), detail::missing_checksums(path), fix);
      const size_t fi = files_.size() - 1;
      for (const auto& t : files_.back().names()) {
        const auto at = t.rfind('@');
        const auto where = fmt::format("checkpoint '{}', file {}, tensor '{}'", dir_, name, t);
        uint64_t start = 0;  // digits only, at most 2^56 (std::stoll threw std::out_of_range past 2^63)
        const bool digits = at != std::string::npos && at + 1 < t.size() &&
                            t.find_first_not_of("0123456789", at + 1) == std::string::npos;
        const auto parsed = digits ? std::from_chars(t.data() + at + 1, t.data() + t.size(), start)
                                   : std::from_chars_result{t.data(), std::errc::invalid_argument};
        HYBRIDRL_CHECK(parsed.ec == std::errc() && start <= SafetensorsFile::kMaxElements,
                       fmt::format("{}: not a piece name (<key>@<first element>)", where), fix);
        const auto key = t.substr(0, at);
        HYBRIDRL_CHECK(shapes_.count(key) > 0, fmt::format("{}: a piece of '{}', which the index does not list", where, key),
                       fix);
        const auto& e = files_.back().entry(t);
        HYBRIDRL_CHECK(e.shape.size() == 1, fmt::format("{}: a piece is 1-D, this one has {} dimensions", where, e.shape.size()),
                       fix);
        pieces_[key].push_back(Piece{static_cast<int64_t>(start), e.shape[0], fi, t});
      }
    }
    for (const auto& [key, shape] : shapes_) {  // the pieces of each key tile its elements
      int64_t numel = 1;
      for (auto d : shape) numel *= d;
      auto& ps = pieces_[key];
      std::sort(ps.begin(), ps.end(), [](const Piece& a, const Piece& b) { return a.start < b.start; });
      int64_t at = 0;
      for (const auto& p : ps) {
        HYBRIDRL_CHECK(p.start <= at,
                       fmt::format("checkpoint '{}': elements [{}, {}) of '{}' are in none of its {} shard files", dir_,
                                   at, p.start, key, files_.size()),
                       fix);
        HYBRIDRL_CHECK(p.start == at,
                       fmt::format("checkpoint '{}': elements from {} of '{}' are in two shard files ({} and an "
                                   "earlier one)", dir_, p.start, key, files_[p.file].path()),
                       fix);
        HYBRIDRL_CHECK(files_[p.file].entry(p.name).dtype == files_[ps.front().file].entry(ps.front().name).dtype,
                       fmt::format("checkpoint '{}': the pieces of '{}' have different dtypes ({})", dir_, key,
                                   files_[p.file].path()),
                       fix);
        at += p.numel;
      }
      HYBRIDRL_CHECK(at == numel,
                     fmt::format("checkpoint '{}': elements [{}, {}) of '{}' are in none of its {} shard files", dir_, at,
                                 numel, key, files_.size()),
                     fix);
    }
  }

  [[nodiscard]] std::optional<std::vector<int64_t>> shape(const std::string& key) const override {
    if (auto it = whole_.find(key); it != whole_.end()) return it->second.sizes().vec();
    if (auto it = shapes_.find(key); it != shapes_.end()) return it->second;
    return std::nullopt;
  }
  [[nodiscard]] at::Tensor read(const std::string& key, int64_t start, int64_t n) const override {
    if (auto it = whole_.find(key); it != whole_.end()) return it->second.reshape({-1}).narrow(0, start, n);
    const auto s = shape(key);
    HYBRIDRL_CHECK(s.has_value(), fmt::format("{} has no '{}'", where(), key), "load a checkpoint of the same model");
    int64_t numel = 1;
    for (auto d : *s) numel *= d;
    HYBRIDRL_CHECK(start >= 0 && n >= 0 && start + n <= numel,
                   fmt::format("{}: elements [{}, {}) of '{}' lie outside its {}", where(), start, start + n, key, numel),
                   "load a checkpoint of the same model");
    const auto& ps = pieces_.at(key);
    // the last piece that starts at or before `start`, then on until the range is filled
    auto it = std::upper_bound(ps.begin(), ps.end(), start, [](int64_t v, const Piece& p) { return v < p.start; });
    --it;
    at::Tensor out = at::empty({n}, at::TensorOptions().dtype(files_[it->file].entry(it->name).dtype));
    for (int64_t done = 0; done < n; ++it) {
      const int64_t from = start + done - it->start, take = std::min(it->numel - from, n - done);
      out.narrow(0, done, take).copy_(files_[it->file].get(it->name).narrow(0, from, take));
      done += take;
    }
    return out;
  }
  [[nodiscard]] std::vector<std::string> keys() const override {
    std::vector<std::string> out;
    for (const auto& [k, v] : whole_) out.push_back(k);
    for (const auto& [k, v] : shapes_) out.push_back(k);
    return out;
  }
  [[nodiscard]] std::string where() const override { return fmt::format("checkpoint '{}'", dir_); }
  /// The shard files, in the index's order.
  [[nodiscard]] size_t files() const noexcept { return files_.size(); }

 private:
  struct Piece {
    int64_t start = 0, numel = 0;
    size_t file = 0;
    std::string name;
  };
  std::string dir_;
  StateDict whole_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::map<std::string, std::vector<Piece>> pieces_;
};

/// A checkpoint read back.
struct CheckpointData {
  std::string path;
  int64_t step = 0;
  /// "model.<HF name>" and the rest, as given to save(); of a sharded checkpoint, the tensors of
  /// trainer_state.safetensors only (the rest is read through `sharded`)
  std::map<std::string, at::Tensor> tensors;
  nlohmann::json meta;  ///< trainer_state.json
  /// A sharded checkpoint's state (every tensor, by flat range); null for a full one.
  std::shared_ptr<const ShardedCheckpointReader> sharded;

  /// trainer_state.json's "algorithm_state" (what the algorithm's save_state wrote: names and
  /// numbers); empty when absent. Any other value is an Error naming the checkpoint.
  [[nodiscard]] std::map<std::string, double> algorithm_state() const {
    std::map<std::string, double> out;
    if (!meta.is_object() || !meta.contains("algorithm_state")) return out;
    const auto& s = meta["algorithm_state"];
    for (auto it = s.begin(); s.is_object() && it != s.end(); ++it) {
      HYBRIDRL_CHECK(it.value().is_number(),
                     fmt::format("checkpoint '{}': trainer_state.json's algorithm_state['{}'] = {} is not a number",
                                 path, it.key(), io::brief(it.value())),
                     "resume from another checkpoint (the file was not written by hybridrl or is damaged)");
      out.emplace(it.key(), it.value().get<double>());
    }
    HYBRIDRL_CHECK(s.is_object(),
                   fmt::format("checkpoint '{}': trainer_state.json's algorithm_state is {}, not an object", path,
                               s.type_name()),
                   "resume from another checkpoint (the file was not written by hybridrl or is damaged)");
    return out;
  }

  /// The state's tensors by key, whatever the format (valid while this object lives).
  [[nodiscard]] std::shared_ptr<const StateSource> source() const {
    if (sharded) return sharded;
    return std::make_shared<StateDictSource>(tensors);
  }
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
    if (kHaveChecksums) meta["checksums"] = "xxh3";  // load() then requires them in every file
    {
      io::AtomicDirectory out(path);
      const fs::path tmp = out.temp_path();
      const auto state_json = meta.dump(2);
      save_safetensors((tmp / "model.safetensors").string(), model, {{"format", "pt"}}, /*checksums=*/true);
      save_safetensors((tmp / "trainer_state.safetensors").string(), rest, state_metadata(state_json), true);
      if (hf_config) io::write_file_atomic((tmp / "config.json").string(), hf_config->dump(2));
      io::write_file_atomic((tmp / "trainer_state.json").string(), state_json);
      out.commit();
    }
    prune();
    return path;
  }

  /// Name of the shard file of rank `rank` of `ranks` in a sharded checkpoint.
  static std::string shard_name(int rank, int ranks) {
    return fmt::format("shard_{:05d}-of-{:05d}.safetensors", rank, ranks);
  }

  /// Writes the sharded checkpoint of `step` (see the file comment). Collective over `comm`
  /// (nullptr: one process): every rank passes its `mine`; rank 0 passes `lead` (its manager;
  /// nullptr on the others), `whole` (written once: mine.whole, RNG states), `meta`,
  /// `hf_config` and `hf_weights` (full weights under HF names for model.safetensors, or empty).
  /// Tensors for the collectives live on `device`. Every rank returns the directory, or throws
  /// when any rank could not write its part — the previous checkpoints untouched.
  static std::string save_sharded(CheckpointManager* lead, Communicator* comm, at::Device device, int64_t step,
                                  const ShardedState& mine, const StateDict& whole, nlohmann::json meta,
                                  const std::optional<nlohmann::json>& hf_config = std::nullopt,
                                  const StateDict& hf_weights = {}) {
    namespace fs = std::filesystem;
    const int ranks = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
    HYBRIDRL_CHECK((rank == 0) == (lead != nullptr),
                   fmt::format("save_sharded: rank {} {} a CheckpointManager", rank, lead ? "passes" : "lacks"),
                   "pass the run's CheckpointManager on rank 0 and nullptr on the other ranks");
    const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
    std::optional<io::AtomicDirectory> out;
    std::exception_ptr failed;
    std::string tmp, path;
    if (lead) {
      try {
        path = (fs::path(lead->dir_) / name_of(step)).string();
        out.emplace(path);
        tmp = out->temp_path();
      } catch (...) {
        failed = std::current_exception();
      }
    }
    if (ranks > 1) {  // the temporary directory's path, from rank 0 (empty: rank 0 could not make one)
      const auto got = broadcast(TensorBatch().set_column("tmp", Column{Value(tmp)}), *comm, 0, device);
      tmp = got.column("tmp")[0].get<std::string>();
    }
    // 0: nothing to write, 1: written, 2: failed
    int64_t status = failed ? 2 : 0;
    if (!tmp.empty() && !mine.pieces.empty()) {
      try {
        HYBRIDRL_CHECK(fs::is_directory(tmp),
                       fmt::format("rank {} does not see the directory '{}' that rank 0 made for checkpoint step {}",
                                   rank, tmp, step),
                       "put trainer.output_dir on a file system every rank shares (on several nodes, a network "
                       "file system), or set trainer.checkpoint_format=full (rank 0 writes everything)");
        std::map<std::string, at::Tensor> named;
        for (const auto& [k, t] : mine.pieces) named.emplace(fmt::format("{}@{}", k.first, k.second), t);
        save_safetensors((fs::path(tmp) / shard_name(rank, ranks)).string(), named, {{"format", "hybridrl-shard"}},
                         /*checksums=*/true);
        status = 1;
      } catch (...) {
        failed = std::current_exception();
        status = 2;
      }
    }
    at::Tensor all = at::zeros({ranks}, opts);
    all[rank] = status;
    if (ranks > 1) comm->all_reduce(all);
    const auto st = all.cpu();
    std::vector<int> bad;
    std::vector<std::string> files;
    for (int r = 0; r < ranks; ++r) {
      if (st[r].item<int64_t>() == 2) bad.push_back(r);
      if (st[r].item<int64_t>() == 1) files.push_back(shard_name(r, ranks));
    }
    const std::string fix = "the previous checkpoint is intact: fix the cause (disk space, permissions, a shared "
                            "trainer.output_dir) and resume from it";
    if (!bad.empty()) {
      if (failed) std::rethrow_exception(failed);  // this rank's own error (rank 0's temporary goes with it)
      throw Error(fmt::format("checkpoint step {} was not written: rank(s) {} could not write their part (their error "
                              "says why)", step, fmt::join(bad, ", ")),
                  fix);
    }
    int64_t ok = 1;
    if (lead) {  // the index and the rest, then the rename: the checkpoint exists once it is whole
      try {
        nlohmann::json shapes = nlohmann::json::object();
        for (const auto& [k, v] : mine.shapes) shapes[k] = v;
        meta["step"] = step;
        meta["format"] = 1;
        if (kHaveChecksums) meta["checksums"] = "xxh3";
        meta["checkpoint_format"] = "sharded";
        meta["shards"] = {{"files", files}, {"shapes", shapes}};
        const auto state_json = meta.dump(2);
        save_safetensors((fs::path(tmp) / "trainer_state.safetensors").string(), whole, state_metadata(state_json), true);
        if (!hf_weights.empty()) {
          save_safetensors((fs::path(tmp) / "model.safetensors").string(), hf_weights, {{"format", "pt"}}, true);
        }
        if (hf_config) io::write_file_atomic((fs::path(tmp) / "config.json").string(), hf_config->dump(2));
        io::write_file_atomic((fs::path(tmp) / "trainer_state.json").string(), state_json);
        out->commit();
        lead->prune();
      } catch (...) {
        failed = std::current_exception();
        ok = 0;
      }
    }
    if (ranks > 1) {
      at::Tensor done = at::full({1}, ok, opts);
      comm->broadcast(done, 0);
      ok = done.cpu().item<int64_t>();
    }
    if (!ok) {
      if (failed) std::rethrow_exception(failed);
      throw Error(fmt::format("checkpoint step {} was not completed: rank 0 could not write it (its error says why)", step),
                  fix);
    }
    if (lead) return path;
    return (fs::path(tmp).parent_path() / name_of(step)).string();
  }

  /// Reads the checkpoint at `path` (a step_… directory); an incomplete or unreadable one is an
  /// Error naming the file.
  static CheckpointData load(const std::string& path) {
    namespace fs = std::filesystem;
    CheckpointData d;
    d.path = path;
    for (const char* f : {"trainer_state.json", "trainer_state.safetensors"}) {
      HYBRIDRL_CHECK(fs::exists(fs::path(path) / f),
                     fmt::format("checkpoint '{}' has no {}", path, f),
                     "resume from a complete checkpoint directory (checkpoints/step_…), or set trainer.resume=never");
    }
    const std::string damaged = "resume from another checkpoint (the file was not written by hybridrl or is damaged)";
    const auto state_file = (fs::path(path) / "trainer_state.json").string();
    const auto text = io::read_text_file(state_file, "trainer state", size_t{64} << 20);
    auto parsed = io::parse_json(text);
    HYBRIDRL_CHECK(static_cast<bool>(parsed), fmt::format("'{}' is not valid JSON ({})", state_file, parsed.error), damaged);
    d.meta = std::move(parsed.value);
    const SafetensorsFile state((fs::path(path) / "trainer_state.safetensors").string());
    // trainer_state.json's checksum lives in trainer_state.safetensors (written together): a
    // changed digit in the step or the loader's position is an Error, not a silently other resume
    if (const auto it = state.metadata().find(kStateJsonChecksumKey); it != state.metadata().end() && kHaveChecksums) {
      const auto got = detail::xxh3_hex(text.data(), text.size());
      HYBRIDRL_CHECK(got == it->second,
                     fmt::format("'{}' does not match the checksum written with it in trainer_state.safetensors "
                                 "(XXH3 {} stored, {} read): the file is damaged", state_file, it->second, got),
                     damaged);
    }
    // written with checksums: every file must still hold them (a flipped bit in a metadata key
    // name would otherwise switch the check off and let a damaged tensor load)
    const bool summed = kHaveChecksums && d.meta.is_object() && d.meta.contains("checksums");
    if (summed) {
      HYBRIDRL_CHECK(state.metadata().count(kStateJsonChecksumKey) != 0 && state.has_checksums(),
                     detail::missing_checksums((fs::path(path) / "trainer_state.safetensors").string()), damaged);
    }
    try {
      const auto& step = d.meta.at("step");  // get<int64_t>() of 1e300 is undefined, of 2^64-1 a wrap
      HYBRIDRL_CHECK(step.is_number_integer() && !(step.is_number_unsigned() && step.get<uint64_t>() > INT64_MAX) &&
                         step.get<int64_t>() >= 0,
                     fmt::format("checkpoint '{}': trainer_state.json's step = {} is not a step number", path,
                                 io::brief(step)),
                     "resume from another checkpoint (the file was not written by hybridrl or is damaged)");
      d.step = step.get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("checkpoint '{}': trainer_state.json is not valid ({})", path, e.what()),
                  "resume from another checkpoint (the file was not written by hybridrl or is damaged)");
    }
    for (const auto& k : state.names()) d.tensors.emplace(k, state.get(k).clone());
    const auto& format = d.meta.contains("checkpoint_format") ? d.meta["checkpoint_format"] : nlohmann::json("full");
    HYBRIDRL_CHECK(format.is_string(),
                   fmt::format("checkpoint '{}': trainer_state.json's checkpoint_format = {} is not a string", path,
                               io::brief(format)),
                   "resume from another checkpoint (the file was not written by hybridrl or is damaged)");
    if (format == "sharded") {
      HYBRIDRL_CHECK(d.meta.contains("shards"), fmt::format("checkpoint '{}': trainer_state.json has no shards index", path),
                     "resume from another checkpoint (the file was not written by hybridrl or is damaged)");
      d.sharded = std::make_shared<ShardedCheckpointReader>(path, d.meta["shards"], d.tensors, summed);
      return d;
    }
    HYBRIDRL_CHECK(fs::exists(fs::path(path) / "model.safetensors"), fmt::format("checkpoint '{}' has no model.safetensors", path),
                   "resume from a complete checkpoint directory (checkpoints/step_…), or set trainer.resume=never");
    const SafetensorsFile model((fs::path(path) / "model.safetensors").string());
    HYBRIDRL_CHECK(!summed || model.has_checksums(), detail::missing_checksums((fs::path(path) / "model.safetensors").string()),
                   damaged);
    for (const auto& k : model.names()) d.tensors.emplace(std::string(kModelPrefix) + k, model.get(k).clone());
    return d;
  }

  /// Replaces checkpoint `path`'s trainer_state.json with `meta` (a tool that edits the state
  /// on purpose: the loader's position, the step) and stamps its new checksum into
  /// trainer_state.safetensors; both files are written atomically, the tensors unchanged.
  static void write_state_json(const std::string& path, const nlohmann::json& meta) {
    namespace fs = std::filesystem;
    const auto text = meta.dump(2);
    const auto state_file = (fs::path(path) / "trainer_state.safetensors").string();
    std::map<std::string, at::Tensor> tensors;
    std::map<std::string, std::string> metadata;
    {
      const SafetensorsFile state(state_file);
      for (const auto& k : state.names()) tensors.emplace(k, state.get(k).clone());
      for (const auto& [k, v] : state.metadata()) {
        if (k != kStateJsonChecksumKey && k != kChecksumKey) metadata.emplace(k, v);
      }
    }
    for (const auto& [k, v] : state_metadata(text)) metadata[k] = v;
    save_safetensors(state_file, tensors, metadata, /*checksums=*/true);
    io::write_file_atomic((fs::path(path) / "trainer_state.json").string(), text);
  }

  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }

 private:
  /// `__metadata__` key of trainer_state.safetensors that holds trainer_state.json's XXH3.
  static constexpr const char* kStateJsonChecksumKey = "hybridrl.trainer_state_json.xxh3";

  /// trainer_state.safetensors' metadata: the checksum of `state_json` (builds with xxHash).
  static std::map<std::string, std::string> state_metadata(const std::string& state_json) {
    if (!kHaveChecksums) return {};
    return {{kStateJsonChecksumKey, detail::xxh3_hex(state_json.data(), state_json.size())}};
  }

  /// Removes the oldest complete checkpoints beyond keep_last.
  void prune() {
    auto all = list();
    while (static_cast<int64_t>(all.size()) > keep_last_) {
      io::detail::remove_tree(all.front().second);
      all.erase(all.begin());
    }
  }

  std::string dir_;
  int64_t keep_last_;
};

}  // namespace hybridrl
