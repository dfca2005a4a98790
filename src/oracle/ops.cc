#include "oracle/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "util/parallel.h"
#include "util/sanitize.h"

namespace tessera::oracle {

TS_RANGE_CHECKED float dot(const float* a, const float* b, int64_t n) {
  const size_t bytes = size_t(std::max<int64_t>(n, 0)) * sizeof(float);
  check_range(a, bytes, false);
  check_range(b, bytes, false);
  // 16 independent partial sums: the compiler vectorizes this, and the summation error
  // stays far below the gates' tolerances.
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  float s = 0;
  for (float v : acc) s += v;
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void rmsnorm(const float* x, const float* w, float* out, int64_t rows, int64_t n, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    const float inv = float(1.0 / std::sqrt(ss / double(n) + eps));
    float* o = out + r * n;
    for (int64_t i = 0; i < n; ++i) o[i] = w[i] * (xr[i] * inv);
  }
}

void linear(const float* x, int64_t T, const Weight& w, const float* bias, float* y, int threads) {
  const int64_t N = w.rows(), K = w.cols();
  parallel_for(N, threads, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t n = begin; n < end; ++n) {
      w.row_f32(n, row.data());
      const float b = bias ? bias[n] : 0.0f;
      for (int64_t t = 0; t < T; ++t) y[t * N + n] = dot(x + t * K, row.data(), K) + b;
    }
  });
}

std::vector<float> rope_inv_freq(const ModelSpec& s) {
  const int64_t half = s.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[size_t(i)] = float(1.0 / std::pow(s.rope_theta, double(2 * i) / double(s.head_dim)));
  if (s.rope_scaling.type == RopeScaling::Type::Llama3) {
    // Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    const RopeScaling& r = s.rope_scaling;
    const double low_wavelen = double(r.original_max_position) / r.low_freq_factor;
    const double high_wavelen = double(r.original_max_position) / r.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        f = float(f / r.factor);
      } else {
        const double smooth = (double(r.original_max_position) / wavelen - r.low_freq_factor) /
                              (r.high_freq_factor - r.low_freq_factor);
        f = float((1.0 - smooth) * f / r.factor + smooth * f);
      }
    }
  }
  if (!s.rope_freq_factors.empty())
    for (int64_t i = 0; i < half; ++i) inv[size_t(i)] /= s.rope_freq_factors[size_t(i)];
  return inv;
}

void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t pos0,
          const std::vector<float>& inv_freq) {
  const int64_t half = head_dim / 2;
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // transformers forms the angle as an fp32 product, then cos/sin in fp32.
      const float angle = float(pos0 + t) * inv_freq[size_t(i)];
      c[size_t(i)] = std::cos(angle);
      s[size_t(i)] = std::sin(angle);
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[size_t(i)] - b * s[size_t(i)];
        v[i + half] = b * c[size_t(i)] + a * s[size_t(i)];
      }
    }
  }
}

void attention(const float* q, int64_t T, int64_t pos0, const float* k, const float* v,
               const ModelSpec& spec, float* out, int threads) {
  const int64_t hd = spec.head_dim, nh = spec.n_heads, kv_dim = spec.kv_dim();
  const int64_t group = spec.gqa_group();
  const float scale = float(spec.attn_scale());
  parallel_for(nh * T, threads, [&](int64_t begin, int64_t end) {
    std::vector<float> p(static_cast<size_t>(pos0 + T));
    for (int64_t job = begin; job < end; ++job) {
      const int64_t h = job / T, t = job % T;
      const int64_t kvh = h / group;
      const int64_t n_keys = pos0 + t + 1;  // causal: keys up to and including this position
      const float* qh = q + t * nh * hd + h * hd;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n_keys; ++j) {
        p[size_t(j)] = dot(qh, k + j * kv_dim + kvh * hd, hd) * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      float sum = 0;
      for (int64_t j = 0; j < n_keys; ++j) {
        p[size_t(j)] = std::exp(p[size_t(j)] - mx);
        sum += p[size_t(j)];
      }
      float* o = out + t * nh * hd + h * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t j = 0; j < n_keys; ++j) {
        const float pj = p[size_t(j)] / sum;
        const float* vj = v + j * kv_dim + kvh * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] += pj * vj[d];
      }
    }
  });
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace tessera::oracle
