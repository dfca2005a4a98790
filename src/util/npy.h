// NumPy .npy files (format 1.0, little-endian float32, C order): how tessera hands tensors
// to any other tool, and how test fixtures come back in.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
// Reads a float32 C-order .npy; throws tessera::Error on anything else.
NpyArray read_npy(const std::string& path);

}  // namespace tessera
