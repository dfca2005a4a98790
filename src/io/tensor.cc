#include "io/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

#include "io/ggml_blocks.h"
#include "util/error.h"
#include "util/half.h"
#include "util/sanitize.h"

namespace tessera {

namespace {

constexpr int64_t kBlock = 32;   // values per block of the simple quantized types
constexpr int64_t kSuper = 256;  // values per super block of the K-quants (ggml's QK_K)

// IQ4_NL's and IQ4_XS's 16 levels (ggml's kvalues_iq4nl).
constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

using ggml::k_scale_min;
using ggml::load_u16;
using ggml::load_u32;

}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::Q8_0: return "Q8_0";
    case DType::Q4_0: return "Q4_0";
    case DType::Q4_1: return "Q4_1";
    case DType::Q5_0: return "Q5_0";
    case DType::Q5_1: return "Q5_1";
    case DType::Q2_K: return "Q2_K";
    case DType::Q3_K: return "Q3_K";
    case DType::Q4_K: return "Q4_K";
    case DType::Q5_K: return "Q5_K";
    case DType::Q6_K: return "Q6_K";
    case DType::IQ4_NL: return "IQ4_NL";
    case DType::IQ4_XS: return "IQ4_XS";
  }
  return "?";
}

int64_t dtype_block_values(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: return 1;
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::IQ4_NL: return kBlock;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS: return kSuper;
  }
  return 1;
}

int64_t dtype_block_bytes(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::Q8_0: return 2 + 32;           // f16 d, int8 qs[32]
    case DType::Q4_0: return 2 + 16;           // f16 d, uint8 qs[16]
    case DType::Q4_1: return 2 + 2 + 16;       // f16 d, f16 m, uint8 qs[16]
    case DType::Q5_0: return 2 + 4 + 16;       // f16 d, uint32 qh, uint8 qs[16]
    case DType::Q5_1: return 2 + 2 + 4 + 16;   // f16 d, f16 m, uint32 qh, uint8 qs[16]
    case DType::IQ4_NL: return 2 + 16;         // f16 d, uint8 qs[16] (indices into a 16-value table)
    case DType::Q2_K: return 16 + 64 + 2 + 2;  // scales[16] (4-bit scale | 4-bit min), qs[64], f16 d, dmin
    case DType::Q3_K: return 32 + 64 + 12 + 2;  // hmask[32], qs[64], 6-bit scales[12], f16 d
    case DType::Q4_K: return 2 + 2 + 12 + 128;  // f16 d, dmin, 6-bit scales and mins[12], qs[128]
    case DType::Q5_K: return 2 + 2 + 12 + 32 + 128;  // as Q4_K, with qh[32]
    case DType::Q6_K: return 128 + 64 + 16 + 2;     // ql[128], qh[64], int8 scales[16], f16 d
    case DType::IQ4_XS: return 2 + 2 + 4 + 128;     // f16 d, scales_h, scales_l[4], qs[128]
  }
  return 1;
}

uint64_t dtype_bytes(DType t, int64_t n) {
  const int64_t per_block = dtype_block_values(t);
  if (n < 0) fail("negative element count {} for {}", n, dtype_name(t));
  if (n % per_block != 0) {
    fail("{} values of {} are not a whole number of {}-value blocks", n, dtype_name(t), per_block);
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(uint64_t(n / per_block), uint64_t(dtype_block_bytes(t)), &bytes)) {
    fail("{} values of {} overflow a 64-bit byte count", n, dtype_name(t));
  }
  return bytes;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// The quantized paths match gguf-py's numpy dequantize bit for bit: every product and
// difference is one fp32 operation in the order numpy does it (the K-quants: the sub-block's
// scale d * sc rounded first, then times q, then minus dmin * m). The build compiles ISO C++
// (no -ffp-contract=fast), so nothing is fused into an FMA.
TS_RANGE_CHECKED void to_f32(DType t, const uint8_t* src, float* dst, int64_t n) {
  if (n <= 0) return;
  const int64_t per_block = dtype_block_values(t);
  if (n % per_block != 0) {
    fail("cannot convert {} values of {}: not a whole number of {}-value blocks", n, dtype_name(t),
         per_block);
  }
  const int64_t blocks = n / per_block;
  check_range(src, size_t(dtype_bytes(t, n)), false);
  check_range(dst, size_t(n) * sizeof(float), true);
  switch (t) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(src + 2 * i));
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case DType::Q8_0:
      for (int64_t b = 0; b < blocks; ++b, src += 34, dst += kBlock) {
        const float d = f16_to_f32(load_u16(src));
        const int8_t* qs = reinterpret_cast<const int8_t*>(src + 2);
        for (int j = 0; j < kBlock; ++j) dst[j] = float(qs[j]) * d;
      }
      return;
    case DType::Q4_0:
      for (int64_t b = 0; b < blocks; ++b, src += 18, dst += kBlock) {
        const float d = f16_to_f32(load_u16(src));
        const uint8_t* qs = src + 2;
        for (int j = 0; j < kBlock / 2; ++j) {
          dst[j] = d * float(int(qs[j] & 0x0F) - 8);
          dst[j + kBlock / 2] = d * float(int(qs[j] >> 4) - 8);
        }
      }
      return;
    case DType::Q4_1:
      for (int64_t b = 0; b < blocks; ++b, src += 20, dst += kBlock) {
        const float d = f16_to_f32(load_u16(src));
        const float m = f16_to_f32(load_u16(src + 2));
        const uint8_t* qs = src + 4;
        for (int j = 0; j < kBlock / 2; ++j) {
          dst[j] = d * float(qs[j] & 0x0F) + m;
          dst[j + kBlock / 2] = d * float(qs[j] >> 4) + m;
        }
      }
      return;
    case DType::Q5_0:
    case DType::Q5_1: {
      const bool q51 = t == DType::Q5_1;
      const int64_t bytes = dtype_block_bytes(t);
      for (int64_t b = 0; b < blocks; ++b, src += bytes, dst += kBlock) {
        const float d = f16_to_f32(load_u16(src));
        const float m = q51 ? f16_to_f32(load_u16(src + 2)) : 0.0f;
        const uint32_t qh = load_u32(src + (q51 ? 4 : 2));  // bit j: the fifth bit of value j
        const uint8_t* qs = src + (q51 ? 8 : 6);
        for (int j = 0; j < kBlock; ++j) {
          const int lo = j < kBlock / 2 ? (qs[j] & 0x0F) : (qs[j - kBlock / 2] >> 4);
          const int q = lo | int((qh >> j) & 1) << 4;
          dst[j] = q51 ? d * float(q) + m : d * float(q - 16);
        }
      }
      return;
    }
    case DType::IQ4_NL:
      for (int64_t b = 0; b < blocks; ++b, src += 18, dst += kBlock) {
        const float d = f16_to_f32(load_u16(src));
        const uint8_t* qs = src + 2;
        for (int j = 0; j < kBlock / 2; ++j) {
          dst[j] = d * float(kIq4Levels[qs[j] & 0x0F]);
          dst[j + kBlock / 2] = d * float(kIq4Levels[qs[j] >> 4]);
        }
      }
      return;
    case DType::Q2_K:
      // 16 sub-blocks of 16: value i is 2 bits of qs[(i / 128) * 32 + i % 32], shifted by
      // 2 * ((i / 32) % 4); its sub-block's scale and min are 4 bits each of scales[i / 16].
      for (int64_t b = 0; b < blocks; ++b, src += 84, dst += kSuper) {
        const uint8_t *sc = src, *qs = src + 16;
        const float d = f16_to_f32(load_u16(src + 80)), dmin = f16_to_f32(load_u16(src + 82));
        for (int i = 0; i < kSuper; ++i) {
          const float dl = d * float(sc[i / 16] & 0x0F), ml = dmin * float(sc[i / 16] >> 4);
          const int q = (qs[(i / 128) * 32 + i % 32] >> (2 * ((i / 32) % 4))) & 3;
          dst[i] = dl * float(q) - ml;
        }
      }
      return;
    case DType::Q3_K:
      // Value i: 2 low bits as Q2_K's, the third bit (hmask[i % 32] >> (i / 32)) set means no
      // offset, clear means -4; 16 signed 6-bit scales (stored + 32), low 4 bits in bytes
      // 0-7 (both nibbles), high 2 bits in bytes 8-11.
      for (int64_t b = 0; b < blocks; ++b, src += 110, dst += kSuper) {
        const uint8_t *hm = src, *qs = src + 32, *sc = src + 96;
        const float d = f16_to_f32(load_u16(src + 108));
        for (int i = 0; i < kSuper; ++i) {
          const int k = i / 16;
          const int lo = k < 8 ? (sc[k] & 0x0F) : (sc[k - 8] >> 4), hi = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
          const float dl = d * float(int8_t(uint8_t(lo | hi << 4)) - 32);
          const int ql = (qs[(i / 128) * 32 + i % 32] >> (2 * ((i / 32) % 4))) & 3;
          const int h = (hm[i % 32] >> (i / 32)) & 1;
          dst[i] = dl * float(ql - (h ? 0 : 4));
        }
      }
      return;
    case DType::Q4_K:
    case DType::Q5_K: {
      // 8 sub-blocks of 32: value i is the (i / 32) % 2-th nibble of qs[(i / 64) * 32 + i % 32]
      // (Q5_K: plus bit i / 32 of qh[i % 32] as the fifth bit).
      const bool q5 = t == DType::Q5_K;
      const int64_t bytes = dtype_block_bytes(t);
      for (int64_t b = 0; b < blocks; ++b, src += bytes, dst += kSuper) {
        const float d = f16_to_f32(load_u16(src)), dmin = f16_to_f32(load_u16(src + 2));
        const uint8_t *scales = src + 4, *qh = src + 16, *qs = src + (q5 ? 48 : 16);
        for (int g = 0; g < 8; ++g) {
          int sc, m;
          k_scale_min(scales, g, sc, m);
          const float dl = d * float(sc), ml = dmin * float(m);
          for (int l = 0; l < 32; ++l) {
            int q = (qs[(g / 2) * 32 + l] >> (4 * (g % 2))) & 0x0F;
            if (q5) q |= ((qh[l] >> g) & 1) << 4;
            dst[g * 32 + l] = dl * float(q) - ml;
          }
        }
      }
      return;
    }
    case DType::Q6_K:
      // Value i = 128 h + r: low nibble (r / 64 selects which) of ql[64 h + r % 64], two high
      // bits of qh[32 h + r % 32] shifted by 2 * (r / 32); signed (stored + 32); 16 int8
      // scales, one per 16 values.
      for (int64_t b = 0; b < blocks; ++b, src += 210, dst += kSuper) {
        const uint8_t *ql = src, *qh = src + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192);
        const float d = f16_to_f32(load_u16(src + 208));
        for (int i = 0; i < kSuper; ++i) {
          const int h = i / 128, r = i % 128;
          const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
          const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
          dst[i] = (d * float(sc[i / 16])) * float(int8_t(uint8_t(lo | hi << 4)) - 32);
        }
      }
      return;
    case DType::IQ4_XS:
      // 8 sub-blocks of 32, each with a signed 6-bit scale (stored + 32: low 4 bits in a
      // nibble of scales_l, high 2 bits in scales_h) and IQ4_NL's levels.
      for (int64_t b = 0; b < blocks; ++b, src += 136, dst += kSuper) {
        const float d = f16_to_f32(load_u16(src));
        const uint16_t sh = load_u16(src + 2);
        const uint8_t *sl = src + 4, *qs = src + 8;
        for (int g = 0; g < 8; ++g) {
          const int lo = (sl[g / 2] >> (4 * (g % 2))) & 0x0F, hi = (sh >> (2 * g)) & 3;
          const float dl = d * float(int8_t(uint8_t(lo | hi << 4)) - 32);
          for (int l = 0; l < 16; ++l) {
            dst[g * 32 + l] = dl * float(kIq4Levels[qs[g * 16 + l] & 0x0F]);
            dst[g * 32 + l + 16] = dl * float(kIq4Levels[qs[g * 16 + l] >> 4]);
          }
        }
      }
      return;
  }
}

}  // namespace tessera
