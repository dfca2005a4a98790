// Quantized weights as the cpu kernels read them: GGML blocks re-laid 16 rows at a time.
//
// A file stores a quantized matrix row after row, each row a run of blocks (scales, then the
// block's quantized values). A decode GEMV wants the opposite: one vector lane per output
// row, so that a block's scale for 16 rows is one vector and a dot product needs no
// horizontal sums. So at load the cpu target re-lays each matrix into tiles of 16 rows x one
// block ("x16"). Tile (g, b) holds block b (32 values, or 256 for the K-quants) of rows
// 16g..16g+15. Every value is stored as an unsigned byte q + offset (x16_value_offset) split
// into a low nibble, kept in "value vectors", and the high bits:
//
//   value vector: 64 bytes whose 32-bit lane i holds four consecutive values of row i; a
//   32-value chunk is 8 of them. 4-bit parts are packed two vectors per 64 bytes (qs[c]:
//   low nibbles = vector 2c, high nibbles = vector 2c + 1); Q8_0's bytes are whole.
//
//   type  tile bytes (file's)   parts, in order
//   Q8_0   544 (544)  f16 d[16]; qs[8][64] (q + 128)
//   Q4_0   288 (288)  f16 d[16]; qs[4][64]
//   Q4_1   320 (320)  f16 d[16]; f16 m[16]; qs[4][64]
//   Q5_0   352 (352)  f16 d[16]; qs[4][64]; qh[64]: bit v of byte 4i+e = fifth bit of vector v's value
//   Q5_1   384 (384)  f16 d[16]; f16 m[16]; qs[4][64]; qh[64] as Q5_0's
//   Q4_K  2368 (2304) f16 d[16]; f16 dmin[16]; u8 sc[8][16]; u8 m[8][16]; qs[8 chunks][4][64]
//   Q5_K  2880 (2816) Q4_K's parts; qh[8 chunks][64], each as Q5_0's qh for its chunk
//   Q6_K  3360 (3360) f16 d[16]; i8 sc[16][16]; qs[8][4][64]; qh[8][2][64]: bits 2s..2s+1 of
//                     byte 4i+e in qh[j][h] = high two bits of chunk j's vector 4h+s
//
// One VNNI dot-product instruction (u8 x s8, four products summed per lane) then advances 16
// rows by four values against four broadcast activation bytes. Q4_K's 6-bit scales and mins
// (and Q5_K's) are unpacked to bytes (2.8% and 2.3% more than the file); every value is
// exactly the file's. Rows
// past the matrix's end are zero (scale 0).
#pragma once
#include <cstdint>
#include <vector>

#include "io/tensor.h"

namespace tessera::cpu {

inline constexpr int64_t kTileRows = 16;
inline constexpr int64_t kQBlock = 32;  // values per activation block (Q8Row) and per chunk of a tile

// Where a tile's parts start (the table above), the values per tile and the offset a stored
// byte adds to the quantized value; bytes == 0 for a type with no tile layout.
struct X16Layout {
  int64_t values, qs, qh, sc, m, bytes;
  int offset;
};
constexpr X16Layout x16_layout(DType t) {
  switch (t) {
    case DType::Q8_0: return {32, 32, 0, 0, 0, 544, 128};
    case DType::Q4_0: return {32, 32, 0, 0, 0, 288, 8};
    case DType::Q4_1: return {32, 64, 0, 0, 32, 320, 0};
    case DType::Q5_0: return {32, 32, 288, 0, 0, 352, 16};
    case DType::Q5_1: return {32, 64, 320, 0, 32, 384, 0};
    case DType::Q4_K: return {256, 320, 0, 64, 192, 2368, 0};
    case DType::Q5_K: return {256, 320, 2368, 64, 192, 2880, 0};
    case DType::Q6_K: return {256, 288, 2336, 32, 0, 3360, 32};
    default: return {0, 0, 0, 0, 0, 0, 0};
  }
}

// The block types' shared shapes, which every kernel on the tiles branches on: a per-row min
// added (Q4_1, Q5_1), the K-quants' 6-bit sub-block scales and subtracted mins (Q4_K, Q5_K),
// a fifth bit (Q5_0, Q5_1, Q5_K).
constexpr bool x16_has_min(DType t) { return t == DType::Q4_1 || t == DType::Q5_1; }
constexpr bool x16_k_scales(DType t) { return t == DType::Q4_K || t == DType::Q5_K; }
constexpr bool x16_fifth_bit(DType t) { return t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q5_K; }

// Whether the cpu kernels read `t` re-laid as x16 tiles (the others are converted to bf16).
bool x16_supported(DType t);
// What a stored byte adds to the quantized value (Q4_0 8, Q5_0 16, Q6_K 32, Q8_0 128).
int x16_value_offset(DType t);
// Bytes of one tile of type t.
int64_t x16_tile_bytes(DType t);
// Bytes of a [rows, cols] matrix of type t as x16 tiles (rows padded to 16).
int64_t x16_bytes(DType t, int64_t rows, int64_t cols);

// Writes the tile of block `block` of 16 rows, each given as its bytes in the file (a null
// row: zeros). Tile (g, b) of a matrix lies at (g * blocks per row + b) * x16_tile_bytes(t).
void x16_pack_tile(DType t, const uint8_t* const rows[kTileRows], int64_t block, uint8_t* tile);

// Exact values of rows [r0, r1) x columns [k0, k1) as fp32, row stride ld: the same
// products the oracle's dequantization computes (io/tensor.cc).
void x16_rows_f32(DType t, const uint8_t* tiles, int64_t cols, int64_t r0, int64_t r1, int64_t k0, int64_t k1,
                  float* out, int64_t ld);
// The same rounded to bf16 (nearest even).
void x16_rows_bf16(DType t, const uint8_t* tiles, int64_t cols, int64_t r0, int64_t r1, int64_t k0, int64_t k1,
                   uint16_t* out, int64_t ld);

// An activation row as the quantized GEMV reads it: per 32-value block, two int8 terms,
// x = d * (hi + lo / 254) with d = max|x| / 127, hi = x / d rounded to nearest even and lo
// the remainder (within +-0.5) times 254, rounded likewise: integer dot products (VNNI) at
// an error of max|x| / 64516 per value, where one int8 term (llama.cpp's Q8_0 activations)
// costs max|x| / 254 and an output NMSE of about 1e-4, more than the gates allow a GEMV.
// (The oracle's Precision::Q8x2_32 states the same rounding independently.)
struct Q8Row {
  static constexpr int32_t kLoSteps = 254;  // lo's steps per unit of hi
  static constexpr float kLoScale = float(kLoSteps);
  std::vector<float> d;                  // per block
  std::vector<float> dsum;               // per block: d * block_sum (what a per-row min multiplies)
  std::vector<int32_t> sum_hi, sum_lo;   // per 16 values: the sums of hi and of lo
  std::vector<int8_t> hi, lo;            // cols values each
  void quantize(const float* x, int64_t cols);        // vectorized (Highway), the plain loop's bytes
  // Blocks [b0, b1) of row x alone, as quantize writes them, into a row resize()d before
  // (threads may fill disjoint block ranges of one row).
  void quantize_blocks(const float* x, int64_t b0, int64_t b1);
  void quantize_plain(const float* x, int64_t cols);  // the plain loop, which states the arithmetic
  void resize(int64_t cols);
  // Value k's two terms as one integer, 254 hi + lo (|.| <= 32385, an int16): one
  // integer product per weight carries both terms' (x / d * 254, exactly as quantized).
  int32_t term(int64_t k) const { return int32_t(hi[size_t(k)]) * kLoSteps + lo[size_t(k)]; }
  // The sum of term() over 16-value group i.
  int32_t term_sum(int64_t i) const { return sum_hi[size_t(i)] * kLoSteps + sum_lo[size_t(i)]; }
  // A chunk's integer dot of weights with term() (exact in int32: |dot| < 32 * 255 * 32385 +
  // 128 * 32 * 32385 < 2^31) as the fp32 dot with x / d: one rounding to fp32, one product.
  static float dot_value(int32_t dot) { return float(dot) * (1.0f / kLoScale); }
  // Block b's sum of x as quantized, over d: sum(hi) + sum(lo) / 254.
  float block_sum(int64_t b) const {
    return float(sum_hi[size_t(2 * b)] + sum_hi[size_t(2 * b + 1)]) +
           float(sum_lo[size_t(2 * b)] + sum_lo[size_t(2 * b + 1)]) * (1.0f / kLoScale);
  }
};
// y[r] = row r . x for r in [r0, r1): per 32-value chunk (16 for Q6_K), the integer dot of
// the stored values with x's terms as one integer (Q8Row::term, the weights' offset taken out
// in integers), as fp32 (Q8Row::dot_value), times both scales (plus Q4_1's min times the
// block's sum of x), summed in fp32 over the chunks in order. The portable kernels
// (Highway's targets) compute exactly this; the AVX-512 VNNI and AMX ones take the same integer
// dots (two int8 terms, VNNI's u8 x s8) and scale them with fused multiply-adds.
void x16_gemv_rows(const Q8Row& x, DType t, const uint8_t* tiles, int64_t cols, int64_t r0, int64_t r1, float* y);

}  // namespace tessera::cpu
