#!/usr/bin/env python3
"""What the gates catch of a bug confined to one layer, measured with perturbations from outside
the target (`--perturb STAGE:gain:SIZE:layer=N`), never tessera's own faults.

    bench/layer_sensitivity.py [--tessera build/tessera] [--model MODEL] [--target cpu]
                               [--layers 0,mid,last] [--caught 0.05] [--sized-stages S1,S2]
                               [--out FILE.md]

For every per-layer stage and each chosen layer, a deploy with the stage's output off by
--caught (5%) in that layer alone must fail, and the diagnosis must name that layer (layer 0:
phase 1's op table, which runs layer 0, names the stage). Then, in the middle layer, the gain
is sized from that run as gate_sensitivity.md sizes its rows: the size that puts the worst
layer-scoped check of phase 3 at 2x its limit (must be caught) and at 0.5x (no gate may fail). Prints a Markdown table (and writes it to --out). Test
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
    # The layer-scoped checks of phase 3 (value over limit, the worst over the prompts).
    worst = 0.0
    for f in sorted((out / "phase3").glob("prompt_*.json")):
        for c in json.loads(f.read_text())["gate"]["checks"]:
            if c["metric"] in ("attention_error", "mlp_error") and isinstance(c["value"], (int, float)):
                worst = max(worst, c["value"] / c["limit"])
    return {"rc": r.returncode, "failed_phase": failed[0] if failed else None, "named": named,
            "worst_over_limit": worst, "seconds": time.time() - t0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", default=str(REPO / "build" / "tessera"))
    ap.add_argument("--model", default="")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--layers", default="0,mid,last")
    ap.add_argument("--caught", type=float, default=0.05)
    ap.add_argument("--sized-stages", default=",".join(STAGES), help="stages also run at 2x and 0.5x (middle layer)")
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
        mid = n_layers // 2
        for stage in STAGES:
            ratio = None  # the layer-scoped checks' worst value / limit per unit of gain, at the middle layer
            for layer in layers:
                spec = f"{stage}:gain:{a.caught}:layer={layer}"
                r = deploy(a.tessera, a.model, a.target, spec, tmp / f"{stage}_{layer}")
                named = bool(r["named"]) and int(r["named"][0][0]) == layer
                if layer == mid and r["worst_over_limit"] > 0:
                    ratio = r["worst_over_limit"] / a.caught
                rows.append((stage, layer, f"{a.caught:g}", "caught" if r["failed_phase"] is not None else "MISSED",
                             r["failed_phase"], f"layer {r['named'][0][0]} {r['named'][0][1]}" if r["named"] else
                             ("the stage's op-table row" if r["failed_phase"] == 1 else "-"),
                             "yes" if named or (layer == 0 and r["failed_phase"] == 1) else "no"))
                print("|", " | ".join(str(x) for x in rows[-1]), "|", flush=True)
            if ratio is None or stage not in a.sized_stages.split(","):
                continue
            # Sized as gate_sensitivity.md sizes: the gain that puts the worst layer-scoped check at
            # 2x and at 0.5x its limit (linear in the gain: a gain's first-order effect).
            for factor in (2.0, 0.5):
                size = factor / ratio
                r = deploy(a.tessera, a.model, a.target, f"{stage}:gain:{size:.3g}:layer={mid}", tmp / f"{stage}_{factor}")
                ok = r["failed_phase"] is not None if factor > 1 else r["failed_phase"] is None
                result = ("caught" if r["failed_phase"] is not None else "MISSED") if factor > 1 else \
                         ("no gate failed" if r["failed_phase"] is None else f"FALSE ALARM (phase {r['failed_phase']})")
                rows.append((stage, mid, f"{size:.3g} ({factor:g}x)", result, r["failed_phase"],
                             f"layer {r['named'][0][0]} {r['named'][0][1]}" if r["named"] else "-",
                             "yes" if (r["named"] and int(r["named"][0][0]) == mid) else ("-" if factor < 1 else "no")))
                print("|", " | ".join(str(x) for x in rows[-1]), "|", flush=True)
    head = ("| stage | layer | gain | result | failed phase | diagnosis names | the perturbed layer named first |\n"
            "|---|---|---|---|---|---|---|\n")
    table = head + "".join("| " + " | ".join("-" if x is None else str(x) for x in row) + " |\n" for row in rows)
    five = [r for r in rows if r[2] == f"{a.caught:g}"]
    twice = [r for r in rows if r[2].endswith("(2x)")]
    half = [r for r in rows if r[2].endswith("(0.5x)")]
    summary = (f"{a.target}, {n_layers} layers: {sum(r[3] == 'caught' for r in five)}/{len(five)} caught at a gain of "
               f"{a.caught:g} (the stage or layer named in {sum(r[6] == 'yes' for r in five)}); at 2x the limit "
               f"{sum(r[3] == 'caught' for r in twice)}/{len(twice)} caught; at 0.5x "
               f"{sum(r[3] == 'no gate failed' for r in half)}/{len(half)} with no gate failing\n")
    print(summary)
    if a.out:
        Path(a.out).write_text(summary + "\n" + table)
    return 0 if all(r[3] in ("caught", "no gate failed") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
