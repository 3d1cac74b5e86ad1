# Probe (GPU machine): does splitting K help a decode step's GEMMs at M = 256 rows?
#   python3 bench/rollout/gemm_split_probe.py
# Each projection of the 160m and 1b configs (bench/support) is timed inside a CUDA graph, back to
# back over rotating copies of its weight (more than 3x L2 in all, as a decode step reads its
# weights from HBM): cuBLAS's own GEMM (F.linear) against K split s ways (a batched GEMM with fp32
# partial sums, then their sum and the cast). µs per GEMM. Results: docs/benchmarks.md.
import torch
import torch.nn.functional as F
torch.manual_seed(0)
dev = "cuda"
dt = torch.bfloat16
L2 = torch.cuda.get_device_properties(0).L2_cache_size
def timed(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2): fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(reps): g.replay()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps * 1e3
shapes = [(256, 2560, 2048, "1b qkv"), (256, 2048, 2048, "1b o"), (256, 11264, 2048, "1b gate_up"),
          (256, 2048, 5632, "1b down"), (256, 2304, 768, "160m qkv"), (256, 768, 768, "160m o"),
          (256, 4096, 768, "160m gate_up"), (256, 768, 2048, "160m down"), (512, 2560, 2048, "1b qkv B512")]
for M, N, K, name in shapes:
    wbytes = N * K * 2
    copies = max(3, min(64, (3 * L2) // wbytes + 1))
    Ws = [torch.randn(N, K, device=dev, dtype=dt) * 0.02 for _ in range(copies)]
    x = torch.randn(M, K, device=dev, dtype=dt)
    out = {}
    def base():
        for W in Ws: F.linear(x, W)
    out["cublas"] = timed(base) / copies
    for s in (2, 3, 4, 8):
        if K % s: continue
        Kc = K // s
        xs = x.view(M, s, Kc).transpose(0, 1)  # [s, M, Kc] strided
        def split(s=s, Kc=Kc, xs=xs):
            for W in Ws:
                Wt = W.view(N, s, Kc).permute(1, 2, 0)  # [s, Kc, N]
                p = torch.bmm(xs, Wt, out_dtype=torch.float32)
                p.sum(0).to(dt)
        try:
            out[f"split{s}"] = timed(split) / copies
        except Exception as e:
            out[f"split{s}"] = str(e)[:80]
    gb = wbytes / 1e9
    print(name, M, N, K, {k: (round(v, 2) if isinstance(v, float) else v) for k, v in out.items()},
          f"cublas {gb / (out['cublas'] * 1e-6) / 1e3:.2f} TB/s", flush=True)
