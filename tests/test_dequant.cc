// Dequantization and half-precision conversions, against values worked out by hand from
// the GGML block formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "io/tensor.h"
#include "util/error.h"
#include "util/half.h"

namespace tessera {
namespace {

constexpr uint16_t kF16Half = 0x3800;             // 0.5
constexpr uint16_t kF16Quarter = 0x3400;          // 0.25
constexpr uint16_t kF16Third = 0x3555;            // 1365/4096 = 0.333251953125
constexpr uint16_t kF16MinusOneAndHalf = 0xBE00;  // -1.5
constexpr uint16_t kF16Tiny = 0x0001;             // 2^-24, the smallest subnormal
constexpr uint16_t kF16_1024 = 0x6400;            // 1024

void put_u16(std::vector<uint8_t>& b, uint16_t v) {
  b.push_back(uint8_t(v & 0xFF));
  b.push_back(uint8_t(v >> 8));
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<float> convert(DType t, const std::vector<uint8_t>& bytes, int64_t n) {
  std::vector<float> out(size_t(n), -12345.0f);
  to_f32(t, bytes.data(), out.data(), n);
  return out;
}

TEST(Dequant, BlockSizes) {
  EXPECT_EQ(dtype_block_values(DType::F32), 1);
  EXPECT_EQ(dtype_block_values(DType::Q4_1), 32);
  EXPECT_EQ(dtype_block_bytes(DType::Q8_0), 34);
  EXPECT_EQ(dtype_block_bytes(DType::Q4_0), 18);
  EXPECT_EQ(dtype_block_bytes(DType::Q4_1), 20);
  EXPECT_EQ(dtype_bytes(DType::F32, 3), 12u);
  EXPECT_EQ(dtype_bytes(DType::BF16, 5), 10u);
  EXPECT_EQ(dtype_bytes(DType::Q8_0, 64), 68u);
  EXPECT_EQ(dtype_bytes(DType::Q4_0, 32), 18u);
  EXPECT_EQ(dtype_bytes(DType::Q4_1, 96), 60u);
  EXPECT_EQ(dtype_bytes(DType::Q4_1, 0), 0u);
  EXPECT_THROW(dtype_bytes(DType::Q4_0, 33), Error);
  EXPECT_THROW(dtype_bytes(DType::F32, -1), Error);
  EXPECT_THROW(dtype_bytes(DType::F32, INT64_MAX), Error);  // byte count overflows
  EXPECT_STREQ(dtype_name(DType::Q4_1), "Q4_1");
  EXPECT_STREQ(dtype_name(DType::BF16), "BF16");
}

TEST(Dequant, TensorInfoShape) {
  TensorInfo t;
  t.shape = {576, 1536};
  EXPECT_EQ(t.numel(), 576 * 1536);
  EXPECT_EQ(t.rows(), 576);
  EXPECT_EQ(t.cols(), 1536);
  EXPECT_EQ(t.shape_str(), "[576, 1536]");
  t.shape = {};
  EXPECT_EQ(t.numel(), 1);
  EXPECT_EQ(t.shape_str(), "[]");
}

TEST(Dequant, Q8_0Block) {
  // Two blocks: d = 0.5 with q = j - 16, then d = 1365/4096 with q spanning -128..127.
  std::vector<uint8_t> b;
  put_u16(b, kF16Half);
  for (int j = 0; j < 32; ++j) b.push_back(uint8_t(int8_t(j - 16)));
  put_u16(b, kF16Third);
  const int8_t q2[4] = {-128, -1, 1, 127};
  for (int j = 0; j < 32; ++j) b.push_back(uint8_t(q2[j % 4]));
  ASSERT_EQ(b.size(), 2 * 34u);

  const auto v = convert(DType::Q8_0, b, 64);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(v[j], 0.5f * float(j - 16)) << j;
  EXPECT_EQ(v[0], -8.0f);
  EXPECT_EQ(v[31], 7.5f);
  const float d2 = 1365.0f / 4096.0f;
  for (int j = 0; j < 32; ++j) EXPECT_EQ(v[32 + j], d2 * float(q2[j % 4])) << j;
  EXPECT_EQ(v[32], -42.65625f);  // -128 * 1365/4096, exact
}

TEST(Dequant, Q4_0Block) {
  // Byte j holds value j in its low nibble and value j+16 in its high nibble.
  std::vector<uint8_t> b;
  put_u16(b, kF16Half);
  for (int j = 0; j < 16; ++j) b.push_back(uint8_t(j | ((15 - j) << 4)));
  const auto v = convert(DType::Q4_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(v[j], 0.5f * float(j - 8)) << j;
    EXPECT_EQ(v[j + 16], 0.5f * float((15 - j) - 8)) << j;
  }
  EXPECT_EQ(v[0], -4.0f);  // nibble 0 -> -8 * 0.5
  EXPECT_EQ(v[15], 3.5f);  // nibble 15 -> 7 * 0.5
  EXPECT_EQ(v[16], 3.5f);
  EXPECT_EQ(v[31], -4.0f);
}

TEST(Dequant, Q4_1Block) {
  // d = 0.25, m = -1.5: value = 0.25 * nibble - 1.5.
  std::vector<uint8_t> b;
  put_u16(b, kF16Quarter);
  put_u16(b, kF16MinusOneAndHalf);
  for (int j = 0; j < 16; ++j) b.push_back(uint8_t((j & 0xF) | (((j * 7) & 0xF) << 4)));
  // Second block: a subnormal d against a large m; d*q is far below half an ulp of 1024,
  // so every value rounds to exactly 1024 (computed as d*q, then + m, like gguf-py).
  put_u16(b, kF16Tiny);
  put_u16(b, kF16_1024);
  for (int j = 0; j < 16; ++j) b.push_back(0xFF);

  const auto v = convert(DType::Q4_1, b, 64);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(v[j], 0.25f * float(j) + -1.5f) << j;
    EXPECT_EQ(v[j + 16], 0.25f * float((j * 7) & 0xF) + -1.5f) << j;
  }
  EXPECT_EQ(v[0], -1.5f);
  EXPECT_EQ(v[15], 2.25f);
  for (int j = 32; j < 64; ++j) EXPECT_EQ(v[j], 1024.0f) << j;
}

TEST(Dequant, PartialBlockIsRefused) {
  std::vector<uint8_t> b(34, 0);
  float out[32];
  EXPECT_THROW(to_f32(DType::Q8_0, b.data(), out, 31), Error);
  to_f32(DType::Q8_0, b.data(), out, 0);  // nothing to do, no error
}

TEST(Dequant, F32PassThrough) {
  const float in[3] = {1.5f, -0.0f, 3.25e-30f};
  std::vector<uint8_t> b(sizeof(in));
  std::memcpy(b.data(), in, sizeof(in));
  const auto v = convert(DType::F32, b, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bits(v[i]), bits(in[i]));
}

TEST(Dequant, F16Specials) {
  struct Case {
    uint16_t h;
    float f;
  };
  const Case cases[] = {
      {0x3C00, 1.0f},
      {0xC000, -2.0f},
      {0x7BFF, 65504.0f},                  // largest finite
      {0x0400, std::ldexp(1.0f, -14)},     // smallest normal
      {0x0001, std::ldexp(1.0f, -24)},     // smallest subnormal
      {0x03FF, std::ldexp(1023.0f, -24)},  // largest subnormal
      {0x8001, -std::ldexp(1.0f, -24)},
      {0x7C00, INFINITY},
      {0xFC00, -INFINITY},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> b;
    put_u16(b, c.h);
    EXPECT_EQ(convert(DType::F16, b, 1)[0], c.f) << std::hex << c.h;
  }
  std::vector<uint8_t> b;
  put_u16(b, 0x8000);  // -0
  put_u16(b, 0x7E00);  // quiet NaN
  put_u16(b, 0xFD01);  // NaN with sign and payload
  const auto v = convert(DType::F16, b, 3);
  EXPECT_EQ(bits(v[0]), 0x80000000u);
  EXPECT_TRUE(std::isnan(v[1]));
  EXPECT_TRUE(std::isnan(v[2]));
  EXPECT_TRUE(std::signbit(v[2]));
}

TEST(Dequant, BF16Conversions) {
  std::vector<uint8_t> b;
  for (uint16_t h : {0x3F80, 0xC040, 0x7F80, 0xFF80, 0x7FC0, 0x0001}) put_u16(b, h);
  const auto v = convert(DType::BF16, b, 6);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], -3.0f);
  EXPECT_EQ(v[2], INFINITY);
  EXPECT_EQ(v[3], -INFINITY);
  EXPECT_TRUE(std::isnan(v[4]));
  EXPECT_EQ(bits(v[5]), 0x00010000u);  // a float subnormal, kept exactly
}

TEST(Dequant, BF16RoundsToNearestEven) {
  const float ulp = std::ldexp(1.0f, -7);  // bf16 spacing in [1, 2)
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.0f + ulp / 2), 0x3F80);                          // tie, 0x3F80 is even
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * ulp / 2), 0x3F82);                      // tie, rounds up to even
  EXPECT_EQ(f32_to_bf16(1.0f + ulp / 2 + std::ldexp(1.0f, -20)), 0x3F81);  // past the tie
  EXPECT_EQ(f32_to_bf16(1.0f + ulp / 2 - std::ldexp(1.0f, -20)), 0x3F80);  // short of it
  EXPECT_EQ(f32_to_bf16(-1.0f - 3 * ulp / 2), 0xBF82);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to inf
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7F80);
  const uint16_t nan = f32_to_bf16(std::nanf(""));
  EXPECT_EQ(nan & 0x7F80, 0x7F80);
  EXPECT_NE(nan & 0x007F, 0);  // still a NaN, not inf
  // A NaN whose payload sits only in the low 16 bits must not truncate to inf.
  float low_nan;
  const uint32_t u = 0x7F800001u;
  std::memcpy(&low_nan, &u, 4);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(low_nan))));
  // Every bf16 survives a round trip through fp32.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    if (!std::isnan(f)) {
      EXPECT_EQ(f32_to_bf16(f), h);
    }
  }
}

// Every block type against the gguf package's numpy dequantize (tests/fixtures/quant/, made
// by tools/reference/quant_fixtures.py from random blocks, finite f16 scales across the range,
// and blocks the package quantized itself): bit for bit.
class DequantFixture : public ::testing::TestWithParam<DType> {};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST_P(DequantFixture, MatchesTheGgufPackageBitForBit) {
  const DType t = GetParam();
  const std::string base = std::string(TESSERA_SOURCE_DIR) + "/tests/fixtures/quant/" + dtype_name(t);
  const std::vector<uint8_t> blocks = read_bytes(base + ".blocks"), expected = read_bytes(base + ".f32");
  ASSERT_EQ(blocks.size() % size_t(dtype_block_bytes(t)), 0u);
  const int64_t n = int64_t(blocks.size()) / dtype_block_bytes(t) * dtype_block_values(t);
  ASSERT_EQ(expected.size(), size_t(n) * 4);
  EXPECT_EQ(dtype_bytes(t, n), blocks.size());
  const std::vector<float> got = convert(t, blocks, n);
  int64_t wrong = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    float want;
    std::memcpy(&want, expected.data() + 4 * i, 4);
    if (bits(got[size_t(i)]) != bits(want)) {
      if (first < 0) first = i;
      ++wrong;
    }
  }
  EXPECT_EQ(wrong, 0) << dtype_name(t) << ": first at value " << first << " (block " << first / dtype_block_values(t)
                      << ")";
}

INSTANTIATE_TEST_SUITE_P(EveryBlockType, DequantFixture,
                         ::testing::Values(DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::IQ4_NL,
                                           DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                                           DType::IQ4_XS),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(Dequant, KQuantBlockSizes) {
  for (const DType t : {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS})
    EXPECT_EQ(dtype_block_values(t), 256) << dtype_name(t);
  EXPECT_EQ(dtype_block_bytes(DType::Q4_K), 144);
  EXPECT_EQ(dtype_block_bytes(DType::Q6_K), 210);
  EXPECT_EQ(dtype_bytes(DType::Q5_K, 512), 352u);
  EXPECT_THROW(dtype_bytes(DType::Q4_K, 576), Error);  // 576 = 2.25 super blocks
}

}  // namespace
}  // namespace tessera
