#!/usr/bin/env python3
"""Regenerate the oracle golden fixtures in tests/fixtures/oracle/ with HF transformers.

    tools/reference/oracle_fixtures.py --all            # every fixture
    tools/reference/oracle_fixtures.py --only Qwen3-0.6B

Each preset is made with `tessera synth --preset P --tiny --seed 0`; the real model
is the default SmolLM2-135M-Instruct GGUF (scripts/setup.sh fetches it). See README.md.
"""
import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import hf_reference as ref
import numpy as np

PRESETS = [
    "Llama-3.2-1B", "Llama-3.2-3B",
    "SmolLM2-135M", "SmolLM2-360M", "SmolLM2-1.7B",
    "Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-3B",
    "Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B",
]
GGUF = ref.REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_FIXTURE = "SmolLM2-135M-Instruct-gguf"
SEED = 0
OUT = ref.REPO / "tests" / "fixtures" / "oracle"


def stats(x):
    return {"mean": float(x.mean()), "std": float(x.std()), "absmax": float(np.abs(x).max())}


def build_fixture(model_path, source, checkpoint_sha256):
    """fixture.json contents plus the hidden.npy and logits.npy arrays for one checkpoint."""
    model = ref.load_model(model_path)
    prompts, hidden, logits = [], [], []
    for text in ref.PROMPTS:
        ids = ref.tokenize(model_path, text)
        h, lg = ref.forward(model, ids)
        positions = [0, len(ids) // 2, len(ids) - 1]
        prompts.append({
            "text": text,
            "ids": ids,
            "positions": positions,
            "argmax": lg.argmax(axis=-1).tolist(),
            "hidden_stats": [stats(layer) for layer in h],
        })
        hidden.append(h[:, positions, :])
        logits.append(lg[-1])
    meta = {
        "source": source,
        "checkpoint_sha256": checkpoint_sha256,
        "transformers_version": ref.transformers.__version__,
        "torch_version": ref.torch.__version__,
        "prompts": prompts,
        "layers": model.config.num_hidden_layers,
    }
    return meta, np.stack(hidden).astype(np.float32), np.stack(logits).astype(np.float32)


def to_json(meta):
    """Indented JSON with lists of numbers and flat objects kept on one line."""
    text = json.dumps(meta, indent=1)
    flat = r"\[[-\d.,e\s]*\]|\{[^{}\[\]]*\}"
    return re.sub(flat, lambda m: m[0][0] + " ".join(m[0][1:-1].split()) + m[0][-1], text) + "\n"


def write(name, meta, hidden, logits):
    out = OUT / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "fixture.json").write_text(to_json(meta))
    np.save(out / "hidden.npy", np.ascontiguousarray(hidden))
    np.save(out / "logits.npy", np.ascontiguousarray(logits))
    top1 = " ".join(str(p["argmax"][-1]) for p in meta["prompts"])
    print(f"{name}: {meta['layers']} layers, ids {[len(p['ids']) for p in meta['prompts']]}, "
          f"hidden {list(hidden.shape)}, logits {list(logits.shape)}, last top-1 {top1} -> {out}")


def make_preset(preset, tessera):
    with tempfile.TemporaryDirectory(prefix="tessera-synth-") as tmp:
        ref.tessera(tessera, "synth", "--preset", preset, "--tiny", "--seed", SEED, "--out", tmp)
        source = {"preset": preset, "tiny": True, "seed": SEED}
        write(preset, *build_fixture(Path(tmp), source, ref.sha256_file(Path(tmp) / "model.safetensors")))


def make_gguf():
    if not GGUF.exists():
        sys.exit(f"{GGUF} is missing: run scripts/setup.sh")
    digest = ref.sha256_file(GGUF)
    write(GGUF_FIXTURE, *build_fixture(GGUF, {"gguf": GGUF.name, "sha256": digest}, digest))


def main():
    names = PRESETS + [GGUF_FIXTURE]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="regenerate every fixture")
    which.add_argument("--only", metavar="NAME", action="append", choices=names,
                       help="regenerate this fixture (repeatable): " + ", ".join(names))
    ap.add_argument("--tessera", default=ref.DEFAULT_TESSERA, help="tessera binary (default: build/tessera)")
    args = ap.parse_args()
    for name in names if args.all else args.only:
        make_gguf() if name == GGUF_FIXTURE else make_preset(name, args.tessera)


if __name__ == "__main__":
    main()
