#include "faults/faulty_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "util/half.h"
#include "util/parallel.h"

namespace tessera::faulty {

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

void matmul_bf16_accumulate(const float* x, int64_t T, const Weight& w, const float* bias, float* y, int threads) {
  const int64_t N = w.rows(), K = w.cols();
  auto bf16 = [](float v) { return bf16_to_f32(f32_to_bf16(v)); };
  parallel_for(N, threads, [&](int64_t n0, int64_t n1) {
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t n = n0; n < n1; ++n) {
      w.row_f32(n, row.data());
      for (float& r : row) r = bf16(r);
      for (int64_t t = 0; t < T; ++t) {
        float acc = 0;
        for (int64_t k = 0; k < K; ++k) acc = bf16(acc + x[t * K + k] * row[size_t(k)]);
        y[t * N + n] = acc + (bias ? bias[n] : 0.0f);
      }
    }
  });
}

void matmul_random_weights(const float* x, int64_t T, int64_t N, int64_t K, float* y, int threads) {
  // A hashed uniform in [-a, a] with a = 0.02 * sqrt(3) (std 0.02), the same every call.
  auto weight = [](int64_t n, int64_t k) {
    uint64_t z = uint64_t(n) * 0x9E3779B97F4A7C15ull ^ (uint64_t(k) + 0x632BE59BD9B4E019ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return float((double(z >> 11) / double(1ull << 53) * 2 - 1) * 0.0346410161513775);
  };
  parallel_for(N, threads, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t t = 0; t < T; ++t) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += double(x[t * K + k]) * weight(n, k);
        y[t * N + n] = float(acc);
      }
  });
}

void attention_with_mistakes(const float* q, int64_t T, int64_t pos0, const float* K, const float* V, int64_t n_heads,
                             int64_t n_kv_heads, int64_t head_dim, float scale, float* out, const AttentionMistakes& m) {
  const int64_t kv_dim = n_kv_heads * head_dim, group = n_heads / n_kv_heads;
  std::vector<float> p(static_cast<size_t>(pos0 + T));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t kvh = m.kv_head == AttentionMistakes::KvHead::Modulo ? h % n_kv_heads
                          : m.kv_head == AttentionMistakes::KvHead::Zero ? 0
                                                                         : h / group;
      const float* qv = q + (t * n_heads + h) * head_dim;
      const int64_t end = pos0 + t + (m.mask_excludes_diagonal ? 0 : 1);  // keys [0, end)
      float mx = -INFINITY;
      for (int64_t j = 0; j < end; ++j) {
        float s = 0;
        for (int64_t d = 0; d < head_dim; ++d) s += qv[d] * K[j * kv_dim + kvh * head_dim + d];
        p[size_t(j)] = s * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      // exp in fp32, as a kernel computes it: unshifted, a score past 88.7 gives inf (inf/inf = NaN).
      const float shift = m.softmax_unshifted ? 0.0f : mx;
      double sum = 0;
      for (int64_t j = 0; j < end; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - shift));
      float* o = out + (t * n_heads + h) * head_dim;
      if (end == 0) {  // every key masked: the softmax is 0/0
        std::fill(o, o + head_dim, std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      std::fill(o, o + head_dim, 0.0f);
      for (int64_t j = 0; j < end; ++j)
        for (int64_t d = 0; d < head_dim; ++d) o[d] += float(p[size_t(j)] / sum) * V[j * kv_dim + kvh * head_dim + d];
    }
}

}  // namespace tessera::faulty
