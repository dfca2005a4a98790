#!/usr/bin/env python3
"""Compare tessera's FP32 oracle with HF transformers on one checkpoint.

    tools/reference/compare_oracle.py models/SmolLM2-135M-Instruct.Q4_1.gguf
    tools/reference/compare_oracle.py DIR --prompt "Water freezes at" --ids 1,2,3

Runs `tessera dump MODEL --ids IDS --out TMP --probes layers` and transformers (float32,
CPU, eager attention) on the same token ids, prints per-layer hidden-state cosine,
final-norm cosine, last-position logit error and top-1 agreement, and exits 0 only
when every sequence passes the acceptance thresholds below. Without --prompt or
--ids it uses the canonical prompts of hf_reference.PROMPTS.
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

import hf_reference as ref
import numpy as np

MIN_LAYER_COSINE = 0.99999   # every layer and the final norm, whole tensor over all positions
MAX_LOGIT_ERROR = 1e-4       # last-position max_abs / (max - min) of the reference logits


def cosine(a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def tessera_dump(binary, model, ids):
    """{name: array} from `tessera dump`: layers.{i}.out, final_norm, logits."""
    with tempfile.TemporaryDirectory(prefix="tessera-dump-") as tmp:
        ref.tessera(binary, "dump", model, "--ids", ",".join(map(str, ids)), "--out", tmp,
                    "--probes", "layers")
        index = json.loads((Path(tmp) / "index.json").read_text())
        if index["ids"] != ids:
            sys.exit(f"tessera dump ran ids {index['ids']}, asked for {ids}")
        return index["n_layers"], {name: np.load(Path(tmp) / t["file"]) for name, t in index["tensors"].items()}


def compare(binary, model_path, model, ids):
    """Print the comparison for one id sequence; return whether it passes."""
    hidden, logits = ref.forward(model, ids)
    n_layers, got = tessera_dump(binary, model_path, ids)
    if n_layers != len(hidden) - 1:
        sys.exit(f"tessera has {n_layers} layers, transformers {len(hidden) - 1}")

    ok = True
    names = [f"layers.{i}.out" for i in range(n_layers)] + ["final_norm"]
    for name, want in zip(names, hidden):
        cos = cosine(got[name], want)
        ok &= cos >= MIN_LAYER_COSINE
        flag = "" if cos >= MIN_LAYER_COSINE else f"  below {MIN_LAYER_COSINE}"
        print(f"  {name:<14} cosine {cos:.8f}{flag}")

    last_want, last_got = logits[-1], got["logits"][-1]
    max_abs = float(np.abs(last_got - last_want).max())
    span = float(last_want.max() - last_want.min())
    ratio = max_abs / span
    ok &= ratio <= MAX_LOGIT_ERROR
    print(f"  logits[last]   max_abs {max_abs:.3e}  range {span:.4f}  ratio {ratio:.3e} "
          f"(limit {MAX_LOGIT_ERROR:g})")

    top_want, top_got = logits.argmax(-1), got["logits"].argmax(-1)
    same = int((top_want == top_got).sum())
    ok &= same == len(ids)
    print(f"  top-1          {same}/{len(ids)} positions agree"
          + ("" if same == len(ids) else f"; first differs at {int(np.argmax(top_want != top_got))}"))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="HF model directory or .gguf file")
    ap.add_argument("--prompt", action="append", default=[], help="text to tokenize (repeatable)")
    ap.add_argument("--ids", action="append", default=[], help="comma-separated token ids (repeatable)")
    ap.add_argument("--tessera", default=ref.DEFAULT_TESSERA, help="tessera binary (default: build/tessera)")
    args = ap.parse_args()

    sequences = [[int(x) for x in s.split(",")] for s in args.ids]
    prompts = args.prompt or ([] if sequences else ref.PROMPTS)
    sequences = [ref.tokenize(args.model, p) for p in prompts] + sequences

    model = ref.load_model(args.model)
    print(f"{args.model}: transformers {ref.transformers.__version__}, torch {ref.torch.__version__}")
    results = []
    for ids in sequences:
        print(f"ids ({len(ids)}): {ids}")
        results.append(compare(args.tessera, args.model, model, ids))
        print(f"  {'PASS' if results[-1] else 'FAIL'}")
    print(f"{'PASS' if all(results) else 'FAIL'}: {sum(results)}/{len(results)} sequences pass")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
