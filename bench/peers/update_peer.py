# The peer of `bench_train update`: transformers' eager training step as ../shared/bench/hf_baseline.py
# measures it — random-init Llama (160m, 1b), bf16 parameters, 16 × 1024 tokens, cross-entropy,
# fused AdamW; mean of 5 steps after 3 warm-up steps; MFU = 6 · params · tokens / time / 989 TFLOP/s.
# Usage on the GPU machine: python3 bench/peers/update_peer.py 160m 1b
import json, sys, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "160m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                 num_attention_heads=12, num_key_value_heads=12),
    "1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4),
}

for name in sys.argv[1:] or ["160m", "1b"]:
    torch.manual_seed(0)
    cfg = LlamaConfig(max_position_embeddings=2048, **SHAPES[name])
    cfg._attn_implementation = "sdpa"
    m = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).train()
    params = sum(p.numel() for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5, fused=True)
    x = torch.randint(100, 32000, (16, 1024), device="cuda")
    for i in range(8):
        if i == 3:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t = time.perf_counter()
        m(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / 5
    print(json.dumps({"bench": "update", "engine": "transformers eager (bf16 params, fused AdamW)", "model": name,
                      "params": params, "tokens": x.numel(), "step_s": round(dt, 4),
                      "tokens_per_s": round(x.numel() / dt, 1), "mfu": round(6 * params * x.numel() / dt / 989e12, 4),
                      "peak_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2)}), flush=True)
    del m, opt
    torch.cuda.empty_cache()
