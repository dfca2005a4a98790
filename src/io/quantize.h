// fp32 -> GGML block formats: the writing side of io/tensor.h's to_f32.
//
// Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 are quantized exactly as the `gguf` Python package's
// gguf.quants.quantize does (the same fp32 operations in the same order, so the bytes are
// identical; it is also what llama.cpp's quantize_row_*_ref compute on ordinary data). The
// K-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K follow llama.cpp's reference quantizers without
// an importance matrix (ggml-quants.c: quantize_row_q*_K_ref with make_qkx2_quants,
// make_qx_quants, make_q3_quants and nearest_int), which is what llama-quantize runs when
// it has no imatrix. Everything is plain fp32 arithmetic in source order (the build is
// ISO C++, no -ffp-contract=fast, no FMA), so results do not depend on the host.
#pragma once
#include <cstdint>

#include "io/tensor.h"

namespace tessera {

// fp32 -> IEEE binary16, round to nearest even; overflow gives +-inf, NaN a quiet NaN
// (numpy's astype(float16) and ggml's GGML_FP32_TO_FP16 agree on every finite input).
uint16_t f32_to_f16(float f);

// True for the types quantize_f32 writes: F32, F16, BF16 and the block types above.
bool can_quantize(DType t);

// Encodes `n` fp32 values (a whole number of t's blocks) as `t` into `dst`, which must
// hold dtype_bytes(t, n) bytes. Blocks are independent: any split of a row into whole
// blocks gives the same bytes. Throws tessera::Error for a type it does not write or a
// partial block.
void quantize_f32(DType t, const float* src, uint8_t* dst, int64_t n);

}  // namespace tessera
