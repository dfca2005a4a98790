#!/usr/bin/env python3
"""What the gates catch of a bug confined to one layer, measured with perturbations from outside
the target (`--perturb STAGE:gain:SIZE:layer=N`), never tessera's own faults.

    bench/layer_sensitivity.py [--tessera build/tessera] [--model MODEL] [--target cpu]
                               [--layers 0,mid,last] [--caught 0.05] [--quiet-size 0.005]
                               [--out FILE.md]

For every per-layer stage and each chosen layer, a deploy with the stage's output off by
--caught (5%) in that layer alone must fail, and the diagnosis must name that layer; then, in
the middle layer, a deploy at --quiet-size (half the least limit of phase 3's layer-scoped rows,
the 0.01 floor) must pass every gate. Prints a Markdown table (and writes it to --out). Test
tooling: tessera never runs it.
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ["attn_norm", "qkv_proj", "rope", "kv_write", "attention", "o_proj", "attn_residual",
          "mlp_norm", "gate_up_proj", "silu_mul", "down_proj", "mlp_residual"]


def deploy(tessera, model, target, perturb, out):
    cmd = [tessera, "deploy", *( [model] if model else [] ), "--target", target, "--out", str(out), "--quiet",
           "--perturb", perturb]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    state = json.loads((out / "state.json").read_text())
    failed = [int(k) for k, v in state["phases"].items() if v.get("status") == "failed"]
    issues = (out / "issues.md").read_text() if (out / "issues.md").exists() else ""
    named = re.findall(r"layer (\d+)'s (attention|mlp) disagrees", issues + r.stdout)
    return {"rc": r.returncode, "failed_phase": failed[0] if failed else None, "named": named,
            "seconds": time.time() - t0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", default=str(REPO / "build" / "tessera"))
    ap.add_argument("--model", default="")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--layers", default="0,mid,last")
    ap.add_argument("--caught", type=float, default=0.05)
    ap.add_argument("--quiet-size", type=float, default=0.005)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    info = json.loads(subprocess.run([a.tessera, "inspect", *([a.model] if a.model else []), "--json"],
                                     capture_output=True, text=True, check=True).stdout)
    n_layers = int(info["spec"]["num_hidden_layers"])
    layers = []
    for x in a.layers.split(","):
        layers.append({"mid": n_layers // 2, "last": n_layers - 1}.get(x, None) if not x.isdigit() else int(x))
    rows = []
    with tempfile.TemporaryDirectory(prefix="layer_sensitivity_") as tmp:
        tmp = Path(tmp)
        for stage in STAGES:
            for layer in layers:
                spec = f"{stage}:gain:{a.caught}:layer={layer}"
                r = deploy(a.tessera, a.model, a.target, spec, tmp / f"{stage}_{layer}")
                ok = r["failed_phase"] is not None
                named = any(int(l) == layer for l, _ in r["named"][:1])
                rows.append((stage, layer, a.caught, "caught" if ok else "MISSED", r["failed_phase"],
                             f"layer {r['named'][0][0]} {r['named'][0][1]}" if r["named"] else "-",
                             "yes" if named else "no"))
                print("|", " | ".join(str(x) for x in rows[-1]), "|", flush=True)
            layer = n_layers // 2
            spec = f"{stage}:gain:{a.quiet_size}:layer={layer}"
            r = deploy(a.tessera, a.model, a.target, spec, tmp / f"{stage}_{layer}_quiet")
            rows.append((stage, layer, a.quiet_size, "no gate failed" if r["failed_phase"] is None else "FALSE ALARM",
                         r["failed_phase"], "-", "-"))
            print("|", " | ".join(str(x) for x in rows[-1]), "|", flush=True)
    head = ("| stage | layer | gain | result | failed phase | diagnosis names | the perturbed layer named first |\n"
            "|---|---|---|---|---|---|---|\n")
    table = head + "".join("| " + " | ".join("-" if x is None else str(x) for x in row) + " |\n" for row in rows)
    caught = [r for r in rows if r[2] == a.caught]
    quiet = [r for r in rows if r[2] == a.quiet_size]
    summary = (f"{a.target}, {n_layers} layers: {sum(r[3] == 'caught' for r in caught)}/{len(caught)} caught at "
               f"{a.caught:g}, the layer named in {sum(r[6] == 'yes' for r in caught)}/{len(caught)}; "
               f"{sum(r[3] == 'no gate failed' for r in quiet)}/{len(quiet)} quiet at {a.quiet_size:g}\n")
    print(summary)
    if a.out:
        Path(a.out).write_text(summary + "\n" + table)
    return 0 if all(r[3] in ("caught", "no gate failed") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
