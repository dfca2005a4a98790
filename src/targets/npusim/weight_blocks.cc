#include "targets/npusim/weight_blocks.h"

#include <cstring>

#include "util/error.h"
#include "util/half.h"

namespace tessera::npusim {

BlockTerms unpack_block(ElemType t, const uint8_t* b) {
  BlockTerms out;
  uint16_t d;
  std::memcpy(&d, b, 2);  // little-endian f16, as GGUF stores it (and the device reads it)
  out.scale = f16_to_f32(d);
  switch (t) {
    case ElemType::Q4_0:
      // Value j in the low nibble of byte j, value j + 16 in its high nibble.
      for (int j = 0; j < kBlockValues / 2; ++j) {
        out.v[j] = int8_t(int(b[2 + j] & 0x0F) - 8);
        out.v[j + kBlockValues / 2] = int8_t(int(b[2 + j] >> 4) - 8);
      }
      return out;
    case ElemType::Q8_0: std::memcpy(out.v, b + 2, kBlockValues); return out;
    default: fail("npusim: {} is not a block format", elem_type_name(t));
  }
}

int64_t unpack_lane_ops(ElemType t) {
  switch (t) {
    case ElemType::Q4_0: return 3;
    case ElemType::Q8_0: return 1;
    default: return 0;
  }
}

int64_t gemv_dequant_ops(ElemType t, int64_t weights) {
  return is_block(t) ? weights * (unpack_lane_ops(t) + 1) : 0;
}

int64_t gemm_dequant_ops(ElemType t, int64_t b_weights, int64_t acc_block_updates) {
  return is_block(t) ? b_weights * unpack_lane_ops(t) + acc_block_updates : 0;
}

float dot_blocks(ElemType t, const uint8_t* row, const float* x, int64_t blocks) {
  const int64_t bytes = elem_bytes(t);
  float acc = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const BlockTerms bt = unpack_block(t, row + b * bytes);
    const float* xb = x + b * kBlockValues;
    float partial = 0;
    for (int l = 0; l < kBlockValues; ++l) partial += float(bt.v[l]) * xb[l];  // exact products
    acc += bt.scale * partial;
  }
  return acc;
}

}  // namespace tessera::npusim
