#!/usr/bin/env python3
"""Make phase 0's independent reference for any checkpoint with HF transformers (float32, CPU).

    tools/reference/make_reference.py MODEL [--out DIR]

MODEL is a Hugging Face directory (one model.safetensors or shards) or a GGUF file. The
reference is a directory (fixture.json, hidden.npy, logits.npy: per-layer hidden states at
three positions and the last-position logits of each canonical reference prompt) keyed by
the checkpoint's digest, which tessera recomputes before it uses the reference:
  - a GGUF file, or a directory with a single model.safetensors: sha256 of that file;
  - a sharded directory: sha256 of the lines "<file name> <sha256 of the file>\\n" over its
    *.safetensors files, sorted by name.
Default --out: $TESSERA_REFERENCES's first directory, else ~/.cache/tessera/references,
then <model name>-<digest[:12]>; `tessera deploy` searches there (or takes --reference DIR).
"""
import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import hf_reference as ref
from oracle_fixtures import build_fixture, to_json

import numpy as np


def checkpoint_digest(model):
    model = Path(model)
    if model.is_file():
        return ref.sha256_file(model)
    shards = sorted(p for p in model.glob("*.safetensors"))
    if not shards:
        sys.exit(f"{model}: no .safetensors files (not a Hugging Face checkpoint)")
    if [p.name for p in shards] == ["model.safetensors"]:
        return ref.sha256_file(shards[0])
    lines = "".join(f"{p.name} {ref.sha256_file(p)}\n" for p in shards)
    return hashlib.sha256(lines.encode()).hexdigest()


def source_of(model):
    """What lets tessera skip hashing a checkpoint no reference could match."""
    model = Path(model)
    if model.is_file():
        return {"gguf": model.name}
    src = {"files": {p.name: p.stat().st_size for p in sorted(model.glob("*.safetensors"))}}
    marker = model / "tessera_synth.json"
    if marker.exists():
        m = json.loads(marker.read_text())
        src.update({k: m[k] for k in ("preset", "tiny", "seed") if k in m})
    return src


def default_root():
    env = os.environ.get("TESSERA_REFERENCES", "")
    first = next((p for p in env.split(":") if p), None)
    if first:
        return Path(first)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "tessera" / "references"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="Hugging Face directory or GGUF file")
    ap.add_argument("--out", help="reference directory to write (default: see above)")
    args = ap.parse_args()
    model = Path(args.model).resolve()
    if not model.exists():
        sys.exit(f"{model} does not exist")
    print(f"hashing {model} ...", flush=True)
    digest = checkpoint_digest(model)
    out = Path(args.out) if args.out else default_root() / f"{model.stem if model.is_file() else model.name}-{digest[:12]}"
    print(f"running transformers (float32) on {model} ...", flush=True)
    meta, hidden, logits = build_fixture(model, source_of(model), digest)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fixture.json").write_text(to_json(meta))
    np.save(out / "hidden.npy", np.ascontiguousarray(hidden))
    np.save(out / "logits.npy", np.ascontiguousarray(logits))
    print(f"reference for checkpoint {digest[:12]}... ({meta['layers']} layers, transformers "
          f"{meta['transformers_version']}) -> {out}")


if __name__ == "__main__":
    main()
