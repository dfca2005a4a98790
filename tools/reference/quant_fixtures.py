#!/usr/bin/env python3
"""Golden dequantization fixtures for every GGML block type tessera reads, computed by the
`gguf` package (gguf-py's numpy dequantize: an implementation independent of tessera's).

For each type it writes tests/fixtures/quant/<TYPE>.blocks (raw blocks) and <TYPE>.f32 (the
gguf package's fp32 values, little-endian). The blocks are random bytes (every bit of every
quant, scale, min and high-bit field is exercised) with the f16 scale fields replaced by
finite values across the f16 range, zero and subnormals included, plus, for the types the
package can quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), blocks it quantized from a normal sample.

    python3 tools/reference/quant_fixtures.py            # writes tests/fixtures/quant/
"""
import argparse
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

# Byte offsets of each block's f16 scale fields (d, dmin, m), per type.
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "IQ4_NL": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_XS": [0],
}
QUANTIZABLE = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}


def f16_samples(rng, n):
    """Finite f16 bit patterns: mostly model-like magnitudes, some zeros, subnormals, extremes."""
    mags = 10.0 ** rng.uniform(-5, -1, n)
    v = (mags * rng.choice([-1.0, 1.0], n)).astype(np.float16).view(np.uint16)
    special = np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x7BFF, 0xFBFF, 0x3C00], dtype=np.uint16)
    k = min(len(special), n // 4)
    v[:k] = special[:k]
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parents[2] / "tests/fixtures/quant"))
    ap.add_argument("--blocks", type=int, default=24, help="random blocks per type")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261205)
    for name, fields in F16_FIELDS.items():
        qt = T[name]
        block_values, block_bytes = quants.GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, size=(args.blocks, block_bytes), dtype=np.uint8)
        for off in fields:
            raw[:, off:off + 2] = f16_samples(rng, args.blocks).view(np.uint8).reshape(args.blocks, 2)
        blocks = [raw]
        if name in QUANTIZABLE:
            x = rng.normal(0, 0.05, size=(8, block_values)).astype(np.float32)
            blocks.append(quants.quantize(x, qt).reshape(8, block_bytes))
        data = np.concatenate(blocks).reshape(-1)
        values = quants.dequantize(data, qt).astype(np.float32).reshape(-1)
        assert values.size == data.size // block_bytes * block_values
        assert np.all(np.isfinite(values)), name
        (out / f"{name}.blocks").write_bytes(data.tobytes())
        (out / f"{name}.f32").write_bytes(values.astype("<f4").tobytes())
        print(f"{name}: {data.size // block_bytes} blocks of {block_values} values ({block_bytes} B each)")


if __name__ == "__main__":
    main()
