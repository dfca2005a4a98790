#include "targets/npusim/npusim_weights.h"

#include <fmt/format.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "model/weights.h"
#include "util/error.h"

namespace tessera::npusim {

namespace {

// The array's block types, by the file's dtype.
std::optional<ElemType> block_type(DType t) {
  switch (t) {
    case DType::Q4_0: return ElemType::Q4_0;
    case DType::Q8_0: return ElemType::Q8_0;
    case DType::Q4_1: return ElemType::Q4_1;
    case DType::Q5_0: return ElemType::Q5_0;
    case DType::Q5_1: return ElemType::Q5_1;
    case DType::Q4_K: return ElemType::Q4_K;
    case DType::Q5_K: return ElemType::Q5_K;
    case DType::Q6_K: return ElemType::Q6_K;
    default: return std::nullopt;
  }
}

}  // namespace

NpuWeightStore::NpuWeightStore(Bf16WeightStore::ParallelFor parallel_for) : bf16_(std::move(parallel_for)) {}
NpuWeightStore::~NpuWeightStore() = default;

void NpuWeightStore::load(const std::map<std::string, std::vector<const Weight*>>& by_buffer, const Weight& embedding) {
  for (const auto& [buffer, ws] : by_buffer) {
    if (ws.empty()) fail("npusim weights: buffer {} has no matrix", buffer);
    const DType t0 = ws[0]->info.dtype;
    bool uniform = true;
    for (const Weight* w : ws) uniform &= w->info.dtype == t0;
    const std::optional<ElemType> bt = block_type(t0);
    if (bt && uniform) {
      formats_.by_buffer[buffer] = *bt;
      why_[buffer] = fmt::format("{} blocks as in the file", dtype_name(t0));
      for (const Weight* w : ws) {
        BlockMatrix m{*bt, nullptr, w->rows(), w->cols()};
        if (m.cols % block_values(*bt)) fail("npusim weights: {} has {} columns, not whole blocks", w->name, m.cols);
        if (w->unpermute_head_dim == 0) {
          m.data = w->info.data;  // the file's pages
          mapped_block_bytes_ += m.bytes();
        } else {
          // GGUF llama q/k: rows stored permuted; the same blocks in Hugging Face row order.
          const int64_t row_bytes = m.bytes() / m.rows;
          copies_.emplace_back(size_t(m.bytes()));
          uint8_t* dst = copies_.back().data();
          for (int64_t r = 0; r < m.rows; ++r)
            std::memcpy(dst + r * row_bytes, w->info.data + w->source_row(r) * row_bytes, size_t(row_bytes));
          m.data = dst;
          copied_block_bytes_ += m.bytes();
        }
        blocks_[w->name] = m;
      }
      continue;
    }
    // bf16 on the array: the file's own bf16, or converted once (said why).
    if (!uniform) {
      std::string types;
      for (const Weight* w : ws) types += (types.empty() ? "" : ", ") + std::string(dtype_name(w->info.dtype));
      why_[buffer] = fmt::format("bf16, converted at load: its layers hold different formats ({}) and a layer's "
                                 "dispatches run one format in every layer",
                                 types);
    } else if (t0 == DType::BF16) {
      why_[buffer] = "bf16 as in the file";
    } else {
      why_[buffer] = fmt::format("bf16, converted at load from {}: the array runs Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K blocks only", dtype_name(t0));
    }
    for (const Weight* w : ws) bf16_.load(*w);
  }
  bf16_.load(embedding);  // gathered as bf16 rows
  why_["w.embed"] = embedding.info.dtype == DType::BF16
                        ? "bf16 as in the file"
                        : fmt::format("bf16, converted at load from {}: the embedding gathers bf16 rows",
                                      dtype_name(embedding.info.dtype));
}

const BlockMatrix& NpuWeightStore::blocks(const std::string& name) const {
  auto it = blocks_.find(name);
  if (it == blocks_.end()) fail("npusim weights: '{}' is not held in blocks", name);
  return it->second;
}

DdrTensor NpuWeightStore::view(const std::string& name) const {
  if (auto it = blocks_.find(name); it != blocks_.end())
    return DdrTensor::blocks(it->second.type, it->second.data, it->second.blocks());
  const Bf16Matrix& m = bf16_.get(name);
  return DdrTensor::bf16(const_cast<uint16_t*>(m.data), m.rows * m.cols);
}

int64_t NpuWeightStore::rows(const std::string& name) const {
  if (auto it = blocks_.find(name); it != blocks_.end()) return it->second.rows;
  return bf16_.get(name).rows;
}

int64_t NpuWeightStore::cols(const std::string& name) const {
  if (auto it = blocks_.find(name); it != blocks_.end()) return it->second.cols;
  return bf16_.get(name).cols;
}

int64_t NpuWeightStore::bytes(const std::string& name) const {
  if (auto it = blocks_.find(name); it != blocks_.end()) return it->second.bytes();
  return bf16_.get(name).bytes();
}

nlohmann::json NpuWeightStore::to_json() const {
  nlohmann::json held = nlohmann::json::object();
  for (const auto& [buffer, why] : why_) held[buffer] = why;
  return {{"formats", formats_.to_json()},
          {"held", held},
          {"block_bytes_mapped", mapped_block_bytes_},
          {"block_bytes_copied", copied_block_bytes_},
          {"bf16_mapped_bytes", bf16_.mapped_bytes()},
          {"bf16_converted_bytes", bf16_.owned_bytes()}};
}

}  // namespace tessera::npusim
