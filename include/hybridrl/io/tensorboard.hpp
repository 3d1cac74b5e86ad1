#pragma once
/// \file
/// TensorBoard event files (scalars), written without TensorFlow or protobuf: the file is a
/// sequence of TFRecords (length, masked CRC32C of the length, the bytes, masked CRC32C of the
/// bytes), each holding a serialized `tensorboard.Event`; the first carries `file_version`
/// "brain.Event:2", the rest one `Summary.Value{tag, simple_value}` each, as PyTorch's
/// SummaryWriter.add_scalar writes them. The few protobuf fields are encoded by hand (proto3
/// rules: a zero step is omitted, a zero simple_value is not, being in a oneof). Tested byte for
/// byte against a file written by TensorBoard's own writer (tests/fixtures/tensorboard/).
///
/// An event file is an append-only log, not a saved artefact: records are appended and flushed
/// after each step, and TensorBoard ignores a truncated last record.

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"

namespace hybridrl::io {

namespace detail {

/// The CRC32C (Castagnoli, reflected polynomial 0x82F63B78) lookup table.
constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

/// CRC32C of `data`.
inline uint32_t crc32c(std::string_view data) {
  static constexpr auto table = crc32c_table();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

/// TFRecord's masked CRC: rotate right by 15, add a constant.
inline uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

inline void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}
inline void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
inline void put_key(std::string& out, int field, int wire) { put_varint(out, static_cast<uint64_t>(field << 3 | wire)); }
inline void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

}  // namespace detail

/// The serialized `tensorboard.Event` that opens a file: wall_time, file_version
/// "brain.Event:2", source_metadata.writer = `writer`.
inline std::string file_version_event(double wall_time, std::string_view writer = "hybridrl") {
  std::string e;
  detail::put_key(e, 1, 1);  // wall_time: double
  detail::put_le(e, std::bit_cast<uint64_t>(wall_time), 8);
  detail::put_bytes(e, 3, "brain.Event:2");
  std::string meta;
  detail::put_bytes(meta, 1, writer);
  detail::put_bytes(e, 10, meta);
  return e;
}

/// The serialized `tensorboard.Event` of one scalar: wall_time, step, summary { value { tag,
/// simple_value } }.
inline std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string e;
  detail::put_key(e, 1, 1);
  detail::put_le(e, std::bit_cast<uint64_t>(wall_time), 8);
  if (step != 0) {  // proto3: the default is not written
    detail::put_key(e, 2, 0);
    detail::put_varint(e, static_cast<uint64_t>(step));
  }
  std::string v;
  detail::put_bytes(v, 1, tag);
  detail::put_key(v, 2, 5);  // simple_value: float, in a oneof (written even when 0)
  detail::put_le(v, std::bit_cast<uint32_t>(value), 4);
  std::string summary;
  detail::put_bytes(summary, 1, v);
  detail::put_bytes(e, 5, summary);
  return e;
}

/// `data` framed as a TFRecord.
inline std::string tfrecord(std::string_view data) {
  std::string r, len;
  detail::put_le(len, data.size(), 8);
  r += len;
  detail::put_le(r, detail::masked_crc32c(len), 4);
  r.append(data);
  detail::put_le(r, detail::masked_crc32c(data), 4);
  return r;
}

/// Appends scalars to a new TensorBoard event file in a directory (`tensorboard --logdir DIR`).
class TensorBoardWriter {
 public:
  /// Creates `dir` if needed and a new file `events.out.tfevents.<seconds>.<host>.<pid>.<n>.hybridrl`
  /// in it, opened by the file_version event (at `wall_time`, default now).
  explicit TensorBoardWriter(const std::filesystem::path& dir, std::optional<double> wall_time = std::nullopt) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    HYBRIDRL_CHECK(!ec, fmt::format("TensorBoardWriter: cannot create '{}': {}", dir.string(), ec.message()),
                   "give trainer.output_dir a directory this process may write");
    char host[256] = "localhost";
    gethostname(host, sizeof(host) - 1);
    const double now = wall_time.value_or(seconds_now());
    static std::atomic<int64_t> serial{0};  // two writers of one process in one second: two files
    path_ = dir / fmt::format("events.out.tfevents.{:010d}.{}.{}.{}.hybridrl", static_cast<int64_t>(now), host,
                              static_cast<int64_t>(getpid()), serial++);
    file_ = std::fopen(path_.c_str(), "ab");
    HYBRIDRL_CHECK(file_ != nullptr, fmt::format("TensorBoardWriter: cannot open '{}' for writing", path_.string()),
                   "give trainer.output_dir a directory this process may write");
    write(file_version_event(now));
    flush();
  }
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  ~TensorBoardWriter() {
    if (file_ != nullptr) std::fclose(file_);
  }

  /// One scalar at `step` (float32, as TensorBoard stores it), at `wall_time` (default now).
  void add_scalar(std::string_view tag, double value, int64_t step, std::optional<double> wall_time = std::nullopt) {
    write(scalar_event(wall_time.value_or(seconds_now()), step, tag, static_cast<float>(value)));
  }

  /// The scalars of one step, one event each, in order; then flush().
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values,
                   std::optional<double> wall_time = std::nullopt) {
    const double t = wall_time.value_or(seconds_now());
    for (const auto& [tag, v] : values) add_scalar(tag, v, step, t);
    flush();
  }

  /// Pushes what was written to the operating system.
  void flush() { std::fflush(file_); }
  /// The event file.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  static double seconds_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  void write(std::string_view event) {
    const auto r = tfrecord(event);
    HYBRIDRL_CHECK(std::fwrite(r.data(), 1, r.size(), file_) == r.size(),
                   fmt::format("TensorBoardWriter: writing '{}' failed", path_.string()),
                   "check the disk has room");
  }

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace hybridrl::io
