#include "targets/npusim/weight_blocks.h"

#include <cstring>

#include "io/ggml_blocks.h"
#include "util/error.h"
#include "util/half.h"

namespace tessera::npusim {

using ggml::load_u16;
using ggml::load_u32;

int group_values(ElemType t) { return !is_block(t) ? 1 : t == ElemType::Q6_K ? 16 : 32; }

bool has_min(ElemType t) {
  return t == ElemType::Q4_1 || t == ElemType::Q5_1 || t == ElemType::Q4_K || t == ElemType::Q5_K;
}

// The layouts are io/tensor.cc's (the oracle's to_f32), value for value; the K-quants' packed
// sub-block scales and mins are read by the same ggml::k_scale_min.
BlockTerms unpack_block(ElemType t, const uint8_t* b) {
  BlockTerms out;
  out.values = block_values(t);
  out.group = group_values(t);
  switch (t) {
    case ElemType::Q4_0:
      // Value j in the low nibble of byte j, value j + 16 in its high nibble.
      out.scale[0] = f16_to_f32(load_u16(b));  // little-endian f16, as GGUF stores it (and the device reads it)
      for (int j = 0; j < kBlockValues / 2; ++j) {
        out.v[j] = int8_t(int(b[2 + j] & 0x0F) - 8);
        out.v[j + kBlockValues / 2] = int8_t(int(b[2 + j] >> 4) - 8);
      }
      return out;
    case ElemType::Q8_0:
      out.scale[0] = f16_to_f32(load_u16(b));
      std::memcpy(out.v, b + 2, kBlockValues);
      return out;
    case ElemType::Q4_1:
      out.scale[0] = f16_to_f32(load_u16(b));
      out.min[0] = -f16_to_f32(load_u16(b + 2));  // the oracle adds m
      for (int j = 0; j < kBlockValues / 2; ++j) {
        out.v[j] = int8_t(b[4 + j] & 0x0F);
        out.v[j + kBlockValues / 2] = int8_t(b[4 + j] >> 4);
      }
      return out;
    case ElemType::Q5_0:
    case ElemType::Q5_1: {
      const bool q51 = t == ElemType::Q5_1;
      out.scale[0] = f16_to_f32(load_u16(b));
      if (q51) out.min[0] = -f16_to_f32(load_u16(b + 2));
      const uint32_t qh = load_u32(b + (q51 ? 4 : 2));  // bit j: the fifth bit of value j
      const uint8_t* qs = b + (q51 ? 8 : 6);
      for (int j = 0; j < kBlockValues; ++j) {
        const int lo = j < kBlockValues / 2 ? (qs[j] & 0x0F) : (qs[j - kBlockValues / 2] >> 4);
        const int q = lo | int((qh >> j) & 1) << 4;
        out.v[j] = int8_t(q51 ? q : q - 16);
      }
      return out;
    }
    case ElemType::Q4_K:
    case ElemType::Q5_K: {
      // 8 sub-blocks of 32: value i is the (i / 32) % 2-th nibble of qs[(i / 64) * 32 + i % 32]
      // (Q5_K: plus bit i / 32 of qh[i % 32] as the fifth bit).
      const bool q5 = t == ElemType::Q5_K;
      const float d = f16_to_f32(load_u16(b)), dmin = f16_to_f32(load_u16(b + 2));
      const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + (q5 ? 48 : 16);
      for (int g = 0; g < 8; ++g) {
        int sc, m;
        ggml::k_scale_min(scales, g, sc, m);
        out.scale[g] = d * float(sc);
        out.min[g] = dmin * float(m);
        for (int l = 0; l < 32; ++l) {
          int q = (qs[(g / 2) * 32 + l] >> (4 * (g % 2))) & 0x0F;
          if (q5) q |= ((qh[l] >> g) & 1) << 4;
          out.v[g * 32 + l] = int8_t(q);
        }
      }
      return out;
    }
    case ElemType::Q6_K: {
      // Value i = 128 h + r: low nibble (r / 64 selects which) of ql[64 h + r % 64], two high
      // bits of qh[32 h + r % 32] shifted by 2 * (r / 32); signed (stored + 32); 16 int8
      // scales, one per 16 values.
      const uint8_t *ql = b, *qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = f16_to_f32(load_u16(b + 208));
      for (int g = 0; g < 16; ++g) out.scale[g] = d * float(sc[g]);
      for (int i = 0; i < kMaxElementValues; ++i) {
        const int h = i / 128, r = i % 128;
        const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
        const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
        out.v[i] = int8_t(int(uint8_t(lo | hi << 4)) - 32);
      }
      return out;
    }
    default: fail("npusim: {} is not a block format", elem_type_name(t));
  }
}

int64_t unpack_lane_ops(ElemType t) {
  switch (t) {
    case ElemType::Q4_0: return 3;  // split, offset, convert
    case ElemType::Q8_0: return 1;  // convert
    case ElemType::Q4_1: return 2;  // split, convert
    case ElemType::Q5_0: return 5;  // split, fifth bit (2), offset, convert
    case ElemType::Q5_1: return 4;  // split, fifth bit (2), convert
    case ElemType::Q4_K: return 2;  // split, convert
    case ElemType::Q5_K: return 4;  // split, fifth bit (2), convert
    case ElemType::Q6_K: return 5;  // split, high bits (2), offset, convert
    default: return 0;
  }
}

int64_t group_decode_ops(ElemType t) {
  switch (t) {
    case ElemType::Q4_K:
    case ElemType::Q5_K: return 8;  // two 6-bit fields out of 12 bytes, converted, x d and x dmin
    case ElemType::Q6_K: return 2;  // the int8 converted, x d
    default: return 0;
  }
}

int64_t gemv_dequant_ops(ElemType t, int64_t weights, int64_t x_values) {
  if (!is_block(t)) return 0;
  const int64_t groups = weights / group_values(t);
  return weights * (unpack_lane_ops(t) + 1) + groups * group_decode_ops(t) +
         (has_min(t) ? groups + x_values : 0);
}

int64_t gemm_dequant_ops(ElemType t, int64_t b_weights, int64_t acc_depth, int64_t a_values) {
  if (!is_block(t)) return 0;
  const int64_t gv = group_values(t);
  return b_weights * unpack_lane_ops(t) + b_weights / gv * group_decode_ops(t) +
         acc_depth / gv * (has_min(t) ? 2 : 1) + (has_min(t) ? a_values : 0);
}

float dot_blocks(ElemType t, const uint8_t* row, const float* x, int64_t elements) {
  const int64_t bytes = elem_bytes(t);
  const bool mins = has_min(t);
  float acc = 0;
  for (int64_t e = 0; e < elements; ++e) {
    const BlockTerms bt = unpack_block(t, row + e * bytes);
    const float* xe = x + e * bt.values;
    for (int g = 0; g < bt.groups(); ++g) {
      const int8_t* v = bt.v + g * bt.group;
      const float* xg = xe + g * bt.group;
      float partial = 0;
      for (int l = 0; l < bt.group; ++l) partial += float(v[l]) * xg[l];  // exact products
      if (mins) {
        float xs = 0;
        for (int l = 0; l < bt.group; ++l) xs += xg[l];
        acc += bt.scale[g] * partial - bt.min[g] * xs;
      } else {
        acc += bt.scale[g] * partial;
      }
    }
  }
  return acc;
}

}  // namespace tessera::npusim
