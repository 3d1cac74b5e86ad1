// libFuzzer target: a safetensors file (model/safetensors.hpp). The input is the whole file: the
// 8-byte header length, the JSON header (dtypes, shapes, data_offsets) and the data. It is put in
// a memfd and opened as /proc/self/fd/N, so SafetensorsFile maps it as it maps a checkpoint; every
// tensor is then read through get(), and each of its bytes touched.
#include <hybridrl/model/safetensors.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_support.hpp"

namespace {

/// One memfd per process, rewritten for every input.
int memfd() {
  static const int fd = [] {
    const int f = ::memfd_create("hybridrl-fuzz-safetensors", MFD_CLOEXEC);
    if (f < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    return f;
  }();
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd();
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    const hybridrl::SafetensorsFile file(path);
    (void)file.metadata();
    unsigned sum = 0;
    for (const auto& name : file.names()) {
      const auto& e = file.entry(name);
      const auto t = file.get(name);
      if (t.numel() > 0) {
        const auto c = t.contiguous();
        const auto* p = static_cast<const uint8_t*>(c.data_ptr());
        const size_t bytes = static_cast<size_t>(c.numel()) * c.element_size();
        if (bytes != e.end - e.begin) std::abort();  // get() must cover exactly the entry's bytes
        for (size_t i = 0; i < bytes; ++i) sum += p[i];
      }
    }
    volatile unsigned keep = sum;
    (void)keep;
  } catch (const hybridrl::Error&) {
  }
  return 0;
}
