#pragma once
/// \file
/// The one atomic writer for files and directories. A reader sees the old content or the new,
/// never a mix, and after commit() the new content survives power loss:
/// - the temporary sibling gets a unique name (pid, thread, counter and random bits), so ranks
///   run as threads, an async checkpoint thread or two hosts on one NFS directory never share it;
/// - it is opened O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC, so a planted file or symlink is never
///   followed or truncated;
/// - commit() fsyncs the file, checks close(), keeps the old file's mode, renames, then fsyncs
///   the directory;
/// - the temporary is removed on every failure path (RAII: destruction without commit()).

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <csignal>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hybridrl/core/error.hpp"
#include "hybridrl/io/fault.hpp"

namespace hybridrl::io {

/// Marks hybridrl's temporary files: `<target>.hybridrl-tmp.<unique>`. save_pretrained removes
/// leftovers of crashed saves by this marker.
inline constexpr std::string_view kTempMarker = ".hybridrl-tmp.";

namespace detail {

/// A name no other process, thread or earlier call uses: pid, thread id hash, a process-wide
/// counter and 32 random bits, in hex.
inline std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}() ^
                                   std::hash<std::thread::id>{}(std::this_thread::get_id())};
  const auto tid = std::hash<std::thread::id>{}(std::this_thread::get_id());
  return fmt::format("{}.{:x}.{:x}.{:08x}", static_cast<long>(::getpid()), tid & 0xffffff,
                     counter.fetch_add(1), static_cast<uint32_t>(rng()));
}

/// The directory part of `path` ("." when none).
inline std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

/// fsync()s directory `dir` so a rename inside it is durable. Throws Error on failure.
inline void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  HYBRIDRL_CHECK(fd >= 0, fmt::format("cannot open directory '{}' to sync it: {}", dir, std::strerror(errno)),
                 "check permissions of the target directory");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems (e.g. certain FUSE mounts) cannot fsync a directory: EINVAL means "not
  // supported", which is not a failure of this write.
  HYBRIDRL_CHECK(rc == 0 || err == EINVAL,
                 fmt::format("cannot sync directory '{}': {}", dir, std::strerror(err)),
                 "check the file system (disk full, I/O error or read-only mount)");
}

/// Removes a directory tree with POSIX nftw (not std::filesystem::remove_all: the LibTorch 2.x
/// pip wheels export a broken copy of it). Best effort; returns whether everything went.
inline bool remove_tree(const std::string& path) {
  return ::nftw(path.c_str(),
                [](const char* f, const struct stat*, int, struct FTW*) { return ::remove(f); }, 16,
                FTW_DEPTH | FTW_PHYS) == 0;
}

}  // namespace detail

/// A file written under a temporary name and renamed onto `path` by commit(). Destroyed without
/// commit() (an exception, an early return), it removes the temporary.
class AtomicFile {
 public:
  /// Creates the temporary sibling of `path`. Throws Error when the directory is missing or not
  /// writable.
  explicit AtomicFile(std::string path) : path_(std::move(path)) {
    for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
      temp_ = fmt::format("{}{}{}", path_, kTempMarker, detail::unique_suffix());
      fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
      if (fd_ < 0 && errno != EEXIST) break;
    }
    HYBRIDRL_CHECK(fd_ >= 0, fmt::format("cannot create '{}': {}", temp_, std::strerror(errno)),
                   "check that the directory exists and is writable");
    fault_ = fault::for_file(path_);  // HYBRIDRL_FAULT, for the fault tests; unset: nothing
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() { discard(); }

  /// Appends `n` bytes. Throws Error (and removes the temporary) on a write failure.
  void write(const void* data, size_t n) {
    HYBRIDRL_CHECK(fd_ >= 0, fmt::format("AtomicFile('{}'): write after commit or failure", path_),
                   "create a new AtomicFile for each write");
    const auto* p = static_cast<const char*>(data);
    if (fault_) inject(p, n);
    while (n > 0) {
      const auto w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("writing", errno);
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  /// Appends `text`.
  void write(std::string_view text) { write(text.data(), text.size()); }

  /// Makes the new content visible at path() and durable: fsync, checked close, the old file's
  /// mode kept, rename, fsync of the directory. Throws Error (temporary removed) on failure.
  void commit() {
    HYBRIDRL_CHECK(fd_ >= 0, fmt::format("AtomicFile('{}'): commit twice", path_), "commit once");
    struct stat old {};
    if (::stat(path_.c_str(), &old) == 0 && S_ISREG(old.st_mode)) {
      if (::fchmod(fd_, old.st_mode & 07777) != 0) fail("setting the mode of", errno);
    }
    if (::fsync(fd_) != 0) fail("syncing", errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("closing", errno);
    if (::rename(temp_.c_str(), path_.c_str()) != 0) fail("renaming", errno);
    temp_.clear();
    detail::fsync_directory(detail::parent_of(path_));
  }

  /// The target path.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// The temporary file's path (empty after commit()).
  [[nodiscard]] const std::string& temp_path() const noexcept { return temp_; }

 private:
  void discard() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!temp_.empty()) ::unlink(temp_.c_str());
    temp_.clear();
  }
  // HYBRIDRL_FAULT (io/fault.hpp): half of the first write reaches the file, then the fault
  void inject(const char* p, size_t n) {
    const auto action = *fault_;
    fault_.reset();
    size_t half = n / 2;
    while (half > 0) {
      const auto w = ::write(fd_, p, half);
      if (w <= 0) break;
      p += w;
      half -= static_cast<size_t>(w);
    }
    if (action == fault::Action::kill) {
      ::raise(SIGKILL);
    }
    fail("writing", ENOSPC);
  }
  [[noreturn]] void fail(const char* what, int err) {
    const auto temp = temp_;
    discard();
    throw Error(fmt::format("{} '{}' (for '{}') failed: {}", what, temp, path_, std::strerror(err)),
                "check free disk space, quota and permissions of the target directory");
  }

  std::string path_;
  std::string temp_;
  int fd_ = -1;
  std::optional<fault::Action> fault_;
};

/// Writes `content` to `path` atomically and durably (see AtomicFile).
inline void write_file_atomic(const std::string& path, std::string_view content) {
  AtomicFile f(path);
  f.write(content);
  f.commit();
}

/// A directory built under a temporary sibling name and put in place by commit(): every file in
/// it is fsynced, then it replaces `path` in one rename (an existing `path` is swapped out
/// atomically with renameat2(RENAME_EXCHANGE) where the kernel has it, and then removed).
/// Destroyed without commit(), it removes the temporary tree.
class AtomicDirectory {
 public:
  /// Creates the temporary sibling directory of `path` (mode 0777 & ~umask).
  explicit AtomicDirectory(std::string path) : path_(std::move(path)) {
    while (!path_.empty() && path_.size() > 1 && path_.back() == '/') path_.pop_back();
    bool made = false;
    for (int attempt = 0; attempt < 100 && !made; ++attempt) {
      temp_ = fmt::format("{}{}{}", path_, kTempMarker, detail::unique_suffix());
      made = ::mkdir(temp_.c_str(), 0777) == 0;
      if (!made && errno != EEXIST) break;
    }
    HYBRIDRL_CHECK(made, fmt::format("cannot create directory '{}': {}", temp_, std::strerror(errno)),
                   "check that the parent directory exists and is writable");
  }
  AtomicDirectory(const AtomicDirectory&) = delete;
  AtomicDirectory& operator=(const AtomicDirectory&) = delete;
  ~AtomicDirectory() {
    if (!temp_.empty()) detail::remove_tree(temp_);
  }

  /// Where to write the directory's files before commit().
  [[nodiscard]] const std::string& temp_path() const noexcept { return temp_; }
  /// The final path.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

  /// fsyncs every file and directory of the tree, renames it onto path(), fsyncs the parent.
  void commit() {
    HYBRIDRL_CHECK(!temp_.empty(), fmt::format("AtomicDirectory('{}'): commit twice", path_), "commit once");
    sync_tree(temp_);
    struct stat st {};
    const bool exists = ::lstat(path_.c_str(), &st) == 0;
    if (!exists) {
      HYBRIDRL_CHECK(::rename(temp_.c_str(), path_.c_str()) == 0,
                     fmt::format("cannot rename '{}' to '{}': {}", temp_, path_, std::strerror(errno)),
                     "check permissions of the parent directory");
      temp_.clear();
    } else {
      HYBRIDRL_CHECK(S_ISDIR(st.st_mode),
                     fmt::format("cannot replace '{}': it exists and is not a directory", path_),
                     "remove it or choose another path");
      exchange_with_existing();
    }
    detail::fsync_directory(detail::parent_of(path_));
  }

 private:
  static void sync_tree(const std::string& root) {
    const int rc = ::nftw(
        root.c_str(),
        [](const char* f, const struct stat* s, int type, struct FTW*) {
          if (type != FTW_F && type != FTW_DP && type != FTW_D) return 0;
          if (type == FTW_F && !S_ISREG(s->st_mode)) return 0;
          const int fd = ::open(f, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
          if (fd < 0) return -1;
          const int r = ::fsync(fd);
          const int err = errno;
          ::close(fd);
          return (r == 0 || err == EINVAL) ? 0 : -1;
        },
        16, FTW_DEPTH | FTW_PHYS);
    HYBRIDRL_CHECK(rc == 0, fmt::format("cannot sync the files under '{}': {}", root, std::strerror(errno)),
                   "check free disk space and the file system");
  }

  void exchange_with_existing() {
#ifdef RENAME_EXCHANGE
    if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_EXCHANGE) == 0) {
      detail::remove_tree(temp_);  // the old tree now lives under the temporary name
      temp_.clear();
      return;
    }
    HYBRIDRL_CHECK(errno == EINVAL || errno == ENOSYS,
                   fmt::format("cannot exchange '{}' with '{}': {}", temp_, path_, std::strerror(errno)),
                   "check permissions of the parent directory");
#endif
    // No atomic exchange: move the old tree aside, put the new one in place, remove the old.
    const auto old = fmt::format("{}{}old.{}", path_, kTempMarker, detail::unique_suffix());
    HYBRIDRL_CHECK(::rename(path_.c_str(), old.c_str()) == 0,
                   fmt::format("cannot move '{}' aside: {}", path_, std::strerror(errno)),
                   "check permissions of the parent directory");
    if (::rename(temp_.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      ::rename(old.c_str(), path_.c_str());
      throw Error(fmt::format("cannot rename '{}' to '{}': {}", temp_, path_, std::strerror(err)),
                  "check permissions of the parent directory");
    }
    temp_.clear();
    detail::remove_tree(old);
  }

  std::string path_;
  std::string temp_;
};

}  // namespace hybridrl::io
