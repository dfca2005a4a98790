// npusim W4A16 / W8A16: what a compute tile does with the GGML blocks a weight fifo brings
// (spatial.h: ElemType::Q4_0, Q8_0; one element = one block of 32 weights, moved through the
// DMA as the file holds it).
//
// Numerics. The tile never rounds a weight: it unpacks a block into its f16 scale (widened to
// fp32, exact) and 32 small integers v (Q4_0: nibble - 8, Q8_0: the int8), each exactly a bf16,
// so the bf16 MAC unit multiplies them by bf16 activations with exact products; the fp32
// partial sum of the block's 32 products is then scaled by the block's scale and added to the
// row's fp32 accumulator. The weight the kernel computes with is scale x v, which is exactly
// the oracle's upcast (io/tensor.cc: d * (q - 8), q * d: an f16 times an integer of at most 8
// bits fits fp32's 24-bit significand); only the summation order differs from a dot product
// over dequantized weights. unpack_block is that upcast (tests hold scale x v to the oracle's
// row bit for bit).
//
// Cost (vector unit, lane operations; the timing model prices WorkerCost::vector_ops at
// Device::vector_lanes_bf16 lanes per cycle times the kernel class's efficiency). xdna2.md
// gives no dequant figure, so these are assumptions, stated here and in design.md:
//  - unpacking, per weight: Q4_0 3 (split the nibbles, subtract the offset 8, convert int8 to
//    bf16), Q8_0 1 (convert int8 to bf16);
//  - scaling: GEMV 1 per weight (the block's 32 lane products scaled before they join the
//    lane accumulators), GEMM 1 per accumulator element per block (the m x n tile scaled per
//    32-deep block).
// So a GEMV block costs Q4_0 128 lane operations (4 cycles at 32 lanes), Q8_0 64 (2 cycles),
// against 32 MACs; a GEMM B tile of n x k is unpacked once per use.
#pragma once
#include <cstdint>

#include "targets/npusim/spatial.h"

namespace tessera::npusim {

inline constexpr int kBlockValues = 32;

// One block as the tile unpacks it: weight i = scale * v[i], exactly.
struct BlockTerms {
  float scale = 0;
  int8_t v[kBlockValues] = {};
};
// Throws unless t is a block type.
BlockTerms unpack_block(ElemType t, const uint8_t* block);

// Lane operations to unpack one weight of type t into a bf16 integer (0 for bf16 weights).
int64_t unpack_lane_ops(ElemType t);
// Vector lane operations of a GEMV worker over `weights` weights of type t (unpack + scale;
// 0 for bf16), and of a GEMM worker that unpacks `b_weights` weights and scales
// `acc_block_updates` accumulator elements once per block.
int64_t gemv_dequant_ops(ElemType t, int64_t weights);
int64_t gemm_dequant_ops(ElemType t, int64_t b_weights, int64_t acc_block_updates);

// sum over `blocks` blocks of scale_b * (v_b . x_b): one row chunk of a quantized GEMV. x is
// the chunk's activations in fp32 (bf16 values widened); each block's partial adds its 32
// exact products in lane order (as dot_bf16 over one vector), then is scaled and added.
float dot_blocks(ElemType t, const uint8_t* row_blocks, const float* x, int64_t blocks);

}  // namespace tessera::npusim
