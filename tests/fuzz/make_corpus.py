#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer targets (tests/fuzz/corpus/<target>/) from the test
fixtures: a handful of valid inputs, each small enough for the targets' -max_len (scripts/fuzz.sh),
and a few broken ones. Deterministic; run it again after a fixture changes:

    python3 tests/fuzz/make_corpus.py

Only the standard library is used. Inputs the fuzzer found (crashes, timeouts, leaks) are committed
beside these as finding-<target>-<what> and are not touched here.
"""
import json
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
CORPUS = os.path.join(HERE, "corpus")


def fixture(*parts):
    return os.path.join(FIXTURES, *parts)


def read(*parts):
    with open(fixture(*parts), "rb") as f:
        return f.read()


def write_corpus(target, seeds):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    for name in os.listdir(d):  # regenerate the seeds, keep the findings
        if name.startswith("seed-"):
            os.remove(os.path.join(d, name))
    for name, data in seeds.items():
        if isinstance(data, str):
            data = data.encode()
        with open(os.path.join(d, "seed-" + name), "wb") as f:
            f.write(data)


# ---- safetensors ----

DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def safetensors(tensors, metadata=None, pad=True):
    """tensors: [(name, dtype, shape)], data filled with a byte pattern."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    data = b""
    for name, dtype, shape in tensors:
        n = DTYPES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        data += bytes((offset + i) % 251 for i in range(n))
        offset += n
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def fixture_tensors(path, keep):
    """The first `keep` tensors of a fixture checkpoint, by name and dtype, with tiny shapes."""
    raw = read(*path)
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = []
    for name, e in sorted(header.items()):
        if name == "__metadata__":
            continue
        shape = [min(d, 3) for d in e["shape"]]
        out.append((name, e["dtype"], shape))
        if len(out) == keep:
            break
    return out, header.get("__metadata__")


def safetensors_seeds():
    llama, meta = fixture_tensors(("models", "llama", "model.safetensors"), 4)
    qwen, _ = fixture_tensors(("models", "qwen2", "model.safetensors"), 3)
    good = safetensors(llama, meta)
    return {
        "llama-tiny": good,
        "qwen2-tiny": safetensors(qwen, {"format": "pt"}),
        "every-dtype": safetensors([(f"t.{d}", d, [2]) for d in DTYPES]),
        "empty-and-scalar": safetensors([("empty", "F32", [0, 4]), ("scalar", "F64", [])]),
        "unaligned": safetensors([("a", "U8", [3]), ("b", "F32", [2])], pad=False),
        "no-tensors": safetensors([], {"format": "pt"}),
        "truncated": good[: len(good) - 5],
        "header-too-long": struct.pack("<Q", 1 << 40) + good[8:64],
        "lfs-pointer": b"version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 12\n",
        "overlap": struct.pack("<Q", 88) + json.dumps(
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
             "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, separators=(",", ":")).encode().ljust(88)
        + bytes(8),
    }


# ---- config.json ----

def config_seeds():
    seeds = {}
    for model in ("llama", "llama_rm", "llama_variant", "mistral", "qwen2", "qwen2_swa", "qwen2_chat"):
        cfg = read("models", model, "config.json")
        seeds[model] = cfg
        gen = fixture("models", model, "generation_config.json")
        if os.path.exists(gen):
            seeds[model + "-with-generation-config"] = cfg + b"\0" + read("models", model, "generation_config.json")
    qwen = json.loads(read("models", "qwen2_swa", "config.json"))
    qwen.pop("layer_types", None)
    seeds["qwen2-window-layers"] = json.dumps(qwen)
    seeds["truncated"] = read("models", "llama", "config.json")[:200]
    seeds["not-an-object"] = "[1, 2, 3]"
    return seeds


# ---- tokenizer.json ----

def small_tokenizer(path, keep_merges):
    """The fixture tokenizer with its vocabulary cut to the byte tokens (and byte-fallback and
    special ones) plus what its first `keep_merges` usable merges make, renumbered from 0."""
    j = json.loads(read(*path))
    m = j["model"]
    vocab = m["vocab"]
    added = {a["content"] for a in j["added_tokens"]}
    byte_level = "ByteLevel" in json.dumps(j.get("pre_tokenizer"))
    keep = set()
    if byte_level:
        keep |= {t for t in vocab if len(t) == 1}  # the 256 byte characters (and other single ones)
    keep |= {t for t in vocab if t.startswith("<0x") and len(t) == 6}
    keep |= {t for t in vocab if len(t) == 1 and not byte_level and t.isascii()}
    keep |= {t for t in vocab if t in added or t == m.get("unk_token")}
    merges = []
    for mg in m["merges"]:
        a, b = mg if isinstance(mg, list) else mg.split(" ", 1)
        if a in keep and b in keep and a + b in vocab:
            keep.add(a + b)
            merges.append(mg)
            if len(merges) == keep_merges:
                break
    order = sorted(keep, key=lambda t: vocab[t])
    ids = {t: i for i, t in enumerate(order)}
    m["vocab"] = ids
    m["merges"] = merges
    for a in j["added_tokens"]:
        a["id"] = ids[a["content"]]
    return json.dumps(j, ensure_ascii=False, separators=(",", ":")).encode()


def conformance_text(tok, line):
    with open(fixture("tokenizers", tok, "conformance.jsonl"), encoding="utf-8") as f:
        for i, l in enumerate(f):
            if i == line:
                return json.loads(l)["text"][:200]
    return "hello"


def tokenizer_seeds():
    seeds = {}
    for tok, merges in (("qwen2", 60), ("llama3", 60), ("fallback", 60)):
        body = small_tokenizer(("tokenizers", tok, "tokenizer.json"), merges)
        config = read("tokenizers", tok, "tokenizer_config.json")
        text = conformance_text(tok, 1).encode()
        seeds[tok] = body + b"\0" + config + b"\0\0" + text
        seeds[tok + "-no-config"] = body + b"\0\0\0" + conformance_text(tok, 7).encode()
    chat = small_tokenizer(("models", "qwen2_chat", "tokenizer.json"), 40)
    seeds["qwen2-chat-generation-config"] = (chat + b"\0" + read("models", "qwen2_chat", "tokenizer_config.json") + b"\0"
                                             + read("models", "qwen2_chat", "generation_config.json") + b"\0"
                                             + "Hello, wörld! 12345 <|im_start|>user\nhi<|im_end|>".encode())
    seeds["truncated"] = small_tokenizer(("tokenizers", "qwen2", "tokenizer.json"), 10)[:300] + b"\0\0\0hi"
    seeds["wordpiece"] = b'{"model": {"type": "WordPiece", "vocab": {"a": 0}}}\0\0\0a'
    return seeds


# ---- JSONL datasets ----

def jsonl_seeds():
    prompts = read("data", "prompts.jsonl")
    bad = read("data", "prompts_bad.jsonl")
    chat = (b'{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}\n'
            b'{"prompt": "plain", "answer": 3, "uid": 18446744073709551615}\n')
    # first byte: bits 0-1 kind (0 prompts, 1 pairs, 2 labelled, 3 completions), 2 skip, 3 chat
    # tokenizer, 4 as_chat, 5 prompt_template, 6 small max lengths, 7 max_line_bytes 64
    return {
        "prompts-raise": b"\x00" + prompts,
        "prompts-bad-skip": b"\x04" + bad,
        "prompts-bad-limits-skip": bytes([4 | 64 | 128]) + bad,
        "gsm8k-question-template": bytes([32 | 4]) + read("data", "gsm8k.jsonl"),
        "chat-messages": bytes([8]) + chat,
        "chat-as-chat-skip": bytes([8 | 16 | 4]) + prompts,
        "pairs": b"\x01" + read("data", "pairs.jsonl"),
        "labelled-skip": b"\x06" + read("data", "labelled.jsonl"),
        "completions": b"\x03" + b'{"prompt": "2+2=", "completion": "4"}\r\n\n{"prompt": "x", "completion": ""}\n',
    }


# ---- YAML configuration and overrides ----

def yaml_seeds():
    grpo = """algorithm:
  name: grpo
  clip_high: 0.28
model:
  init: tiny
task:
  name: reverse
rollout:
  n: 4
  block_size: 16
  sampling:
    temperature: 0.7
    stop_token_ids: [2, 5]
trainer:
  total_steps: 2
  seed: 3
data:
  train_batch_size: 8
"""
    dpo = """algorithm: {name: dpo, beta: 0.1}
data:
  train_files: [a.jsonl, "b c.jsonl"]
  max_length: 64
trainer: {total_steps: 1, output_dir: /tmp/x}
"""
    return {
        "grpo": grpo,
        "grpo-overrides": grpo + "\0rollout.n=8\ntrainer.seed=9\nalgorithm.name=ppo\nrollout.sampling.stop_token_ids=[1, 2]",
        "dpo": dpo,
        "kto-overrides": dpo.replace("dpo", "kto") + "\0data.max_prompt_length=16\nloader.drop_last=false",
        "sft-anchor": "task: &t {name: reverse}\nalgorithm: {name: sft}\n",
        "empty-overrides-only": "\0task.name=reverse\nmodel.dtype=bfloat16\ndistributed.timeout_s=30",
        "bad-yaml": "a: [unclosed\n",
        "unknown-key": "rollout:\n  blok_size: 3\ntask: {name: reverse}\n",
    }


# ---- checkpoint directories ----

def archive(files):
    out = b""
    for name, content in files:
        if isinstance(content, str):
            content = content.encode()
        out += b"%%FILE " + name.encode() + b"\n" + content + b"\n"
    return out[:-1]


def checkpoint_seeds():
    state = {"step": 7, "format": 1, "loader": {"seed": 0, "epoch": 1, "batch_in_epoch": 2, "dataset_size": 5,
                                                 "loader": "Packed"},
             "algorithm_state": {"kl_coef": 0.05}}
    rest = safetensors([("rng.cpu", "U8", [16]), ("optimizer.step", "I64", [1])])
    model = safetensors([("model.norm.weight", "F32", [4]), ("lm_head.weight", "BF16", [3, 4])], {"format": "pt"})
    sharded_state = dict(state, checkpoint_format="sharded",
                         shards={"files": ["shard_00000-of-00002.safetensors", "shard_00001-of-00002.safetensors"],
                                 "shapes": {"model.w": [2, 3], "optim.m": [4]}})
    shard0 = safetensors([("model.w@0", "F32", [4]), ("optim.m@0", "F32", [1])], {"format": "hybridrl-shard"})
    shard1 = safetensors([("model.w@4", "F32", [2]), ("optim.m@1", "F32", [3])], {"format": "hybridrl-shard"})
    index = {"metadata": {"total_size": 40}, "weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors",
                                                            "lm_head.weight": "model-00002-of-00002.safetensors"}}
    part1 = safetensors([("model.norm.weight", "F32", [4])])
    part2 = safetensors([("lm_head.weight", "BF16", [3, 4])])
    config = read("models", "llama", "config.json")
    return {
        "full": archive([("trainer_state.json", json.dumps(state)), ("trainer_state.safetensors", rest),
                         ("model.safetensors", model), ("config.json", config)]),
        "sharded": archive([("trainer_state.json", json.dumps(sharded_state)), ("trainer_state.safetensors", rest),
                            ("shard_00000-of-00002.safetensors", shard0),
                            ("shard_00001-of-00002.safetensors", shard1)]),
        "hf-index": archive([("model.safetensors.index.json", json.dumps(index)),
                             ("model-00001-of-00002.safetensors", part1), ("model-00002-of-00002.safetensors", part2),
                             ("config.json", config),
                             ("generation_config.json", read("models", "llama", "generation_config.json"))]),
        "missing-model": archive([("trainer_state.json", json.dumps(state)), ("trainer_state.safetensors", rest)]),
        "index-escapes": archive([("model.safetensors.index.json",
                                   json.dumps({"weight_map": {"a": "../a.safetensors", "b": "/etc/passwd"}}))]),
    }


def main():
    write_corpus("safetensors", safetensors_seeds())
    write_corpus("config_json", config_seeds())
    write_corpus("tokenizer_json", tokenizer_seeds())
    write_corpus("jsonl", jsonl_seeds())
    write_corpus("yaml_config", yaml_seeds())
    write_corpus("checkpoint_dir", checkpoint_seeds())
    for target in sorted(os.listdir(CORPUS)):
        d = os.path.join(CORPUS, target)
        sizes = [os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)]
        print(f"{target}: {len(sizes)} inputs, {sum(sizes)} bytes, largest {max(sizes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
