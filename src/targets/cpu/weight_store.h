// The cpu target's weights: what each matrix is as the kernels read it, loaded once.
//  - BF16 in Hugging Face row order: the file's pages, mapped (no copy);
//  - Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: re-laid as x16 tiles (cpu/quant.h), the same
//    bytes per block (Q4_K: 2.8% more), and the file's pages released once copied, so
//    memory stays about the file's size;
//  - anything else (F32, F16, the other block formats, or permuted on disk): converted to
//    bf16 once (Bf16WeightStore).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "targets/bf16_weights.h"
#include "targets/cpu/kernels.h"

namespace tessera {

class CpuWeightStore {
 public:
  explicit CpuWeightStore(Bf16WeightStore::ParallelFor parallel_for = {});
  ~CpuWeightStore();

  // Sizes one arena for the tiles of every weight in `ws` that load() will tile, before the
  // first load (optional): the tiles then fill one region whose last, partly used 2 MiB page
  // stays on 4 KiB pages, instead of 64 MiB arenas each ending in a partly used huge page
  // (resident whole). Loads beyond it open 64 MiB arenas as before.
  void reserve(const std::vector<const Weight*>& ws);
  const cpu::WeightMatrix& load(const Weight& w);              // once per name
  const cpu::WeightMatrix& get(const std::string& name) const;  // throws naming the weight
  int64_t mapped_bytes() const { return bf16_.mapped_bytes(); }
  int64_t converted_bytes() const { return bf16_.owned_bytes(); }  // bf16 copies
  int64_t tiled_bytes() const { return tiled_bytes_; }           // x16 tiles (the file's blocks)
  int64_t arena_bytes() const;  // mapped for the tiles (resident only as far as filled)
  // How each loaded matrix is held, counted: "Q4_1 x16 tiles" -> 210, "bf16 mapped" -> ...
  std::map<std::string, int64_t> formats() const;

 private:
  Bf16WeightStore::ParallelFor parallel_for_;
  Bf16WeightStore bf16_;
  std::map<std::string, cpu::WeightMatrix> matrices_;
  std::map<std::string, std::string> format_;  // by name
  uint8_t* allocate(int64_t bytes);  // 64-byte aligned, in the current arena
  void open_arena(size_t bytes);     // a fresh mapping, 2 MiB aligned, huge pages where whole
  struct Arena {
    uint8_t* p;
    size_t size;
  };
  std::vector<Arena> arenas_;
  uint8_t* arena_next_ = nullptr;
  size_t arena_left_ = 0;
  int64_t tiled_bytes_ = 0;
};

}  // namespace tessera
