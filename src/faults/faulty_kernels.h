// Deliberately wrong computations of one stage each, in fp32 on the model's own weights and
// the target's KV cache rows: what the porting faults (faults/kernel_faults.cc) run in place
// of a target's kernel. Never used otherwise.
#pragma once
#include <cstdint>

#include "model/weights.h"

namespace tessera::faulty {

// RoPE pairing (x[2i], x[2i+1]) (GPT-J / Meta-checkpoint style) instead of half-split.
void rope_interleaved(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t pos0, const float* inv_freq);

// y [T, N] = x . W^T (+ bias) with W rounded to bf16 and the running sum rounded to bf16
// after every multiply-add.
void matmul_bf16_accumulate(const float* x, int64_t T, const Weight& w, const float* bias, float* y, int threads);

// y [T, N] = x . R^T with R a fresh random matrix (uniform, std 0.02, the same every call) in
// place of the weights: an LM head that was not tied to the embedding.
void matmul_random_weights(const float* x, int64_t T, int64_t N, int64_t K, float* y, int threads);

// Causal attention over k, v [pos0 + T, kv_dim] with the mistakes an attention port makes,
// each switchable: which kv head query head h reads, whether a row sees its own position (a
// mask off by one leaves the first row no key at all: 0/0), and whether the softmax
// subtracts the row max before exp.
struct AttentionMistakes {
  enum class KvHead { Group, Modulo, Zero } kv_head = KvHead::Group;  // h / group, h % n_kv, 0
  bool mask_excludes_diagonal = false;
  bool softmax_unshifted = false;
};
void attention_with_mistakes(const float* q, int64_t T, int64_t pos0, const float* k, const float* v, int64_t n_heads,
                             int64_t n_kv_heads, int64_t head_dim, float scale, float* out, const AttentionMistakes& m);

}  // namespace tessera::faulty
