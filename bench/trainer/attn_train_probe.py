# Training attention, packed (varlen) causal: FlashAttention-2 (at::_flash_attention_forward, what
# model/attention.hpp calls) against cuDNN's ragged SDPA (at::_cudnn_attention_forward with
# cum_seq_q/k) and, where every row has one length, the dense SDPA kernels (cuDNN, flash,
# memory-efficient) on a [B, H, T, D] view, forward and forward + backward, at the update benchmark's shapes: 16 sequences of
# 1024 tokens (and a ragged mix of the same total), 160m (12 heads / 12 KV, D 64) and 1b (32 / 4,
# D 64). Values of each against the other, and µs per call (CUDA events, mean of 20 after 5).
# Usage on the GPU machine: python3 bench/trainer/attn_train_probe.py
import json, torch

torch.manual_seed(0)
dev = "cuda"


def timeit(fn, reps=20, warm=5):
    for _ in range(warm):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / reps


for name, H, Hkv in (("160m", 12, 12), ("1b", 32, 4)):
    for lens_name, lens in (("16x1024", [1024] * 16), ("ragged", [1500, 700, 300, 1024, 2000, 812, 256, 1000,
                                                                     1200, 900, 1100, 1500, 700, 1300, 1100, 1292])):
        T, D = sum(lens), 64
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=dev)
        mx = max(lens)
        q = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(T, Hkv, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(T, Hkv, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        go = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
        scale = D ** -0.5
        row = {"model": name, "lens": lens_name, "tokens": T}

        def fa_fwd():
            return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, mx, mx, 0.0, True, False, scale=scale)[0]

        def cd_fwd():
            return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, mx, mx, True, 0.0, True, False,
                                                           scale=scale)[0]

        # rows of one length (the update benchmark's full 16 x 1024): the dense [B, H, T, D] kernels
        # through SDPA on a strided view of the packed tensors, GQA by enable_gqa
        dense = len(set(lens)) == 1
        B, L = len(lens), lens[0]

        def sdpa(backend):
            def f():
                qd, kd, vd = (t.view(B, L, -1, D).transpose(1, 2) for t in (q, k, v))
                with torch.nn.attention.sdpa_kernel(backend):
                    o = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scale,
                                                                         enable_gqa=H != Hkv)
                return o.transpose(1, 2).reshape(T, H, D)
            return f

        outs = {}
        kinds = [("flash", fa_fwd), ("cudnn", cd_fwd)]
        if dense:
            from torch.nn.attention import SDPBackend
            kinds += [("dense_cudnn", sdpa(SDPBackend.CUDNN_ATTENTION)), ("dense_flash", sdpa(SDPBackend.FLASH_ATTENTION)),
                      ("dense_efficient", sdpa(SDPBackend.EFFICIENT_ATTENTION))]
        for tag, f in kinds:
            try:
                with torch.no_grad():
                    outs[tag] = f().float()
                    row[f"{tag}_fwd_us"] = round(timeit(f), 1)

                def fb(f=f):
                    for t in (q, k, v):
                        t.grad = None
                    f().backward(go)
                row[f"{tag}_fwd_bwd_us"] = round(timeit(fb), 1)
                fb()
                outs[tag + "_g"] = [t.grad.float().clone() for t in (q, k, v)]
            except Exception as e:  # noqa: BLE001
                row[f"{tag}_error"] = str(e).splitlines()[0][:200]
        for other in ("cudnn", "dense_cudnn", "dense_flash", "dense_efficient"):
            if "flash" in outs and other in outs:
                row[f"{other}_out_max_diff"] = float((outs["flash"] - outs[other]).abs().max())
                if "flash_g" in outs and other + "_g" in outs:
                    row[f"{other}_grad_rel"] = [float((a - b).norm() / a.norm())
                                                for a, b in zip(outs["flash_g"], outs[other + "_g"])]
        # the exact reference on the first sequence (fp32 math)
        if "flash" in outs:
            n = lens[0]
            qq, kk, vv = (t[:n].float().transpose(0, 1) for t in (q, k, v))
            kk, vv = (t.repeat_interleave(H // Hkv, 0) for t in (kk, vv))
            ref = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=scale).transpose(0, 1)
            for tag in ("flash", "cudnn", "dense_cudnn", "dense_flash", "dense_efficient"):
                if tag in outs:
                    row[f"{tag}_vs_fp32"] = float((outs[tag][:n] - ref.detach()).abs().max())
        print(json.dumps(row), flush=True)
