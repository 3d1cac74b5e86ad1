#!/usr/bin/env python3
"""Where the GPU waits: reads a Kineto Chrome trace (bench_train profile ... TRACE.json) and prints
the GPU's busy and idle time over the recorded span, split into phases found from the kernels
(generation: from the first paged decode kernel to the last; before it; after it), the idle gaps
inside generation (per decode step), and the host work that ran during the largest idle stretches
(the innermost CPU op, or runtime call, covering each gap's middle).

    python3 bench/support/trace_gaps.py TRACE.json [--min-gap-us 20] [--top 25]
"""
import argparse
import heapq
import json
from collections import defaultdict


def load(path):
    with open(path) as f:
        doc = json.load(f)
    ev = doc["traceEvents"] if isinstance(doc, dict) else doc
    kernels, host = [], []
    for e in ev:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat = e.get("cat", "")
        t0, d = float(e["ts"]), float(e["dur"])
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            kernels.append((t0, t0 + d, e.get("name", "?")))
        elif cat in ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "python_function"):
            host.append((t0, t0 + d, e.get("name", "?")))
    kernels.sort()
    host.sort()
    return kernels, host


def merge(intervals):
    out = []
    for a, b, *_ in intervals:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def gaps_of(busy, lo, hi, min_gap):
    """Idle stretches of at least min_gap µs in [lo, hi)."""
    g, t = [], lo
    for a, b in busy:
        if b <= lo:
            continue
        if a >= hi:
            break
        if a - t >= min_gap:
            g.append((t, a))
        t = max(t, b)
    if hi - t >= min_gap:
        g.append((t, hi))
    return g


def busy_in(busy, lo, hi):
    s = 0.0
    for a, b in busy:
        a, b = max(a, lo), min(b, hi)
        if b > a:
            s += b - a
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--min-gap-us", type=float, default=20.0)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    kernels, host = load(a.trace)
    if not kernels:
        raise SystemExit("no kernels in the trace")
    busy = merge(kernels)
    t_lo = min(kernels[0][0], host[0][0] if host else kernels[0][0])
    t_hi = max(max(k[1] for k in kernels), max((h[1] for h in host), default=0.0))
    dec = [k for k in kernels if "paged_decode" in k[2]]
    phases = [("whole span", t_lo, t_hi)]
    if dec:
        d0, d1 = dec[0][0], dec[-1][1]
        phases += [("before generation's decode", t_lo, d0), ("generation's decode", d0, d1), ("after it", d1, t_hi)]
    for name, lo, hi in phases:
        span = hi - lo
        b = busy_in(busy, lo, hi)
        gs = gaps_of(busy, lo, hi, 0.0)
        big = [g for g in gs if g[1] - g[0] >= a.min_gap_us]
        print(json.dumps({"phase": name, "span_ms": round(span / 1e3, 2), "busy_ms": round(b / 1e3, 2),
                          "idle_ms": round((span - b) / 1e3, 2), "busy_fraction": round(b / span, 3) if span else None,
                          f"gaps_over_{a.min_gap_us:g}us": len(big),
                          "their_ms": round(sum(g[1] - g[0] for g in big) / 1e3, 2)}))
    if dec:
        # decode steps: the graph replays inside generation; the idle before each one's kernels
        launches = [h for h in host if h[2] in ("cudaGraphLaunch", "cuGraphLaunch") and d0 - 1e4 <= h[0] <= d1]
        print(json.dumps({"decode_graph_launches": len(launches), "decode_attention_calls": len(dec),
                          "idle_per_launch_us": round((d1 - d0 - busy_in(busy, d0, d1)) / max(len(launches), 1), 1)}))
    # what the host ran during the idle stretches: the latest-started host event still running at
    # each gap's middle (the innermost one of a thread's nested ops), by a sweep over the gaps
    by = defaultdict(lambda: [0.0, 0])
    active, k = [], 0
    for lo, hi in gaps_of(busy, t_lo, t_hi, a.min_gap_us):
        mid = (lo + hi) / 2
        while k < len(host) and host[k][0] <= mid:
            heapq.heappush(active, (-host[k][0], host[k][1], host[k][2]))
            k += 1
        while active and active[0][1] < mid:
            heapq.heappop(active)  # ended before this gap, so before every later one
        name = active[0][2] if active else "(no host event)"
        phase = "decode" if dec and d0 <= mid <= d1 else ("before" if dec and mid < d0 else "after")
        by[(phase, name)][0] += hi - lo
        by[(phase, name)][1] += 1
    rows = sorted(by.items(), key=lambda kv: -kv[1][0])[: a.top]
    for (phase, name), (us, n) in rows:
        print(json.dumps({"idle_under": name[:100], "phase": phase, "ms": round(us / 1e3, 2), "gaps": n}))


if __name__ == "__main__":
    main()
