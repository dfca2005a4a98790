// The quantizers under `tessera quantize`, against independent references:
// - Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 byte for byte against the gguf package's quantize;
// - Q2_K..Q6_K (and the five above) byte for byte against llama.cpp's llama-quantize;
// all in tests/fixtures/quantize/, made by tools/reference/quantize_fixtures.py (the
// inputs are 256-value rows: slices of the default model's weights and synthetic rows
// with outliers, zero blocks, negative extremes, constant blocks and exact ties).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/quantize.h"
#include "test_support.h"

namespace tessera {
namespace {


constexpr int64_t kRow = 256;

std::string fixture(const std::string& name) {
  return std::string(TESSERA_SOURCE_DIR) + "/tests/fixtures/quantize/" + name;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ADD_FAILURE() << "missing fixture " << path << " (tools/reference/quantize_fixtures.py)";
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

template <typename T>
std::vector<T> read_array(const std::string& path) {
  const std::vector<uint8_t> b = read_bytes(path);
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

std::vector<float> fixture_rows() {
  std::vector<float> rows = read_array<float>(fixture("rows.f32"));
  EXPECT_EQ(rows.size() % kRow, 0u);
  return rows;
}

std::vector<uint8_t> quantize_rows(DType t, const std::vector<float>& rows) {
  const int64_t n = int64_t(rows.size());
  std::vector<uint8_t> out(dtype_bytes(t, n));
  // Row by row, as tessera quantize does (each row on its own).
  const uint64_t row_bytes = dtype_bytes(t, kRow);
  for (int64_t r = 0; r < n / kRow; ++r) quantize_f32(t, rows.data() + r * kRow, out.data() + r * row_bytes, kRow);
  return out;
}

// Compares block by block; returns the number of blocks that differ and says which.
int64_t differing_blocks(DType t, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                         const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  const int64_t bytes = dtype_block_bytes(t), per_row = kRow / dtype_block_values(t);
  int64_t bad = 0;
  for (size_t b = 0; b * size_t(bytes) < std::min(got.size(), want.size()); ++b) {
    if (std::memcmp(got.data() + b * bytes, want.data() + b * bytes, size_t(bytes)) == 0) continue;
    if (++bad <= 4) {
      std::string diff;
      for (int64_t k = 0; k < bytes; ++k)
        if (got[b * bytes + k] != want[b * bytes + k])
          diff += fmt::format(" [{}] {:02x}/{:02x}", k, got[b * bytes + k], want[b * bytes + k]);
      ADD_FAILURE() << what << " " << dtype_name(t) << ": row " << b / per_row << " block " << b % per_row
                    << " differs (byte: tessera/reference):" << diff;
    }
  }
  return bad;
}

TEST(Quantize, F16RoundingMatchesNumpy) {
  const auto x = read_array<float>(fixture("f16.f32"));
  const auto h = read_array<uint16_t>(fixture("f16.u16"));
  ASSERT_EQ(x.size(), h.size());
  ASSERT_GT(x.size(), 100u);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(f32_to_f16(x[i]), h[i]) << i << ": " << x[i];
}

// Byte identity with gguf.quants.quantize on every row (real and synthetic).
TEST(Quantize, SimpleTypesMatchGgufPackage) {
  const std::vector<float> rows = fixture_rows();
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1}) {
    const auto want = read_bytes(fixture(std::string(dtype_name(t)) + ".gguf-py"));
    EXPECT_EQ(differing_blocks(t, quantize_rows(t, rows), want, "gguf-py"), 0) << dtype_name(t);
  }
}

// Byte identity with llama.cpp's reference quantizers (llama-quantize --pure, no imatrix).
// Every block is identical (both are plain fp32 arithmetic in the same order): the test
// holds them to exact equality.
TEST(Quantize, AllTypesMatchLlamaCpp) {
  const std::vector<float> rows = fixture_rows();
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K,
                  DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const auto want = read_bytes(fixture(std::string(dtype_name(t)) + ".llama-cpp"));
    EXPECT_EQ(differing_blocks(t, quantize_rows(t, rows), want, "llama.cpp"), 0) << dtype_name(t);
  }
}

// What the bytes mean: dequantized by tessera's reader (bit-exact with gguf-py's), each type
// stays within its resolution of the input (relative RMS error per row, a sanity bound: a
// layout mistake gives errors of order 1), and a split of a row into whole blocks does not
// change the bytes. The "tiny" row (values of sd 1e-6) is left out of the bound: its f16
// scales underflow and every quantizer, llama.cpp's and the gguf package's included,
// returns junk for it (the byte tests above cover it).
TEST(Quantize, RoundTripErrorWithinResolution) {
  const std::vector<float> rows = fixture_rows();
  const int64_t n = int64_t(rows.size());
  const std::map<DType, double> bound = {{DType::Q8_0, 0.02}, {DType::Q6_K, 0.04}, {DType::Q5_0, 0.10},
                                         {DType::Q5_1, 0.10}, {DType::Q5_K, 0.10}, {DType::Q4_0, 0.20},
                                         {DType::Q4_1, 0.20}, {DType::Q4_K, 0.20}, {DType::Q3_K, 0.30},
                                         {DType::Q2_K, 0.45}, {DType::F16, 1e-3}, {DType::BF16, 1e-2}};
  std::ifstream manifest_in(fixture("manifest.json"));
  ASSERT_TRUE(manifest_in);
  const auto rows_desc = nlohmann::json::parse(manifest_in)["rows"];
  ASSERT_EQ(int64_t(rows_desc.size()) * kRow, n);
  for (const auto& [t, limit] : bound) {
    const std::vector<uint8_t> q = quantize_rows(t, rows);
    std::vector<float> back(rows.size());
    to_f32(t, q.data(), back.data(), n);
    for (int64_t r = 0; r < n / kRow; ++r) {
      if (rows_desc[size_t(r)].get<std::string>().find("tiny") != std::string::npos) continue;
      double err2 = 0, ref2 = 0;
      for (int64_t i = r * kRow; i < (r + 1) * kRow; ++i) {
        err2 += (double(back[i]) - rows[i]) * (double(back[i]) - rows[i]);
        ref2 += double(rows[i]) * rows[i];
      }
      if (ref2 == 0) {
        EXPECT_EQ(err2, 0) << dtype_name(t) << " row " << r;  // zeros stay zeros
        continue;
      }
      EXPECT_LT(std::sqrt(err2 / ref2), limit) << dtype_name(t) << " row " << r;
    }
    // One call over all rows (blocks are independent) gives the same bytes.
    std::vector<uint8_t> whole(q.size());
    quantize_f32(t, rows.data(), whole.data(), n);
    EXPECT_EQ(whole, q) << dtype_name(t);
  }
  EXPECT_THROW(quantize_f32(DType::Q4_K, rows.data(), nullptr, 32), Error);
  EXPECT_THROW(quantize_f32(DType::IQ4_NL, rows.data(), nullptr, 32), Error);
}

}  // namespace
}  // namespace tessera
