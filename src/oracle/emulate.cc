#include "oracle/emulate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "io/quantize.h"
#include "util/error.h"
#include "util/half.h"

namespace tessera::oracle {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::F32: return "fp32";
    case Precision::BF16: return "bf16";
    case Precision::F16: return "fp16";
    case Precision::Q8x2_32: return "int8 + int8/254 per 32-value block";
  }
  return "?";
}

float round_to(Precision p, float x) {
  switch (p) {
    case Precision::F32: return x;
    case Precision::BF16: return bf16_to_f32(f32_to_bf16(x));
    // io's round-to-nearest-even conversion, not a _Float16 cast: clang before 15 has no
    // _Float16 on x86 without AVX512-FP16 (the fuzz build uses Debian's clang 14).
    case Precision::F16: return f16_to_f32(f32_to_f16(x));
    case Precision::Q8x2_32: fail("internal: int8 per 32-value block is a block-wise rounding (round_all)");
  }
  return x;
}

std::string Numerics::describe() const {
  std::string s = fmt::format(
      "weights {}, GEMM inputs {}, GEMM outputs {} (fp32 accumulation), activations {}, KV cache {}, norm gains {}, "
      "1/rms {}{}, attention queries {}, softmax probabilities {}{}, RoPE table {}",
      precision_name(weights), precision_name(matmul_inputs), precision_name(matmul_outputs), precision_name(activations),
      precision_name(kv_cache), precision_name(norm_weights), precision_name(norm_scale),
      norm_rounds_product ? " (x * 1/rms rounded before the gain)" : "", precision_name(attention_q),
      precision_name(softmax_probs), probs_normalized ? " (normalized before the V product)" : "",
      precision_name(rope_table));
  s += approximations.empty() ? "; exp, 1/sqrt, SiLU exact to fp32" : "; " + approximations;
  return s;
}

namespace emulated {

void round_all(Precision p, float* x, int64_t n) {
  if (p == Precision::F32) return;
  if (p == Precision::Q8x2_32) {
    // Each block of 32 (the last may be shorter) as d * (hi + lo / 254): d = max|x| / 127,
    // v = x * 127 / max|x|, hi = v and lo = (v - hi) * 254 rounded to nearest even; a
    // non-finite value makes the whole block NaN.
    for (int64_t b = 0; b < n; b += 32) {
      const int64_t e = std::min(n, b + 32);
      float amax = 0;
      bool finite = true;
      for (int64_t i = b; i < e; ++i) {
        amax = std::max(amax, std::fabs(x[i]));
        finite = finite && std::isfinite(x[i]);
      }
      const float id = amax > 0 && finite ? 127.0f / amax : 0.0f, d = finite ? amax / 127.0f : NAN;
      for (int64_t i = b; i < e; ++i) {
        const float v = x[i] * id, hi = std::nearbyint(v), lo = std::nearbyint((v - hi) * 254.0f);
        x[i] = (hi + lo / 254.0f) * d;
      }
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) x[i] = round_to(p, x[i]);
}

std::vector<int64_t> sample_columns(int64_t N, int64_t max_cols) {
  std::vector<int64_t> cols;
  if (N <= max_cols) {
    for (int64_t i = 0; i < N; ++i) cols.push_back(i);
    return cols;
  }
  for (int64_t i = 0; i < max_cols; ++i) cols.push_back(i * N / max_cols);
  return cols;
}

void linear(const Numerics& num, const float* x, int64_t T, const Weight& w, const float* bias,
            std::span<const int64_t> cols, float* y) {
  const int64_t K = w.cols(), C = int64_t(cols.size());
  std::vector<float> xr(x, x + T * K);
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) round_all(num.matmul_inputs, xr.data() + t * K, K);  // per row (blocks)
  for (int64_t c = 0; c < C; ++c) {
    w.row_f32(cols[size_t(c)], row.data());
    round_all(num.weights, row.data(), K);
    for (int64_t t = 0; t < T; ++t) {
      float acc = 0;  // fp32 accumulation, as declared
      const float* xt = xr.data() + t * K;
      for (int64_t k = 0; k < K; ++k) acc += xt[k] * row[size_t(k)];
      if (bias) acc += bias[cols[size_t(c)]];
      y[t * C + c] = round_to(num.matmul_outputs, acc);
    }
  }
}

void rmsnorm(const Numerics& num, const float* x, const float* w, float* out, int64_t rows, int64_t n, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> xr(x + r * n, x + (r + 1) * n);
    round_all(num.activations, xr.data(), n);
    float ss = 0;
    for (float v : xr) ss += v * v;
    const float ms = ss / float(n) + float(eps);
    const float inv = round_to(num.norm_scale, num.rsqrt ? num.rsqrt(ms) : float(1.0 / std::sqrt(double(ms))));
    float* o = out + r * n;
    for (int64_t i = 0; i < n; ++i) {
      const float g = round_to(num.norm_weights, w[i]);
      const float xi = num.norm_rounds_product ? round_to(num.activations, xr[size_t(i)] * inv) : xr[size_t(i)] * inv;
      o[i] = round_to(num.activations, xi * g);
    }
  }
}

void rope(const Numerics& num, float* x, int64_t T, int64_t heads, int64_t hd, int64_t pos0,
          const std::vector<float>& inv_freq) {
  const int64_t half = hd / 2;
  round_all(num.activations, x, T * heads * hd);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = float(pos0 + t) * inv_freq[size_t(i)];
      const float c = round_to(num.rope_table, std::cos(angle)), s = round_to(num.rope_table, std::sin(angle));
      for (int64_t h = 0; h < heads; ++h) {
        float* xh = x + (t * heads + h) * hd;
        const float a = xh[i], b = xh[i + half];
        xh[i] = round_to(num.activations, a * c - b * s);
        xh[i + half] = round_to(num.activations, b * c + a * s);
      }
    }
}

void attention(const Numerics& num, const float* q, int64_t T, int64_t pos0, const float* k, const float* v,
               const ModelSpec& spec, float* out) {
  const int64_t hd = spec.head_dim, nh = spec.n_heads, kvd = spec.kv_dim(), group = nh / spec.n_kv_heads;
  const int64_t ctx = pos0 + T;
  std::vector<float> kr(k, k + ctx * kvd), vr(v, v + ctx * kvd);
  std::vector<float> qh(static_cast<size_t>(hd)), p(static_cast<size_t>(ctx)), acc(static_cast<size_t>(hd));
  round_all(num.kv_cache, kr.data(), ctx * kvd);
  round_all(num.kv_cache, vr.data(), ctx * kvd);
  const float scale = float(spec.attn_scale());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t d = 0; d < hd; ++d)
        qh[size_t(d)] = round_to(num.attention_q, round_to(num.activations, q[t * nh * hd + h * hd + d]));
      const int64_t kvh = h / group, last = pos0 + t;
      float mx = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        float s = 0;
        for (int64_t d = 0; d < hd; ++d) s += qh[size_t(d)] * kr[size_t(j * kvd + kvh * hd + d)];
        p[size_t(j)] = s * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      float l = 0;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j <= last; ++j) {
        p[size_t(j)] = num.exp ? num.exp(p[size_t(j)] - mx) : std::exp(p[size_t(j)] - mx);
        if (!num.probs_normalized) p[size_t(j)] = round_to(num.softmax_probs, p[size_t(j)]);
        l += p[size_t(j)];
      }
      for (int64_t j = 0; j <= last; ++j) {
        const float e = num.probs_normalized ? round_to(num.softmax_probs, p[size_t(j)] / l) : p[size_t(j)];
        for (int64_t d = 0; d < hd; ++d) acc[size_t(d)] += e * vr[size_t(j * kvd + kvh * hd + d)];
      }
      for (int64_t d = 0; d < hd; ++d)
        out[t * nh * hd + h * hd + d] = round_to(num.activations, num.probs_normalized ? acc[size_t(d)] : acc[size_t(d)] / l);
    }
}

void silu_mul(const Numerics& num, const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = round_to(num.activations, gate[i]), u = round_to(num.activations, up[i]);
    const float s = num.silu ? num.silu(g) : g / (1.0f + std::exp(-g));
    out[i] = round_to(num.activations, s * u);
  }
}

void add(const Numerics& num, float* acc, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    acc[i] = round_to(num.activations, round_to(num.activations, acc[i]) + round_to(num.activations, x[i]));
}

}  // namespace emulated
}  // namespace tessera::oracle
