#include "targets/bf16_weights.h"

#include "model/weights.h"
#include "util/error.h"
#include "util/half.h"

namespace tessera {

const Bf16Matrix& Bf16WeightStore::load(const Weight& w) {
  if (auto it = matrices_.find(w.name); it != matrices_.end()) return it->second;
  Bf16Matrix m;
  m.rows = w.rows();
  m.cols = w.cols();
  if (w.info.dtype == DType::BF16 && w.unpermute_head_dim == 0) {
    // Already what the kernels read: use the file's pages, no copy.
    m.data = reinterpret_cast<const uint16_t*>(w.info.data);
    mapped_bytes_ += m.bytes();
  } else {
    owned_.emplace_back(size_t(m.rows * m.cols));
    uint16_t* dst = owned_.back().data();
    auto convert = [&](int64_t r0, int64_t r1) {
      std::vector<float> row(size_t(m.cols));
      for (int64_t r = r0; r < r1; ++r) {
        w.row_f32(r, row.data());
        for (int64_t c = 0; c < m.cols; ++c) dst[r * m.cols + c] = f32_to_bf16(row[size_t(c)]);
      }
    };
    if (parallel_for_) parallel_for_(m.rows, convert);
    else convert(0, m.rows);
    m.data = dst;
    owned_bytes_ += m.bytes();
  }
  return matrices_[w.name] = m;
}

const Bf16Matrix& Bf16WeightStore::get(const std::string& name) const {
  auto it = matrices_.find(name);
  if (it == matrices_.end()) fail("no bf16 matrix '{}' was loaded", name);
  return it->second;
}

}  // namespace tessera
