// The x16 tile layouts (quant.h): packing from the file's blocks, exact dequantization and
// the portable GEMV. Compiled for the baseline ISA, so the compiler fuses no multiply-add
// that the oracle's dequantization (io/tensor.cc) does not: the values are the same floats.
#include "targets/cpu/quant.h"

#include <cmath>
#include <cstring>

#include "io/ggml_blocks.h"
#include "targets/cpu/kernels_internal.h"
#include "util/error.h"
#include "util/half.h"

namespace tessera::cpu {

namespace {

using ggml::k_scale_min;
using ggml::load_u16;
using ggml::load_u32;

// The tile layout of t; throws for a type with none.
X16Layout layout(DType t) {
  const X16Layout L = x16_layout(t);
  if (L.bytes == 0) fail("cpu kernels: no x16 tile layout for {}", dtype_name(t));
  return L;
}

// The stored byte of value k (within the tile's block) of row i, as the VNNI kernel
// multiplies it: the quantized value plus the type's offset (value_offset), 0..255.
int stored_value(DType t, const uint8_t* tile, const X16Layout& L, int64_t i, int k) {
  const int j = k / 32, kk = k % 32, v = kk / 4;  // chunk of 32, value-vector of four
  if (t == DType::Q8_0) return tile[L.qs + v * 64 + 4 * i + kk % 4];
  const uint8_t byte = tile[L.qs + j * 256 + (kk / 8) * 64 + 4 * i + kk % 4];
  int q = (kk % 8) / 4 ? byte >> 4 : byte & 0x0F;
  if (t == DType::Q5_0 || t == DType::Q5_1) q |= ((tile[L.qh + 4 * i + kk % 4] >> v) & 1) << 4;
  if (t == DType::Q5_K) q |= ((tile[L.qh + j * 64 + 4 * i + kk % 4] >> v) & 1) << 4;
  if (t == DType::Q6_K) q |= ((tile[L.qh + j * 128 + (v / 4) * 64 + 4 * i + kk % 4] >> (2 * (v % 4))) & 3) << 4;
  return q;
}

}  // namespace

bool x16_supported(DType t) { return x16_layout(t).bytes > 0; }

int x16_value_offset(DType t) { return x16_layout(t).offset; }

int64_t x16_tile_bytes(DType t) { return layout(t).bytes; }

int64_t x16_bytes(DType t, int64_t rows, int64_t cols) {
  return (rows + kTileRows - 1) / kTileRows * (cols / dtype_block_values(t)) * x16_tile_bytes(t);
}

void x16_pack_tile(DType t, const uint8_t* const rows[kTileRows], int64_t block, uint8_t* tile) {
  const X16Layout L = layout(t);
  const int64_t bb = dtype_block_bytes(t), n = dtype_block_values(t);
  std::memset(tile, 0, size_t(L.bytes));
  int q[256];  // the block's quantized values of one row, offset included (0..255)
  for (int64_t i = 0; i < kTileRows; ++i) {
    if (!rows[i]) continue;
    const uint8_t* src = rows[i] + block * bb;
    switch (t) {
      case DType::Q8_0:
        std::memcpy(tile + 2 * i, src, 2);
        for (int k = 0; k < 32; ++k) q[k] = src[2 + k] ^ 0x80;
        break;
      case DType::Q4_0:
      case DType::Q4_1:
      case DType::Q5_0:
      case DType::Q5_1: {
        std::memcpy(tile + 2 * i, src, 2);
        const bool with_min = t == DType::Q4_1 || t == DType::Q5_1;
        if (with_min) std::memcpy(tile + L.m + 2 * i, src + 2, 2);
        // GGML's 32-value blocks: byte j holds value j (low nibble) and value j + 16 (high);
        // Q5_0's and Q5_1's qh bit j is value j's fifth bit.
        const int qh_at = t == DType::Q5_0 ? 2 : t == DType::Q5_1 ? 4 : 0;
        const uint8_t* qs = src + (qh_at ? qh_at + 4 : with_min ? 4 : 2);
        const uint32_t qh = qh_at ? load_u32(src + qh_at) : 0;
        for (int j = 0; j < 16; ++j) {
          q[j] = (qs[j] & 0x0F) | int((qh >> j) & 1) << 4;
          q[j + 16] = (qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
        }
        break;
      }
      case DType::Q4_K:
      case DType::Q5_K: {
        std::memcpy(tile + 2 * i, src, 2);            // d
        std::memcpy(tile + 32 + 2 * i, src + 2, 2);   // dmin
        // Q5_K: qh[32] between the scales and the nibbles; bit g of qh[l] is value 32g + l's fifth.
        const bool q5 = t == DType::Q5_K;
        const uint8_t *qh = src + 16, *qs = src + (q5 ? 48 : 16);
        for (int g = 0; g < 8; ++g) {
          int sc, m;
          k_scale_min(src + 4, g, sc, m);
          tile[L.sc + g * 16 + i] = uint8_t(sc);
          tile[L.m + g * 16 + i] = uint8_t(m);
          for (int l = 0; l < 32; ++l)
            q[g * 32 + l] = ((qs[(g / 2) * 32 + l] >> (4 * (g % 2))) & 0x0F) | (q5 ? ((qh[l] >> g) & 1) << 4 : 0);
        }
        break;
      }
      case DType::Q6_K: {
        std::memcpy(tile + 2 * i, src + 208, 2);  // d
        for (int s = 0; s < 16; ++s) tile[L.sc + s * 16 + i] = src[192 + s];
        const uint8_t *ql = src, *qh = src + 128;
        for (int k = 0; k < 256; ++k) {
          const int h = k / 128, r = k % 128;
          q[k] = ((ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F) | ((qh[32 * h + r % 32] >> (2 * (r / 32))) & 3) << 4;
        }
        break;
      }
      default: fail("cpu kernels: no x16 tile layout for {}", dtype_name(t));
    }
    for (int k = 0; k < n; ++k) {
      const int j = k / 32, kk = k % 32, v = kk / 4, e = kk % 4;
      if (t == DType::Q8_0) {
        tile[L.qs + v * 64 + 4 * i + e] = uint8_t(q[k]);
        continue;
      }
      tile[L.qs + j * 256 + (kk / 8) * 64 + 4 * i + e] |= uint8_t((q[k] & 0x0F) << (4 * ((kk % 8) / 4)));
      if (t == DType::Q5_0 || t == DType::Q5_1) tile[L.qh + 4 * i + e] |= uint8_t(((q[k] >> 4) & 1) << v);
      if (t == DType::Q5_K) tile[L.qh + j * 64 + 4 * i + e] |= uint8_t(((q[k] >> 4) & 1) << v);
      if (t == DType::Q6_K) tile[L.qh + j * 128 + (v / 4) * 64 + 4 * i + e] |= uint8_t(((q[k] >> 4) & 3) << (2 * (v % 4)));
    }
  }
}

void x16_rows_f32(DType t, const uint8_t* tiles, int64_t cols, int64_t r0, int64_t r1, int64_t k0, int64_t k1,
                  float* out, int64_t ld) {
  const X16Layout L = layout(t);
  const int64_t n = dtype_block_values(t), blocks = cols / n, off = x16_value_offset(t);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t g = r / kTileRows, i = r % kTileRows;
    float* o = out + (r - r0) * ld;
    for (int64_t c = k0; c < k1; ++c) {
      const uint8_t* tile = tiles + (g * blocks + c / n) * L.bytes;
      const int k = int(c % n);
      const int q = stored_value(t, tile, L, i, k) - int(off);
      const float d = f16_to_f32(load_u16(tile + 2 * i));
      // The products io/tensor.cc computes for the same value, in the same order.
      switch (t) {
        case DType::Q8_0: o[c - k0] = float(q) * d; break;
        case DType::Q4_0:
        case DType::Q5_0: o[c - k0] = d * float(q); break;
        case DType::Q4_1:
        case DType::Q5_1: o[c - k0] = d * float(q) + f16_to_f32(load_u16(tile + L.m + 2 * i)); break;
        case DType::Q4_K:
        case DType::Q5_K: {
          const float dl = d * float(tile[L.sc + (k / 32) * 16 + i]);
          const float ml = f16_to_f32(load_u16(tile + 32 + 2 * i)) * float(tile[L.m + (k / 32) * 16 + i]);
          o[c - k0] = dl * float(q) - ml;
          break;
        }
        case DType::Q6_K: o[c - k0] = (d * float(int8_t(tile[L.sc + (k / 16) * 16 + i]))) * float(q); break;
        default: fail("cpu kernels: no x16 tile layout for {}", dtype_name(t));
      }
    }
  }
}

void x16_rows_bf16(DType t, const uint8_t* tiles, int64_t cols, int64_t r0, int64_t r1, int64_t k0, int64_t k1,
                   uint16_t* out, int64_t ld) {
  float row[256];
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t k = k0; k < k1; k += 256) {
      const int64_t e = std::min(k1, k + 256);
      x16_rows_f32(t, tiles, cols, r, r + 1, k, e, row, 256);
      uint16_t* o = out + (r - r0) * ld + (k - k0);
      for (int64_t j = 0; j < e - k; ++j) o[j] = f32_to_bf16(row[j]);
    }
}

void Q8Row::resize(int64_t cols) {
  const int64_t blocks = cols / kQBlock;
  d.resize(size_t(blocks));
  dsum.resize(size_t(blocks));
  sum_hi.resize(size_t(2 * blocks));
  sum_lo.resize(size_t(2 * blocks));
  hi.resize(size_t(cols));
  lo.resize(size_t(cols));
}

void Q8Row::quantize(const float* x, int64_t cols) {
  resize(cols);
  quantize_blocks(x, 0, cols / kQBlock);
}

void Q8Row::quantize_blocks(const float* x, int64_t b0, int64_t b1) {
  detail::quantize_q8_hwy(x + b0 * kQBlock, b1 - b0, d.data() + b0, sum_hi.data() + 2 * b0, sum_lo.data() + 2 * b0,
                          hi.data() + b0 * kQBlock, lo.data() + b0 * kQBlock);
  for (int64_t b = b0; b < b1; ++b) dsum[size_t(b)] = d[size_t(b)] * block_sum(b);
}

void Q8Row::quantize_plain(const float* x, int64_t cols) {
  resize(cols);
  const int64_t blocks = cols / kQBlock;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kQBlock;
    float amax = 0;
    bool finite = true;
    for (int64_t k = 0; k < kQBlock; ++k) {
      amax = std::max(amax, std::fabs(xb[k]));
      finite = finite && std::isfinite(xb[k]);
    }
    const float id = amax > 0 && finite ? 127.0f / amax : 0.0f;
    int32_t sh[2] = {0, 0}, sl[2] = {0, 0};
    for (int64_t k = 0; k < kQBlock && !finite; ++k) hi[size_t(b * kQBlock + k)] = lo[size_t(b * kQBlock + k)] = 0;
    for (int64_t k = 0; k < kQBlock && finite; ++k) {
      const float v = xb[k] * id;
      const float h = std::nearbyint(v);
      const int l = int(std::nearbyint((v - h) * kLoScale));
      hi[size_t(b * kQBlock + k)] = int8_t(h);
      lo[size_t(b * kQBlock + k)] = int8_t(l);
      sh[k / 16] += int(h);
      sl[k / 16] += l;
    }
    // A non-finite value makes the scale NaN, so every product with the block is NaN (never
    // hidden as a zero); its terms stay 0 (a NaN has no integer value to convert to).
    d[size_t(b)] = finite ? amax / 127.0f : NAN;
    for (int h = 0; h < 2; ++h) {
      sum_hi[size_t(2 * b + h)] = sh[h];
      sum_lo[size_t(2 * b + h)] = sl[h];
    }
    dsum[size_t(b)] = d[size_t(b)] * block_sum(b);
  }
}

void x16_gemv_rows(const Q8Row& x, DType t, const uint8_t* tiles, int64_t cols, int64_t r0, int64_t r1, float* y) {
  const X16Layout L = layout(t);
  const int64_t n = dtype_block_values(t), blocks = cols / n;
  const int off = x16_value_offset(t);
  const int group = t == DType::Q6_K ? 16 : 32;  // values sharing one scale
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t g = r / kTileRows, i = r % kTileRows;
    float acc = 0, acc_min = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* tile = tiles + (g * blocks + b) * L.bytes;
      const float d = f16_to_f32(load_u16(tile + 2 * i));
      for (int k0 = 0; k0 < n; k0 += group) {
        const int64_t xk = b * n + k0, xb = xk / kQBlock;  // x's value index and 32-value block
        int32_t dot = -off * x.term_sum(xk / 16);
        if (group == 32) dot -= off * x.term_sum(xk / 16 + 1);
        for (int k = k0; k < k0 + group; ++k)
          dot += stored_value(t, tile, L, i, k) * x.term(b * n + k);
        float scale = d;
        if (x16_k_scales(t)) scale = d * float(tile[L.sc + (k0 / 32) * 16 + i]);
        if (t == DType::Q6_K) scale = d * float(int8_t(tile[L.sc + (k0 / 16) * 16 + i]));
        const float xd = x.d[size_t(xb)];
        acc += Q8Row::dot_value(dot) * (scale * xd);
        if (x16_has_min(t) || x16_k_scales(t)) {
          const float xsum = x.block_sum(xb);
          const bool k_quant = x16_k_scales(t);
          const float m = !k_quant ? f16_to_f32(load_u16(tile + L.m + 2 * i))
                                           : -(f16_to_f32(load_u16(tile + 32 + 2 * i)) * float(tile[L.m + (k0 / 32) * 16 + i]));
          acc_min += m * (xd * xsum);
        }
      }
    }
    y[r] = acc + acc_min;
  }
}

}  // namespace tessera::cpu
