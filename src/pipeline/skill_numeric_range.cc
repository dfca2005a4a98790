// Debug skill numeric-range: attention past exp's fp32 range (porting-pitfalls row 8).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "oracle/ops.h"
#include "pipeline/skill_support.h"
#include "util/half.h"

namespace tessera {

// The row's experiment, "max abs per tensor along the graph", on the op phase 1 stresses:
// attention whose largest score is past exp's fp32 range. Evidence: how large the scores are,
// how many outputs went non-finite, and whether the kernel is right once they are back in range.
std::vector<Hypothesis> numeric_range(PhaseContext& ctx, const Failure&) {
  const ModelSpec& s = ctx.model.spec();
  const Acts a = layer0_acts(ctx);
  const int64_t T = a.T, Q = s.q_dim(), KV = s.kv_dim(), hd = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const StressAttention st = stress_attention_inputs(s, a.probe.at("q"), a.probe.at("k"), a.probe.at("v"), T, kStressScore);
  std::unique_ptr<StagedRunner> t = ctx.fresh_target();
  auto on_target = [&](const std::vector<float>& q) {
    t->reset();
    t->op_kv_write(0, 0, st.k.data(), st.v.data(), T);
    std::vector<float> got(size_t(T * Q));
    t->op_attention(0, q.data(), T, 0, got.data());
    t->reset();
    return got;
  };
  auto on_oracle = [&](const std::vector<float>& q) {
    std::vector<float> o(size_t(T * Q));
    oracle::attention(q.data(), T, 0, st.k.data(), st.v.data(), s, o.data(), 0);
    return o;
  };
  const std::vector<float> got = on_target(st.q), correct = on_oracle(st.q);
  // In range: the same inputs with the scores scaled back down to the model's own.
  std::vector<float> q_small(st.q.size());
  for (size_t i = 0; i < q_small.size(); ++i) q_small[i] = bf16_to_f32(f32_to_bf16(float(st.q[i] / st.scaled_by)));
  const double small_nmse = nmse(on_oracle(q_small), on_target(q_small));
  // The variant: exp(s) in fp32 without subtracting the row max first.
  std::vector<float> unshifted(size_t(T * Q));
  const float scale = float(s.attn_scale());
  std::vector<float> e(static_cast<size_t>(T));
  for (int64_t r = 0; r < T; ++r)
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const float* qh = st.q.data() + r * Q + h * hd;
      const int64_t g = h / group;
      double sum = 0;
      for (int64_t j = 0; j <= r; ++j) {
        float d = 0;
        for (int64_t i = 0; i < hd; ++i) d += qh[i] * st.k[size_t(j * KV + g * hd + i)];
        sum += (e[size_t(j)] = std::exp(d * scale));
      }
      float* o = unshifted.data() + r * Q + h * hd;
      for (int64_t j = 0; j <= r; ++j)
        for (int64_t i = 0; i < hd; ++i) o[i] += float(e[size_t(j)] / sum) * st.v[size_t(j * KV + g * hd + i)];
    }
  const int64_t nonfinite = std::count_if(got.begin(), got.end(), [](float x) { return !std::isfinite(x); });
  Hypothesis h = judge("softmax exp taken without subtracting the row max (inf past 88.7)", "softmax-unshifted", got,
                       unshifted, correct);
  h.evidence = fmt::format("largest score {:.0f}: {} of {} outputs non-finite; with the scores back in the model's range "
                           "the target matches the oracle (NMSE {:.3g}). ",
                           kStressScore, nonfinite, got.size(), small_nmse) +
               h.evidence;
  return {h};
}

}  // namespace tessera
