#!/usr/bin/env bash
# The GPU benchmark matrix of docs/benchmarks.md on one H200 (through the device tool), after
# scripts/gpu_check.sh has built build-gpu with the bench targets (bench_rollout bench_train).
# One JSON object per line on stdout and in $OUT/bench.jsonl.
#   scripts/gpu_bench.sh [sections...]     (default: rollout update)
# Sections:
#   rollout      decode breakdown (each op of a layer in CUDA graphs) and generate tokens/s with the
#                fused kernels on and off against the HBM roofline, 160m and 1b, B = 256 and 64
#   rollout-peer transformers generate() (static cache, compiled), B = 256 (~3 min)
#   update       the policy update (16 x 1024 tokens, AdamW): hybridrl and transformers eager, MFU
#   grpo         a GRPO step (64 prompts x 8, prompt 128, gen 256): hybridrl, with the GPU's busy
#                fraction (nvidia-smi utilization sampled every 100 ms over the steps after the first);
#                then with the micro-batch sizer off (32 sequences per micro-batch; GRPO_FIXED=0 skips it)
#   grpo-peer    the same step with transformers generate() + torch (bench/peers/grpo_step_peer.py)
#   profile      GPU time per kernel class and kernel (Kineto) of the update (160m, 1b) and of a
#                GRPO step (160m, 1b); Chrome traces in $TRACES (default /tmp/hybridrl-traces)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
B=build-gpu/bench
sections=("$@")
((${#sections[@]} == 0)) && sections=(rollout update)
busy() {  # mean utilization.gpu between the first and the last grpo_step line of $1
  python3 - "$1" "$2" <<'PY'
import json, sys, datetime
steps = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{") and '"grpo_step"' in l]
samples = []
for line in open(sys.argv[2]):
    try:
        ts, util = [x.strip() for x in line.split(",")]
        t = datetime.datetime.strptime(ts, "%Y/%m/%d %H:%M:%S.%f").timestamp()
        samples.append((t, float(util)))
    except ValueError:
        pass
if len(steps) >= 2 and samples:
    a, b = steps[0]["unix_time"], steps[-1]["unix_time"]
    inside = [u for t, u in samples if a <= t <= b]
    if inside:
        print(json.dumps({"bench": "grpo_busy", "model": steps[0]["model"], "steps_after_first": len(steps) - 1,
                          "samples": len(inside), "gpu_busy_fraction": round(sum(inside) / len(inside) / 100, 3)}))
PY
}
for s in "${sections[@]}"; do
  case "$s" in
    rollout)
      for m in 1b 160m; do "$B/bench_rollout" breakdown "$m" 256 256; done
      "$B/bench_rollout" generate 1b 256 64
      "$B/bench_rollout" generate 160m 256 64
      ;;
    rollout-peer) python3 bench/rollout/hf_generate_peer.py 160m 1b --batch 256 ;;
    update)
      for m in 160m 1b; do "$B/bench_train" update "$m" 16; "$B/bench_train" update "$m" 4; done
      python3 bench/peers/update_peer.py 160m 1b
      ;;
    grpo)
      for m in 160m 1b; do
        nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 100 > "$OUT/util_$m.csv" &
        smi=$!
        "$B/bench_train" grpo "$m" 4 | tee "$OUT/grpo_$m.jsonl"
        kill $smi
        busy "$OUT/grpo_$m.jsonl" "$OUT/util_$m.csv"
        [[ ${GRPO_FIXED:-1} == 1 ]] && "$B/bench_train" grpo "$m" 3 32 | grep '"grpo_step"' | sed 's/"engine": "hybridrl GRPOTrainer"/"engine": "hybridrl GRPOTrainer, fixed micro 32"/'
      done
      ;;
    profile)
      TRACES=${TRACES:-/tmp/hybridrl-traces}
      mkdir -p "$TRACES"
      for m in 160m 1b; do "$B/bench_train" profile update "$m" "$TRACES/update_$m.json" 16; done
      for m in 160m 1b; do "$B/bench_train" profile grpo "$m" "$TRACES/grpo_$m.json"; done
      ;;
    grpo-peer) python3 bench/peers/grpo_step_peer.py 160m 1b --steps 3 ;;
    *) echo "gpu_bench.sh: unknown section $s" >&2; exit 2 ;;
  esac
done 2>&1 | tee -a "$OUT/bench.jsonl"
