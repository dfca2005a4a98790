// npusim GEMM mapping: C[M, N] = A[M, K] . B, B given as [K, N] row-major or, for a Linear
// weight, as [N, K] (b_nk). The herd's rows and columns take the M and N tiles (m_on_rows
// chooses which); A tiles are broadcast through one memory tile per M group to the workers
// of that group, B tiles likewise per N group, and each column's C tiles are joined in its
// memory tile and drained to DDR. Each worker loops over its output tiles: zero C, then for
// every k block acquire A and B, multiply-accumulate in fp32, add into C (bf16: rounded on
// every k block, as the device's matmul kernels store C between calls), release.
// The first mapping generator; the other kernel classes live in mappings_*.h.
#pragma once
#include <cstdint>
#include <string>

#include "targets/npusim/device.h"
#include "targets/npusim/spatial.h"

namespace tessera::npusim {

class Engine;

struct GemmShape {
  int64_t M = 0, K = 0, N = 0;
};
struct GemmTiles {
  int64_t m = 64, k = 32, n = 64;
  int64_t k_l2 = 0;  // K per L2 object (a multiple of k); 0: k
};
struct GemmHerd {
  int cols = 8, rows = 4;
  bool m_on_rows = true;  // herd rows take M tiles, columns N tiles (false: the other way round)
};
struct GemmOptions {
  std::string name = "gemm";
  ElemType c_type = ElemType::BF16;
  bool b_nk = false;  // B is [N, K] (a Linear weight), read as n x k tiles
  // B's element type: a GGML block type (weight_blocks.h) moves B as [N, K/32]
  // blocks, n rows x k/32 blocks per L1 object (k a multiple of 32), and the workers run
  // gemm_blocks: per 32-deep block, A times the block's integers on the bf16 mmul, the fp32
  // product scaled per output column by the block's scale, then added into C.
  ElemType b_type = ElemType::BF16;
  int depth = 2;      // L1 ring depth of A, B and C
  std::string a = "A", b = "B", c = "C";  // DDR tensor names
};

// Throws tessera::Error if the shape is not a whole number of herd tiles or the herd does
// not fit the device's columns and rows (the checker then judges memories and DMA).
Launch gemm_launch(const GemmShape& shape, const GemmTiles& tiles, const GemmHerd& herd, const Device& device,
                   const GemmOptions& opt = {});
// Registers the kernels the GEMM workers run ("gemm_bf16", "gemm_blocks").
void register_gemm_kernels(Engine& engine);

}  // namespace tessera::npusim
