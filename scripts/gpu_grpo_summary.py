#!/usr/bin/env python3
"""Prints the grpo_step lines of a bench_train log (stdin) as a short table: step, phase times,
the weights' fingerprint time share, memory peaks, agreement metrics (used by the device runs)."""
import json
import sys

keys = ["time/step", "time/generate", "time/old_log_prob", "time/ref", "time/update", "time/fingerprint",
        "rollout/log_prob_diff", "memory/peak_update_gb", "geometry/micro_batch_size_update"]
for line in sys.stdin:
    if line.startswith("{") and '"grpo_step"' in line:
        d = json.loads(line)
        print(d["model"], d["step"], " ".join(f"{k.split('/')[-1]}={d[k]:.4g}" for k in keys if k in d))
    elif "signal" in line or "crash" in line or line.startswith("#"):
        print(line.rstrip()[:300])
