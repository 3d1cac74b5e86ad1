# The peer of `bench_rollout generate`: transformers' generate() with a static KV cache (compiled),
# random-init Llama configs of the same shapes (160m and 1b as in ../shared/bench/hf_baseline.py),
# prompt 128, gen 256, sampling, bf16, timed on the second call at each shape (the first compiles).
# Prints one JSON object per measurement. Usage on the GPU machine:
#   python3 bench/rollout/hf_generate_peer.py 160m 1b --batch 64 256
import argparse, json, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "160m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                 num_attention_heads=12, num_key_value_heads=12),
    "1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=256)
    a = ap.parse_args()
    torch.manual_seed(0)
    for name in a.models:
        cfg = LlamaConfig(max_position_embeddings=2048, **SHAPES[name])
        cfg._attn_implementation = "sdpa"
        model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
        for B in a.batch:
            prompt = torch.randint(100, 32000, (B, a.prompt), device="cuda")
            kw = dict(max_new_tokens=a.gen, min_new_tokens=a.gen, do_sample=True, pad_token_id=0,
                      cache_implementation="static")
            with torch.no_grad():
                model.generate(prompt, **kw)
                torch.cuda.synchronize()
                t = time.perf_counter()
                model.generate(prompt, **kw)
                torch.cuda.synchronize()
                secs = time.perf_counter() - t
            print(json.dumps({"bench": "generate", "engine": "transformers static compiled", "model": name,
                              "batch": B, "generated_tokens": B * a.gen, "seconds": round(secs, 3),
                              "tokens_per_s": round(B * a.gen / secs, 1)}), flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
