#!/usr/bin/env bash
# The update against its switches on one GPU machine, beside its peer (device tool; see
# docs/development.md): builds and runs the CUDA suites (cuda, model, sharding), then
# `bench_train update 160m|1b 16` as built ("base"), with FlashAttention-2 instead of cuDNN's dense
# attention (HYBRIDRL_CUDNN_ATTENTION=0, "flash") and with a cast of each unit at every gather
# (BENCH_KEEP_PARAM_COPY=0, "nokeep"), then bench/peers/update_peer.py and 3 GRPO steps of each
# model in GRPO_MODELS (default 160m) — each step skipped when DEADLINE (seconds from the start,
# default 540) would not allow it. SUITES (default cuda|model|sharding) picks the CUDA suites;
# DECODE_MODELS (default none) first times `bench_rollout generate <m> 256` (Paged) with plain
# launches and with programmatic dependent launch (HYBRIDRL_PDL=1), one process each;
# UPDATE_MODELS (default "160m 1b") the update's models ("" skips the update and its peer).
#   DEADLINE=540 bash scripts/gpu_update_matrix.sh       # logs in $OUT/logs.tgz
# PROFILE_PDL=1 then profiles a GRPO step of 160m with plain and programmatic launches and prints
# where its GPU waits (bench/support/trace_gaps.py).
#   DEADLINE=540 DECODE_MODELS='160m 1b' UPDATE_MODELS= GRPO_MODELS='160m 1b' bash scripts/gpu_update_matrix.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT=${OUT:-$PWD/gpu-logs}
L=$OUT/logs
mkdir -p "$L"
T0=$(date +%s)
D=${DEADLINE:-540}
el() { echo "[t=$(($(date +%s) - T0))s] $*"; }
left() { echo $((D - ($(date +%s) - T0))); }
fits() { (($(left) > $1)); }
SUITES=${SUITES:-cuda|model|sharding}
targets=()
for s in ${SUITES//|/ }; do targets+=("${s}_tests"); done
[[ -n "${DECODE_MODELS:-}" ]] && targets+=(bench_rollout)
OUT=$L CTEST_ARGS="-R ^($SUITES)\$" timeout $((D - 20)) bash scripts/gpu_check.sh "${targets[@]}" bench_train 2>&1 | tail -7
grep -E "FAILED|ERROR|failed|refused|MESSAGE" "$L/ctest.log" | head -24 | cut -c1-300
update() {  # model, switch
  local env=()
  case $2 in flash) env=(HYBRIDRL_CUDNN_ATTENTION=0) ;; nokeep) env=(BENCH_KEEP_PARAM_COPY=0) ;; esac
  fits 40 || { el "skipped: update $1 $2"; return; }
  el "update $1 $2"
  env "${env[@]}" timeout 40 build-gpu/bench/bench_train update "$1" 16 > "$L/update-$1-$2.txt" 2>&1
  grep '"bench"' "$L/update-$1-$2.txt" | python3 -c '
import sys, json
for l in sys.stdin:
    d = json.loads(l)
    print({k: d.get(k) for k in ("step_s", "mfu", "forward_backward_s", "optimizer_s", "step_synced_s", "peak_gb")})' ||
    tail -3 "$L/update-$1-$2.txt" | cut -c1-300
}
decode() {  # model, switch
  local env=(BENCH_GENERATE_ENGINES=paged)
  [[ $2 == pdl ]] && env+=(HYBRIDRL_PDL=1)
  fits 60 || { el "skipped: decode $1 $2"; return; }
  el "decode $1 $2"
  env "${env[@]}" timeout 60 build-gpu/bench/bench_rollout generate "$1" 256 > "$L/decode-$1-$2.txt" 2>&1
  grep -E '"bench": "(generate|roofline)"' "$L/decode-$1-$2.txt" | cut -c1-400 || tail -3 "$L/decode-$1-$2.txt" | cut -c1-300
}
for m in ${DECODE_MODELS:-}; do decode "$m" plain; decode "$m" pdl; done
profile_gaps() {  # switch: a GRPO step of 160m under the profiler, where its GPU waits (trace_gaps.py)
  local env=()
  [[ $1 == pdl ]] && env=(HYBRIDRL_PDL=1)
  fits 90 || { el "skipped: profile $1"; return; }
  el "profile grpo 160m $1"
  env "${env[@]}" timeout 80 build-gpu/bench/bench_train profile grpo 160m "/tmp/grpo-$1.json" > "$L/profile-$1.txt" 2>&1
  python3 bench/support/trace_gaps.py "/tmp/grpo-$1.json" --top 0 2>&1 | head -8 | cut -c1-300
}
if [[ -n "${PROFILE_PDL:-}" ]]; then profile_gaps plain; profile_gaps pdl; fi
UPDATE_MODELS=${UPDATE_MODELS-160m 1b}
for m in $UPDATE_MODELS; do update "$m" base; done
for m in $UPDATE_MODELS; do update "$m" flash; done
if [[ -n "$UPDATE_MODELS" ]] && fits 75; then
  el peer
  timeout 70 python3 bench/peers/update_peer.py $UPDATE_MODELS > "$L/peer.txt" 2>&1
  echo "peer rc=$?"; grep -v "^$" "$L/peer.txt" | tail -2 | cut -c1-400
fi
for m in $UPDATE_MODELS; do update "$m" nokeep; done
grpo() {  # model, seconds it needs
  fits "$2" || { el "skipped: grpo $1"; return; }
  el "grpo $1"
  timeout $(($(left) - 5)) build-gpu/bench/bench_train grpo "$1" 3 > "$L/grpo-$1.txt" 2>&1
  echo "grpo $1 rc=$?"
  python3 - "$L/grpo-$1.txt" <<'PY'
import sys, json
for l in open(sys.argv[1]):
    if not l.startswith('{'):
        continue
    try:
        d = json.loads(l)
    except ValueError:
        continue
    keep = ("step", "generate", "reference", "update", "busy", "log_prob")
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items() if any(s in k for s in keep)})
PY
}
for m in ${GRPO_MODELS:-160m}; do
  case $m in 1b) grpo 1b 60 ;; *) grpo "$m" 30 ;; esac
done
el finished
(cd "$L" && tar czf ../logs.tgz . ) && rm -rf "$L"
