# HYBRIDRL_SANITIZE: build our own targets (tests, the program, examples, benchmarks and the
# precompiled header they share) with GCC's or Clang's sanitizers. `./scripts/test.sh --sanitize`
# uses "address,undefined" in build-asan/, `--tsan` uses "thread" in build-tsan/. Every UBSan
# finding aborts (-fno-sanitize-recover), so a finding fails its test instead of scrolling by.
# LibTorch and the other libraries are not instrumented: ASan still sees every allocation (malloc
# is intercepted), TSan only our own code's accesses.
set(HYBRIDRL_SANITIZE "" CACHE STRING "Sanitizers for hybridrl's own targets: address,undefined | thread | empty")
if(HYBRIDRL_SANITIZE)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    message(FATAL_ERROR "HYBRIDRL_SANITIZE needs GCC or Clang (this is ${CMAKE_CXX_COMPILER_ID})")
  endif()
  if(HYBRIDRL_SANITIZE MATCHES "thread" AND HYBRIDRL_SANITIZE MATCHES "address")
    message(FATAL_ERROR "HYBRIDRL_SANITIZE=${HYBRIDRL_SANITIZE}: ThreadSanitizer cannot be combined with "
      "AddressSanitizer; build them in two trees (scripts/test.sh --sanitize and --tsan)")
  endif()
  message(STATUS "hybridrl: sanitizers ${HYBRIDRL_SANITIZE}")
  add_compile_options(-fsanitize=${HYBRIDRL_SANITIZE} -fno-omit-frame-pointer -g1)
  add_link_options(-fsanitize=${HYBRIDRL_SANITIZE})
  if(HYBRIDRL_SANITIZE MATCHES "undefined")
    # -fno-sanitize=vptr: the vptr check needs the typeinfo of every polymorphic class it meets, and
    # sentencepiece's comes from a library loaded at run time (detail/sentencepiece_library.hpp)
    add_compile_options(-fno-sanitize-recover=undefined -fno-sanitize=vptr)
  endif()
  # GCC's flow analysis sees the sanitizers' checks and warns of values "maybe used uninitialized"
  # in std::optional and c10::optional (GCC's manual: such warnings are expected with sanitizers);
  # the plain build keeps the warning
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options(-Wno-maybe-uninitialized)
  endif()
  # the sanitizers' runtimes read these at start; ctest and the app tests inherit them
  set(HYBRIDRL_SANITIZER_SUPPRESSIONS ${CMAKE_CURRENT_LIST_DIR}/sanitizers)
endif()
