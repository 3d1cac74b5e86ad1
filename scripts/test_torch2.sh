#!/usr/bin/env bash
# Builds and tests hybridrl against LibTorch 2.x on a CPU-only machine, using the C++ library inside
# PyPI's torch wheel (the wheel is only unpacked: no Python runs the code). CUDA code paths compile
# against the CUDA toolkit installed here but run only where a GPU is (scripts/gpu_check.sh).
#   ./scripts/test_torch2.sh            # TORCH_VERSION=2.11.0 by default
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=${TORCH_VERSION:-2.11.0}
CACHE=${TORCH2_CACHE:-$HOME/.cache/hybridrl-torch-$TORCH_VERSION}
BUILD_DIR=${BUILD_DIR:-build-torch2}
if [[ ! -d "$CACHE/torch/share/cmake/Torch" ]]; then
  mkdir -p "$CACHE/wheels"
  # The wheel's libtorch_cuda needs these three at load time; the CUDA toolkit provides the rest.
  python3 -m pip download -q --no-deps -d "$CACHE/wheels" "torch==$TORCH_VERSION" \
    nvidia-cufile nvidia-cusparselt-cu13 nvidia-nvshmem-cu13
  for w in "$CACHE"/wheels/*.whl; do python3 -m zipfile -e "$w" "$CACHE"; done
fi
export LD_LIBRARY_PATH="$CACHE/nvidia/cu13/lib:$CACHE/nvidia/nvshmem/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
# c10_LIBRARY: TorchConfig would otherwise prefer a system LibTorch's libc10 (e.g. Debian's 1.13).
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$CACHE/torch/share/cmake" \
  "-Dc10_LIBRARY=$CACHE/torch/lib/libc10.so" -DCMAKE_CUDA_ARCHITECTURES=90 -DTORCH_CUDA_ARCH_LIST=9.0  # no GPU here: name the architecture
cmake --build "$BUILD_DIR" -j "$(nproc)" --target all hybridrl_benchmarks  # the benchmarks are not in `all`
# Everything, the compile-only lint included (test.sh --lint's: the header check, the compile-fail
# cases' whole output): the compatibility header is what differs between the LibTorch versions.
COMPILE_FAIL_FULL=1 ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" -LE slow ${CTEST_ARGS:-}
