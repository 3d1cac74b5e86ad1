#!/usr/bin/env bash
# Builds and tests hybridrl on the GPU machine (LibTorch 2.x + CUDA from the pip torch wheel).
# Used through the device tool; see docs/development.md. (range-v3 and Eigen are optional now; a
# copy under .deps/range-v3, when carried along, is still picked up.)
#   scripts/gpu_check.sh [build targets...]     (default: all)
# Environment: CTEST_ARGS (e.g. "-R core"), OUT (log folder, default ./gpu-logs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
TORCH_PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
NCCL_ROOT=$(python3 - <<'PY'
import importlib.util, os, glob
for mod in ("nvidia.nccl", "nvidia.cu13", "nvidia"):
    try:
        spec = importlib.util.find_spec(mod)
    except ModuleNotFoundError:
        continue
    if spec and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            hits = glob.glob(os.path.join(base, "**", "nccl.h"), recursive=True)
            if hits:
                print(os.path.dirname(os.path.dirname(hits[0]))); raise SystemExit
PY
)
echo "torch: $TORCH_PREFIX  nccl: ${NCCL_ROOT:-none}" | tee "$OUT/env.txt"
python3 -c 'import torch;print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))' | tee -a "$OUT/env.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$OUT/env.txt"
# The NCCL wheel ships libnccl.so.2 only; give the linker the unversioned name too.
if [[ -n "${NCCL_ROOT}" && ! -e "$NCCL_ROOT/lib/libnccl.so" && -e "$NCCL_ROOT/lib/libnccl.so.2" ]]; then
  mkdir -p /tmp/nccl-link && ln -sf "$NCCL_ROOT/lib/libnccl.so.2" /tmp/nccl-link/libnccl.so
  export LIBRARY_PATH=/tmp/nccl-link:${LIBRARY_PATH:-}
fi
export LD_LIBRARY_PATH=${NCCL_ROOT:+$NCCL_ROOT/lib:}${LD_LIBRARY_PATH:-}

RANGE_V3_DIR=
[[ -d "$PWD/.deps/range-v3/lib/cmake/range-v3" ]] && RANGE_V3_DIR="$PWD/.deps/range-v3/lib/cmake/range-v3"
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_PREFIX_PATH=$TORCH_PREFIX" \
  ${RANGE_V3_DIR:+-Drange-v3_DIR=$RANGE_V3_DIR} \
  ${NCCL_ROOT:+-DHYBRIDRL_NCCL_ROOT=$NCCL_ROOT} -DCMAKE_CUDA_ARCHITECTURES=90 \
  2>&1 | tee "$OUT/configure.log" | tail -5
targets=("$@")
if ((${#targets[@]} == 0)); then targets=(all); fi
cmake --build build-gpu -j "$(nproc)" --target "${targets[@]}" -- -k 0 > "$OUT/build.log" 2>&1  # -k 0: one failure stops nothing else
build_rc=$?
t1=$(date +%s)
echo "build rc=$build_rc in $((t1 - t0)) s"
grep -E "error|Error" "$OUT/build.log" | head -40
ctest --test-dir build-gpu --output-on-failure -j 8 -LE slow ${CTEST_ARGS:-} > "$OUT/ctest.log" 2>&1
test_rc=$?
t2=$(date +%s)
tail -25 "$OUT/ctest.log"
echo "ctest rc=$test_rc in $((t2 - t1)) s"
exit $((build_rc || test_rc))
