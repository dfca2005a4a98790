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

// Attention where query head h reads kv head h % n_kv_heads.
void attention_gqa_modulo(const float* q, int64_t T, int64_t pos0, const KvCache& cache, int64_t layer,
                          int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale, float* out);

}  // namespace tessera::cpu::faulty
