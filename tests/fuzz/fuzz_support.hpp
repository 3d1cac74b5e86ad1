#pragma once
/// \file
/// What the libFuzzer targets of tests/fuzz/ share: the input cut into parts at NUL bytes, a
/// scratch directory of this process (on /dev/shm when there is one, removed at exit), and files
/// written into it. A target catches hybridrl::Error only: any other exception escaping, a crash,
/// a leak, a hang or an allocation past -rss_limit_mb is a finding (scripts/fuzz.sh runs them).

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace hybridrl::fuzz {

/// The fuzzer's bytes as text.
inline std::string_view bytes_of(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// `data` cut at its first `cuts` NUL bytes: `cuts + 1` parts, the last holding the rest (NULs
/// and all); parts past the last NUL present are empty. JSON and YAML cannot hold a NUL, so a
/// NUL is a free separator for the parts that are files.
inline std::vector<std::string_view> split_at_nul(std::string_view data, size_t cuts) {
  std::vector<std::string_view> parts;
  for (size_t k = 0; k < cuts; ++k) {
    const auto at = data.find('\0');
    if (at == std::string_view::npos) break;
    parts.push_back(data.substr(0, at));
    data.remove_prefix(at + 1);
  }
  parts.push_back(data);
  parts.resize(cuts + 1);
  return parts;
}

/// A directory of this process's own, created on first use and removed at exit (each libFuzzer
/// worker or job is a process of its own).
inline const std::filesystem::path& scratch_dir() {
  struct Dir {
    std::filesystem::path path;
    Dir() {
      const char* base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
      std::string tmpl = std::string(base) + "/hybridrl-fuzz-XXXXXX";
      if (::mkdtemp(tmpl.data()) == nullptr) {
        std::perror("hybridrl fuzz: mkdtemp");
        std::abort();
      }
      path = tmpl;
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

/// Writes `bytes` to `path`, replacing it; aborts when the write fails (the harness is broken).
inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::perror("hybridrl fuzz: open");
    std::abort();
  }
  for (size_t done = 0; done < bytes.size();) {
    const auto n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::perror("hybridrl fuzz: write");
      std::abort();
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

/// Writes `bytes` to `path`, or removes `path` when `bytes` is empty (an absent file).
inline void write_or_remove(const std::filesystem::path& path, std::string_view bytes) {
  if (bytes.empty()) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  } else {
    write_file(path, bytes);
  }
}

/// Removes everything inside `dir`, keeping `dir`.
inline void clear_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) std::filesystem::remove_all(e.path(), ec);
}

}  // namespace hybridrl::fuzz
