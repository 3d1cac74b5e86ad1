#!/usr/bin/env bash
# The GPU-machine run recorded in docs/development.md and docs/models.md: build and test the whole
# suite against LibTorch 2.x CUDA (scripts/gpu_check.sh), then the model acceptance checks that need
# transformers: save -> transformers load round trip, and bf16 CUDA logits of a 1.1B-shaped Llama.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1
bash scripts/gpu_check.sh
check_rc=$?
B=build-gpu
echo "== model round trip (our save -> transformers load)"
rm -rf /tmp/rt /tmp/l1b
HYBRIDRL_ROUNDTRIP_DIR=/tmp/rt $B/tests/model_tests -tc='write checkpoints*' 2>&1 | tail -3
python3 tests/fixtures/make_model_fixtures.py --roundtrip /tmp/rt 2>&1 | tee "$OUT/roundtrip.log" | tail -15
echo "== bf16 CUDA logits, 1.1B-shaped Llama: HF vs hybridrl"
python3 tests/fixtures/make_model_fixtures.py --bf16-1b /tmp/l1b 2>&1 | tail -3
HYBRIDRL_DUMP_LOGITS_DIR=/tmp/l1b $B/tests/model_tests -tc='dump logits*' 2>&1 | tail -3
python3 tests/fixtures/make_model_fixtures.py --bf16-1b-compare /tmp/l1b 2>&1 | tee "$OUT/bf16.log" | tail -10
echo "== device report"
$B/examples/example_quickstart
exit $check_rc
