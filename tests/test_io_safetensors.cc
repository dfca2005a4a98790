// safetensors: writer/reader round trip, and every malformed header refused with one line
// that names the file and the problem.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "test_support.h"
#include "util/error.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct StTemp : testing_support::TempFile {
  StTemp() : TempFile(".safetensors") {}
};
// Opening `path` must fail with one line naming the file and containing `needle`.
void expect_st_error(const std::string& path, const std::string& needle) {
  testing_support::expect_open_error([](const std::string& p) { SafetensorsFile::open(p); }, path, needle);
}
std::vector<uint8_t> st_bytes(size_t n, uint8_t seed) { return testing_support::byte_pattern(n, seed, 37); }

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A file with the given JSON header and `data_bytes` bytes of data.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = char(uint64_t(header.size()) >> (8 * i));
  out += header;
  out.append(data_bytes, '\x5a');
  write_file(path, out);
}

TEST(Safetensors, RoundTrip) {
  StTemp tmp;
  const std::vector<SafetensorsWriter::Entry> entries = {
      {"model.embed_tokens.weight", DType::BF16, {4, 3}},
      {"model.norm.weight", DType::F32, {3}},
      {"lm_head.weight", DType::F16, {2, 2, 3}},
      {"scalar", DType::F32, {}},
      {"empty", DType::F16, {0, 5}},
  };
  const std::vector<std::vector<uint8_t>> data = {
      st_bytes(24, 1), st_bytes(12, 2), st_bytes(24, 3), st_bytes(4, 4), {}};
  {
    SafetensorsWriter w(tmp.path(), entries, {{"format", "pt"}, {"note", "héllo"}});
    for (size_t i = 0; i < entries.size(); ++i) {
      w.write(entries[i].name, data[i].data(), data[i].size());
    }
    w.close();
  }

  const std::string raw = read_file(tmp.path());
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + header_len + 24 + 12 + 24 + 4);

  const SafetensorsFile st = SafetensorsFile::open(tmp.path());
  EXPECT_EQ(st.metadata().at("format"), "pt");
  EXPECT_EQ(st.metadata().at("note"), "héllo");
  ASSERT_EQ(st.tensors().size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const TensorInfo* t = nullptr;
    for (const TensorInfo& x : st.tensors()) {
      if (x.name == entries[i].name) t = &x;
    }
    ASSERT_NE(t, nullptr) << entries[i].name;
    EXPECT_EQ(t->dtype, entries[i].dtype) << t->name;
    EXPECT_EQ(t->shape, entries[i].shape) << t->name;
    ASSERT_EQ(t->nbytes, data[i].size()) << t->name;
    if (!data[i].empty()) {
      EXPECT_EQ(std::memcmp(t->data, data[i].data(), t->nbytes), 0) << t->name;
    }
    EXPECT_NE(t->file, nullptr);
  }
  // Non-empty tensors come back in file (declaration) order.
  EXPECT_EQ(st.tensors()[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(st.tensors()[1].name, "model.norm.weight");
  EXPECT_EQ(st.tensors()[2].name, "lm_head.weight");
}

TEST(Safetensors, TensorsOutliveTheFileObject) {
  StTemp tmp;
  const auto bytes = st_bytes(8, 9);
  {
    SafetensorsWriter w(tmp.path(), {{"w", DType::F32, {2}}});
    w.write("w", bytes.data(), bytes.size());
    w.close();
  }
  TensorInfo t = SafetensorsFile::open(tmp.path()).tensors().at(0);
  EXPECT_EQ(std::memcmp(t.data, bytes.data(), 8), 0);  // the mapping lives in t.file
}

TEST(Safetensors, WriterChecksOrderAndSizes) {
  StTemp tmp;
  const auto bytes = st_bytes(16, 0);
  {
    SafetensorsWriter w(tmp.path(), {{"a", DType::F32, {2}}, {"b", DType::F16, {4}}});
    EXPECT_THROW(w.write("b", bytes.data(), 8), Error);   // out of order
    EXPECT_THROW(w.write("a", bytes.data(), 12), Error);  // wrong size
    w.write("a", bytes.data(), 8);
    EXPECT_THROW(w.close(), Error);  // "b" not written
  }
  // An unfinished writer leaves no truncated file behind.
  EXPECT_FALSE(fs::exists(tmp.path()));
  EXPECT_THROW(SafetensorsWriter(tmp.path(), {{"q", DType::Q8_0, {32}}}), Error);
  EXPECT_THROW(SafetensorsWriter(tmp.path(), {{"a", DType::F32, {1}}, {"a", DType::F32, {1}}}),
               Error);
  EXPECT_THROW(SafetensorsWriter(tmp.path(), {{"a", DType::F32, {-1}}}), Error);
}

TEST(Safetensors, WritesTensorsInParts) {
  StTemp tmp;
  const auto bytes = st_bytes(40, 5);
  {
    SafetensorsWriter w(tmp.path(), {{"a", DType::F32, {2, 4}}, {"b", DType::F16, {4}}});
    w.write_part("a", bytes.data(), 12);
    EXPECT_THROW(w.write("a", bytes.data(), 32), Error);       // already begun in parts
    EXPECT_THROW(w.write_part("a", bytes.data(), 24), Error);  // 12 + 24 > 32
    w.write_part("a", bytes.data() + 12, 0);
    w.write_part("a", bytes.data() + 12, 20);
    w.write_part("b", bytes.data() + 32, 8);
    w.close();
  }
  const SafetensorsFile st = SafetensorsFile::open(tmp.path());
  ASSERT_EQ(st.tensors().size(), 2u);
  EXPECT_EQ(std::memcmp(st.tensors()[0].data, bytes.data(), 32), 0);
  EXPECT_EQ(std::memcmp(st.tensors()[1].data, bytes.data() + 32, 8), 0);
}

TEST(Safetensors, TruncatedFile) {
  StTemp tmp;
  write_file(tmp.path(), "");
  expect_st_error(tmp.path(), "too short");
  write_file(tmp.path(), std::string("\x10\0\0", 3));
  expect_st_error(tmp.path(), "too short");
}

TEST(Safetensors, HeaderLengthPastEnd) {
  StTemp tmp;
  std::string bytes(8, '\0');
  bytes[0] = char(200);
  bytes += "{}";
  write_file(tmp.path(), bytes);
  expect_st_error(tmp.path(), "header length 200 runs past the end");
  bytes.assign(8, '\xff');  // 2^64 - 1: must not wrap around
  write_file(tmp.path(), bytes);
  expect_st_error(tmp.path(), "runs past the end");
}

TEST(Safetensors, HeaderNotJson) {
  StTemp tmp;
  write_raw(tmp.path(), "{\"a\": {\"dtype\": ", 0);
  expect_st_error(tmp.path(), "not valid JSON");
  write_raw(tmp.path(), "\xff\xfe garbage", 0);
  expect_st_error(tmp.path(), "not valid JSON");
  write_raw(tmp.path(), "[1, 2]", 0);
  expect_st_error(tmp.path(), "not a JSON object");
}

TEST(Safetensors, EmptyHeaderIsValid) {
  StTemp tmp;
  write_raw(tmp.path(), "{}      ", 0);
  const SafetensorsFile st = SafetensorsFile::open(tmp.path());
  EXPECT_TRUE(st.tensors().empty());
}

TEST(Safetensors, UnknownAndUnsupportedDtypes) {
  StTemp tmp;
  write_raw(tmp.path(), R"({"t": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8);
  expect_st_error(tmp.path(), "dtype I64, which tessera does not support");
  write_raw(tmp.path(), R"({"t": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 8]}})", 8);
  expect_st_error(tmp.path(), "unknown dtype 'Q9'");
}

TEST(Safetensors, BadShapes) {
  StTemp tmp;
  write_raw(tmp.path(), R"({"t": {"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 8]}})", 8);
  expect_st_error(tmp.path(), "negative dimension -3");
  write_raw(tmp.path(), R"({"t": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})", 8);
  expect_st_error(tmp.path(), "non-integer dimension");
  write_raw(tmp.path(),
            R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})",
            8);
  expect_st_error(tmp.path(), "overflows");
}

TEST(Safetensors, BadOffsets) {
  StTemp tmp;
  write_raw(tmp.path(), R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8);
  expect_st_error(tmp.path(), "begin 8 > end 0");
  write_raw(tmp.path(), R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4);
  expect_st_error(tmp.path(), "past the end of the data region");
  write_raw(
      tmp.path(),
      R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [18446744073709551608, 18446744073709551615]}})",
      8);
  expect_st_error(tmp.path(), "past the end of the data region");
  write_raw(tmp.path(), R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}})", 12);
  expect_st_error(tmp.path(), "holds 12 bytes but shape [2] of F32 needs 8");
  write_raw(tmp.path(), R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [-4, 4]}})", 8);
  expect_st_error(tmp.path(), "not non-negative integers");
  write_raw(tmp.path(), R"({"t": {"dtype": "F32", "shape": [2]}})", 8);
  expect_st_error(tmp.path(), "data_offsets");
}

TEST(Safetensors, OverlappingTensors) {
  StTemp tmp;
  write_raw(tmp.path(),
            R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
            R"( "b": {"dtype": "F16", "shape": [4], "data_offsets": [4, 12]}})",
            12);
  expect_st_error(tmp.path(), "'a' and 'b' overlap");
}

TEST(Safetensors, BadMetadata) {
  StTemp tmp;
  write_raw(tmp.path(), R"({"__metadata__": {"format": 1}})", 0);
  expect_st_error(tmp.path(), "__metadata__ value for 'format' is not a string");
  write_raw(tmp.path(), R"({"__metadata__": [1]})", 0);
  expect_st_error(tmp.path(), "__metadata__ is not a JSON object");
  write_raw(tmp.path(), R"({"t": [1]})", 0);
  expect_st_error(tmp.path(), "'t' is not a JSON object");
}

TEST(Safetensors, HugeNumberLiteral) {
  StTemp tmp;
  write_raw(tmp.path(), R"({"t": {"dtype": "F32", "shape": [1e999], "data_offsets": [0, 4]}})", 4);
  expect_st_error(tmp.path(), "not valid JSON");
}

// Random byte flips and truncations of a valid file: each one opens or is refused with a
// tessera::Error, never a crash (run under ASan/UBSan to catch stray reads).
TEST(Safetensors, SurvivesRandomCorruption) {
  StTemp tmp;
  const auto bytes = st_bytes(64, 1);
  {
    SafetensorsWriter w(tmp.path(), {{"a", DType::F32, {2, 4}}, {"b", DType::BF16, {16}}},
                        {{"format", "pt"}});
    w.write("a", bytes.data(), 32);
    w.write("b", bytes.data() + 32, 32);
    w.close();
  }
  const std::string good = read_file(tmp.path());
  uint32_t rng = 12345;
  auto next = [&rng] { return rng = rng * 1664525u + 1013904223u; };
  int opened = 0;
  for (int iter = 0; iter < 500; ++iter) {
    std::string bad = good;
    const int flips = 1 + int(next() % 4);
    for (int k = 0; k < flips; ++k) {
      const size_t at = next() % std::min<size_t>(bad.size(), 8 + 160);  // mostly the header
      bad[at] = char(next() >> 24);
    }
    if (next() % 4 == 0) bad.resize(next() % bad.size());
    write_file(tmp.path(), bad);
    try {
      const SafetensorsFile st = SafetensorsFile::open(tmp.path());
      for (const TensorInfo& t : st.tensors()) {
        std::vector<float> out(size_t(t.numel()));
        to_f32(t.dtype, t.data, out.data(), t.numel());
      }
      ++opened;
    } catch (const Error&) {
    }
  }
  EXPECT_GT(opened, 0);  // some flips land in values that stay valid
}

TEST(Safetensors, MissingFile) {
  EXPECT_THROW(SafetensorsFile::open(testing::TempDir() + "/tessera_no_such_file.safetensors"),
               Error);
}

}  // namespace
}  // namespace tessera
