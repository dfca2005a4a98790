// The x16 tile layouts (quant.h): packing from the file's blocks and exact dequantization.
// Compiled for the baseline ISA, so the compiler fuses no multiply-add that the oracle's
// dequantization (io/tensor.cc) does not: the values are the same floats, bit for bit.
#include "targets/cpu/quant.h"

#include <cmath>
#include <cstring>

#include "util/error.h"
#include "util/half.h"

namespace tessera::cpu {

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Offset of the quantized bytes in a tile, after the per-row f16 scales (and mins).
int64_t qs_offset(DType t) { return t == DType::Q4_1 ? 64 : 32; }

// The 4-bit value k (0..31) of tile row i, from the nibble layout shared by Q4_0 and Q4_1.
inline int nibble(const uint8_t* qs, int64_t i, int k) {
  const int c = k / 8, e = k % 4, high = (k % 8) / 4;
  const uint8_t byte = qs[c * 64 + 4 * i + e];
  return high ? byte >> 4 : byte & 0x0F;
}

}  // namespace

bool x16_supported(DType t) { return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q8_0; }

int64_t x16_tile_bytes(DType t) {
  if (!x16_supported(t)) fail("cpu kernels: no x16 tile layout for {}", dtype_name(t));
  return kTileRows * dtype_block_bytes(t);
}

int64_t x16_bytes(DType t, int64_t rows, int64_t cols) {
  return (rows + kTileRows - 1) / kTileRows * (cols / kQBlock) * x16_tile_bytes(t);
}

void x16_pack_tile(DType t, const uint8_t* const rows[kTileRows], int64_t block, uint8_t* tile) {
  const int64_t bb = dtype_block_bytes(t);
  std::memset(tile, 0, size_t(x16_tile_bytes(t)));
  uint8_t* qs = tile + qs_offset(t);
  for (int64_t i = 0; i < kTileRows; ++i) {
    if (!rows[i]) continue;
    const uint8_t* src = rows[i] + block * bb;
    std::memcpy(tile + 2 * i, src, 2);                              // d
    if (t == DType::Q4_1) std::memcpy(tile + 32 + 2 * i, src + 2, 2);  // m
    if (t == DType::Q8_0) {
      for (int k = 0; k < 32; ++k) qs[(k / 4) * 64 + 4 * i + k % 4] = uint8_t(src[2 + k] ^ 0x80);
      continue;
    }
    // GGML's 4-bit blocks: byte j holds value j (low nibble) and value j + 16 (high).
    const uint8_t* q = src + (t == DType::Q4_1 ? 4 : 2);
    int n[32];
    for (int j = 0; j < 16; ++j) {
      n[j] = q[j] & 0x0F;
      n[j + 16] = q[j] >> 4;
    }
    for (int c = 0; c < 4; ++c)
      for (int e = 0; e < 4; ++e) qs[c * 64 + 4 * i + e] = uint8_t(n[8 * c + e] | n[8 * c + 4 + e] << 4);
  }
}

void x16_rows_f32(DType t, const uint8_t* tiles, int64_t cols, int64_t r0, int64_t r1, int64_t k0, int64_t k1,
                  float* out, int64_t ld) {
  const int64_t blocks = cols / kQBlock, tb = x16_tile_bytes(t);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t g = r / kTileRows, i = r % kTileRows;
    float* o = out + (r - r0) * ld;
    for (int64_t b = k0 / kQBlock; b < k1 / kQBlock; ++b, o += kQBlock) {
      const uint8_t* tile = tiles + (g * blocks + b) * tb;
      const uint8_t* qs = tile + qs_offset(t);
      const float d = f16_to_f32(load_u16(tile + 2 * i));
      // The products io/tensor.cc computes for the same block, in the same order.
      switch (t) {
        case DType::Q8_0:
          for (int k = 0; k < 32; ++k) o[k] = float(int8_t(qs[(k / 4) * 64 + 4 * i + k % 4] ^ 0x80)) * d;
          break;
        case DType::Q4_0:
          for (int k = 0; k < 32; ++k) o[k] = d * float(nibble(qs, i, k) - 8);
          break;
        case DType::Q4_1: {
          const float m = f16_to_f32(load_u16(tile + 32 + 2 * i));
          for (int k = 0; k < 32; ++k) o[k] = d * float(nibble(qs, i, k)) + m;
          break;
        }
        default: fail("cpu kernels: no x16 tile layout for {}", dtype_name(t));
      }
    }
  }
}

void x16_rows_bf16(DType t, const uint8_t* tiles, int64_t cols, int64_t r0, int64_t r1, int64_t k0, int64_t k1,
                   uint16_t* out, int64_t ld) {
  float row[kQBlock];
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t k = k0; k < k1; k += kQBlock) {
      x16_rows_f32(t, tiles, cols, r, r + 1, k, k + kQBlock, row, kQBlock);
      uint16_t* o = out + (r - r0) * ld + (k - k0);
      for (int64_t j = 0; j < kQBlock; ++j) o[j] = f32_to_bf16(row[j]);
    }
}

void Q8Row::quantize(const float* x, int64_t cols) {
  const int64_t blocks = cols / kQBlock;
  d.resize(size_t(blocks));
  sum_hi.resize(size_t(blocks));
  sum_lo.resize(size_t(blocks));
  hi.resize(size_t(cols));
  lo.resize(size_t(cols));
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kQBlock;
    float amax = 0;
    bool finite = true;
    for (int64_t k = 0; k < kQBlock; ++k) {
      amax = std::max(amax, std::fabs(xb[k]));
      finite = finite && std::isfinite(xb[k]);
    }
    const float id = amax > 0 && finite ? 127.0f / amax : 0.0f;
    int32_t sh = 0, sl = 0;
    for (int64_t k = 0; k < kQBlock; ++k) {
      const float v = xb[k] * id;
      const float h = std::nearbyint(v);
      const int l = int(std::nearbyint((v - h) * kLoScale));
      hi[size_t(b * kQBlock + k)] = int8_t(h);
      lo[size_t(b * kQBlock + k)] = int8_t(l);
      sh += int(h);
      sl += l;
    }
    // A non-finite value makes the scale NaN, so every product with the block is NaN (never
    // hidden as a zero).
    d[size_t(b)] = finite ? amax / 127.0f : NAN;
    sum_hi[size_t(b)] = sh;
    sum_lo[size_t(b)] = sl;
  }
}

void x16_gemv_rows(const Q8Row& x, DType t, const uint8_t* tiles, int64_t cols, int64_t r0, int64_t r1, float* y) {
  const int64_t blocks = cols / kQBlock, tb = x16_tile_bytes(t);
  const int offset = t == DType::Q4_0 ? 8 : t == DType::Q8_0 ? 128 : 0;  // what the tile's bytes add
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t g = r / kTileRows, i = r % kTileRows;
    float acc = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* tile = tiles + (g * blocks + b) * tb;
      const uint8_t* qs = tile + qs_offset(t);
      const int8_t* xh = x.hi.data() + b * kQBlock;
      const int8_t* xl = x.lo.data() + b * kQBlock;
      int32_t dot_hi = -offset * x.sum_hi[size_t(b)], dot_lo = -offset * x.sum_lo[size_t(b)];
      for (int k = 0; k < 32; ++k) {
        const int v = t == DType::Q8_0 ? qs[(k / 4) * 64 + 4 * i + k % 4] : nibble(qs, i, k);
        dot_hi += v * xh[k];
        dot_lo += v * xl[k];
      }
      const float dd = f16_to_f32(load_u16(tile + 2 * i)) * x.d[size_t(b)];
      acc += (float(dot_hi) + float(dot_lo) * (1.0f / Q8Row::kLoScale)) * dd;
      if (t == DType::Q4_1) {
        const float xsum = float(x.sum_hi[size_t(b)]) + float(x.sum_lo[size_t(b)]) * (1.0f / Q8Row::kLoScale);
        acc += f16_to_f32(load_u16(tile + 32 + 2 * i)) * (x.d[size_t(b)] * xsum);
      }
    }
    y[r] = acc;
  }
}

}  // namespace tessera::cpu
