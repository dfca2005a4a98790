#!/usr/bin/env python3
"""Makes the seed corpora in fuzz/corpus/ from real files, small (the whole corpus stays
a few hundred KB): the default model's GGUF (its first 16 KiB, and a trimmed copy whose
tokenizer arrays and tensors are cut down), snippets of the Llama 3 and Qwen3 tokenizers in
data/tokenizers, the chat fixtures' messages, request bodies, devices/*.json, and
the plan.json / state.json of the deployments and the config.json of the synth models given.

    python3 fuzz/make_seeds.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
        [--deployment DIR ...] [--synth-model DIR ...]

The committed corpus was made with the deployments of a tiny synth model on cpu (tests/serve_e2e.py's)
and of a quantized one on npusim (test_npusim_quant's), and their synth models.
"""
import argparse
import hashlib
import json
import os
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def put(harness, data, name=None):
    d = CORPUS / harness
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / (name or hashlib.sha1(data).hexdigest()[:16])).write_bytes(data)


# GGUF ----------------------------------------------------------------------------------
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.pos:self.pos + n]
        self.pos += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(SCALARS[t])


def w_string(s):
    return struct.pack("<Q", len(s)) + s


def w_value(t, v):
    if t == 8:
        return w_string(v)
    if t == 9:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(w_value(et, x) for x in items)
    return struct.pack(SCALARS[t], v)


def gguf_seeds(model):
    data = model.open("rb").read(16 << 20)  # metadata and tensor infos fit in the first 16 MiB
    put("gguf", data[:16384], "default_model_head16k")
    r = Reader(data)
    magic, version, n_tensors, n_kv = r.take("<I"), r.take("<I"), r.take("<Q"), r.take("<Q")
    kv = []
    for _ in range(n_kv):
        key = r.string()
        t = r.take("<I")
        kv.append((key, t, r.value(t)))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.take("<I")
        dims = [r.take("<Q") for _ in range(nd)]
        infos.append((name, dims, r.take("<I"), r.take("<Q")))
    # Trimmed: the first 600 tokens, the merges among them, three small F32 tensors.
    keep = 600
    out_kv = []
    token_set = set()
    for key, t, v in kv:
        if key == b"tokenizer.ggml.tokens":
            token_set = set(v[1][:keep])
    for key, t, v in kv:
        if t == 9 and key.startswith(b"tokenizer.ggml."):
            et, items = v
            if key == b"tokenizer.ggml.merges":
                items = [m for m in items if all(p in token_set for p in m.split(b" ")) and m.replace(b" ", b"") in token_set]
            else:
                items = items[:keep]
            v = (et, items)
        elif t == 9 and len(v[1]) > 64:
            v = (v[0], v[1][:64])
        if key.endswith(b".vocab_size"):
            v = keep
        out_kv.append((key, t, v))
    small = [(n, [32], 0) for n, _, _, _ in infos[:3]]
    head = struct.pack("<IIQQ", magic, version, len(small), len(out_kv))
    head += b"".join(w_string(k) + struct.pack("<I", t) + w_value(t, v) for k, t, v in out_kv)
    off = 0
    for name, dims, typ in small:
        head += w_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        head += struct.pack("<IQ", typ, off)
        off += 128
    head += b"\0" * (-len(head) % 32)
    body = b"".join(struct.pack("<32f", *[0.01 * i for i in range(32)]) for _ in small)
    put("gguf", head + body, "default_model_trimmed")
    # The metadata alone, no tensors.
    put("gguf", struct.pack("<IIQQ", magic, version, 0, 2) + w_string(b"general.architecture") +
        struct.pack("<I", 8) + w_string(b"llama") + w_string(b"general.alignment") + struct.pack("<II", 4, 32),
        "minimal")


# safetensors ---------------------------------------------------------------------------
def safetensors_seeds():
    header = {"__metadata__": {"format": "pt"},
              "model.embed_tokens.weight": {"dtype": "BF16", "shape": [4, 8], "data_offsets": [0, 64]},
              "model.norm.weight": {"dtype": "F32", "shape": [8], "data_offsets": [64, 96]},
              "lm_head.weight": {"dtype": "F16", "shape": [2, 8], "data_offsets": [96, 128]}}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    put("safetensors", struct.pack("<Q", len(h)) + h + bytes(range(128)), "three_tensors")
    put("safetensors", struct.pack("<Q", 2) + b"{}", "empty")
    index = {"metadata": {"total_size": 128},
             "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                            "model.norm.weight": "model-00002-of-00002.safetensors"}}
    put("safetensors", json.dumps(index), "shard_index")


# tokenizers ----------------------------------------------------------------------------
def tokenizer_seeds(shared):
    for fam in ("llama3", "qwen3"):
        path = shared / "tokenizers" / fam / "tokenizer.json"
        if not path.exists():
            continue
        j = json.loads(path.read_text())
        vocab = dict(list(j["model"]["vocab"].items())[:400])
        merges = []
        for m in j["model"]["merges"]:
            parts = m.split(" ") if isinstance(m, str) else m
            if all(p in vocab for p in parts) and "".join(parts) in vocab:
                merges.append(m)
        j["model"]["vocab"] = vocab
        j["model"]["merges"] = merges
        j["added_tokens"] = [t for t in j.get("added_tokens", [])][:6]
        for t in j["added_tokens"]:
            t["id"] = len(vocab) + j["added_tokens"].index(t)
        put("tokenizer_json", json.dumps(j), fam + "_snippet")
        cfg = json.loads((path.parent / "tokenizer_config.json").read_text())
        samples = ["Hello, world!", "  leading spaces and\ttabs\n\nnewlines", "12345 678.9e-3",
                   "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F600", "<|im_start|>user\nhi<|im_end|>",
                   "don't won't I'm", "<|begin_of_text|><|start_header_id|>system<|end_header_id|>"]
        for i, s in enumerate(samples):
            for mode in range(4):
                put("tokenize", bytes([(mode << 1) | (fam == "qwen3")]) + s.encode(), f"{fam}_{i}_{mode}")


def chat_seeds():
    # known_chat_template_sources(): llama3, llama3 (always prompt), qwen3, qwen2.5, smollm2, chatml, chatml (escaped)
    family_index = {"llama3": 0, "qwen3": 2, "smollm2": 4}
    roles = {"system": 0, "user": 1, "assistant": 2, "tool": 3}
    for f in sorted((ROOT / "tests" / "fixtures" / "chat").glob("*.json")):
        fx = json.loads(f.read_text())
        for i, case in enumerate(fx["cases"][:4]):
            for pick in sorted(set(family_index.values()) | {1, 3, 5, 6}):
                fields = []
                for m in case["messages"]:
                    fields.append(bytes([roles.get(m["role"], 1)]))
                    c = m.get("content") or ""
                    if m.get("reasoning_content"):
                        c = "\x01" + m["reasoning_content"] + "\x02" + c
                    fields.append(c.encode())
                mode = pick | 0x40
                put("chat_template", bytes([mode]) + b"\0".join(fields), f"{f.stem}_{i}_{pick}")


def serve_seeds():
    bodies = [
        {"model": "tessera", "messages": [{"role": "user", "content": "Hi"}]},
        {"model": "tessera", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}],
         "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["\n", "END"], "stream": True,
         "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2},
        {"model": "tessera", "messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}],
         "chat_template_kwargs": {"enable_thinking": False}, "stop_token_ids": [2], "ignore_eos": True},
        {"model": "tessera", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0},
        {"model": "tessera", "prompt": [1, 2, 3], "n": 1, "echo": False},
        {"model": "tessera", "messages": [{"role": "assistant", "content": "x", "reasoning_content": "y"}], "n": 2},
    ]
    for b in bodies:
        put("serve_request", json.dumps(b))


def deployment_seeds(deployments, models):
    """plan.json and state.json of deployments (tiny synth models' `tessera deploy` output),
    and config.json of synth models (`tessera synth --tiny`)."""
    for d in deployments:
        for name, harness in (("plan.json", "plan"), ("state.json", "state")):
            if (d / name).exists():
                put(harness, (d / name).read_bytes(), f"{d.parent.name}_{d.name}_{name}")
    for m in models:
        put("config", (m / "config.json").read_bytes(), f"{m.name}_config.json")
    put("config", json.dumps({"bos_token_id": 1, "eos_token_id": [2, 7], "do_sample": True, "temperature": 0.6}),
        "generation_config.json")


def manifest_seeds():
    """manifest.json as fuzz_manifest's fixed deployment would have it (plan.json and
    report.json "{}\n", model.gguf "GGUF model bytes\n"), then edited and damaged."""
    h = lambda b: hashlib.sha256(b).hexdigest()
    good = {"plan.json": h(b"{}\n"), "report.json": h(b"{}\n"), "model": {"model.gguf": h(b"GGUF model bytes\n")}}
    put("manifest", json.dumps(good, indent=2), "matching.json")
    put("manifest", json.dumps({**good, "report.json": "0" * 64, "model": {"model.gguf": 7}}), "edited.json")
    put("manifest", json.dumps([good]), "array.json")
    put("manifest", json.dumps({"plan.json": 1, "model": "x"}), "wrong_types.json")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf", type=pathlib.Path)
    ap.add_argument("--shared", default=ROOT / "data", type=pathlib.Path)
    ap.add_argument("--deployment", action="append", default=[], type=pathlib.Path,
                    help="a deployment directory (plan.json, state.json); repeatable")
    ap.add_argument("--synth-model", action="append", default=[], type=pathlib.Path,
                    help="a synth model directory (config.json); repeatable")
    args = ap.parse_args()
    if args.model.exists():
        gguf_seeds(args.model)
    safetensors_seeds()
    tokenizer_seeds(args.shared)
    chat_seeds()
    serve_seeds()
    manifest_seeds()
    deployment_seeds(args.deployment, args.synth_model)
    for p in sorted((ROOT / "devices").glob("*.json")):
        put("device", p.read_bytes(), p.stem)


if __name__ == "__main__":
    main()
