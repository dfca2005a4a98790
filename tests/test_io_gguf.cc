// GGUF: GgufWriter/GgufFile round trip, and corrupt files refused with one line that names
// the file and the problem (crafted with the writer, then patched or truncated).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "model/weights.h"
#include "util/error.h"
#include "util/mapped_file.h"
#include "test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using Type = GgufValue::Type;

struct GgufTemp : testing_support::TempFile {
  GgufTemp() : TempFile(".gguf") {}
};
void expect_gguf_error(const std::string& path, const std::string& needle) {
  testing_support::expect_open_error([](const std::string& p) { GgufFile::open(p); }, path, needle);
}
std::vector<uint8_t> gguf_bytes(size_t n, uint8_t seed) { return testing_support::byte_pattern(n, seed, 31); }

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

template <typename T>
void patch(const std::string& path, size_t pos, T value) {
  auto b = read_bytes(path);
  ASSERT_LE(pos + sizeof(T), b.size());
  std::memcpy(b.data() + pos, &value, sizeof(T));
  write_bytes(path, b);
}

void truncate_by(const std::string& path, size_t n) {
  fs::resize_file(path, fs::file_size(path) - n);
}

// Offset of the first occurrence of `s` in the file (a key or tensor name).
size_t find_in_file(const std::string& path, const std::string& s) {
  const auto b = read_bytes(path);
  auto it = std::search(b.begin(), b.end(), s.begin(), s.end());
  EXPECT_NE(it, b.end()) << s;
  return size_t(it - b.begin());
}

// A small valid file: one string key and one F32 tensor [2, 4].
constexpr uint64_t kHeaderBytes = 24;  // magic, version, tensor count, kv count
void write_small(const std::string& path) {
  GgufWriter w(path);
  w.add_string("general.name", "tiny model");
  w.add_tensor("blk.0.attn_q.weight", DType::F32, {2, 4});
  const auto data = gguf_bytes(32, 7);
  w.write("blk.0.attn_q.weight", data.data(), data.size());
  w.close();
}

// Where the u64 data offset of the tensor named `name` (with `n_dims` dims) lies.
size_t tensor_offset_field(const std::string& path, const std::string& name, int n_dims) {
  return find_in_file(path, name) + name.size() + 4 + 8 * n_dims + 4;
}

struct TensorCase {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

TEST(Gguf, RoundTrip) {
  GgufTemp tmp;
  const std::vector<TensorCase> cases = {
      {"f32", DType::F32, {3, 5}},      {"f16", DType::F16, {7}},
      {"bf16", DType::BF16, {2, 3, 4}}, {"q8_0", DType::Q8_0, {3, 64}},
      {"q4_0", DType::Q4_0, {2, 32}},   {"q4_1", DType::Q4_1, {1, 2, 96}},
      {"empty", DType::F32, {0, 4}},
  };
  std::vector<std::vector<uint8_t>> data;
  {
    GgufWriter w(tmp.path());
    w.add_u8("k.u8", 200);
    w.add_i8("k.i8", -100);
    w.add_u16("k.u16", 60000);
    w.add_i16("k.i16", -30000);
    w.add_u32("k.u32", 4000000000u);
    w.add_i32("k.i32", -2000000000);
    w.add_f32("k.f32", 1.5f);
    w.add_bool("k.bool", true);
    w.add_string("k.string", "héllo {{ template }}");
    w.add_u64("k.u64", 1ull << 60);
    w.add_i64("k.i64", -(1ll << 50));
    w.add_f64("k.f64", 0.1);
    w.add_array("k.strings", std::vector<std::string>{"a", "", "ü", "<|im_end|>"});
    w.add_array("k.i32s", Type::I32, {-1, 0, 7, 2147483647});
    w.add_array("k.f32s", Type::F32, {0.5, -2.25});
    w.add_array("k.u8s", Type::U8, {});
    w.add_array("k.bools", Type::BOOL, {1, 0});
    w.add_u32("general.alignment", 64);
    for (size_t i = 0; i < cases.size(); ++i) {
      w.add_tensor(cases[i].name, cases[i].dtype, cases[i].shape);
      int64_t n = 1;
      for (int64_t d : cases[i].shape) n *= d;
      data.push_back(gguf_bytes(dtype_bytes(cases[i].dtype, n), uint8_t(i)));
    }
    for (size_t i = 0; i < cases.size(); ++i) {
      w.write(cases[i].name, data[i].data(), data[i].size());
    }
    w.close();
  }

  const GgufFile g = GgufFile::open(tmp.path());
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 64u);
  EXPECT_EQ(g.path(), tmp.path());
  EXPECT_EQ(g.get("k.u8").type, Type::U8);
  EXPECT_EQ(g.get("k.u8").as_int(), 200);
  EXPECT_EQ(g.get("k.i8").as_int(), -100);
  EXPECT_EQ(g.get("k.u16").as_int(), 60000);
  EXPECT_EQ(g.get("k.i16").as_int(), -30000);
  EXPECT_EQ(g.get("k.u32").as_int(), 4000000000ll);
  EXPECT_EQ(g.get("k.i32").as_int(), -2000000000);
  EXPECT_EQ(g.get("k.i32").type, Type::I32);
  EXPECT_EQ(g.get("k.f32").as_double(), 1.5);
  EXPECT_EQ(g.get("k.f32").type, Type::F32);
  EXPECT_TRUE(g.get("k.bool").as_bool());
  EXPECT_EQ(g.get("k.string").as_string(), "héllo {{ template }}");
  EXPECT_EQ(g.get("k.u64").as_int(), int64_t(1ull << 60));
  EXPECT_EQ(g.get("k.i64").as_int(), -(1ll << 50));
  EXPECT_EQ(g.get("k.f64").as_double(), 0.1);
  EXPECT_EQ(g.get("k.u32").as_double(), 4e9);
  const GgufValue& strings = g.get("k.strings");
  EXPECT_TRUE(strings.is_array());
  EXPECT_EQ(strings.elem_type, Type::STRING);
  EXPECT_EQ(strings.strings, (std::vector<std::string>{"a", "", "ü", "<|im_end|>"}));
  EXPECT_EQ(g.get("k.i32s").elem_type, Type::I32);
  EXPECT_EQ(g.get("k.i32s").numbers, (std::vector<double>{-1, 0, 7, 2147483647}));
  EXPECT_EQ(g.get("k.f32s").numbers, (std::vector<double>{0.5, -2.25}));
  EXPECT_TRUE(g.get("k.u8s").numbers.empty());
  EXPECT_EQ(g.get("k.bools").numbers, (std::vector<double>{1, 0}));
  EXPECT_EQ(g.metadata().size(), 18u);

  ASSERT_EQ(g.tensors().size(), cases.size());
  const uint8_t* base = g.tensors()[0].file->data();
  for (size_t i = 0; i < cases.size(); ++i) {
    const TensorInfo& t = g.tensors()[i];
    EXPECT_EQ(t.name, cases[i].name);
    EXPECT_EQ(t.dtype, cases[i].dtype) << t.name;
    EXPECT_EQ(t.shape, cases[i].shape) << t.name;
    ASSERT_EQ(t.nbytes, data[i].size()) << t.name;
    if (t.nbytes) {
      EXPECT_EQ(std::memcmp(t.data, data[i].data(), t.nbytes), 0) << t.name;
    }
    EXPECT_EQ(size_t(t.data - base) % 64, 0u) << t.name;
  }
}

TEST(Gguf, DimsAreStoredInnermostFirst) {
  GgufTemp tmp;
  {
    GgufWriter w(tmp.path());
    w.add_tensor("w", DType::F16, {3, 5, 7});
    const auto d = gguf_bytes(3 * 5 * 7 * 2, 0);
    w.write("w", d.data(), d.size());
    w.close();
  }
  const auto b = read_bytes(tmp.path());
  const size_t at = find_in_file(tmp.path(), "w") + 1;
  uint32_t n_dims;
  uint64_t dims[3];
  std::memcpy(&n_dims, b.data() + at, 4);
  std::memcpy(dims, b.data() + at + 4, 24);
  EXPECT_EQ(n_dims, 3u);
  EXPECT_EQ(dims[0], 7u);
  EXPECT_EQ(dims[1], 5u);
  EXPECT_EQ(dims[2], 3u);
  EXPECT_EQ(GgufFile::open(tmp.path()).tensors()[0].shape, (std::vector<int64_t>{3, 5, 7}));
}

TEST(Gguf, Version2IsRead) {
  GgufTemp tmp;
  write_small(tmp.path());
  patch<uint32_t>(tmp.path(), 4, 2);
  const GgufFile g = GgufFile::open(tmp.path());
  EXPECT_EQ(g.version(), 2u);
  EXPECT_EQ(g.get("general.name").as_string(), "tiny model");
}

TEST(Gguf, MetadataAccessErrors) {
  GgufTemp tmp;
  write_small(tmp.path());
  const GgufFile g = GgufFile::open(tmp.path());
  EXPECT_EQ(g.find("nope"), nullptr);
  try {
    g.get("llama.block_count");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing metadata key 'llama.block_count'"),
              std::string::npos);
  }
  EXPECT_THROW(g.get("general.name").as_int(), Error);
  EXPECT_THROW(g.get("general.name").as_double(), Error);
  EXPECT_THROW(g.get("general.name").as_bool(), Error);
  GgufValue big;
  big.type = Type::U64;
  big.scalar = uint64_t(1) << 63;
  EXPECT_THROW(big.as_int(), Error);
}

TEST(Gguf, WriterChecks) {
  GgufTemp tmp;
  {
    GgufWriter w(tmp.path());
    w.add_u32("a", 1);
    EXPECT_THROW(w.add_u32("a", 2), Error);                        // duplicate key
    EXPECT_THROW(w.add_array("b", Type::U8, {256}), Error);        // out of range
    EXPECT_THROW(w.add_array("b", Type::I32, {0.5}), Error);       // not integral
    EXPECT_THROW(w.add_u32("general.alignment", 48), Error);       // not a power of two
    EXPECT_THROW(w.add_u64("general.alignment", 64), Error);       // not a u32
    EXPECT_THROW(w.add_tensor("q", DType::Q4_0, {2, 16}), Error);  // partial block
    w.add_tensor("t", DType::F32, {2});
    EXPECT_THROW(w.add_tensor("t", DType::F32, {2}), Error);  // duplicate tensor
    const float v[2] = {1, 2};
    EXPECT_THROW(w.write("t", v, 4), Error);  // wrong size
    w.write("t", v, 8);
    EXPECT_THROW(w.add_u8("late", 1), Error);  // header already on disk
    w.close();
  }
  EXPECT_TRUE(fs::exists(tmp.path()));
  EXPECT_EQ(GgufFile::open(tmp.path()).metadata().size(), 1u);
  {
    GgufWriter w(tmp.path());
    w.add_tensor("t", DType::F32, {2});
    EXPECT_THROW(w.close(), Error);  // "t" not written
  }
  EXPECT_FALSE(fs::exists(tmp.path()));  // no partial file left behind
}

TEST(Gguf, WritesTensorsInParts) {
  GgufTemp tmp;
  const auto bytes = gguf_bytes(68 + 6, 9);
  {
    GgufWriter w(tmp.path());
    w.add_tensor("q", DType::Q8_0, {2, 32});
    w.add_tensor("h", DType::F16, {3});
    w.write_part("q", bytes.data(), 34);  // one row at a time
    EXPECT_THROW(w.write("q", bytes.data(), 68), Error);
    EXPECT_THROW(w.write_part("q", bytes.data(), 35), Error);
    w.write_part("q", bytes.data() + 34, 34);
    w.write("h", bytes.data() + 68, 6);
    w.close();
  }
  const GgufFile g = GgufFile::open(tmp.path());
  ASSERT_EQ(g.tensors().size(), 2u);
  EXPECT_EQ(std::memcmp(g.tensors()[0].data, bytes.data(), 68), 0);
  EXPECT_EQ(std::memcmp(g.tensors()[1].data, bytes.data() + 68, 6), 0);
}

TEST(Gguf, CopiesMetadataValues) {
  GgufTemp src, dst;
  {
    GgufWriter w(src.path());
    w.add_i16("x", -7);
    w.add_array("v", std::vector<std::string>{"p", "q"});
    w.add_array("n", Type::F32, {1.25});
    w.close();
  }
  const GgufFile a = GgufFile::open(src.path());
  {
    GgufWriter w(dst.path());
    for (const auto& [k, v] : a.metadata()) w.add(k, v);
    w.close();
  }
  EXPECT_EQ(read_bytes(dst.path()).size(), read_bytes(src.path()).size());
  const GgufFile b = GgufFile::open(dst.path());
  EXPECT_EQ(b.get("x").type, Type::I16);
  EXPECT_EQ(b.get("x").as_int(), -7);
  EXPECT_EQ(b.get("v").strings, (std::vector<std::string>{"p", "q"}));
  EXPECT_EQ(b.get("n").elem_type, Type::F32);
  EXPECT_EQ(b.get("n").numbers, (std::vector<double>{1.25}));
}

TEST(Gguf, WrongMagic) {
  GgufTemp tmp;
  write_small(tmp.path());
  patch<uint32_t>(tmp.path(), 0, 0x46554747u + 0x01000000u);  // "GGUG"
  expect_gguf_error(tmp.path(), "not a GGUF file (starts with 'GGUG'");
  write_bytes(tmp.path(), {'G', 'G'});
  expect_gguf_error(tmp.path(), "too short");
  write_bytes(tmp.path(), {});
  expect_gguf_error(tmp.path(), "too short");
}

TEST(Gguf, UnsupportedVersion) {
  GgufTemp tmp;
  write_small(tmp.path());
  patch<uint32_t>(tmp.path(), 4, 1);
  expect_gguf_error(tmp.path(), "unsupported GGUF version 1");
  patch<uint32_t>(tmp.path(), 4, 4);
  expect_gguf_error(tmp.path(), "unsupported GGUF version 4");
  patch<uint32_t>(tmp.path(), 4, 0x03000000u);
  expect_gguf_error(tmp.path(), "big-endian");
}

TEST(Gguf, CountsLargerThanTheFile) {
  GgufTemp tmp;
  write_small(tmp.path());
  patch<uint64_t>(tmp.path(), 8, 1000000);
  expect_gguf_error(tmp.path(), "tensor count 1000000 is larger than the file could hold");
  patch<uint64_t>(tmp.path(), 8, ~uint64_t(0));
  expect_gguf_error(tmp.path(), "tensor count");
  write_small(tmp.path());
  patch<uint64_t>(tmp.path(), 16, uint64_t(1) << 62);
  expect_gguf_error(tmp.path(), "metadata count");
}

TEST(Gguf, HeaderTruncated) {
  GgufTemp tmp;
  write_bytes(tmp.path(), {'G', 'G', 'U', 'F', 3, 0, 0, 0, 1, 0});
  expect_gguf_error(tmp.path(), "runs past the end of the file");
}

TEST(Gguf, TruncatedString) {
  GgufTemp tmp;
  {
    GgufWriter w(tmp.path());
    w.add_string("general.name", "a name that the file will not finish");
    w.close();
  }
  truncate_by(tmp.path(), 10);
  expect_gguf_error(tmp.path(), "metadata 'general.name' runs past the end of the file");

  // A string length far beyond the file.
  {
    GgufWriter w(tmp.path());
    w.add_string("general.name", "short");
    w.close();
  }
  const size_t len_at = find_in_file(tmp.path(), "general.name") + 12 + 4;
  patch<uint64_t>(tmp.path(), len_at, uint64_t(1) << 60);
  expect_gguf_error(tmp.path(), "metadata 'general.name' runs past the end of the file");

  // A key length far beyond the file.
  patch<uint64_t>(tmp.path(), kHeaderBytes, uint64_t(1) << 40);
  expect_gguf_error(tmp.path(), "metadata key 0");
}

TEST(Gguf, AbsurdArrayCount) {
  GgufTemp tmp;
  {
    GgufWriter w(tmp.path());
    w.add_array("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b"});
    w.close();
  }
  const size_t count_at = find_in_file(tmp.path(), "tokenizer.ggml.tokens") + 21 + 4 + 4;
  patch<uint64_t>(tmp.path(), count_at, uint64_t(1) << 61);
  expect_gguf_error(tmp.path(), "claims 2305843009213693952 array elements");
  // Nested arrays are refused by name.
  patch<uint32_t>(tmp.path(), count_at - 4, 9);
  expect_gguf_error(tmp.path(), "nested array");
  patch<uint32_t>(tmp.path(), count_at - 4, 77);
  expect_gguf_error(tmp.path(), "array of unknown value type 77");
}

TEST(Gguf, UnknownValueType) {
  GgufTemp tmp;
  write_small(tmp.path());
  patch<uint32_t>(tmp.path(), find_in_file(tmp.path(), "general.name") + 12, 13);
  expect_gguf_error(tmp.path(), "metadata 'general.name' has unknown value type 13");
}

TEST(Gguf, TensorDataPastTheEnd) {
  GgufTemp tmp;
  write_small(tmp.path());
  truncate_by(tmp.path(), 1);
  expect_gguf_error(tmp.path(),
                    "tensor 'blk.0.attn_q.weight' data (offset 0, 32 bytes) runs past "
                    "the end of the file");

  write_small(tmp.path());
  patch<uint64_t>(tmp.path(), tensor_offset_field(tmp.path(), "blk.0.attn_q.weight", 2),
                  uint64_t(1) << 20);
  expect_gguf_error(tmp.path(), "runs past the end of the file");
  // Large enough to wrap around if offset + size were computed naively.
  patch<uint64_t>(tmp.path(), tensor_offset_field(tmp.path(), "blk.0.attn_q.weight", 2),
                  ~uint64_t(31));
  expect_gguf_error(tmp.path(), "runs past the end of the file");
}

TEST(Gguf, UnalignedTensorOffset) {
  GgufTemp tmp;
  write_small(tmp.path());
  patch<uint64_t>(tmp.path(), tensor_offset_field(tmp.path(), "blk.0.attn_q.weight", 2), 4);
  expect_gguf_error(tmp.path(), "offset 4 is not a multiple of the alignment 32");
}

TEST(Gguf, KQuantTensorsAreRead) {
  GgufTemp tmp;
  {
    GgufWriter w(tmp.path());
    w.add_tensor_raw("blk.0.ffn_down.weight", 12, {2, 256}, 288);  // q4_K: 2 super blocks of 144 bytes
    const auto d = gguf_bytes(288, 0);
    w.write("blk.0.ffn_down.weight", d.data(), d.size());
    w.close();
  }
  const GgufFile g = GgufFile::open(tmp.path());
  ASSERT_EQ(g.tensors().size(), 1u);
  EXPECT_EQ(g.tensors()[0].dtype, DType::Q4_K);
  EXPECT_EQ(g.tensors()[0].nbytes, 288u);
  EXPECT_TRUE(g.unsupported().empty());
}

// A tensor type tessera does not read is left out and listed, not refused at open: the model
// loader refuses it by name after the architecture check.
TEST(Gguf, UnsupportedTensorTypeIsListed) {
  GgufTemp tmp;
  {
    GgufWriter w(tmp.path());
    w.add_tensor_raw("blk.0.ffn_down.weight", 16, {2, 256}, 132);  // iq2_xxs
    w.add_tensor_raw("x", 999, {4}, 4);
    w.add_tensor_raw("y", 0, {2}, 8);
    const auto d = gguf_bytes(132, 0);
    w.write("blk.0.ffn_down.weight", d.data(), d.size());
    w.write("x", "abcd", 4);
    const float y[2] = {1.5f, -2.0f};
    w.write("y", y, sizeof(y));
    w.close();
  }
  const GgufFile g = GgufFile::open(tmp.path());
  ASSERT_EQ(g.tensors().size(), 1u);
  EXPECT_EQ(g.tensors()[0].name, "y");
  ASSERT_EQ(g.unsupported().size(), 2u);
  const std::string a = GgufFile::describe(g.unsupported()[0]), b = GgufFile::describe(g.unsupported()[1]);
  EXPECT_NE(a.find("tensor 'blk.0.ffn_down.weight' has tensor type 16 (iq2_xxs), which tessera does not read (it "
                   "reads f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K"),
            std::string::npos)
      << a;
  EXPECT_NE(b.find("tensor 'x' has unknown tensor type 999,"), std::string::npos) << b;
}

// An unsupported architecture is named before a tensor type tessera does not read.
TEST(Gguf, UnsupportedArchitectureIsNamedBeforeAnUnsupportedTensorType) {
  GgufTemp tmp;
  {
    GgufWriter w(tmp.path());
    w.add_string("general.architecture", "gpt2");
    w.add_tensor_raw("blk.0.ffn_down.weight", 16, {2, 256}, 132);  // iq2_xxs
    const auto d = gguf_bytes(132, 0);
    w.write("blk.0.ffn_down.weight", d.data(), d.size());
    w.close();
  }
  testing_support::expect_open_error([](const std::string& p) { Model::open(p); }, tmp.path(),
                                     "unsupported architecture: GGUF general.architecture 'gpt2'");
}

TEST(Gguf, PartialQuantBlock) {
  GgufTemp tmp;
  {
    GgufWriter w(tmp.path());
    w.add_tensor_raw("q", 8, {2, 16}, 68);  // q8_0 with rows of 16 values
    const auto d = gguf_bytes(68, 0);
    w.write("q", d.data(), d.size());
    w.close();
  }
  expect_gguf_error(tmp.path(), "inner dimension 16, not a multiple of its block size 32");
}

TEST(Gguf, TooManyDimensions) {
  GgufTemp tmp;
  {
    GgufWriter w(tmp.path());
    w.add_tensor_raw("x", 0, {1, 1, 1, 1, 1}, 4);
    w.write("x", "abcd", 4);
    w.close();
  }
  expect_gguf_error(tmp.path(), "5 dimensions");
}

TEST(Gguf, OverlappingTensors) {
  GgufTemp tmp;
  {
    GgufWriter w(tmp.path());
    w.add_tensor("a", DType::F32, {16});
    w.add_tensor("b", DType::F32, {8});
    const auto d = gguf_bytes(64, 0);
    w.write("a", d.data(), 64);
    w.write("b", d.data(), 32);
    w.close();
  }
  patch<uint64_t>(tmp.path(), tensor_offset_field(tmp.path(), "b", 1), 32);
  expect_gguf_error(tmp.path(), "tensors 'a' and 'b' overlap");
}

TEST(Gguf, BadAlignment) {
  GgufTemp tmp;
  {
    GgufWriter w(tmp.path());
    w.add_u32("general.alignment", 64);
    w.close();
  }
  const size_t at = find_in_file(tmp.path(), "general.alignment") + 17 + 4;
  patch<uint32_t>(tmp.path(), at, 48);
  expect_gguf_error(tmp.path(), "general.alignment must be a power of two");
  patch<uint32_t>(tmp.path(), at, 0);
  expect_gguf_error(tmp.path(), "general.alignment must be a power of two");
}

TEST(Gguf, DuplicateNames) {
  GgufTemp tmp;
  {
    GgufWriter w(tmp.path());
    w.add_u8("aa", 1);
    w.add_u8("ab", 2);
    w.add_tensor("t1", DType::F32, {1});
    w.add_tensor("t2", DType::F32, {1});
    w.write("t1", "abcd", 4);
    w.write("t2", "abcd", 4);
    w.close();
  }
  patch<uint8_t>(tmp.path(), find_in_file(tmp.path(), "ab") + 1, 'a');
  expect_gguf_error(tmp.path(), "metadata key 'aa' appears twice");
}

// Random byte flips and truncations of a valid file: each one opens or is refused with a
// tessera::Error, never a crash (run under ASan/UBSan to catch stray reads).
TEST(Gguf, SurvivesRandomCorruption) {
  GgufTemp tmp;
  {
    GgufWriter w(tmp.path());
    w.add_string("general.name", "fuzz");
    w.add_array("tokenizer.ggml.tokens", std::vector<std::string>{"a", "bc", "def"});
    w.add_array("tokenizer.ggml.scores", Type::F32, {0.5, 1, 2});
    w.add_u32("llama.block_count", 2);
    w.add_tensor("q", DType::Q4_1, {2, 32});
    w.add_tensor("f", DType::F16, {3});
    const auto d = gguf_bytes(40, 3);
    w.write("q", d.data(), 40);
    w.write("f", d.data(), 6);
    w.close();
  }
  const auto good = read_bytes(tmp.path());
  uint32_t rng = 777;
  auto next = [&rng] { return rng = rng * 1664525u + 1013904223u; };
  int opened = 0;
  for (int iter = 0; iter < 800; ++iter) {
    auto bad = good;
    const int flips = 1 + int(next() % 4);
    for (int k = 0; k < flips; ++k) {
      const size_t at = next() % bad.size();
      // Often a high byte of a length or count; otherwise any bits.
      bad[at] = iter % 3 == 0 ? uint8_t(0xFF) : uint8_t(next() >> 24);
    }
    if (next() % 4 == 0) bad.resize(next() % bad.size());
    write_bytes(tmp.path(), bad);
    try {
      const GgufFile g = GgufFile::open(tmp.path());
      for (const TensorInfo& t : g.tensors()) {
        std::vector<float> out(size_t(t.numel()));
        to_f32(t.dtype, t.data, out.data(), t.numel());
      }
      ++opened;
    } catch (const Error&) {
    }
  }
  EXPECT_GT(opened, 0);
}

// The shipped default model, when present: a real Q4_1 file from llama.cpp's converter.
TEST(Gguf, OpensSmolLM2WhenPresent) {
  const std::string path =
      std::string(TESSERA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path << " not present";
  const GgufFile g = GgufFile::open(path);
  EXPECT_EQ(g.get("general.architecture").as_string(), "llama");
  EXPECT_EQ(g.get("llama.embedding_length").as_int(), 576);
  EXPECT_EQ(g.get("tokenizer.ggml.tokens").strings.size(), 49152u);
  const TensorInfo* emb = nullptr;
  for (const TensorInfo& t : g.tensors()) {
    if (t.name == "token_embd.weight") emb = &t;
  }
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{49152, 576}));
  std::vector<float> row(576);
  to_f32(emb->dtype, emb->data, row.data(), 576);
  for (float v : row) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace tessera
