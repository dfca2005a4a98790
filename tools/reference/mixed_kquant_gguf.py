#!/usr/bin/env python3
"""A mixed-type GGUF from a GGUF model, with the `gguf` package: every ffn_down weight
becomes random but valid K-quant blocks (Q6_K in even layers, Q4_K in odd ones; small scales,
so the model stays finite), everything else is copied as it is. The file exercises a loader on
the K-quants and on a file mixing types per tensor (as Q4_K_M files do); its numbers mean
nothing, but the oracle dequantizes the same blocks, so every gate still applies.

    python3 tools/reference/mixed_kquant_gguf.py models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/mixed.gguf

ffn_down's inner dimension must be a multiple of 256 (SmolLM2-135M: 1536).
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFWriter, quants
src, dst = sys.argv[1], sys.argv[2]
r = GGUFReader(src)
arch = r.fields['general.architecture'].contents()
w = GGUFWriter(dst, arch)
for k, f in r.fields.items():
    if k.startswith('GGUF.') or k == 'general.architecture': continue
    vt = f.types[0]
    sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
    w.add_key_value(k, f.contents(), vt, sub_type=sub)
rng = np.random.default_rng(1)
for t in r.tensors:
    data = np.asarray(t.data)
    if 'ffn_down' in t.name:
        qt = T.Q6_K if int(t.name.split('.')[1]) % 2 == 0 else T.Q4_K
        vals, bb = quants.GGML_QUANT_SIZES[qt]
        rows, cols = int(t.shape[1]), int(t.shape[0])
        nb = rows * cols // vals
        raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
        d = (rng.uniform(1e-4, 4e-4, nb)).astype(np.float16).view(np.uint8).reshape(nb, 2)
        if qt == T.Q6_K: raw[:, 208:210] = d
        else:
            raw[:, 0:2] = d; raw[:, 2:4] = (np.full(nb, 1e-4)).astype(np.float16).view(np.uint8).reshape(nb, 2)
        w.add_tensor(t.name, raw.reshape(rows, cols // vals * bb), raw_dtype=qt)
    else:
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
print('wrote', dst)
