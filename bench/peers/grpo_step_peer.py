# The peer of `bench_train grpo`: the same GRPO step written in Python with transformers generate()
# and torch — 64 prompts × 8 samples, prompt 128 random tokens, 256 new tokens (min_new_tokens =
# max_new_tokens, as hybridrl's rollout.ignore_eos), bf16, random-init Llama configs of
# ../shared/bench/hf_baseline.py. Equal work to hybridrl's GRPOTrainer step: generation, the
# reward (share of even response ids), group-normalised advantages, the old log-probs and the
# reference's (no grad, micro-batches of 32), one update over the 512 sequences in micro-batches
# of 32 (clipped ratio, low-variance KL to the reference with coefficient 0.001, token mean),
# gradient clipping at 1.0 and fused AdamW. Prints one JSON object per step (phase times); the
# first step pays generate()'s compilation: read the later ones. Usage on the GPU machine:
#   python3 bench/peers/grpo_step_peer.py 160m 1b [--steps 3] [--cache static|dynamic]
import argparse, json, time
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "160m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                 num_attention_heads=12, num_key_value_heads=12),
    "1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4),
}
PROMPTS, N, P, G, MICRO = 64, 8, 128, 256, 32


def token_log_probs(model, seqs):
    """log p of each response token of `seqs` [B, P + G] (positions P .. P+G-1), fp32."""
    logits = model(input_ids=seqs).logits[:, P - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, seqs[:, P:, None]).squeeze(-1)


def sync():
    torch.cuda.synchronize()
    return time.perf_counter()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cache", default="static")
    a = ap.parse_args()
    for name in a.models:
        torch.manual_seed(0)
        cfg = LlamaConfig(max_position_embeddings=2048, **SHAPES[name])
        cfg._attn_implementation = "sdpa"
        policy = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)
        ref = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
        ref.load_state_dict(policy.state_dict())
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-6, fused=True)
        params = sum(p.numel() for p in policy.parameters())
        for step in range(1, a.steps + 1):
            prompts = torch.randint(100, 32000, (PROMPTS, P), device="cuda").repeat_interleave(N, 0)
            t0 = sync()
            policy.eval()
            with torch.no_grad():
                kw = dict(max_new_tokens=G, min_new_tokens=G, do_sample=True, pad_token_id=0)
                if a.cache == "static":
                    kw["cache_implementation"] = "static"
                seqs = policy.generate(prompts, **kw)
            t1 = sync()
            resp = seqs[:, P:]
            reward = (resp % 2 == 0).float().mean(-1)
            r = reward.view(PROMPTS, N)
            adv = ((r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-6)).view(-1, 1)
            t2 = sync()
            with torch.no_grad():
                old = torch.cat([token_log_probs(policy, s) for s in seqs.split(MICRO)])
                t3 = sync()
                ref_lp = torch.cat([token_log_probs(ref, s) for s in seqs.split(MICRO)])
            t4 = sync()
            policy.train()
            for i, s in enumerate(seqs.split(MICRO)):
                sl = slice(i * MICRO, (i + 1) * MICRO)
                lp = token_log_probs(policy, s)
                ratio = torch.exp(lp - old[sl])
                pg = torch.maximum(-adv[sl] * ratio, -adv[sl] * ratio.clamp(0.8, 1.2))
                d = ref_lp[sl] - lp
                kl = (torch.exp(d) - d - 1).clamp(-10, 10)
                loss = (pg + 0.001 * kl).mean() * (s.shape[0] / seqs.shape[0])
                loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            t5 = sync()
            print(json.dumps({"bench": "grpo_step", "engine": f"transformers generate ({a.cache} cache) + torch",
                              "model": name, "params": params, "prompts": PROMPTS, "n": N, "step": step,
                              "time/step": round(t5 - t0, 4), "time/generate": round(t1 - t0, 4),
                              "time/reward": round(t2 - t1, 4), "time/old_log_prob": round(t3 - t2, 4),
                              "time/ref": round(t4 - t3, 4), "time/update": round(t5 - t4, 4),
                              "memory/peak_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2)}), flush=True)
        del policy, ref, opt
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
