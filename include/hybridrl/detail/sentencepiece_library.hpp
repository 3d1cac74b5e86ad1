#pragma once
/// \file
/// Opens the sentencepiece shared library at run time, isolated from the rest of the process.
///
/// Why: Debian's libsentencepiece embeds protobuf-lite 3.14 and exports its symbols; Debian's
/// LibTorch loads libprotobuf 3.21. Linked into one program the two resolve each other's protobuf
/// symbols and the program crashes before main() (or aborts on protobuf's version check). Opened
/// with RTLD_LOCAL | RTLD_DEEPBIND, sentencepiece binds to its own protobuf and exports nothing to
/// the process, so both work. (DEEPBIND is used only when a protobuf is visible process-wide.) The C++ API is used through its header: virtual calls need no
/// symbols; the three out-of-line non-virtual functions we need are looked up with dlsym.

#include <dlfcn.h>
#include <fmt/format.h>
#include <sentencepiece_processor.h>

#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "hybridrl/core/error.hpp"

/// 1 in a build with AddressSanitizer (GCC's __SANITIZE_ADDRESS__, Clang's feature test).
#if defined(__SANITIZE_ADDRESS__)
#define HYBRIDRL_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HYBRIDRL_ADDRESS_SANITIZER 1
#endif
#endif
#ifndef HYBRIDRL_ADDRESS_SANITIZER
#define HYBRIDRL_ADDRESS_SANITIZER 0
#endif

namespace hybridrl::detail {

/// The dlopen'ed sentencepiece library and the out-of-line functions hybridrl calls.
class SentencePieceLibrary {
 public:
  /// The process-wide instance (opened once, on first use; never closed).
  static const SentencePieceLibrary& get() {
    static const SentencePieceLibrary lib;
    return lib;
  }

  /// A new processor; destroy it with destroy().
  [[nodiscard]] sentencepiece::SentencePieceProcessor* create() const {
    void* mem = ::operator new(sizeof(sentencepiece::SentencePieceProcessor));
    construct_(mem);
    return static_cast<sentencepiece::SentencePieceProcessor*>(mem);
  }
  /// Destroys a processor made by create() (its destructor is virtual: no symbol needed).
  static void destroy(sentencepiece::SentencePieceProcessor* p) {
    if (p == nullptr) return;
    p->~SentencePieceProcessor();
    ::operator delete(p);
  }

  /// Calls `f()` — a sentencepiece call returning util::Status — and converts a failure into its
  /// message. The Status is built in place and destroyed through the library's own destructor.
  template <class F>
  [[nodiscard]] std::pair<bool, std::string> status_of(F&& f) const {
    alignas(sentencepiece::util::Status) unsigned char buf[sizeof(sentencepiece::util::Status)];
    auto* status = new (buf) sentencepiece::util::Status(std::forward<F>(f)());  // no temporary
    std::pair<bool, std::string> out{status->ok(), {}};
    if (!out.first) out.second = to_string_(status);
    destroy_status_(status);
    return out;
  }

 private:
  SentencePieceLibrary() {
    // DEEPBIND only when a protobuf is already visible process-wide (Debian's LibTorch loads
    // libprotobuf globally): then sentencepiece must keep to its own copy. Otherwise (the pip
    // wheels hide their protobuf) plain RTLD_LOCAL keeps one libstdc++ binding for everyone;
    // DEEPBIND there would let sentencepiece bind C++ runtime symbols differently from the program.
    const bool protobuf_visible =
        ::dlsym(RTLD_DEFAULT, "_ZN6google8protobuf11MessageLite14ParseFromArrayEPKvi") != nullptr;
    // ASan's runtime refuses RTLD_DEEPBIND (google/sanitizers#611) and aborts the process: an
    // Error instead, before the dlopen
    HYBRIDRL_CHECK(!(HYBRIDRL_ADDRESS_SANITIZER && protobuf_visible),
                   "the sentencepiece library must be opened with RTLD_DEEPBIND (its protobuf apart from "
                   "LibTorch's), which AddressSanitizer does not support",
                   "read tokenizer.model in a build without -fsanitize=address, or use the checkpoint's "
                   "tokenizer.json");
    const int flags = RTLD_NOW | RTLD_LOCAL | (protobuf_visible ? RTLD_DEEPBIND : 0);
    for (const char* name : {"libsentencepiece.so.0", "libsentencepiece.so"}) {
      handle_ = ::dlopen(name, flags);
      if (handle_ != nullptr) break;
    }
    HYBRIDRL_CHECK(handle_ != nullptr,
                   fmt::format("cannot open the sentencepiece library: {}", dlerror_text()),
                   "install it (Debian/Ubuntu: apt-get install libsentencepiece0) or add its "
                   "folder to LD_LIBRARY_PATH");
    construct_ = reinterpret_cast<void (*)(void*)>(
        symbol("_ZN13sentencepiece22SentencePieceProcessorC1Ev"));
    destroy_status_ = reinterpret_cast<void (*)(void*)>(symbol("_ZN13sentencepiece4util6StatusD1Ev"));
    // std::string Status::ToString() const: on the Itanium ABI the result slot comes first, then
    // `this`, exactly like a free function `std::string f(const void*)`.
    to_string_ = reinterpret_cast<std::string (*)(const void*)>(
        symbol("_ZNK13sentencepiece4util6Status8ToStringB5cxx11Ev"));
  }

  void* symbol(const char* mangled) const {
    void* s = ::dlsym(handle_, mangled);
    HYBRIDRL_CHECK(s != nullptr,
                   fmt::format("the sentencepiece library lacks symbol {} ({})", mangled,
                               dlerror_text()),
                   "install a sentencepiece whose headers and library come from the same package");
    return s;
  }
  static std::string dlerror_text() {
    const char* e = ::dlerror();
    return e != nullptr ? e : "unknown error";
  }

  void* handle_ = nullptr;
  void (*construct_)(void*) = nullptr;
  void (*destroy_status_)(void*) = nullptr;
  std::string (*to_string_)(const void*) = nullptr;
};

}  // namespace hybridrl::detail
