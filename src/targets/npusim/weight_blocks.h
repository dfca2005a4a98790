// npusim W4A16 / W5A16 / W6A16 / W8A16: what a compute tile does with the GGML blocks a weight
// fifo brings (spatial.h: one element = one block of 32 weights, Q4_0 Q4_1 Q5_0 Q5_1 Q8_0, or
// one super-block of 256, Q4_K Q5_K Q6_K; moved through the DMA as the file holds it).
//
// Numerics. The tile never rounds a weight. It unpacks an element into groups (the 32-weight
// types: one group, the block; Q4_K, Q5_K: 8 sub-blocks of 32; Q6_K: 16 of 16), each with an
// fp32 scale, an fp32 min (0 for the types without one) and small integers v, each exactly a
// bf16 (at most 6 bits with sign), so that weight i of group g is scale_g x v_i - min_g:
//  - Q4_0: d, nibble - 8;  Q8_0: d, the int8;  Q5_0: d, (nibble | fifth bit << 4) - 16;
//  - Q4_1, Q5_1: d, the 4- or 5-bit value, min = -m (the oracle adds m: the same fp32 sum);
//  - Q4_K, Q5_K: d x sc_g, the 4- or 5-bit value, min = dmin x m_g (sc_g, m_g the 6-bit
//    packed sub-block scale and min, io/ggml_blocks.h's k_scale_min);
//  - Q6_K: d x sc_g (sc_g the int8 sub-block scale), the 6-bit value - 32.
// Every scale and min is an f16 times an integer of at most 8 bits, so exact in fp32, and
// scale x v is exact (at most 24 significant bits), so fp32(scale x v - min) is the oracle's
// upcast (io/tensor.cc) bit for bit (BlockTerms::weight; tests hold it to the oracle's rows).
// The bf16 MAC unit multiplies the integers by bf16 activations with exact products; per group
// the fp32 partial sum is scaled, and for a type with a min, min x (the group's sum of x) is
// subtracted: the kernel computes with the weights scale x v - min before fp32 rounding, which
// differ from the oracle's rounded weights by at most half an fp32 ulp each (the types without
// a min: no difference at all); only the summation order differs beyond that.
//
// Cost (vector unit, lane operations; the timing model prices WorkerCost::vector_ops at
// Device::vector_lanes_bf16 lanes per cycle times the kernel class's efficiency). xdna2.md
// gives no dequant figure, so these are assumptions, stated here and in design.md:
//  - unpacking, per weight (unpack_lane_ops): split the nibbles 1, a fifth bit or Q6_K's two
//    high bits 2 (shift into place, or), an offset 1 (Q4_0 8, Q5_0 16, Q6_K 32), convert the
//    integer to bf16 1: Q4_0 3, Q4_1 2, Q5_0 5, Q5_1 4, Q8_0 1, Q4_K 2, Q5_K 4, Q6_K 5;
//  - decoding a group's scale and min, per group (group_decode_ops): Q4_K, Q5_K 8 (the two
//    6-bit fields out of 12 bytes, converted, times d and dmin), Q6_K 2 (the int8 converted,
//    times d); the 32-weight types 0 (their f16 d and m are widened with the block);
//  - scaling: GEMV 1 per weight (the group's lane products scaled before they join the lane
//    accumulators), GEMM 1 per accumulator element per group (the m x n tile scaled per group);
//  - a min (Q4_1, Q5_1, Q4_K, Q5_K): 1 per row (GEMV) or accumulator element (GEMM) per group
//    (min x the group's sum of x, one fused multiply-subtract, as the scale's multiply-add), and
//    1 per activation the worker reads to form the groups' sums of x.
// So a GEMV Q4_0 block costs 128 lane operations (4 cycles at 32 lanes) against 32 MACs; a
// Q4_K super-block 256 x 3 + 8 x (8 + 1) = 840 (26.25 cycles) against 256 MACs; a Q6_K
// super-block 256 x 6 + 16 x 2 = 1568 (49 cycles).
#pragma once
#include <cstdint>

#include "targets/npusim/spatial.h"

namespace tessera::npusim {

inline constexpr int kBlockValues = 32;        // the 32-weight types' block
inline constexpr int kMaxElementValues = 256;  // a K-quant super-block
inline constexpr int kMaxGroups = 16;          // Q6_K's sub-blocks of 16

// Values sharing one scale (and min): 32, Q6_K 16 (1 for bf16 and f32).
int group_values(ElemType t);
// Whether the type subtracts a min per group (Q4_1, Q5_1, Q4_K, Q5_K).
bool has_min(ElemType t);

// One element as the tile unpacks it: weight i = scale[g] x v[i] - min[g], g = i / group,
// exactly the oracle's weight once rounded to fp32 (weight()).
struct BlockTerms {
  int values = 0;  // 32 or 256
  int group = 0;   // values per group
  float scale[kMaxGroups] = {};
  float min[kMaxGroups] = {};
  int8_t v[kMaxElementValues] = {};
  int groups() const { return values / group; }
  float weight(int i) const { return scale[i / group] * float(v[i]) - min[i / group]; }
};
// Throws unless t is a block type.
BlockTerms unpack_block(ElemType t, const uint8_t* element);

// Lane operations to unpack one weight of type t into a bf16 integer (0 for bf16 weights), and
// to decode one group's scale and min.
int64_t unpack_lane_ops(ElemType t);
int64_t group_decode_ops(ElemType t);
// Vector lane operations of a GEMV worker over `weights` weights of type t that reads
// `x_values` activations (unpack, group decode, scale, min; 0 for bf16), and of a GEMM worker
// that unpacks `b_weights` weights, accumulates `acc_depth` = (accumulator elements x K depth)
// and reads `a_values` values of A.
int64_t gemv_dequant_ops(ElemType t, int64_t weights, int64_t x_values);
int64_t gemm_dequant_ops(ElemType t, int64_t b_weights, int64_t acc_depth, int64_t a_values);

// sum over `elements` elements of sum over groups g of scale_g (v_g . x_g) - min_g sum(x_g): one
// row chunk of a quantized GEMV. x is the chunk's activations in fp32 (bf16 values widened);
// each group's partial adds its exact products in lane order, then is scaled (and its min
// term subtracted) and added.
float dot_blocks(ElemType t, const uint8_t* row_elements, const float* x, int64_t elements);

}  // namespace tessera::npusim
