#!/usr/bin/env bash
# Installs what is missing (Debian 12 / Ubuntu: apt), configures, builds and runs the test suite.
#   ./scripts/test.sh                 # everything CI runs
#   BUILD_DIR=build-x ./scripts/test.sh
#   CTEST_ARGS="-L core" ./scripts/test.sh
#   SKIP_TESTS=1 ./scripts/test.sh    # install, configure and build only
#   ./scripts/test.sh --lint          # the compile-only checks, whole (CI runs this too): every public
#                                     # header compiled alone, each compile-fail case's full output,
#                                     # and the benchmark programs (bench/: not in the default build)
#   ./scripts/test.sh --sanitize      # AddressSanitizer + UndefinedBehaviorSanitizer, in build-asan/
#   ./scripts/test.sh --tsan          # ThreadSanitizer on the threaded parts, in build-tsan/
#   TARGETS="core_tests io_tests" ./scripts/test.sh --sanitize   # build (and run) only these
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=
lint=
case "${1:-}" in
  --sanitize) sanitize=address,undefined ;;
  --tsan) sanitize=thread ;;
  --lint) lint=1 ;;
  "") ;;
  *) echo "usage: $0 [--lint | --sanitize | --tsan]" >&2; exit 2 ;;
esac
if [[ $sanitize == thread ]]; then
  BUILD_DIR=${BUILD_DIR:-build-tsan}
  # the threaded parts: the prefetcher (data), the thread communicator and its users
  # (distributed, sharding), the paged scheduler (rollout)
  TARGETS=${TARGETS:-data_tests distributed_tests rollout_tests}
elif [[ -n $sanitize ]]; then
  BUILD_DIR=${BUILD_DIR:-build-asan}
fi
if [[ -n $sanitize ]]; then
  # the benchmarks are no tests: a sanitizer build leaves them out
  CMAKE_ARGS="-DHYBRIDRL_SANITIZE=$sanitize -DHYBRIDRL_BUILD_BENCH=OFF ${CMAKE_ARGS:-}"
  supp=$PWD/cmake/sanitizers
  # a finding fails the test: abort with a report; leaks are findings too
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}
  export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$supp/lsan.supp:print_suppressions=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp}
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp}
  # LibTorch's intra-op pool (OpenMP) is not instrumented: one thread keeps TSan to our threads
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi

BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-Release}
JOBS=${JOBS:-$(nproc)}

packages=(
  g++ cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev libeigen3-dev librange-v3-dev doctest-dev libbenchmark-dev
  nlohmann-json3-dev libfmt-dev libsentencepiece-dev libyaml-cpp-dev libcli11-dev libpcre2-dev libicu-dev libxxhash-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "== installing: ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}"
fi

# ccache: precompiled headers need these settings to hit the cache.
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}

echo "== configure ($BUILD_DIR, $BUILD_TYPE)"
# HYBRIDRL_WERROR: a warning in our own code fails the build (CI runs this script).
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" -DHYBRIDRL_WERROR=${HYBRIDRL_WERROR:-ON} ${CMAKE_ARGS:-}
echo "== build"
if [[ -n "${TARGETS:-}" ]]; then
  # shellcheck disable=SC2086
  cmake --build "$BUILD_DIR" -j "$JOBS" --target ${TARGETS}
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
if [[ -n "${SKIP_TESTS:-}" ]]; then exit 0; fi  # set-up and build only (scripts/demo.sh)
echo "== test"
if [[ -n $sanitize ]]; then
  # compile-only checks (compile_fail, headers) and the install-and-build-a-consumer tests
  # (downstream) run no code of ours: the sanitizers have nothing to watch there
  exclude="slow|compile_fail|headers|downstream"
  if [[ -n "${TARGETS:-}" ]]; then
    # only the suites built: "core_tests io_tests" runs ctest entries core and io
    only=$(echo "${TARGETS}" | tr ' ' '\n' | sed -n 's/_tests$//p' | paste -sd'|')
    # shellcheck disable=SC2086
    ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" -R "^(${only})$" -LE "$exclude" ${CTEST_ARGS:-}
  else
    # shellcheck disable=SC2086
    ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" -LE "$exclude" ${CTEST_ARGS:-}
  fi
  exit 0
fi
if [[ -n $lint ]]; then
  # the header check (its ~100 compiles in parallel), then the compile-fail cases compiled to the
  # end: their whole output is checked (at most one static_assert, nothing that matches REJECT)
  cmake --build "$BUILD_DIR" -j "$JOBS" --target hybridrl_header_check
  # the benchmark programs: no tests, so not in the default build — compiled here, not run
  if cmake --build "$BUILD_DIR" --target help 2>/dev/null | grep "^hybridrl_benchmarks" >/dev/null; then
    cmake --build "$BUILD_DIR" -j "$JOBS" --target hybridrl_benchmarks
  fi
  # shellcheck disable=SC2086
  COMPILE_FAIL_FULL=1 ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" -L "headers|compile_fail" ${CTEST_ARGS:-}
  exit 0
fi
# Convergence runs ('slow') stay out; the header check ('headers') is --lint's (a lint of the
# headers, the largest item of a cold build); the compile-fail cases stop at their first error.
# shellcheck disable=SC2086
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" -LE "slow|headers" ${CTEST_ARGS:-}
