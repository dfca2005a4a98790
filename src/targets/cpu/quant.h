// Quantized weights as the cpu kernels read them: GGML blocks re-laid 16 rows at a time.
//
// A file stores a quantized matrix row after row, each row a run of blocks (scale, then the
// block's 32 quantized values). A decode GEMV wants the opposite: one vector lane per output
// row, so that a block's scale for 16 rows is one vector and a dot product needs no
// horizontal sums. So at load the cpu target re-lays each matrix into tiles of 16 rows x one
// block ("x16"), with exactly the file's bytes per block (the tiles replace the mapped rows:
// memory stays the file's size). Tile (g, b) holds block b of rows 16g..16g+15:
//
//   Q4_0x16 (288 B): f16 d[16]; u8 qs[4][64]: qs[c][4i + e] = n(i, 8c + e) | n(i, 8c + 4 + e) << 4
//   Q4_1x16 (320 B): f16 d[16]; f16 m[16]; u8 qs[4][64] as Q4_0
//   Q8_0x16 (544 B): f16 d[16]; u8 qs[8][64]: qs[j][4i + e] = q(i, 4j + e) + 128
//
// where n(i, k) is the 4-bit value k of row i's block (0..15), q(i, k) its int8 value. So a
// 64-byte vector of qs (nibbles split into low and high) holds, in 32-bit lane i, four
// consecutive values of row i: one VNNI dot-product instruction (u8 x s8, four products
// summed per lane) advances 16 rows by four values against four broadcast activation bytes.
// Values stay exactly the file's (Q8_0 is biased by 128 to be unsigned; the kernels subtract
// 128 x the activations' sum). Rows past the matrix's end are zero (scale 0).
#pragma once
#include <cstdint>
#include <vector>

#include "io/tensor.h"

namespace tessera::cpu {

inline constexpr int64_t kTileRows = 16;
inline constexpr int64_t kQBlock = 32;  // values per block of every x16 type

// Whether the cpu kernels read `t` re-laid as x16 tiles (the others are converted to bf16).
bool x16_supported(DType t);
// Bytes of one tile of type t (16 x the block's bytes).
int64_t x16_tile_bytes(DType t);
// Bytes of a [rows, cols] matrix of type t as x16 tiles (rows padded to 16).
int64_t x16_bytes(DType t, int64_t rows, int64_t cols);

// Writes the tile of block `block` of 16 rows, each given as its bytes in the file (a null
// row: zeros). Tile (g, b) of a matrix lies at (g * cols / 32 + b) * x16_tile_bytes(t).
void x16_pack_tile(DType t, const uint8_t* const rows[kTileRows], int64_t block, uint8_t* tile);

// Exact values of rows [r0, r1) x columns [k0, k1) (k0, k1 multiples of 32) as fp32, row
// stride ld: the same products the oracle's dequantization computes (io/tensor.cc).
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
  static constexpr float kLoScale = 254.0f;
  std::vector<float> d;                  // per block
  std::vector<int32_t> sum_hi, sum_lo;   // per block: the sums of hi and of lo
  std::vector<int8_t> hi, lo;            // cols values each
  void quantize(const float* x, int64_t cols);
};
// y[r] = row r . x for r in [r0, r1): per block, the integer dots of the block's values with
// hi and lo (the weights' offset taken out in integers), combined as dot_hi + dot_lo / 254,
// times both scales (plus Q4_1's min times the block's sum of x), summed in fp32 over the
// blocks in order. The portable GEMV; the AVX-512 VNNI one computes the same.
void x16_gemv_rows(const Q8Row& x, DType t, const uint8_t* tiles, int64_t cols, int64_t r0, int64_t r1, float* y);

}  // namespace tessera::cpu
