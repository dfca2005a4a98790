// Small pieces of GGML's block formats shared by the readers of their bytes (io/tensor.cc's
// dequantization, the cpu target's re-laying in targets/cpu/quant.cc).
#pragma once
#include <cstdint>
#include <cstring>

namespace tessera::ggml {

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Q4_K's and Q5_K's eight 6-bit scales and mins, packed in 12 bytes: bytes 0-3 hold scales
// 0-3 (low 6 bits) and the top bits of scales 4-7, bytes 4-7 the same for the mins, bytes
// 8-11 the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high nibble).
inline void k_scale_min(const uint8_t* q, int j, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 0x3F;
    m = q[j + 4] & 0x3F;
  } else {
    sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 2) & 0x30);
    m = (q[j + 4] >> 4) | ((q[j] >> 2) & 0x30);
  }
}

}  // namespace tessera::ggml
