#!/usr/bin/env python3
"""Which operator, at which shapes, spends the GPU's time: reads a Kineto Chrome trace
(bench_train profile ... TRACE.json, recorded with input shapes) and sums each kernel's time under
the CPU operator that launched it (matched by the trace's External id), keyed by the operator's
name and input shapes. Prints the `top` keys by GPU time per repetition, with the kernel names
they ran and, for matrix products, the achieved TFLOP/s.

    python3 bench/support/trace_ops.py TRACE.json [--reps 5] [--top 30] [--match gemm]
"""
import argparse
import json
from collections import defaultdict


def mm_flops(name, dims):
    """2·M·N·K of a matrix product from its input shapes (aten::mm / addmm / bmm / linear)."""
    try:
        if name == "aten::mm" and len(dims) >= 2:
            (m, k), (_, n) = dims[0], dims[1]
            return 2 * m * n * k
        if name == "aten::addmm" and len(dims) >= 3:
            (m, k), (_, n) = dims[1], dims[2]
            return 2 * m * n * k
        if name == "aten::bmm" and len(dims) >= 2:
            (b, m, k), (_, _, n) = dims[0], dims[1]
            return 2 * b * m * n * k
    except (TypeError, ValueError):
        pass
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--match", default="", help="only kernels whose name contains this")
    a = ap.parse_args()
    with open(a.trace) as f:
        doc = json.load(f)
    ev = doc["traceEvents"] if isinstance(doc, dict) else doc
    ops = {}
    kernels = []
    for e in ev:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        args = e.get("args", {})
        if e.get("cat") == "cpu_op" and "External id" in args:
            ops[args["External id"]] = (e.get("name", "?"), args.get("Input Dims", []))
        elif e.get("cat") == "kernel":
            kernels.append((e.get("name", "?"), float(e["dur"]), args.get("External id")))
    agg = defaultdict(lambda: [0.0, 0, set(), 0])
    total = 0.0
    for kname, dur, ext in kernels:
        total += dur
        if a.match and a.match not in kname:
            continue
        name, dims = ops.get(ext, ("(no op)", []))
        dims = [d for d in dims if d]
        key = (name, json.dumps(dims))
        s = agg[key]
        s[0] += dur
        s[1] += 1
        s[2].add(kname[:40])
        s[3] = mm_flops(name, dims)
    rows = sorted(agg.items(), key=lambda kv: -kv[1][0])
    print(f"kernels {total / a.reps / 1e3:.2f} ms per rep; top {a.top} operator/shape keys:")
    for (name, dims), (us, calls, knames, fl) in rows[: a.top]:
        per = us / a.reps
        tf = f" {fl * calls / us / 1e6:6.1f} TF/s" if fl else ""
        print(f"{per / 1e3:8.3f} ms {calls / a.reps:6.1f}x {name:22s} {dims[:60]:60s}{tf} {sorted(knames)[0]}")


if __name__ == "__main__":
    main()
