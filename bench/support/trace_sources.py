#!/usr/bin/env python3
"""Who launches a kernel: reads a Kineto Chrome trace (bench_train profile ... TRACE.json) and, for
every kernel whose name contains one of the given patterns, finds the host runtime call that
launched it (by correlation id) and the CPU ops around that call on its thread (outermost first,
the autograd node included), then prints one JSON line per (pattern, op chain) with calls and GPU
milliseconds. What a profile's copy, fill and memcpy rows are there for.

    python3 bench/support/trace_sources.py TRACE.json Fill Memcpy direct_copy [--depth 4] [--top 30]
"""
import argparse
import bisect
import json
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("patterns", nargs="+")
    ap.add_argument("--depth", type=int, default=4, help="innermost CPU ops shown per chain")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    with open(a.trace) as f:
        doc = json.load(f)
    ev = doc["traceEvents"] if isinstance(doc, dict) else doc
    launches, ops, kernels = {}, defaultdict(list), []
    for e in ev:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat, args = e.get("cat", ""), e.get("args", {})
        if cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launches[args["correlation"]] = (e["tid"], float(e["ts"]))
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            kernels.append((e.get("name", "?"), float(e["dur"]), args.get("correlation")))
        elif cat in ("cpu_op", "user_annotation"):
            ops[e["tid"]].append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e.get("name", "?")))
    starts = {}
    for tid in ops:
        ops[tid].sort()
        starts[tid] = [o[0] for o in ops[tid]]
    rows = defaultdict(lambda: [0, 0.0])
    for name, dur, corr in kernels:
        pat = next((p for p in a.patterns if p in name), None)
        if pat is None:
            continue
        chain = "(no launch record)"
        if corr in launches:
            tid, t = launches[corr]
            lst = ops.get(tid, [])
            i = bisect.bisect_right(starts.get(tid, []), t)
            cover = [o for o in lst[max(0, i - 400):i] if o[1] >= t]  # ops still running at the launch
            cover.sort(key=lambda o: o[0])
            chain = " > ".join(o[2] for o in cover[-a.depth:]) or "(no cpu op)"
        r = rows[(pat, name[:60], chain)]
        r[0] += 1
        r[1] += dur
    for (pat, kname, chain), (n, us) in sorted(rows.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(json.dumps({"pattern": pat, "kernel": kname, "calls": n, "gpu_ms": round(us / 1e3, 3), "under": chain[:300]}))


if __name__ == "__main__":
    main()
