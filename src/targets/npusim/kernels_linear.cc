// Worker kernels of the linear layers: the GEMV (decode projections, LM head). The GEMM
// kernel is helper-11's (mappings_gemm.cc).
#include <cstring>

#include "targets/npusim/engine.h"
#include "targets/npusim/mappings.h"
#include "targets/npusim/numerics.h"

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

}  // namespace

void register_linear_kernels(Engine& e) { e.register_kernel("gemv_bf16", gemv_bf16_kernel); }

}  // namespace tessera::npusim::detail
