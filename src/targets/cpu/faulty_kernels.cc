#include "targets/cpu/faulty_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "util/half.h"

namespace tessera::cpu::faulty {

void rope_interleaved(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t pos0, const float* inv_freq) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < head_dim / 2; ++i) {
        const double angle = double(pos0 + t) * double(inv_freq[i]);
        const float c = float(std::cos(angle)), s = float(std::sin(angle));
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c - b * s;
        v[2 * i + 1] = b * c + a * s;
      }
    }
}

void matmul_bf16_accumulate(const float* x, int64_t T, const Bf16Matrix& w, const float* bias, float* y,
                            ThreadPool& pool) {
  const int64_t N = w.rows, K = w.cols;
  pool.parallel_for(N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const uint16_t* row = w.data + n * K;
      for (int64_t t = 0; t < T; ++t) {
        float acc = 0;
        for (int64_t k = 0; k < K; ++k) acc = bf16_to_f32(f32_to_bf16(acc + x[t * K + k] * bf16_to_f32(row[k])));
        y[t * N + n] = acc + (bias ? bias[n] : 0.0f);
      }
    }
  });
}

void attention_gqa_modulo(const float* q, int64_t T, int64_t pos0, const KvCache& cache, int64_t layer,
                          int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale, float* out) {
  const int64_t kv_dim = cache.kv_dim(), ctx = pos0 + T;
  std::vector<float> K(static_cast<size_t>(ctx * kv_dim)), V(static_cast<size_t>(ctx * kv_dim)), p(static_cast<size_t>(ctx));
  for (int64_t j = 0; j < ctx; ++j) {
    cache.read_k(layer, j, K.data() + j * kv_dim);
    cache.read_v(layer, j, V.data() + j * kv_dim);
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t kvh = h % n_kv_heads;  // the fault: should be h / (n_heads / n_kv_heads)
      const float* qv = q + (t * n_heads + h) * head_dim;
      const int64_t last = pos0 + t;
      float mx = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        float s = 0;
        for (int64_t d = 0; d < head_dim; ++d) s += qv[d] * K[size_t(j * kv_dim + kvh * head_dim + d)];
        p[size_t(j)] = s * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      double sum = 0;
      for (int64_t j = 0; j <= last; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
      float* o = out + (t * n_heads + h) * head_dim;
      std::fill(o, o + head_dim, 0.0f);
      for (int64_t j = 0; j <= last; ++j)
        for (int64_t d = 0; d < head_dim; ++d) o[d] += float(p[size_t(j)] / sum) * V[size_t(j * kv_dim + kvh * head_dim + d)];
    }
}

}  // namespace tessera::cpu::faulty
