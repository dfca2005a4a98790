// npusim's weights as its DDR holds them. Each weight buffer of the lowering ("w.q" ...
// "w.down", "w.lm_head") runs on the array in the file's GGML blocks (W4A16 ... W8A16: Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0, and the K-quants' super-blocks Q4_K, Q5_K, Q6_K, weight_blocks.h)
// when every layer's matrix of it has that one format: the layer's
// dispatches are lowered once, so a buffer has one format in every layer. Blocks are the
// file's pages, mapped (GGUF llama q/k rows, stored permuted, are copied once in Hugging Face
// row order: the same blocks). Anything else (bf16, f16/f32, other block formats, a role
// whose layers differ) is bf16, mapped or converted once (Bf16WeightStore), and the reason is
// recorded for plan.json. The embedding table is gathered as bf16 rows (converted from a
// block file at load): its drain is bf16 either way.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "targets/bf16_weights.h"
#include "targets/npusim/engine.h"
#include "targets/npusim/program.h"

namespace tessera {
class Weight;
}

namespace tessera::npusim {

// A [rows, cols] matrix as GGML blocks, row-major: each row cols / 32 blocks (cols / 256 super-blocks).
struct BlockMatrix {
  ElemType type = ElemType::Q4_0;
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t blocks() const { return rows * (cols / block_values(type)); }
  int64_t bytes() const { return blocks() * elem_bytes(type); }
};

class NpuWeightStore {
 public:
  explicit NpuWeightStore(Bf16WeightStore::ParallelFor parallel_for = {});
  ~NpuWeightStore();

  // `by_buffer`: each weight buffer's matrices, one per layer ("w.lm_head": one); `embedding`
  // the table the embedding gathers. Decides every buffer's format, then loads.
  void load(const std::map<std::string, std::vector<const Weight*>>& by_buffer, const Weight& embedding);

  const WeightFormats& formats() const { return formats_; }
  // The matrix `name` (a canonical weight name) as the device reads it: blocks or bf16.
  DdrTensor view(const std::string& name) const;
  bool in_blocks(const std::string& name) const { return blocks_.count(name) > 0; }
  int64_t rows(const std::string& name) const;
  int64_t cols(const std::string& name) const;
  int64_t bytes(const std::string& name) const;  // as held in DDR
  const Bf16Matrix& bf16(const std::string& name) const { return bf16_.get(name); }  // bf16-held ones and the table
  const BlockMatrix& blocks(const std::string& name) const;                            // throws unless in blocks
  // plan.json's "weights": per buffer its format and why, and the bytes held each way.
  nlohmann::json to_json() const;

 private:
  Bf16WeightStore bf16_;
  WeightFormats formats_;
  std::map<std::string, std::string> why_;  // buffer -> how it is held and why
  std::map<std::string, BlockMatrix> blocks_;
  std::vector<std::vector<uint8_t>> copies_;  // blocks re-ordered into Hugging Face rows
  int64_t mapped_block_bytes_ = 0, copied_block_bytes_ = 0;
};

}  // namespace tessera::npusim
