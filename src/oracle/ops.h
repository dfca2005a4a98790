// The oracle's kernels: plain FP32 with Hugging Face transformers' semantics. Each target
// kernel has its reference twin here; they favour clarity over speed (beyond threads and
// a vectorizable dot product).
#pragma once
#include <cstdint>
#include <vector>

#include "model/weights.h"
#include "model/spec.h"

namespace tessera::oracle {

float dot(const float* a, const float* b, int64_t n);

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w, for `rows` rows of length n.
void rmsnorm(const float* x, const float* w, float* out, int64_t rows, int64_t n, double eps);

// y[T, N] = x[T, K] . W[N, K]^T (+ bias[N]); W is upcast row by row from its stored dtype.
void linear(const float* x, int64_t T, const Weight& w, const float* bias, float* y, int threads);

// RoPE inverse frequencies (head_dim / 2 of them) with the model's scaling applied.
std::vector<float> rope_inv_freq(const ModelSpec& spec);

// Rotates `n_heads` heads of each of T rows in place, half-split (rotate_half) pairing:
// (x[i], x[i + d/2]) for i < d/2. Row t is at position pos0 + t.
void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t pos0,
          const std::vector<float>& inv_freq);

// Causal attention with GQA (query head h reads kv head h / group). q: [T, n_heads*hd] at
// positions pos0..pos0+T-1; k, v: [pos0 + T, n_kv*hd] (the cache, already holding these
// rows); out: [T, n_heads*hd]. Softmax in fp32 with the max subtracted.
void attention(const float* q, int64_t T, int64_t pos0, const float* k, const float* v,
               const ModelSpec& spec, float* out, int threads);

// out = silu(gate) * up, silu(x) = x / (1 + exp(-x)).
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

}  // namespace tessera::oracle
