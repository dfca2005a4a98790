#!/usr/bin/env python3
"""The include edges between tessera's layers, checked against their order.

Each folder under src/ is a layer; a file may include headers of its own layer and of the
layers below it, never above (an upward edge would make two layers one: each needs the
other to build or to test). Prints every edge between layers with the files that make it
and exits 1 when one goes upward, naming it, or when a folder is missing from LAYERS.

    python3 tools/check_layers.py [--root DIR]
"""
import argparse
import collections
import pathlib
import re
import sys

# Lowest first. A layer may include only itself and those before it.
LAYERS = [
    "util",       # errors, halves, mmap, threads
    "io",         # file formats: safetensors, GGUF, tensor dtypes, block quantizers
    "model",      # ModelSpec, tensor names, presets, Model (the weights), layer parameters
    "tokenizer",  # BPE, pre-tokenizers, chat templates
    "convert",    # a model and its tokenizer written as a GGUF (export, quantize)
    "oracle",     # the FP32 reference and the numerics twins
    "gates",      # metrics and thresholds
    "targets",    # the runners: cpu, npusim
    "runtime",    # generation, sampling, chat sessions
    "faults",     # faults that wrap a runner from outside
    "pipeline",   # phases, plans, deployments, debug skills
    "synth",      # random-weight checkpoints
    "eval",       # audit, campaign, perplexity
    "serve",      # the OpenAI-compatible server
    "report",     # the deployment report: SVG charts, the HTML page
    "cli",        # one file per subcommand
]

INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/')


def edges(src):
    """{(from_layer, to_layer): [file, ...]} for every include that crosses layers."""
    found = collections.defaultdict(list)
    for path in sorted(src.rglob("*")):
        if path.suffix not in (".h", ".cc", ".inc") or not path.is_file():
            continue
        layer = path.relative_to(src).parts[0]
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            m = INCLUDE.match(line)
            if m and m.group(1) != layer and (src / m.group(1)).is_dir():
                found[(layer, m.group(1))].append(str(path.relative_to(src)))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=pathlib.Path(__file__).resolve().parent.parent, type=pathlib.Path,
                    help="the repository (default: this script's)")
    args = ap.parse_args()
    src = args.root / "src"
    folders = sorted(p.name for p in src.iterdir() if p.is_dir())
    rank = {name: i for i, name in enumerate(LAYERS)}
    bad = 0
    for name in folders:
        if name not in rank:
            print(f"check_layers: src/{name}/ is in no layer (add it to LAYERS in {pathlib.Path(__file__).name})")
            bad += 1
    found = edges(src)
    for (a, b), files in sorted(found.items(), key=lambda e: (rank.get(e[0][0], -1), rank.get(e[0][1], -1))):
        up = a in rank and b in rank and rank[b] > rank[a]
        mark = "UPWARD" if up else "ok"
        shown = ", ".join(sorted(set(files))[:3]) + (" ..." if len(set(files)) > 3 else "")
        print(f"{mark:6} {a} -> {b}  ({len(files)} includes: {shown})")
        bad += up
    if bad:
        print(f"check_layers: {bad} problem(s); order, lowest first: {' < '.join(LAYERS)}")
        return 1
    print(f"check_layers: {len(found)} edges, all downward ({' < '.join(LAYERS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
