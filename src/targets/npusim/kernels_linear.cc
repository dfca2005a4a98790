// Worker kernels of the linear layers: the GEMV (decode projections, LM head). The GEMM
// kernel is helper-11's (mappings_gemm.cc).
#include <cstring>
#include <vector>

#include "targets/npusim/engine.h"
#include "targets/npusim/mappings.h"
#include "targets/npusim/numerics.h"
#include "targets/npusim/weight_blocks.h"

namespace tessera::npusim::detail {

namespace {

// y[rb] (fp32, the drain slot used as the accumulator) += W[rb, kc] . x[kc] per K chunk.
void gemv_bf16_kernel(WorkerContext& ctx) {
  const auto& p = ctx.params();
  const int64_t rb = p["rb"], kc = p["kc"], KC = p["k_chunks"], NB = p["blocks"];
  const bool x_once = p["x_once"];
  const int W = ctx.fifo(p["w_fifo"]), X = ctx.fifo(p["x_fifo"]), Y = ctx.fifo(p["y_fifo"]);
  const uint16_t* xs = x_once ? ctx.acquire(X).bf16() : nullptr;
  for (int64_t b = 0; b < NB; ++b) {
    float* y = ctx.acquire(Y).f32();
    std::fill_n(y, rb, 0.0f);
    for (int64_t q = 0; q < KC; ++q) {
      const uint16_t* x = x_once ? xs : ctx.acquire(X).bf16();
      const uint16_t* w = ctx.acquire(W).bf16();
      for (int64_t i = 0; i < rb; ++i) y[i] += dot_bf16(w + i * kc, x, kc);
      ctx.release(W);
      if (!x_once) ctx.release(X);
    }
    ctx.release(Y);
  }
  if (x_once) ctx.release(X);
}

// The same loop over GGML blocks (W4A16, W8A16: weight_blocks.h): the K chunk's x widened
// from bf16 once, each row's chunk of blocks unpacked and scaled block by block.
void gemv_blocks_kernel(WorkerContext& ctx) {
  const auto& p = ctx.params();
  const int64_t rb = p["rb"], kc = p["kc"], KC = p["k_chunks"], NB = p["blocks"];
  const bool x_once = p["x_once"];
  const int W = ctx.fifo(p["w_fifo"]), X = ctx.fifo(p["x_fifo"]), Y = ctx.fifo(p["y_fifo"]);
  std::vector<float> xf(static_cast<size_t>(kc));
  if (x_once) bf16_to_f32(ctx.acquire(X).bf16(), xf.data(), kc);
  for (int64_t b = 0; b < NB; ++b) {
    float* y = ctx.acquire(Y).f32();
    std::fill_n(y, rb, 0.0f);
    for (int64_t q = 0; q < KC; ++q) {
      if (!x_once) bf16_to_f32(ctx.acquire(X).bf16(), xf.data(), kc);
      const ObjectRef w = ctx.acquire(W);
      const uint8_t* blocks = w.blocks(w.type);
      const int64_t bpr = kc / block_values(w.type);  // elements (blocks, super-blocks) per row of the chunk
      const int64_t row_bytes = bpr * elem_bytes(w.type);
      for (int64_t i = 0; i < rb; ++i) y[i] += dot_blocks(w.type, blocks + i * row_bytes, xf.data(), bpr);
      ctx.release(W);
      if (!x_once) ctx.release(X);
    }
    ctx.release(Y);
  }
  if (x_once) ctx.release(X);
}

}  // namespace

void register_linear_kernels(Engine& e) {
  e.register_kernel("gemv_bf16", gemv_bf16_kernel);
  e.register_kernel("gemv_blocks", gemv_blocks_kernel);
}

}  // namespace tessera::npusim::detail
