// Deliberately wrong kernels for `--inject`: each reproduces one known porting failure so
// that the gates and debug skills can be shown to catch it. Never used otherwise.
#pragma once
#include <cstdint>

#include "targets/cpu/kernels.h"

namespace tessera::cpu::faulty {

// RoPE pairing (x[2i], x[2i+1]) (GPT-J / Meta-checkpoint style) instead of half-split.
void rope_interleaved(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t pos0, const float* inv_freq);

// Matmul whose running sums are rounded to bf16 after every multiply-add.
void matmul_bf16_accumulate(const float* x, int64_t T, const Bf16Matrix& w, const float* bias, float* y,
                            ThreadPool& pool);

// Plain causal attention with the mistakes an attention port makes, each switchable:
// which kv head query head h reads, and whether a row sees its own position (a mask off by
// one leaves the first row with no key at all: 0/0).
struct AttentionMistakes {
  enum class KvHead { Group, Modulo, Zero } kv_head = KvHead::Group;  // h / group, h % n_kv, 0
  bool mask_excludes_diagonal = false;
  bool softmax_unshifted = false;  // exp(s) without subtracting the row max first
};
void attention_with_mistakes(const float* q, int64_t T, int64_t pos0, const KvCache& cache, int64_t layer,
                             int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale, float* out,
                             const AttentionMistakes& m);

// y[T, N] = x . R^T with R a fresh random matrix (normal-like, std 0.02, fixed seed) in
// place of the weights: an LM head that was not tied to the embedding.
void matmul_random_weights(const float* x, int64_t T, int64_t N, int64_t K, float* y, ThreadPool& pool);

}  // namespace tessera::cpu::faulty
