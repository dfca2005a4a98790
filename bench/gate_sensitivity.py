#!/usr/bin/env python3
"""What the gates catch, measured with perturbations from outside the target.

    bench/gate_sensitivity.py [--tessera build/tessera] [--model DIR] [--out docs/gate_sensitivity.md]
                              [--targets cpu,npusim] [--kinds gain,offset,...,shift] [--clean 10]

For each target: a clean deploy of the model gives every op-table row's limits
(kernel_registry.json). Then, for every stage and kind, the perturbation is sized from the
smallest limit of that stage's rows (size = the size that puts the kind's own metric at
FACTOR x its limit) and deployed at FACTOR 2 (must fail, at phase 1, the first phase that
runs every stage alone, with that stage among the failing rows) and at FACTOR 0.5 (no
gate may fail). Then --clean deploys per target of the tiny presets with other seeds: no
gate may fail. Writes a Markdown table. Test tooling: tessera never runs it.

Sizes, for a stage whose rows' smallest limits are L (from the clean deploy):
  gain     SIZE = F x L[gain_error]            (the gain moves by SIZE)
  offset   SIZE = F x L[offset_error]          (the offset moves by SIZE, in RMS units)
  noise    SIZE = sqrt(F x L[nmse])            (NMSE grows by SIZE^2)
  element  SIZE = F x L[max_err] x ref_max / ref_rms  (one element per row off by SIZE x the output's RMS)
  stale, shift  continuous but data-dependent (a blend with the previous call's or the previous
           position's values), and the gain and offset limits grow with a row's own NMSE: SIZE
           is found by bisection (in log SIZE) on `tessera kernels CLEAN --perturb ... --json`,
           the least at which the largest check / limit of the stage's rows reaches F.
  tail, permute  structural: the least size is one zeroed column / one swapped pair of each
           row, so "0.5x" cannot be made; the table gives how far over its limit the least one
           already is (the same kernels run).
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ["embedding", "attn_norm", "qkv_proj", "rope", "kv_write", "attention", "o_proj", "attn_residual",
          "mlp_norm", "gate_up_proj", "silu_mul", "down_proj", "mlp_residual", "final_norm", "lm_head"]
METRIC = {"gain": "gain_error", "offset": "offset_error", "noise": "nmse", "element": "max_err",
          "stale": "any", "shift": "any", "tail": "any", "permute": "any"}
KINDS = ["gain", "offset", "noise", "element", "stale", "shift", "tail", "permute"]
STRUCTURAL = {"tail", "permute"}     # their least size: one column, one pair
CALIBRATED = {"stale", "shift"}      # sized by bisection on kernels runs
UPPER = ("nmse", "max_err", "gain_error", "offset_error")  # the "<=" checks a perturbation moves


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


def deploy(tessera, model, out, target, perturb=None):
    shutil.rmtree(out, ignore_errors=True)
    cmd = [tessera, "deploy", model, "--target", target, "--out", out, "--quiet"]
    if perturb:
        cmd += ["--perturb", perturb]
    r = run(cmd)
    if r.returncode not in (0, 3):
        sys.exit(f"deploy failed to run ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stderr}")
    state = json.loads((Path(out) / "state.json").read_text())
    failed = [int(p) for p, rec in sorted(state["phases"].items(), key=lambda kv: int(kv[0]))
              if rec.get("status") == "failed"]
    return (failed[0] if failed else None), r.returncode


def failing_stages(out, phase):
    """The stages the failing phase's record names: its failing op-table rows, or phase 2's bisect."""
    rec = json.loads((Path(out) / f"phase{phase}.json").read_text())
    stages = {k["stage"] for k in rec["details"].get("kernels", []) if not k.get("pass", True) and "stage" in k}
    bisect = rec["details"].get("bisect", {})
    if bisect.get("named"):
        stages.add(bisect.get("stage"))
    return stages


def stage_limits(registry):
    """Per stage: the smallest limit of each metric over its rows, and ref_max / ref_rms there."""
    out = {}
    for row in registry["kernels"]:
        s = out.setdefault(row["stage"], {})
        for metric, limit in row["limits"].items():
            if isinstance(limit, (int, float)):
                s[metric] = min(s.get(metric, math.inf), limit)
        m = row["metrics"]
        if isinstance(m.get("ref_rms"), (int, float)) and m["ref_rms"] > 0:
            s["peak_over_rms"] = min(s.get("peak_over_rms", math.inf), m["ref_max"] / m["ref_rms"])
    return out


def kernel_checks(tessera, dep, stage, perturb=None):
    """(role, metric) -> (value, limit) for the op-table rows of `stage`, as `tessera kernels` measures them."""
    cmd = [tessera, "kernels", dep, "--json"] + (["--perturb", perturb] if perturb else [])
    r = run(cmd)
    if r.returncode not in (0, 3):
        sys.exit(f"kernels failed to run ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stderr}")
    out = {}
    for row in json.loads(r.stdout)["rows"]:
        if row["stage"] != stage:
            continue
        for m in UPPER:
            v, lim = row["values"].get(m), row["limits"].get(m)
            if isinstance(v, (int, float)) and isinstance(lim, (int, float)) and lim > 0:
                out[(row["role"] + " " + row["shape"], m)] = (v, lim)
    return out


def calibrated_size(tessera, dep, stage, kind, factor, lo=1e-9, hi=1.0, steps=14):
    """Bisection in log SIZE for the size at which the stage's largest check / limit reaches factor."""
    ratio = lambda size: over_limit(kernel_checks(tessera, dep, stage, f"{stage}:{kind}:{size:.6g}"))
    if ratio(hi) < factor:
        return math.inf
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        if ratio(mid) >= factor:
            hi = mid
        else:
            lo = mid
    return hi if factor > 1 else lo  # 2x: at or just over; 0.5x: at or just under


def over_limit(checks):
    """The largest check / limit ratio."""
    return max((v / lim for v, lim in checks.values()), default=0.0)


def size_for(kind, lim, factor):
    if kind == "gain":
        return factor * lim["gain_error"]
    if kind == "offset":
        return factor * lim["offset_error"]
    if kind == "noise":
        return math.sqrt(factor * lim["nmse"])
    if kind == "element":
        return factor * lim["max_err"] * lim["peak_over_rms"]
    raise ValueError(kind)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", default=REPO / "build" / "tessera")
    ap.add_argument("--model", help="checkpoint (default: a tiny SmolLM2-360M synthesized here)")
    ap.add_argument("--targets", default="cpu,npusim")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--clean", type=int, default=10, help="clean deploys per target (other presets and seeds)")
    ap.add_argument("--out", default=REPO / "docs" / "gate_sensitivity.md")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tessera-sensitivity-"))
    t0 = time.time()
    model = args.model
    if not model:
        model = work / "model"
        r = run([args.tessera, "synth", "--preset", "SmolLM2-360M", "--tiny", "--out", model])
        if r.returncode:
            sys.exit(r.stderr)
    rows, summary = [], []
    for target in args.targets.split(","):
        clean = work / f"clean-{target}"
        phase, _ = deploy(args.tessera, model, clean, target)
        if phase is not None:
            sys.exit(f"the clean deploy on {target} fails phase {phase}: nothing to measure against")
        limits = stage_limits(json.loads((clean / "kernel_registry.json").read_text()))
        caught = named = false_alarms = downstream = total = halves = 0
        for stage in args.stages.split(","):
            for kind in args.kinds.split(","):
                lim = limits[stage]
                cells = {}
                least = None
                if kind in STRUCTURAL:
                    least = over_limit(kernel_checks(args.tessera, clean, stage, f"{stage}:{kind}:1e-9"))
                for factor in (2.0, 0.5):
                    if kind in STRUCTURAL and factor < 1:
                        cells[factor] = (None, None, False, [], least)  # cannot be made smaller
                        continue
                    if kind in STRUCTURAL:
                        size = 1e-9  # one column / one pair of each row
                    elif kind in CALIBRATED:
                        size = calibrated_size(args.tessera, clean, stage, kind, factor)
                        if not math.isfinite(size):
                            sys.exit(f"{target} {stage}:{kind}: even size 1 moves no check of the stage's rows to {factor}x")
                    else:
                        size = size_for(kind, lim, factor)
                    out = work / "p"
                    phase, _ = deploy(args.tessera, model, out, target, f"{stage}:{kind}:{size:.6g}")
                    where = failing_stages(out, phase) if phase is not None else set()
                    cells[factor] = (size, phase, stage in where, sorted(where - {stage}), least)
                    print(f"{target} {stage}:{kind} x{factor} size {size:.3g}: "
                          f"{'phase ' + str(phase) if phase is not None else 'no gate failed'}"
                          f"{', stage named' if stage in where else ''}", flush=True)
                total += 1
                caught += cells[2.0][1] is not None
                named += cells[2.0][2]
                # At 0.5x the stage's own rows must pass; a row of a later stage that the
                # error flows into may be more sensitive to it (counted apart: the error is real).
                if cells[0.5][0] is not None:
                    false_alarms += cells[0.5][1] is not None and (cells[0.5][2] or not cells[0.5][3])
                    downstream += cells[0.5][1] is not None and not cells[0.5][2] and bool(cells[0.5][3])
                    halves += 1
                rows.append((target, stage, kind, METRIC[kind], cells))
        cleans = 0
        presets = ["SmolLM2-360M", "Qwen3-0.6B", "Llama-3.2-1B", "Qwen2.5-0.5B", "SmolLM2-135M"]
        for i in range(args.clean):
            m = work / f"clean-model-{i}"
            preset, seed = presets[i % len(presets)], 100 + i
            r = run([args.tessera, "synth", "--preset", preset, "--tiny", "--seed", seed, "--out", m])
            if r.returncode:
                sys.exit(r.stderr)
            phase, _ = deploy(args.tessera, m, work / "c", target)
            cleans += phase is None
            print(f"{target} clean {preset} seed {seed}: {'pass' if phase is None else f'phase {phase} FAILS'}", flush=True)
            shutil.rmtree(m, ignore_errors=True)
        summary.append((target, total, caught, named, false_alarms, downstream, halves, cleans, args.clean))

    md = ["# Gate sensitivity", "",
          "Made by `bench/gate_sensitivity.py` (perturbations from outside the target, `--perturb`; never tessera's "
          "own faults). Each stage x kind is sized from the smallest limit of that stage's op-table rows in a clean "
          "deploy of the same model, so that the kind's own metric sits at 2x (must be caught, by phase 1, with the "
          "stage among its failing rows) or 0.5x (no gate may fail) its limit. Clean deploys: tiny presets with "
          "other seeds, no perturbation.", "",
          "Kinds: gain, offset, noise and element are sized from the limits directly; stale (a blend with the previous same-shaped call's output: phase 1 runs every case on decoy inputs first) and shift (a blend with the previous position's row) by bisection on `tessera kernels --perturb` runs on the clean deployment (the size at which the largest check / limit of the stage's rows is 2, or 0.5: the gain and offset limits grow with a row's own NMSE, so no closed form); tail and permute are structural: their least size (one zeroed column, one swapped pair per row) is already far over the limit, so only the 2x column applies, and the table gives how far over the least one is. A kv_write perturbation at 0.5x its own rows' limits can fail an attention row: attention reads the cache, and an offset or noise in the values moves the attention output by more, in units of its RMS, than it moves the values (a weighted average of values has a smaller RMS than the values). The error is real and the attention row is the more sensitive witness; it is counted apart from false alarms.", "",
          f"Model: {args.model or 'tiny SmolLM2-360M (seed 0)'}; run took {time.time() - t0:.0f} s.", "",
          "| target | stage x kind cases | caught at 2x | stage named at 2x | false alarms at 0.5x (the stage's own rows fail) | "
          "at 0.5x, a later stage's row sees the error | clean deploys passing |",
          "|---|---|---|---|---|---|---|"]
    for target, total, caught, named, fa, ds, halves, cl, ncl in summary:
        md.append(f"| {target} | {total} | {caught}/{total} ({100 * caught / total:.0f}%) | {named}/{total} "
                  f"({100 * named / total:.0f}%) | {fa}/{halves} | {ds}/{halves} | {cl}/{ncl} |")
    md += ["", "| target | stage | kind (metric) | size at 2x | caught by | stage named | size at 0.5x | result |",
           "|---|---|---|---|---|---|---|---|"]
    for target, stage, kind, metric, cells in rows:
        s2, p2, n2, _, _ = cells[2.0]
        s5, p5, own5, other5, least = cells[0.5]
        if s5 is None:
            result = f"cannot be made: the least one is {least:.3g}x its limit"
        elif p5 is None:
            result = "no gate failed"
        elif own5 or not other5:
            result = f"FALSE ALARM (phase {p5})"
        else:
            result = f"phase {p5}: a row of {', '.join(other5)} sees it"
        md.append(f"| {target} | {stage} | {kind} ({metric}) | {s2:.3g} | {'phase ' + str(p2) if p2 is not None else 'NOT CAUGHT'} | "
                  f"{'yes' if n2 else 'no'} | {'-' if s5 is None else f'{s5:.3g}'} | {result} |")
    Path(args.out).write_text("\n".join(md) + "\n")
    print(f"wrote {args.out}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
