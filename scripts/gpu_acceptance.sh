#!/usr/bin/env bash
# The GPU-machine run recorded in docs/development.md and docs/models.md: build and test the whole
# suite against LibTorch 2.x CUDA (scripts/gpu_check.sh), then the model acceptance checks that need
# transformers: save -> transformers load round trip, and bf16 CUDA logits of a 1.1B-shaped Llama.
# Every step's exit status counts: the script exits non-zero when any step fails, and says which.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1
failed=()
# step NAME CMD...: runs CMD (a pipeline's status is its first failing command's, via pipefail).
step() {
  local name=$1
  shift
  if ! "$@"; then
    failed+=("$name")
    echo "!! step failed: $name"
  fi
}
step "build + ctest (gpu_check.sh)" bash scripts/gpu_check.sh
B=build-gpu
echo "== model round trip (our save -> transformers load)"
rm -rf /tmp/rt /tmp/l1b
step "write round-trip checkpoints" bash -c "HYBRIDRL_ROUNDTRIP_DIR=/tmp/rt $B/tests/model_tests -tc='saved checkpoints are byte*' 2>&1 | tail -3"
step "transformers loads our save" bash -c "python3 tests/fixtures/make_model_fixtures.py --roundtrip /tmp/rt 2>&1 | tee '$OUT/roundtrip.log' | tail -15"
echo "== bf16 CUDA logits, 1.1B-shaped Llama: HF vs hybridrl"
step "make the 1.1B checkpoint" bash -c "python3 tests/fixtures/make_model_fixtures.py --bf16-1b /tmp/l1b 2>&1 | tail -3"
step "hybridrl bf16 logits" bash -c "HYBRIDRL_DUMP_LOGITS_DIR=/tmp/l1b $B/tests/model_tests --no-skip=true -tc='dump logits*' 2>&1 | tail -3"
step "bf16 logits within the bound" bash -c "python3 tests/fixtures/make_model_fixtures.py --bf16-1b-compare /tmp/l1b 2>&1 | tee '$OUT/bf16.log' | tail -10"
echo "== device report"
step "device report" "$B/examples/example_quickstart"
if ((${#failed[@]} > 0)); then
  printf 'FAILED steps:\n'; printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "all acceptance steps passed"
