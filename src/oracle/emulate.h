// The oracle's twins run under a target's declared numerics (oracle/numerics.h): inputs
// rounded where the target rounds them, the declared approximations in place of exp,
// 1/sqrt and SiLU, outputs rounded as the target drains them. Compared with the exact
// oracle, an emulated twin gives the error a correct kernel of that target is expected to
// have; phase 1's limits are a margin above it. Plain scalar code: clarity over speed.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/weights.h"
#include "model/spec.h"
#include "oracle/numerics.h"

namespace tessera::oracle::emulated {

// Rounds n values in place to p.
void round_all(Precision p, float* x, int64_t n);

// y[T, cols.size()] = the columns `cols` of x[T, K] . W^T (+ bias): operands rounded as the
// target's GEMM rounds them, fp32 accumulation, output drained as declared.
void linear(const Numerics& num, const float* x, int64_t T, const Weight& w, const float* bias,
            std::span<const int64_t> cols, float* y);
// Up to `max_cols` output columns spread evenly over [0, N) (all of them when N is small):
// the expected error of a large matrix is a statistic, so a sample of its columns gives it.
std::vector<int64_t> sample_columns(int64_t N, int64_t max_cols);

void rmsnorm(const Numerics& num, const float* x, const float* w, float* out, int64_t rows, int64_t n, double eps);
// RoPE in place on T rows of `heads` heads (half-split pairing), cos/sin rounded as the
// target's table; input and output rounded as activations.
void rope(const Numerics& num, float* x, int64_t T, int64_t heads, int64_t hd, int64_t pos0,
          const std::vector<float>& inv_freq);
// Causal GQA attention as oracle::attention, q rounded as an activation, k and v as the
// cache stores them, exp and the probabilities as declared.
void attention(const Numerics& num, const float* q, int64_t T, int64_t pos0, const float* k, const float* v,
               const ModelSpec& spec, float* out);
void silu_mul(const Numerics& num, const float* gate, const float* up, float* out, int64_t n);
// acc += x, rounded as an activation.
void add(const Numerics& num, float* acc, const float* x, int64_t n);

}  // namespace tessera::oracle::emulated
