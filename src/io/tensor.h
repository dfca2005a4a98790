// Tensor descriptions shared by the file readers: dtype, shape, and where the bytes lie.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera {

class MappedFile;

// Storage types tessera reads. Quantized types are GGML block formats: 32 values a block
// (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL), or 256 (the K-quants Q2_K..Q6_K, IQ4_XS: a super
// block of 16- or 32-value sub-blocks with their own quantized scales).
enum class DType : uint8_t { F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS };

const char* dtype_name(DType t);
// Values per block (1 for plain types) and bytes per block.
int64_t dtype_block_values(DType t);
int64_t dtype_block_bytes(DType t);
// Bytes holding `n` consecutive values; throws if n is not a whole number of blocks.
uint64_t dtype_bytes(DType t, int64_t n);

// One tensor inside a mapped file. `shape` is outermost first (PyTorch / Hugging Face
// order: a Linear weight is [out_features, in_features]), whatever order the file used.
struct TensorInfo {
  std::string name;  // name as stored in the file
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into `file`'s mapping
  uint64_t nbytes = 0;
  std::shared_ptr<const MappedFile> file;  // keeps the mapping alive

  int64_t numel() const;
  int64_t rows() const { return shape.size() >= 2 ? numel() / shape.back() : 1; }
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  std::string shape_str() const;  // "[576, 1536]"
};

// Convert `n` values starting at `src` (which must begin on a block boundary) to fp32.
void to_f32(DType t, const uint8_t* src, float* dst, int64_t n);

}  // namespace tessera
