#!/usr/bin/env bash
# The main job, on the CPU: installs what is missing and builds (scripts/test.sh's set-up, without
# the test run), then trains a small random model (model.init=tiny) on the built-in `reverse` task
# ("reverse 472 =" -> "274"): the untrained model's reward (one GRPO step, untrained/), a short SFT
# warm-up that teaches the answer's form, then GRPO from the warmed-up model, and prints the reward
# curve. Outputs under $OUT (default runs/demo): untrained/, sft/ and grpo/, each with
# metrics.jsonl, metrics.svg, tensorboard/, checkpoints/ and model/.
#   ./scripts/demo.sh
#   OUT=/tmp/demo SFT_STEPS=90 GRPO_STEPS=80 ./scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/demo}
BUILD_DIR=${BUILD_DIR:-build}
SFT_STEPS=${SFT_STEPS:-90}
GRPO_STEPS=${GRPO_STEPS:-80}
if [[ ! -x "$BUILD_DIR/apps/hybridrl" ]]; then
  SKIP_TESTS=1 ./scripts/test.sh
fi
HYBRIDRL="$BUILD_DIR/apps/hybridrl"
rm -rf "$OUT"
t0=$(date +%s)
GRPO_ARGS=(algorithm.name=grpo task.name=reverse task.seed=1 trainer.log_every=5
  data.train_batch_size=16 rollout.n=8 rollout.max_new_tokens=5 rollout.kv_cache_tokens=8192
  geometry.ppo_mini_batch_size=4 geometry.micro_batch_size_per_gpu=32
  optim.lr=5e-4 sharding.param_dtype=float32 loader.epochs=0)
echo "== the untrained model (one GRPO step: its reward)"
"$HYBRIDRL" train "${GRPO_ARGS[@]}" model.init=tiny trainer.total_steps=1 trainer.output_dir="$OUT/untrained" \
  trainer.save_model=false
echo "== SFT warm-up ($SFT_STEPS steps)"
"$HYBRIDRL" train algorithm.name=sft task.name=reverse task.examples=4096 model.init=tiny \
  trainer.total_steps="$SFT_STEPS" trainer.output_dir="$OUT/sft" trainer.log_every=10 \
  data.train_batch_size=32 geometry.ppo_mini_batch_size=32 geometry.micro_batch_size_per_gpu=32 \
  optim.lr=3e-3 optim.weight_decay=0 sharding.param_dtype=float32 loader.epochs=0
echo "== GRPO ($GRPO_STEPS steps, 16 prompts x 8 samples, 4 updates per step)"
"$HYBRIDRL" train "${GRPO_ARGS[@]}" model.path="$OUT/sft/model" trainer.total_steps="$GRPO_STEPS" \
  trainer.output_dir="$OUT/grpo"
t1=$(date +%s)
python3 - "$OUT/untrained/metrics.jsonl" "$OUT/grpo/metrics.jsonl" <<'PY' || true
import json, sys
untrained = json.loads(open(sys.argv[1]).readline())["reward_mean"]
r = [json.loads(l)["reward_mean"] for l in open(sys.argv[2])]
k = max(1, len(r) // 10)
print("mean reward: untrained %.3f (random digits would score 0.1); GRPO after the SFT warm-up: first %d steps %.3f "
      "-> last %d steps %.3f" % (untrained, k, sum(r[:k]) / k, k, sum(r[-k:]) / k))
PY
echo "== done in $((t1 - t0)) s: $OUT/grpo/metrics.svg (open in a browser), tensorboard --logdir $OUT"
