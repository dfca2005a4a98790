#include "io/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

#include "util/error.h"
#include "util/half.h"

namespace tessera {

namespace {

constexpr int64_t kBlock = 32;  // values per GGML block for every quantized type here

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::Q8_0: return "Q8_0";
    case DType::Q4_0: return "Q4_0";
    case DType::Q4_1: return "Q4_1";
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
    case DType::Q4_1: return kBlock;
  }
  return 1;
}

int64_t dtype_block_bytes(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::Q8_0: return 2 + 32;      // f16 d, int8 qs[32]
    case DType::Q4_0: return 2 + 16;      // f16 d, uint8 qs[16]
    case DType::Q4_1: return 2 + 2 + 16;  // f16 d, f16 m, uint8 qs[16]
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

// The quantized paths match gguf-py's numpy dequantize bit for bit: d*q is exact in fp32
// (an 11-bit f16 mantissa times an at most 8-bit integer), so the only rounding is the
// final add of m (Q4_1), and it does not matter whether the compiler fuses it into an FMA.
void to_f32(DType t, const uint8_t* src, float* dst, int64_t n) {
  if (n <= 0) return;
  const int64_t per_block = dtype_block_values(t);
  if (n % per_block != 0) {
    fail("cannot convert {} values of {}: not a whole number of {}-value blocks", n, dtype_name(t),
         per_block);
  }
  const int64_t blocks = n / per_block;
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
  }
}

}  // namespace tessera
