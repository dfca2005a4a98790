// Worker kernels of the row and element-wise ops: RMSNorm, softmax, bias add, SiLU x mul,
// residual add, RoPE, and the embedding's row copy. Numerics as numerics.h describes the
// aie2p kernels: bf16 operands, fp32 accumulation, bf16 rounding where a result leaves.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "targets/npusim/engine.h"
#include "targets/npusim/mappings.h"
#include "targets/npusim/numerics.h"

namespace tessera::npusim::detail {

namespace {

using tessera::bf16_to_f32;
using tessera::f32_to_bf16;

// RMSNorm (rms_norm.cc): sum of squares in fp32, invsqrt, the inverse RMS rounded to bf16,
// then bf16(bf16(x * inv) * g).
void rmsnorm_kernel(WorkerContext& ctx) {
  const auto& p = ctx.params();
  const int64_t rt = p["rt"], n = p["n"], NB = p["blocks"];
  const float eps = float(p["eps"].get<double>());
  const int X = ctx.fifo(p["x_fifo"]), G = ctx.fifo(p["g_fifo"]), Y = ctx.fifo(p["y_fifo"]);
  const uint16_t* g = ctx.acquire(G).bf16();
  for (int64_t b = 0; b < NB; ++b) {
    const uint16_t* x = ctx.acquire(X).bf16();
    uint16_t* y = ctx.acquire(Y).bf16();
    for (int64_t r = 0; r < rt; ++r) {
      const uint16_t* xr = x + r * n;
      const float ss = dot_bf16(xr, xr, n);
      const float inv = round_bf16(rsqrt_approx(ss / float(n) + eps));
      for (int64_t i = 0; i < n; ++i)
        y[r * n + i] = f32_to_bf16(round_bf16(bf16_to_f32(xr[i]) * inv) * bf16_to_f32(g[i]));
    }
    ctx.release(X);
    ctx.release(Y);
  }
  ctx.release(G);
}

// Softmax (softmax.cc): row max, e = exp_bf16(x - max), sum in fp32, y = bf16(e / sum).
void softmax_kernel(WorkerContext& ctx) {
  const auto& p = ctx.params();
  const int64_t rt = p["rt"], n = p["n"], NB = p["blocks"];
  const int X = ctx.fifo(p["x_fifo"]), Y = ctx.fifo(p["y_fifo"]);
  for (int64_t b = 0; b < NB; ++b) {
    const uint16_t* x = ctx.acquire(X).bf16();
    uint16_t* y = ctx.acquire(Y).bf16();
    for (int64_t r = 0; r < rt; ++r) {
      const uint16_t* xr = x + r * n;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < n; ++i) mx = std::max(mx, bf16_to_f32(xr[i]));
      float sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float e = exp_bf16(bf16_to_f32(xr[i]) - mx);
        y[r * n + i] = f32_to_bf16(e);
        sum += e;
      }
      const float inv = 1.0f / sum;
      for (int64_t i = 0; i < n; ++i) y[r * n + i] = f32_to_bf16(bf16_to_f32(y[r * n + i]) * inv);
    }
    ctx.release(X);
    ctx.release(Y);
  }
}

// y = x + bias (fp32 rows, bf16 bias).
void bias_add_kernel(WorkerContext& ctx) {
  const auto& p = ctx.params();
  const int64_t rt = p["rt"], n = p["n"], NB = p["blocks"];
  const int X = ctx.fifo(p["x_fifo"]), G = ctx.fifo(p["g_fifo"]), Y = ctx.fifo(p["y_fifo"]);
  const uint16_t* g = ctx.acquire(G).bf16();
  for (int64_t b = 0; b < NB; ++b) {
    const float* x = ctx.acquire(X).f32();
    float* y = ctx.acquire(Y).f32();
    for (int64_t r = 0; r < rt; ++r)
      for (int64_t i = 0; i < n; ++i) y[r * n + i] = x[r * n + i] + bf16_to_f32(g[i]);
    ctx.release(X);
    ctx.release(Y);
  }
  ctx.release(G);
}

// y = bf16(silu_bf16(gate) * up).
void silu_mul_kernel(WorkerContext& ctx) {
  const auto& p = ctx.params();
  const int64_t tile = p["tile"], NB = p["blocks"];
  const int A = ctx.fifo(p["a_fifo"]), B = ctx.fifo(p["b_fifo"]), Y = ctx.fifo(p["y_fifo"]);
  for (int64_t b = 0; b < NB; ++b) {
    const uint16_t* a = ctx.acquire(A).bf16();
    const uint16_t* u = ctx.acquire(B).bf16();
    uint16_t* y = ctx.acquire(Y).bf16();
    for (int64_t i = 0; i < tile; ++i) y[i] = f32_to_bf16(silu_bf16(bf16_to_f32(a[i])) * bf16_to_f32(u[i]));
    ctx.release(A);
    ctx.release(B);
    ctx.release(Y);
  }
}

// y = a + b in fp32 (the residual stream).
void add_kernel(WorkerContext& ctx) {
  const auto& p = ctx.params();
  const int64_t tile = p["tile"], NB = p["blocks"];
  const int A = ctx.fifo(p["a_fifo"]), B = ctx.fifo(p["b_fifo"]), Y = ctx.fifo(p["y_fifo"]);
  for (int64_t b = 0; b < NB; ++b) {
    const float* a = ctx.acquire(A).f32();
    const float* u = ctx.acquire(B).f32();
    float* y = ctx.acquire(Y).f32();
    for (int64_t i = 0; i < tile; ++i) y[i] = a[i] + u[i];
    ctx.release(A);
    ctx.release(B);
    ctx.release(Y);
  }
}

// RoPE, half-split pairs (x[i], x[i + hd/2]) rotated by the position's bf16 cos/sin, each
// result an fp32 sum of bf16 products rounded to bf16.
void rope_kernel(WorkerContext& ctx) {
  const auto& p = ctx.params();
  const int64_t T = p["T"], hpw = p["hpw"], hd = p["hd"], half = hd / 2;
  const int X = ctx.fifo(p["x_fifo"]), CS = ctx.fifo(p["cs_fifo"]), Y = ctx.fifo(p["y_fifo"]);
  for (int64_t t = 0; t < T; ++t) {
    const uint16_t* cs = ctx.acquire(CS).bf16();
    const uint16_t* x = ctx.acquire(X).bf16();
    uint16_t* y = ctx.acquire(Y).bf16();
    for (int64_t h = 0; h < hpw; ++h) {
      const uint16_t* xh = x + h * hd;
      uint16_t* yh = y + h * hd;
      for (int64_t i = 0; i < half; ++i) {
        const float a = bf16_to_f32(xh[i]), b = bf16_to_f32(xh[i + half]);
        const float c = bf16_to_f32(cs[i]), s = bf16_to_f32(cs[half + i]);
        yh[i] = f32_to_bf16(a * c - b * s);
        yh[i + half] = f32_to_bf16(b * c + a * s);
      }
    }
    ctx.release(CS);
    ctx.release(X);
    ctx.release(Y);
  }
}

// The embedding's row copy: the DMA gathered the rows; the core forwards them.
void copy_kernel(WorkerContext& ctx) {
  const auto& p = ctx.params();
  const int64_t n = p["objects"];
  const int I = ctx.fifo(p["in_fifo"]), O = ctx.fifo(p["out_fifo"]);
  for (int64_t j = 0; j < n; ++j) {
    const ObjectRef in = ctx.acquire(I);
    const ObjectRef out = ctx.acquire(O);
    std::memcpy(out.data, in.data, size_t(in.bytes()));
    ctx.release(I);
    ctx.release(O);
  }
}

}  // namespace

void register_row_kernels(Engine& e) {
  e.register_kernel("rmsnorm_bf16", rmsnorm_kernel);
  e.register_kernel("softmax_bf16", softmax_kernel);
  e.register_kernel("bias_add_f32", bias_add_kernel);
  e.register_kernel("silu_mul_bf16", silu_mul_kernel);
  e.register_kernel("add_f32", add_kernel);
  e.register_kernel("rope_bf16", rope_kernel);
  e.register_kernel("copy_bf16", copy_kernel);
}

}  // namespace tessera::npusim::detail
