// Debug skill gemm-precision: a GEMM whose running sum is held in bf16.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "model/tensors.h"
#include "pipeline/skill_support.h"
#include "util/half.h"

namespace tessera {

std::vector<Hypothesis> gemm_precision(PhaseContext& ctx, const Failure&) {
  const ModelSpec& s = ctx.model.spec();
  const Acts a = layer0_acts(ctx);
  const int64_t H = s.hidden, N = std::min<int64_t>(s.q_dim(), 256);
  std::unique_ptr<StagedRunner> t = ctx.fresh_target();
  const std::string wq = layer_tensor(0, "self_attn.q_proj.weight");
  const float* x = a.probe.at("attn_norm").data() + (a.T - 1) * H;  // one row: the decode shape
  std::vector<float> got(size_t(s.q_dim()));
  t->op_linear(Stage::QkvProj, x, 1, wq, a.q_bias, got.data());
  got.resize(size_t(N));
  const std::vector<float> w = ctx.model.get(wq).to_f32();
  std::vector<float> exact(static_cast<size_t>(N)), bf16acc(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    double e = 0;
    float acc = 0;
    for (int64_t k = 0; k < H; ++k) {
      const float p = x[k] * w[size_t(n * H + k)];
      e += double(p);
      acc = bf16_to_f32(f32_to_bf16(acc + p));  // the running sum held in bf16
    }
    const float b = a.q_bias.empty() ? 0.0f : a.q_bias[size_t(n)];
    exact[size_t(n)] = float(e) + b;
    bf16acc[size_t(n)] = acc + b;
  }
  return {judge("GEMM/GEMV accumulating in bf16 instead of fp32", "bf16-accumulate", got, bf16acc, exact)};
}

}  // namespace tessera
