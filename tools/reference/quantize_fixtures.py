#!/usr/bin/env python3
"""Golden quantization fixtures for `tessera quantize`, computed by independent quantizers.

Writes tests/fixtures/quantize/:

  rows.f32              the input: 256-value rows (little-endian fp32), real and synthetic
  <TYPE>.gguf-py        Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 blocks of every row, by gguf.quants.quantize
  <TYPE>.llama-cpp      Q2_K Q3_K Q4_K Q5_K Q6_K (and the five above) by llama.cpp's own
                        llama-quantize --pure on an F32 GGUF holding the rows (no imatrix)
  f16.f32 / f16.u16     fp32 values and numpy's float16 bits for them (ties, subnormals, overflow)
  <scheme>.types.json   with --model: the type llama-quantize gives every tensor of a model
                        for Q4_K_M and Q5_K_M (the default model, converted to BF16)
  manifest.json         what made each file (versions, row descriptions)

The rows: 6 real ones (256-value slices of the default model's weights, dequantized from
its Q4_1 blocks by the gguf package and rounded to BF16, as `tessera convert` writes them)
and synthetic ones chosen for the rounding rules: gaussian, heavy tails with outliers,
all-zero 32-value blocks and a zero super block, blocks whose extreme is negative,
constant blocks, exact ties for round-half-away / trunc(x + .5), tiny (f16-subnormal
scales) and large magnitudes.

    tools/reference/quantize_fixtures.py                       # rows, gguf-py and f16 fixtures
    tools/reference/quantize_fixtures.py --llama-quantize BIN  # also llama.cpp's K-quant bytes
    tools/reference/quantize_fixtures.py --llama-quantize BIN --model SMOLLM2.bf16.gguf  # recipes

BIN defaults to llama-quantize under ~/.cache/tessera/llama.cpp/build-*/bin (bench/llama_cpp.sh's
build of the llama.cpp vendored in llama-cpp-python). Needs numpy and gguf (pip).
"""
import argparse
import glob
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROW = 256
GGUF_PY_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
# llama-quantize type argument for each tensor type (with --pure every 2-D weight gets it).
LLAMA_TYPES = {"Q8_0": "Q8_0", "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0", "Q5_1": "Q5_1",
               "Q2_K": "Q2_K", "Q3_K": "Q3_K_S", "Q4_K": "Q4_K_S", "Q5_K": "Q5_K_S", "Q6_K": "Q6_K"}
# Real rows: (tensor, row, first column) of the default model.
REAL_ROWS = [("token_embd.weight", 1000, 0), ("blk.0.attn_q.weight", 3, 256),
             ("blk.5.attn_v.weight", 10, 0), ("blk.10.ffn_down.weight", 7, 1024),
             ("blk.29.ffn_up.weight", 0, 0), ("blk.15.attn_output.weight", 100, 320)]


def bf16_round(x):
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


def real_rows(model):
    r = gguf.GGUFReader(model)
    by_name = {t.name: t for t in r.tensors}
    rows, desc = [], []
    for name, row, col in REAL_ROWS:
        t = by_name[name]
        v = quants.dequantize(np.asarray(t.data[row]), T(t.tensor_type)).reshape(-1)
        rows.append(bf16_round(v[col:col + ROW]))
        desc.append(f"real: {name} row {row} [{col}:{col + ROW}] ({t.tensor_type.name} -> fp32 -> bf16)")
    return rows, desc


def synthetic_rows(rng):
    rows, desc = [], []

    def add(v, d):
        v = np.asarray(v, dtype=np.float32).reshape(-1)
        assert v.size == ROW, d
        rows.append(v)
        desc.append("synthetic: " + d)

    add(rng.normal(0, 0.02, ROW), "gaussian sd 0.02")
    v = rng.standard_t(3, ROW) * 0.01
    v[rng.integers(0, ROW, 6)] *= 60
    add(v, "student-t(3) * 0.01 with 6 outliers x60")
    v = rng.normal(0, 0.05, ROW)
    v[0:32] = 0
    v[96:128] = 0
    v[200:232] = 0
    add(v, "gaussian with all-zero 32-value blocks 0, 3 and a block straddling 6/7")
    add(np.zeros(ROW), "all zeros (a whole zero super block)")
    v = np.abs(rng.normal(0, 0.03, ROW))
    v[::32] = -0.2  # every block's largest magnitude is negative
    v[16::32] *= -1
    add(v, "mostly positive, each block's extreme negative (-0.2 at its first value)")
    v = np.repeat(rng.choice([0.01, -0.03, 0.5, -1.0, 7.0, -2.5, 1e-3, 3.0], 8), 32)
    add(v, "constant 32-value blocks (max == min)")
    # Ties: values that put x / d exactly on .5 for Q8_0 (amax 127) and on integers for the
    # 4/5-bit types (x - min multiples of d, offsets of .5).
    v = np.concatenate([
        np.arange(-15.5, 16.5, 1.0),                             # half-integer ramp
        np.concatenate([[127.0], np.arange(-14.5, 16.5, 1.0)]),  # amax 127: id = 1, x.5 -> round half away
        np.concatenate([[-8.0], np.arange(-7.5, 8.0, 0.5)[:31]]),  # Q4_0 d = 1: x + 8.5 on integers and halves
        np.concatenate([[-16.0], np.arange(-15.0, 16.0, 1.0)]),    # Q5_0 d = 1
        np.linspace(0, 15, 32),                                  # Q4_1 d = 1 / 2: steps of 15/31
        np.arange(32, dtype=np.float64) * 0.5 - 3.0,             # Q4_1/Q5_1: (x - min) / d on .5 steps
        np.arange(32, dtype=np.float64) * 0.25,                   # exact quarters
        np.arange(32, dtype=np.float64) - 31.0,                   # negative ramp, extreme -31
    ])
    add(v, "exact ties for round-half-away / trunc(x + .5) (ramps, halves, quarters)")
    add(rng.normal(0, 1e-6, ROW), "tiny: sd 1e-6 (f16-subnormal scales)")
    add(rng.normal(0, 1e-3, ROW) + np.where(rng.random(ROW) < 0.02, 3e-8, 0), "sd 1e-3")
    add(rng.normal(0, 40, ROW), "large: sd 40")
    add(bf16_round(rng.uniform(-1, 1, ROW)), "uniform [-1, 1], bf16-rounded")
    v = rng.normal(0, 0.02, ROW)
    v[128:] = np.abs(v[128:]) + 0.01  # second half all positive: min > 0 clamps to 0 in the K-quants
    add(v, "second half strictly positive (K-quant min clamped to 0)")
    return rows, desc


def f16_cases(rng):
    special = np.array([0.0, 1.0, -2.0, 65504.0, 65519.99, 65520.0, 70000.0, 1e30, 2.0 ** -14, 2.0 ** -24,
                        2.0 ** -25, 2.0 ** -25 * 1.0000001, 2.0 ** -26, 3 * 2.0 ** -25, 5 * 2.0 ** -25,
                        1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -11 + 2.0 ** -20,
                        2.0 ** -15 * 1.5, 6.1e-5, 6.0975552e-05, np.inf, -np.inf], dtype=np.float32)
    special = np.concatenate([special, -special])
    mags = (10.0 ** rng.uniform(-9, 5, 400)).astype(np.float32) * rng.choice([-1, 1], 400)
    # Exact ties between neighbouring f16 values, normal and subnormal.
    h = rng.integers(1, 0x7BFF, 100).astype(np.uint16)
    lo = h.view(np.float16).astype(np.float32)
    hi = (h + 1).view(np.float16).astype(np.float32)
    ties = ((lo.astype(np.float64) + hi.astype(np.float64)) / 2).astype(np.float32)
    x = np.concatenate([special, mags, ties]).astype(np.float32)
    return x, x.astype(np.float16).view(np.uint16)


def find_llama_quantize(arg):
    if arg:
        return arg
    cands = sorted(glob.glob(os.path.expanduser("~/.cache/tessera/llama.cpp/build-*/bin/llama-quantize")))
    return cands[-1] if cands else None


def write_f32_model(path, data):
    """A minimal llama-architecture F32 GGUF whose blk.0.ffn_down.weight holds `data`
    ([rows, 256]); llama-quantize reads only the hyperparameters and the tensors."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tessera quantize fixture")
    w.add_context_length(256)
    w.add_embedding_length(ROW)
    w.add_block_count(1)
    w.add_feed_forward_length(ROW)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_rope_dimension_count(64)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)  # ALL_F32
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "c", "d"])
    w.add_token_types([1, 1, 1, 1])
    w.add_tensor("blk.0.ffn_down.weight", data.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_quantize(binary, src, dst, qtype, pure=True, threads=1):
    cmd = [binary] + (["--pure"] if pure else []) + [str(src), str(dst), qtype, str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def tensor_bytes(path, name):
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.name == name:
            return t.tensor_type.name, np.asarray(t.data).tobytes()
    sys.exit(f"{path}: no tensor {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests/fixtures/quantize"))
    ap.add_argument("--default-model", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--llama-quantize", default=None, help="llama-quantize binary (default: the bench cache's)")
    ap.add_argument("--model", default=None,
                    help="BF16 GGUF of the default model (tessera convert): record llama-quantize's "
                         "per-tensor types for Q4_K_M and Q5_K_M")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261205)

    rows, desc = real_rows(args.default_model)
    srows, sdesc = synthetic_rows(rng)
    rows += srows
    desc += sdesc
    data = np.stack(rows).astype(np.float32)
    assert np.all(np.isfinite(data))
    (out / "rows.f32").write_bytes(data.astype("<f4").tobytes())
    manifest = {"generator": "tools/reference/quantize_fixtures.py", "row_length": ROW, "rows": desc,
                "numpy": np.__version__, "gguf": getattr(gguf, "__version__", None) or _pkg_version("gguf"),
                "files": {}}
    for name in GGUF_PY_TYPES:
        q = quants.quantize(data, T[name])
        (out / f"{name}.gguf-py").write_bytes(q.tobytes())
        manifest["files"][f"{name}.gguf-py"] = f"gguf.quants.quantize(rows, {name})"
        print(f"{name}.gguf-py: {q.nbytes} bytes")

    x, h = f16_cases(rng)
    (out / "f16.f32").write_bytes(x.astype("<f4").tobytes())
    (out / "f16.u16").write_bytes(h.astype("<u2").tobytes())
    manifest["files"]["f16.u16"] = "numpy astype(float16) of f16.f32"

    binary = find_llama_quantize(args.llama_quantize)
    if binary and os.path.exists(binary):
        manifest["llama_quantize"] = binary
        with tempfile.TemporaryDirectory() as tmp:
            src = pathlib.Path(tmp) / "rows.f32.gguf"
            write_f32_model(src, data)
            for name, arg in LLAMA_TYPES.items():
                dst = pathlib.Path(tmp) / f"rows.{name}.gguf"
                llama_quantize(binary, src, dst, arg)
                got_type, b = tensor_bytes(dst, "blk.0.ffn_down.weight")
                assert got_type == name, (name, got_type)
                (out / f"{name}.llama-cpp").write_bytes(b)
                manifest["files"][f"{name}.llama-cpp"] = f"llama-quantize --pure F32 {arg} (1 thread)"
                print(f"{name}.llama-cpp: {len(b)} bytes")
            if args.model:
                for scheme in ["Q4_K_M", "Q5_K_M"]:
                    dst = pathlib.Path(tmp) / f"model.{scheme}.gguf"
                    llama_quantize(binary, args.model, dst, scheme, pure=False, threads=os.cpu_count() or 1)
                    r = gguf.GGUFReader(str(dst))
                    types = {t.name: t.tensor_type.name for t in r.tensors}
                    ft = int(r.fields["general.file_type"].parts[-1][0])
                    doc = {"source": os.path.basename(args.model), "llama_quantize": binary,
                           "scheme": scheme, "file_type": ft, "tensors": types}
                    (out / f"{scheme.lower()}.types.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
                    manifest["files"][f"{scheme.lower()}.types.json"] = f"llama-quantize {scheme} of {args.model}"
                    print(f"{scheme.lower()}.types.json: {len(types)} tensors, file_type {ft}")
    else:
        print("no llama-quantize: K-quant references not written (pass --llama-quantize BIN)")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def _pkg_version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    main()
