#!/usr/bin/env python3
"""The peer of bench_tokenizer: Hugging Face tokenizers encoding the same fixture strings on one
core (TOKENIZERS_PARALLELISM and RAYON_NUM_THREADS pinned to one thread), warm (after a first
pass) and cold (a fresh tokenizer), one encode() per string as bench_tokenizer does, and
encode_batch() for reference.
  RAYON_NUM_THREADS=1 taskset -c 0 python3 bench/tokenizer/hf_tokenizer_peer.py
"""
import json
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "tokenizers")


def rate(f, texts, repeat):
    nbytes = sum(len(t.encode()) for t in texts)
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        f(texts)
        best = max(best, nbytes / (time.perf_counter() - t0) / 1e6)
    return best


for style in sys.argv[1:] or ["qwen2", "llama3", "fallback"]:
    d = os.path.join(ROOT, style)
    texts = [json.loads(l)["text"] for l in open(os.path.join(d, "conformance.jsonl"), encoding="utf-8")]
    cold = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    t0 = time.perf_counter()
    for t in texts:
        cold.encode(t, add_special_tokens=False)
    cold_rate = sum(len(t.encode()) for t in texts) / (time.perf_counter() - t0) / 1e6
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    one = lambda ts: [tok.encode(t, add_special_tokens=False) for t in ts]
    batch = lambda ts: tok.encode_batch(ts, add_special_tokens=False)
    one(texts)
    print(f"{style}: HF tokenizers encode() {rate(one, texts, 5):.2f} MB/s warm, {cold_rate:.2f} MB/s cold; "
          f"encode_batch() {rate(batch, texts, 5):.2f} MB/s (RAYON_NUM_THREADS={os.environ['RAYON_NUM_THREADS']})")
