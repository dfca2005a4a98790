// BF16 weights as the targets' kernels read them: a matrix view, and a store that maps a
// checkpoint's BF16 tensors in place (no copy: the file's pages) and converts anything else
// (quantized, fp16/fp32, or permuted on disk) to BF16 once, rounding to nearest even.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tessera {

class Weight;

// A row-major [rows, cols] BF16 matrix (a Linear weight is [out, in]).
struct Bf16Matrix {
  const uint16_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t bytes() const { return rows * cols * 2; }
};

class Bf16WeightStore {
 public:
  // How conversion runs its rows in parallel: fn(n, body(begin, end)); empty: serially.
  using ParallelFor = std::function<void(int64_t, const std::function<void(int64_t, int64_t)>&)>;
  explicit Bf16WeightStore(ParallelFor parallel_for = {}) : parallel_for_(std::move(parallel_for)) {}

  const Bf16Matrix& load(const Weight& w);              // maps or converts, once per name
  const Bf16Matrix& get(const std::string& name) const;  // throws naming the weight
  int64_t mapped_bytes() const { return mapped_bytes_; }
  int64_t owned_bytes() const { return owned_bytes_; }

 private:
  ParallelFor parallel_for_;
  std::map<std::string, Bf16Matrix> matrices_;
  std::vector<std::vector<uint16_t>> owned_;
  int64_t mapped_bytes_ = 0, owned_bytes_ = 0;
};

}  // namespace tessera
