#!/usr/bin/env bash
# Installs what is missing (Debian 12 / Ubuntu: apt), configures, builds and runs the test suite.
#   ./scripts/test.sh                 # everything CI runs
#   BUILD_DIR=build-x ./scripts/test.sh
#   CTEST_ARGS="-L core" ./scripts/test.sh
#   SKIP_TESTS=1 ./scripts/test.sh    # install, configure and build only
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-Release}
JOBS=${JOBS:-$(nproc)}

packages=(
  g++ cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev libeigen3-dev librange-v3-dev doctest-dev libbenchmark-dev
  nlohmann-json3-dev libfmt-dev libsentencepiece-dev libyaml-cpp-dev libcli11-dev libpcre2-dev libicu-dev
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
cmake --build "$BUILD_DIR" -j "$JOBS"
if [[ -n "${SKIP_TESTS:-}" ]]; then exit 0; fi  # set-up and build only (scripts/demo.sh)
echo "== test"
# Convergence runs carry the label 'slow' and stay out of the default run.
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" -LE slow ${CTEST_ARGS:-}
