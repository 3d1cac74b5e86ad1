#pragma once
/// \file
/// Reading and writing the safetensors format (https://github.com/huggingface/safetensors):
/// 8 bytes little-endian header length N, N bytes of JSON header
/// `{"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}`,
/// then the raw little-endian tensor bytes; offsets count from the end of the header.
///
/// SafetensorsFile memory-maps the file (POSIX mmap) and validates the whole header against the
/// file size BEFORE any tensor is created, so a corrupt or truncated file is an Error naming the
/// file and tensor, never a crash. The header rules are the reference reader's: at most 100 MB,
/// no NUL or trailing bytes, no duplicate names, string-only `__metadata__`, and tensors that
/// tile the data section exactly (sorted, from byte 0, no gap, overlap or uncovered byte).
/// Tensors it returns alias a copy-on-write mapping (zero copy); the mapping lives as long as any
/// of them. save_safetensors writes through io::AtomicFile, so a reader never sees a half-written
/// file.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hybridrl/core/error.hpp"
#include "hybridrl/io/atomic_file.hpp"
#include "hybridrl/io/json.hpp"

#if HYBRIDRL_WITH_XXHASH
#include <xxhash.h>
#endif

namespace hybridrl {

namespace detail {

/// A private (copy-on-write) memory mapping of a whole regular file; unmapped on destruction.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) : path_(path) {
    // O_NONBLOCK: opening a FIFO must not wait for a writer; S_ISREG below rejects it.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    HYBRIDRL_CHECK(fd >= 0, fmt::format("cannot open '{}': {}", path, std::strerror(errno)),
                   "check that the file exists and is readable");
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      throw Error(fmt::format("cannot stat '{}': {}", path, std::strerror(err)),
                  "check that the path is a regular file");
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw Error(fmt::format("'{}' is not a regular file", path),
                  "pass a safetensors file (a directory, FIFO or device cannot be a checkpoint)");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      // Copy-on-write: tensors alias these pages, and an in-place op on one writes a private
      // copy instead of faulting; nothing ever reaches the file.
      void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      const int err = errno;
      ::close(fd);
      HYBRIDRL_CHECK(p != MAP_FAILED,
                     fmt::format("cannot memory-map '{}': {}", path, std::strerror(err)),
                     "check free address space and that the file is a regular file");
      data_ = static_cast<uint8_t*>(p);
    } else {
      ::close(fd);
    }
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }

  [[nodiscard]] uint8_t* data() const noexcept { return data_; }
  [[nodiscard]] size_t size() const noexcept { return size_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

/// safetensors dtype string → ATen dtype; std::nullopt when unknown to hybridrl.
inline std::optional<at::ScalarType> safetensors_dtype(const std::string& s) {
  static const std::map<std::string, at::ScalarType> table = {
      {"F64", at::kDouble}, {"F32", at::kFloat},  {"F16", at::kHalf},  {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool}};
  auto it = table.find(s);
  if (it == table.end()) return std::nullopt;
  return it->second;
}

/// ATen dtype → safetensors dtype string (throws for dtypes the format has no name for here).
inline std::string safetensors_dtype_name(at::ScalarType t, const std::string& tensor) {
  switch (t) {
    case at::kDouble: return "F64";
    case at::kFloat: return "F32";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kShort: return "I16";
    case at::kChar: return "I8";
    case at::kByte: return "U8";
    case at::kBool: return "BOOL";
    default:
      throw Error(fmt::format("tensor '{}' has dtype {}, which safetensors cannot store", tensor,
                              c10::toString(t)),
                  "convert it to a float or integer dtype before saving");
  }
}

/// XXH3-64 of `n` bytes as 16 hex digits; empty in a build without xxHash.
inline std::string xxh3_hex(const void* p, size_t n) {
#if HYBRIDRL_WITH_XXHASH
  return fmt::format("{:016x}", static_cast<uint64_t>(XXH3_64bits(p, n)));
#else
  (void)p;
  (void)n;
  return {};
#endif
}

}  // namespace detail

/// `__metadata__` key of the per-tensor checksums that training checkpoints carry
/// (save_safetensors with checksums): a JSON object, as a string, of tensor name → XXH3-64 of its
/// bytes in hex. SafetensorsFile::get() verifies a tensor against it, so a damaged byte is an
/// Error naming the file and the tensor, never a wrong load. Files without it (Hugging Face
/// checkpoints, save_pretrained) are read as they are.
inline constexpr const char* kChecksumKey = "hybridrl.xxh3";

/// Whether this build writes and verifies checksums (it was built with xxHash).
#if HYBRIDRL_WITH_XXHASH
inline constexpr bool kHaveChecksums = true;
#else
inline constexpr bool kHaveChecksums = false;
#endif

/// Where one tensor lives in a safetensors file.
struct SafetensorsEntry {
  at::ScalarType dtype = at::kFloat;  ///< element type
  std::vector<int64_t> shape;         ///< dimensions
  size_t begin = 0;                   ///< byte offset from the start of the data section
  size_t end = 0;                     ///< one past the last byte
  std::string checksum;               ///< XXH3-64 in hex from kChecksumKey; empty: none
};

/// A memory-mapped, fully validated safetensors file. Cheap to copy (shares the mapping).
class SafetensorsFile {
 public:
  /// Maps and validates `path`. Throws Error naming the file (and the tensor) when the file is
  /// truncated, the header is not valid JSON, a dtype is unknown, or an entry's bytes do not match
  /// its shape or lie outside the file.
  explicit SafetensorsFile(const std::string& path)
      : map_(std::make_shared<detail::MappedFile>(path)) {
    const auto size = map_->size();
    const std::string fix = "the file is corrupt or truncated: re-download or re-save the checkpoint";
    HYBRIDRL_CHECK(size >= 8,
                   fmt::format("'{}' is not a safetensors file: {} bytes, fewer than the 8-byte "
                               "header length", path, size),
                   fix);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | map_->data()[i];
    // An implausible length usually means another kind of file (a Git LFS pointer, HTML from a
    // failed download): say what it starts with, in hex. MappedFile opened a regular file only,
    // and PretrainedReader only names files inside the model directory.
    auto starts = [&] {
      std::string hex;
      for (int i = 0; i < 8; ++i) hex += fmt::format("{}{:02x}", i ? " " : "", map_->data()[i]);
      const bool lfs = std::memcmp(map_->data(), "version ", 8) == 0;
      return fmt::format(" (the file starts with bytes {}{})", hex,
                         lfs ? ", \"version \": a Git LFS pointer, not the weights; run git lfs pull" : "");
    };
    HYBRIDRL_CHECK(n <= kMaxHeaderBytes,
                   fmt::format("'{}': the header claims {} bytes, more than the format's limit of {}{}",
                               path, n, kMaxHeaderBytes, starts()),
                   fix);
    HYBRIDRL_CHECK(n <= size - 8,
                   fmt::format("'{}': the header claims {} bytes but the file has only {} after the "
                               "length field{}", path, n, size - 8, starts()),
                   fix);
    data_offset_ = 8 + static_cast<size_t>(n);
    // Depth-capped, NUL-rejecting, duplicate-rejecting parse; trailing spaces (the format's
    // padding) are whitespace, anything else after the object is an error.
    auto parsed = io::parse_json(
        std::string_view(reinterpret_cast<const char*>(map_->data()) + 8, static_cast<size_t>(n)),
        io::JSONLimits{.max_depth = 8, .unique_keys = true});
    HYBRIDRL_CHECK(static_cast<bool>(parsed),
                   fmt::format("'{}': the safetensors header is not valid JSON ({})", path, parsed.error),
                   fix);
    const nlohmann::json& header = parsed.value;
    HYBRIDRL_CHECK(header.is_object(),
                   fmt::format("'{}': the safetensors header is not a JSON object", path), fix);
    const size_t data_size = size - data_offset_;
    for (const auto& [name, v] : header.items()) {
      if (name == "__metadata__") {
        HYBRIDRL_CHECK(v.is_object(),
                       fmt::format("'{}': __metadata__ is {}, not an object of strings", path, v.type_name()),
                       fix);
        for (const auto& [k, s] : v.items()) {
          HYBRIDRL_CHECK(s.is_string(),
                         fmt::format("'{}': __metadata__ value '{}' is {}, not a string", path, k,
                                     s.type_name()),
                         fix);
          metadata_[k] = s.get<std::string>();
        }
        continue;
      }
      const auto where = fmt::format("'{}', tensor '{}'", path, name);
      HYBRIDRL_CHECK(v.is_object() && v.contains("dtype") && v.contains("shape") &&
                         v.contains("data_offsets") && v["dtype"].is_string() &&
                         v["shape"].is_array() && v["data_offsets"].is_array() &&
                         v["data_offsets"].size() == 2,
                     fmt::format("{}: the header entry lacks dtype/shape/data_offsets", where), fix);
      const auto dtype_name = v["dtype"].get<std::string>();
      const auto dtype = detail::safetensors_dtype(dtype_name);
      HYBRIDRL_CHECK(dtype.has_value(),
                     fmt::format("{}: unknown dtype '{}'", where,
                                 dtype_name.size() > 40 ? dtype_name.substr(0, 40) + "..." : dtype_name),
                     "hybridrl reads F64, F32, F16, BF16, I64, I32, I16, I8, U8 and BOOL; convert "
                     "the checkpoint to one of these");
      SafetensorsEntry e;
      e.dtype = *dtype;
      const auto shape_text = io::brief(v["shape"]);
      uint64_t numel = 1;
      for (const auto& d : v["shape"]) {
        HYBRIDRL_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                       fmt::format("{}: shape {} has a negative or non-integer dimension", where,
                                   shape_text),
                       fix);
        const auto dim = d.get<uint64_t>();
        // Each dimension is bounded on its own too: [0, 2^63+5] holds 0 bytes but no tensor.
        HYBRIDRL_CHECK(dim <= kMaxElements && (dim == 0 || numel <= kMaxElements / dim),
                       fmt::format("{}: shape {} is impossibly large", where, shape_text), fix);
        numel *= dim;
        e.shape.push_back(static_cast<int64_t>(dim));
      }
      const auto& off = v["data_offsets"];
      HYBRIDRL_CHECK(off[0].is_number_unsigned() && off[1].is_number_unsigned(),
                     fmt::format("{}: data_offsets {} are not non-negative integers", where,
                                 io::brief(off)),
                     fix);
      e.begin = off[0].get<size_t>();
      e.end = off[1].get<size_t>();
      HYBRIDRL_CHECK(e.begin <= e.end && e.end <= data_size,
                     fmt::format("{}: data_offsets [{}, {}] lie outside the {} data bytes of the "
                                 "file (truncated?)", where, e.begin, e.end, data_size),
                     fix);
      const auto want = numel * static_cast<uint64_t>(c10::elementSize(e.dtype));
      HYBRIDRL_CHECK(e.end - e.begin == want,
                     fmt::format("{}: {} bytes stored but dtype {} and shape {} need {}", where,
                                 e.end - e.begin, dtype_name, shape_text, want),
                     fix);
      entries_.emplace(name, std::move(e));
    }
    check_layout(path, data_size, fix);
    read_checksums(path, fix);
  }

  /// Largest header the format allows (the reference reader's limit: 100 MB).
  static constexpr uint64_t kMaxHeaderBytes = 100'000'000;
  /// Largest element count of one tensor (and of one dimension): 2^56.
  static constexpr uint64_t kMaxElements = uint64_t{1} << 56;

  /// The file's path.
  [[nodiscard]] const std::string& path() const noexcept { return map_->path(); }
  /// Tensor names in the file, sorted.
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& [k, v] : entries_) out.push_back(k);
    return out;
  }
  /// Whether the file holds `name`.
  [[nodiscard]] bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  /// Dtype, shape and offsets of `name` (throws when absent).
  [[nodiscard]] const SafetensorsEntry& entry(const std::string& name) const {
    auto it = entries_.find(name);
    HYBRIDRL_CHECK(it != entries_.end(),
                   fmt::format("'{}' has no tensor '{}'", path(), name),
                   "check the tensor name (Hugging Face names, e.g. model.layers.0.mlp.up_proj.weight)");
    return it->second;
  }
  /// The `__metadata__` string map of the header.
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const noexcept {
    return metadata_;
  }

  /// Whether the file carries checksums (kChecksumKey) that get() verifies.
  [[nodiscard]] bool has_checksums() const noexcept { return metadata_.count(kChecksumKey) != 0; }

  /// A CPU tensor aliasing the mapped bytes of `name`; it keeps the mapping alive. The mapping is
  /// copy-on-write: writing to the tensor changes only this process's copy, never the file.
  /// Unaligned data is copied once so the tensor is always usable. (A file truncated in place by
  /// another program while such a tensor lives still faults on access: write checkpoints by
  /// rename, as save_safetensors does, or clone the tensors.) A file with checksums has the
  /// tensor's bytes verified first: a mismatch is an Error naming the file and the tensor.
  [[nodiscard]] at::Tensor get(const std::string& name) const {
    const auto& e = entry(name);
    const auto elem = c10::elementSize(e.dtype);
    uint8_t* p = map_->data() + data_offset_ + e.begin;
    if (!e.checksum.empty()) {
      const auto got = detail::xxh3_hex(p, e.end - e.begin);
      HYBRIDRL_CHECK(got == e.checksum,
                     fmt::format("'{}', tensor '{}': its {} bytes do not match the checksum written with them "
                                 "(XXH3 {} stored, {} read): the file is damaged", path(), name, e.end - e.begin,
                                 e.checksum, got),
                     "resume from another checkpoint (trainer.resume=<an older checkpoints/step_… directory>), "
                     "or restore the file from a copy");
    }
    auto options = at::TensorOptions().dtype(e.dtype).device(at::kCPU);
    if (e.end == e.begin) return at::empty(e.shape, options);
    auto keep = map_;
    auto t = at::from_blob(p, e.shape, [keep](void*) {}, options);
    if (reinterpret_cast<uintptr_t>(p) % elem != 0) return t.clone();
    return t;
  }

 private:
  /// The format's layout rule, as the reference reader enforces it: sorted by offset, the tensors
  /// tile the data section from byte 0 to its end, with no gap, overlap or uncovered byte.
  void check_layout(const std::string& path, size_t data_size, const std::string& fix) const {
    std::vector<std::pair<const std::string*, const SafetensorsEntry*>> order;
    order.reserve(entries_.size());
    for (const auto& [k, v] : entries_) order.emplace_back(&k, &v);
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
    });
    size_t at = 0;
    for (const auto& [name, e] : order) {
      HYBRIDRL_CHECK(e->begin == at,
                     fmt::format("'{}', tensor '{}': data_offsets [{}, {}] {} (the previous tensor "
                                 "ends at byte {})", path, *name, e->begin, e->end,
                                 e->begin < at ? "overlap another tensor" : "leave a gap", at),
                     fix);
      at = e->end;
    }
    HYBRIDRL_CHECK(at == data_size,
                   fmt::format("'{}': the tensors cover {} of the {} data bytes (trailing bytes "
                               "belong to no tensor)", path, at, data_size),
                   fix);
  }

  /// Reads kChecksumKey into the entries: every tensor must have one, and every one a tensor. A
  /// build without xxHash cannot verify them and reads the file as if it had none.
  void read_checksums(const std::string& path, const std::string& fix) {
    const auto it = metadata_.find(kChecksumKey);
    if (it == metadata_.end() || !kHaveChecksums) return;
    const auto where = fmt::format("'{}': __metadata__['{}']", path, kChecksumKey);
    const auto parsed = io::parse_json(it->second, io::JSONLimits{.max_depth = 2, .unique_keys = true});
    HYBRIDRL_CHECK(parsed && parsed.value.is_object(),
                   fmt::format("{} is not a JSON object ({})", where, parsed ? "another type" : parsed.error), fix);
    for (const auto& [k, v] : parsed.value.items()) {
      const auto e = entries_.find(k);
      HYBRIDRL_CHECK(e != entries_.end() && v.is_string() && v.get_ref<const std::string&>().size() == 16,
                     fmt::format("{} has an entry for '{}', {}", where, io::brief(nlohmann::json(k)),
                                 e == entries_.end() ? "which is not a tensor of the file" : "which is not 16 hex digits"),
                     fix);
      e->second.checksum = v.get<std::string>();
    }
    for (const auto& [k, e] : entries_) {
      HYBRIDRL_CHECK(!e.checksum.empty(), fmt::format("{} has no checksum of tensor '{}'", where, k), fix);
    }
  }

  std::shared_ptr<detail::MappedFile> map_;
  size_t data_offset_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// Writes `tensors` (any device; stored as contiguous CPU bytes) and string `metadata` to `path`
/// atomically and durably (io::AtomicFile: unique temporary, fsync, rename). With `checksums` (and
/// a build with xxHash) the metadata also holds every tensor's XXH3 (kChecksumKey), which
/// SafetensorsFile verifies on read. Throws Error on I/O failure.
inline void save_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {}, bool checksums = false) {
  nlohmann::json header = nlohmann::json::object();
  std::map<std::string, std::string> meta = metadata;
  nlohmann::json sums = nlohmann::json::object();
  std::vector<at::Tensor> bufs;
  bufs.reserve(tensors.size());
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    HYBRIDRL_CHECK(t.defined(), fmt::format("save_safetensors('{}'): tensor '{}' is undefined", path, name),
                   "pass only defined tensors");
    auto c = t.detach().to(at::kCPU).contiguous();
    const auto bytes = static_cast<size_t>(c.numel()) * c.element_size();
    header[name] = {{"dtype", detail::safetensors_dtype_name(c.scalar_type(), name)},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    if (checksums && kHaveChecksums) sums[name] = detail::xxh3_hex(c.data_ptr(), bytes);
    bufs.push_back(std::move(c));
  }
  if (checksums && kHaveChecksums) meta[kChecksumKey] = sums.dump();
  if (!meta.empty()) header["__metadata__"] = meta;
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  uint8_t len[8];
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  io::AtomicFile f(path);
  f.write(len, 8);
  f.write(h);
  for (const auto& c : bufs) {
    const auto bytes = static_cast<size_t>(c.numel()) * c.element_size();
    if (bytes > 0) f.write(c.data_ptr(), bytes);
  }
  f.commit();
}

/// Reads every tensor of a safetensors file into owned CPU tensors (for small files; models are
/// loaded through SafetensorsFile without the extra copy).
inline std::map<std::string, at::Tensor> load_safetensors(const std::string& path) {
  SafetensorsFile file(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& name : file.names()) out.emplace(name, file.get(name).clone());
  return out;
}

}  // namespace hybridrl
