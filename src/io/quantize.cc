#include "io/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/error.h"
#include "util/half.h"

namespace tessera {

namespace {

constexpr int kBlock = 32;   // values per block of the simple types
constexpr int kSuper = 256;  // values per K-quant super block (ggml's QK_K)
// A group whose largest magnitude is below this is all zeros to the K-quants (GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;

void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// llama.cpp's nearest_int: adding 1.5 * 2^23 leaves round(x) (ties to even) in the low
// mantissa bits, for |x| < 2^22. Outside that range the result is as meaningless as
// llama.cpp's, and equally so: callers clamp it.
int nearest_int(float x) {
  const float biased = x + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &biased, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

// ---- the gguf package's simple types ------------------------------------------------------

// numpy's argmax(abs(x)): the first value of largest magnitude.
float signed_absmax(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(x[best])) best = i;
  return x[best];
}

// trunc(v) as numpy's astype(uint8) after trunc, then clip(0, hi): v is never below -1 here.
uint8_t trunc_clip(float v, int hi) {
  const int q = int(v);  // toward zero, as np.trunc
  return uint8_t(std::clamp(q, 0, hi));
}

// Q8_0: d = max|x| / 127, q = round-half-away(x / d) (the package's np_roundf, which is roundf).
void q8_0_block(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d == 0.0f ? 0.0f : 1.0f / d;
  store_u16(out, f32_to_f16(d));
  for (int j = 0; j < kBlock; ++j) out[2 + j] = uint8_t(int8_t(std::roundf(x[j] * id)));
}

// Q4_0 / Q5_0: d = (the signed value of largest magnitude) / -2^(bits-1); q = trunc(x / d + 2^(bits-1) + 0.5).
void qx_0_values(const float* x, int bits, float& d, uint8_t* q) {
  const float half = float(1 << (bits - 1));
  d = signed_absmax(x, kBlock) / -half;
  const float id = d == 0.0f ? 0.0f : 1.0f / d;
  const float offset = half + 0.5f;
  for (int j = 0; j < kBlock; ++j) q[j] = trunc_clip(x[j] * id + offset, (1 << bits) - 1);
}

// Q4_1 / Q5_1: d = (max - min) / (2^bits - 1), m = min, q = trunc((x - min) / d + 0.5).
void qx_1_values(const float* x, int bits, float& d, float& m, uint8_t* q) {
  float lo = x[0], hi = x[0];
  for (int j = 1; j < kBlock; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  d = (hi - lo) / float((1 << bits) - 1);
  m = lo;
  const float id = d == 0.0f ? 0.0f : 1.0f / d;
  for (int j = 0; j < kBlock; ++j) q[j] = trunc_clip((x[j] - lo) * id + 0.5f, (1 << bits) - 1);
}

// Low nibbles: value j in byte j's low half, value j + 16 in its high half.
void pack_nibbles(const uint8_t* q, uint8_t* qs) {
  for (int j = 0; j < kBlock / 2; ++j) qs[j] = uint8_t((q[j] & 0x0F) | ((q[j + kBlock / 2] & 0x0F) << 4));
}

// The fifth bits, value j at bit j of a little-endian u32.
void pack_high_bits(const uint8_t* q, uint8_t* qh) {
  uint32_t h = 0;
  for (int j = 0; j < kBlock; ++j) h |= uint32_t((q[j] >> 4) & 1) << j;
  std::memcpy(qh, &h, 4);
}

void q4_0_block(const float* x, uint8_t* out) {
  float d;
  uint8_t q[kBlock];
  qx_0_values(x, 4, d, q);
  store_u16(out, f32_to_f16(d));
  pack_nibbles(q, out + 2);
}

void q4_1_block(const float* x, uint8_t* out) {
  float d, m;
  uint8_t q[kBlock];
  qx_1_values(x, 4, d, m, q);
  store_u16(out, f32_to_f16(d));
  store_u16(out + 2, f32_to_f16(m));
  pack_nibbles(q, out + 4);
}

void q5_0_block(const float* x, uint8_t* out) {
  float d;
  uint8_t q[kBlock];
  qx_0_values(x, 5, d, q);
  store_u16(out, f32_to_f16(d));
  pack_high_bits(q, out + 2);
  pack_nibbles(q, out + 6);
}

void q5_1_block(const float* x, uint8_t* out) {
  float d, m;
  uint8_t q[kBlock];
  qx_1_values(x, 5, d, m, q);
  store_u16(out, f32_to_f16(d));
  store_u16(out + 2, f32_to_f16(m));
  pack_high_bits(q, out + 4);
  pack_nibbles(q, out + 8);
}

// ---- llama.cpp's K-quant helpers ------------------------------------------------------------

// Symmetric levels -nmax..nmax-1 for n values weighted by x^2 (make_qx_quants, rmse_type 1,
// no importance weights): start from the scale that maps the signed extreme to -nmax, then
// try 18 nearby scales and keep the one with the best weighted least-squares fit. L gets
// l + nmax; returns the scale.
float symmetric_levels(int n, int nmax, const float* x, int8_t* L) {
  float max = 0.0f, amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  auto level = [nmax](float v) { return std::clamp(nearest_int(v), -nmax, nmax - 1); };
  float iscale = float(-nmax) / max;
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = level(iscale * x[i]);
    L[i] = int8_t(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * float(l);
    suml2 += w * float(l) * float(l);
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    iscale = -(float(nmax) + 0.1f * float(step)) / max;
    sumlx = suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = level(iscale * x[i]);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * float(l);
      suml2 += w * float(l) * float(l);
    }
    if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = int8_t(level(iscale * x[i]) + nmax);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q3_K's sub-block levels -nmax..nmax-1 (make_q3_quants with do_rmse): round at the
// extreme's scale, then up to five passes that move single levels while the x^2-weighted fit
// improves. L gets l + nmax; returns the scale.
float q3_levels(int n, int nmax, const float* x, int8_t* L) {
  float max = 0.0f, amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const float iscale = float(-nmax) / max;
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = int8_t(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * float(l);
    suml2 += w * float(l) * float(l);
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * float(L[i]);
      if (slx > 0.0f) {
        float sl2 = suml2 - w * float(L[i]) * float(L[i]);
        const int nl = std::clamp(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (nl != L[i]) {
          slx += w * x[i] * float(nl);
          sl2 += w * float(nl) * float(nl);
          if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = int8_t(nl);
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = int8_t(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Levels 0..nmax with a scale and a non-positive offset (make_qkx2_quants): x ~ scale * l + min.
// Starts from the min/max range, then tries nstep + 1 scales (rmin + rdelta * step + nmax) /
// range, solving each one's weighted least-squares scale and min, and keeps the one with the
// smallest weighted error (squared, or absolute with use_mad). Stores -min in *neg_min.
float offset_levels(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* neg_min,
                    uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0.0f) min = 0.0f;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *neg_min = -min;
    return 0.0f;
  }
  auto error_of = [use_mad](float diff) { return use_mad ? std::fabs(diff) : diff * diff; };
  float iscale = float(nmax) / (max - min);
  float scale = 1.0f / iscale;
  float best_error = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = uint8_t(std::clamp(l, 0, nmax));
    const float diff = scale * float(L[i]) + min - x[i];
    best_error += weights[i] * error_of(diff);
  }
  if (nstep < 1) {
    *neg_min = -min;
    return scale;
  }
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * float(step) + float(nmax)) / (max - min);
    float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = uint8_t(l);
      const float w = weights[i];
      sum_l += w * float(l);
      sum_l2 += w * float(l) * float(l);
      sum_xl += w * float(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0.0f) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0.0f) {
        this_min = 0.0f;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0.0f;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * float(Laux[i]) + this_min - x[i];
        cur_error += weights[i] * error_of(diff);
      }
      if (cur_error < best_error) {
        std::memcpy(L, Laux, size_t(n));
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

// Q4_K's and Q5_K's 6-bit scale and min of sub-block j, as io/tensor.cc's k_scale_min reads them.
void put_scale_min(uint8_t* s, int j, uint8_t ls, uint8_t lm) {
  if (j < 4) {
    s[j] = ls;
    s[j + 4] = lm;
  } else {
    s[j + 4] = uint8_t((ls & 0x0F) | ((lm & 0x0F) << 4));
    s[j - 4] |= uint8_t((ls >> 4) << 6);
    s[j] |= uint8_t((lm >> 4) << 6);
  }
}

void get_scale_min(const uint8_t* s, int j, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = uint8_t((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    m = uint8_t((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// 2-bit packing shared by Q2_K and Q3_K: value 128h + 32k + l in bits 2k of byte 32h + l.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < kSuper; j += 128)
    for (int l = 0; l < 32; ++l)
      qs[j / 4 + l] = uint8_t(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

// ---- K-quant super blocks (llama.cpp's quantize_row_q*_K_ref) -------------------------------

// Q2_K: 16 sub-blocks of 16, levels 0..3 with a scale and min each, both quantized to 4 bits
// against the super block's d and dmin. Layout: scales[16], qs[64], d, dmin.
void q2_k_block(const float* x, uint8_t* out) {
  uint8_t L[kSuper], Laux[16];
  float weights[16], mins[16], scales[16];
  uint8_t* sc = out;
  uint8_t* qs = out + 16;
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
    scales[j] = offset_levels(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float q4scale = 15.0f;
  uint16_t d16, dmin16;
  if (max_scale > 0.0f) {
    const float iscale = q4scale / max_scale;
    for (int j = 0; j < 16; ++j) sc[j] = uint8_t(nearest_int(iscale * scales[j]));
    d16 = f32_to_f16(max_scale / q4scale);
  } else {
    for (int j = 0; j < 16; ++j) sc[j] = 0;
    d16 = f32_to_f16(0.0f);
  }
  if (max_min > 0.0f) {
    const float iscale = q4scale / max_min;
    for (int j = 0; j < 16; ++j) sc[j] |= uint8_t(nearest_int(iscale * mins[j]) << 4);
    dmin16 = f32_to_f16(max_min / q4scale);
  } else {
    dmin16 = f32_to_f16(0.0f);
  }
  store_u16(out + 80, d16);
  store_u16(out + 82, dmin16);
  const float d_all = f16_to_f32(d16), dmin_all = f16_to_f32(dmin16);
  for (int j = 0; j < 16; ++j) {
    const float d = d_all * float(sc[j] & 0x0F);
    if (d == 0.0f) continue;  // keeps the levels found above, as llama.cpp does
    const float dm = dmin_all * float(sc[j] >> 4);
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = uint8_t(std::clamp(nearest_int((x[16 * j + i] + dm) / d), 0, 3));
  }
  pack_2bit(L, qs);
}

// Q3_K: 16 sub-blocks of 16, signed levels -4..3 and a signed 6-bit scale each against the
// super block's d. Layout: hmask[32], qs[64], scales[12], d.
void q3_k_block(const float* x, uint8_t* out) {
  int8_t L[kSuper];
  float scales[16];
  uint8_t *hmask = out, *qs = out + 32, *sc = out + 96;
  float max_scale = 0.0f, amax = 0.0f;
  for (int j = 0; j < 16; ++j) {
    scales[j] = q3_levels(16, 4, x + 16 * j, L + 16 * j);
    const float a = std::fabs(scales[j]);
    if (a > amax) {
      amax = a;
      max_scale = scales[j];
    }
  }
  std::memset(sc, 0, 12);
  uint16_t d16;
  if (max_scale != 0.0f) {
    const float iscale = -32.0f / max_scale;
    for (int j = 0; j < 16; ++j) {
      int l = int(int8_t(nearest_int(iscale * scales[j])));
      l = std::clamp(l, -32, 31) + 32;
      if (j < 8) sc[j] = uint8_t(l & 0x0F);
      else sc[j - 8] |= uint8_t((l & 0x0F) << 4);
      l >>= 4;
      sc[j % 4 + 8] |= uint8_t(l << (2 * (j / 4)));
    }
    d16 = f32_to_f16(1.0f / iscale);
  } else {
    d16 = f32_to_f16(0.0f);
  }
  store_u16(out + 108, d16);
  const float d_all = f16_to_f32(d16);
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? (sc[j] & 0x0F) : (sc[j - 8] >> 4);
    const int s = int(int8_t(uint8_t(lo | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)))) - 32;
    const float d = d_all * float(s);
    if (d == 0.0f) continue;
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = int8_t(std::clamp(nearest_int(x[16 * j + i] / d), -4, 3) + 4);
  }
  // The third bit of value j goes to bit j / 32 of hmask[j % 32].
  std::memset(hmask, 0, 32);
  uint8_t U[kSuper];
  for (int j = 0; j < kSuper; ++j) {
    int l = L[j];
    if (l > 3) {
      hmask[j % 32] |= uint8_t(1 << (j / 32));
      l -= 4;
    }
    U[j] = uint8_t(l);
  }
  pack_2bit(U, qs);
}

// Q4_K / Q5_K: 8 sub-blocks of 32, levels 0..2^bits-1 with a scale and a min each, both
// quantized to 6 bits against d and dmin. Weights |x| + rms(x) of the sub-block.
void q45_k_block(const float* x, uint8_t* out, int bits) {
  const int nmax = (1 << bits) - 1;
  const float rmin = bits == 4 ? -1.0f : -0.5f;
  const int nstep = bits == 4 ? 20 : 15;
  uint8_t L[kSuper], Laux[32];
  float weights[32], mins[8], scales[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0.0f;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32.0f);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = offset_levels(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  uint8_t* s = out + 4;
  std::memset(s, 0, 12);
  const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls = std::min<uint8_t>(63, uint8_t(nearest_int(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, uint8_t(nearest_int(inv_min * mins[j])));
    put_scale_min(s, j, ls, lm);
  }
  const uint16_t d16 = f32_to_f16(max_scale / 63.0f), dmin16 = f32_to_f16(max_min / 63.0f);
  store_u16(out, d16);
  store_u16(out + 2, dmin16);
  const float d_all = f16_to_f32(d16), dmin_all = f16_to_f32(dmin16);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    get_scale_min(s, j, sc, m);
    const float d = d_all * float(sc);
    if (d == 0.0f) continue;
    const float dm = dmin_all * float(m);
    for (int i = 0; i < 32; ++i)
      L[32 * j + i] = uint8_t(std::clamp(nearest_int((x[32 * j + i] + dm) / d), 0, nmax));
  }
  // Value 64g + l (l < 32) in the low nibble of byte 32g + l, value 64g + 32 + l in its high
  // nibble; Q5_K's fifth bits: bit 2g of qh[l] for the first, bit 2g + 1 for the second.
  uint8_t* qh = out + 16;
  uint8_t* qs = out + (bits == 5 ? 48 : 16);
  if (bits == 5) std::memset(qh, 0, 32);
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      int l1 = L[64 * g + l], l2 = L[64 * g + 32 + l];
      if (bits == 5) {
        if (l1 > 15) {
          l1 -= 16;
          qh[l] |= uint8_t(1 << (2 * g));
        }
        if (l2 > 15) {
          l2 -= 16;
          qh[l] |= uint8_t(2 << (2 * g));
        }
      }
      qs[32 * g + l] = uint8_t(l1 | (l2 << 4));
    }
  }
}

// Q6_K: 16 sub-blocks of 16, signed levels -32..31 and an int8 scale each against d.
// Layout: ql[128], qh[64], scales[16], d.
void q6_k_block(const float* x, uint8_t* out) {
  int8_t L[kSuper];
  float scales[16];
  float max_scale = 0.0f, max_abs_scale = 0.0f;
  for (int ib = 0; ib < 16; ++ib) {
    const float scale = symmetric_levels(16, 32, x + 16 * ib, L + 16 * ib);
    scales[ib] = scale;
    const float a = std::fabs(scale);
    if (a > max_abs_scale) {
      max_abs_scale = a;
      max_scale = scale;
    }
  }
  if (max_abs_scale < kGroupMaxEps) {
    std::memset(out, 0, 210);
    store_u16(out + 208, f32_to_f16(0.0f));
    return;
  }
  int8_t* sc = reinterpret_cast<int8_t*>(out + 192);
  const float iscale = -128.0f / max_scale;
  const uint16_t d16 = f32_to_f16(1.0f / iscale);
  store_u16(out + 208, d16);
  for (int ib = 0; ib < 16; ++ib) sc[ib] = int8_t(std::min(127, nearest_int(iscale * scales[ib])));
  const float d_all = f16_to_f32(d16);
  for (int j = 0; j < 16; ++j) {
    const float d = d_all * float(sc[j]);
    if (d == 0.0f) continue;
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = int8_t(std::clamp(nearest_int(x[16 * j + i] / d), -32, 31) + 32);
  }
  // Value 128h + 32k + l: low nibble in ql[64h + 32(k % 2) + l] (high half when k >= 2), the
  // two high bits at bits 2k of qh[32h + l].
  uint8_t *ql = out, *qh = out + 128;
  for (int h = 0; h < 2; ++h) {
    const int8_t* Lh = L + 128 * h;
    for (int l = 0; l < 32; ++l) {
      const uint8_t q1 = Lh[l] & 0x0F, q2 = Lh[l + 32] & 0x0F, q3 = Lh[l + 64] & 0x0F, q4 = Lh[l + 96] & 0x0F;
      ql[64 * h + l] = uint8_t(q1 | (q3 << 4));
      ql[64 * h + l + 32] = uint8_t(q2 | (q4 << 4));
      qh[32 * h + l] = uint8_t((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                               ((Lh[l + 96] >> 4) << 6));
    }
  }
}

}  // namespace

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // 65520 and up round to inf
  if (a >= 0x38800000u) {  // normal half (2^-14 and up)
    const uint32_t rest = a & 0x1fffu;
    uint32_t h = ((a >> 23) - 112u) << 10 | ((a >> 13) & 0x3ffu);
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry moves into the exponent
    return uint16_t(sign | h);
  }
  // Subnormal half: a multiple of 2^-24. The float is m * 2^(e - 150) with the implicit bit.
  const uint32_t e = a >> 23;
  if (e < 102) return sign;  // below 2^-25: rounds to zero (2^-25 itself ties to even zero)
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - e;  // 14..24
  uint32_t h = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

bool can_quantize(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: return true;
    case DType::IQ4_NL:
    case DType::IQ4_XS: return false;
  }
  return false;
}

void quantize_f32(DType t, const float* src, uint8_t* dst, int64_t n) {
  if (!can_quantize(t)) fail("tessera does not write {} tensors", dtype_name(t));
  const int64_t per_block = dtype_block_values(t);
  if (n < 0 || n % per_block != 0)
    fail("cannot quantize {} values to {}: not a whole number of {}-value blocks", n, dtype_name(t), per_block);
  const int64_t blocks = n / per_block, bytes = dtype_block_bytes(t);
  void (*block)(const float*, uint8_t*) = nullptr;
  switch (t) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) store_u16(dst + 2 * i, f32_to_f16(src[i]));
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) store_u16(dst + 2 * i, f32_to_bf16(src[i]));
      return;
    case DType::Q8_0: block = q8_0_block; break;
    case DType::Q4_0: block = q4_0_block; break;
    case DType::Q4_1: block = q4_1_block; break;
    case DType::Q5_0: block = q5_0_block; break;
    case DType::Q5_1: block = q5_1_block; break;
    case DType::Q2_K: block = q2_k_block; break;
    case DType::Q3_K: block = q3_k_block; break;
    case DType::Q4_K: block = [](const float* x, uint8_t* o) { q45_k_block(x, o, 4); }; break;
    case DType::Q5_K: block = [](const float* x, uint8_t* o) { q45_k_block(x, o, 5); }; break;
    case DType::Q6_K: block = q6_k_block; break;
    default: break;
  }
  for (int64_t b = 0; b < blocks; ++b) block(src + b * per_block, dst + b * bytes);
}

}  // namespace tessera
