#!/usr/bin/env python3
"""The peer for bench_model: the same workloads with Hugging Face transformers on the CPU.

Same geometry as bench/model/model_bench.cpp (the tests/fixtures/models/llama config: hidden 64,
2 layers, 4 heads, 2 KV heads, intermediate 128, vocab 320), fp32, one intra-op thread, random
weights, eager and SDPA attention. Prints tokens/s per workload (median over repeats).

  python3 bench/model/hf_peer.py            # needs torch + transformers (a helper, not a dependency)
"""
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 320


def model(attn):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                      max_position_embeddings=1024)
    return LlamaForCausalLM(cfg).to(torch.float32), attn


def timed(fn, tokens, repeats=15, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return tokens / statistics.median(times)


def forward_backward(attn, B, T):
    m, _ = model(attn)
    m.config._attn_implementation = attn
    m.train()
    ids = torch.randint(0, VOCAB, (B, T))

    def step():
        logits = m(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        loss.backward()
        loss.item()
    return timed(step, B * T)


def decode(attn, B, P, N):
    m, _ = model(attn)
    m.config._attn_implementation = attn
    m.eval()
    prompt = torch.randint(0, VOCAB, (B, P))

    @torch.no_grad()
    def run():
        m.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=N, min_new_tokens=N,
                   do_sample=False, use_cache=True, pad_token_id=0)
    return timed(run, B * N, repeats=7)


def main():
    torch.set_num_threads(1)
    import transformers
    print(f"peer: torch {torch.__version__}, transformers {transformers.__version__}, 1 thread")
    for attn in ("eager", "sdpa"):
        print(f"HF_ForwardBackward/batch:4/seq:128 [{attn}]  {forward_backward(attn, 4, 128):10.0f} tokens/s")
        print(f"HF_ForwardBackward/batch:1/seq:512 [{attn}]  {forward_backward(attn, 1, 512):10.0f} tokens/s")
        print(f"HF_Decode/batch:4/prompt:32/new:32 [{attn}]  {decode(attn, 4, 32, 32):10.0f} tokens/s")


if __name__ == "__main__":
    main()
