// Debug skill qkv-projection: the q/k/v projections against their variants (bias, row order, outputs swapped).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "model/tensors.h"
#include "pipeline/skill_support.h"

namespace tessera {

std::vector<Hypothesis> qkv_projection(PhaseContext& ctx, const Failure&) {
  const ModelSpec& s = ctx.model.spec();
  const Acts a = layer0_acts(ctx);
  const int64_t T = a.T, Q = s.q_dim(), H = s.hidden;
  std::unique_ptr<StagedRunner> t = ctx.fresh_target();
  const std::string wq = layer_tensor(0, "self_attn.q_proj.weight");
  std::vector<float> got(size_t(T * Q));
  t->op_linear(Stage::QkvProj, a.probe.at("attn_norm").data(), T, wq, a.q_bias, got.data());
  std::vector<Hypothesis> out;
  if (!s.qkv_bias) {
    out.push_back(not_applicable("q/k/v bias dropped", "drop-qkv-bias", "the model has no q/k/v bias"));
    out.push_back(not_applicable("q/k bias added after RoPE", "qkv-bias-after-rope", "the model has no q/k/v bias"));
  } else {
    // The projection without its bias; then, is the bias added back after RoPE? (the
    // target's RoPE on the bias-free projection, against RoPE of it plus the bias)
    const Hypothesis no_bias = judge("the projection leaves the bias out", "", got, a.q_nb, a.q_raw);
    std::vector<float> qn = a.q_nb, kn = a.k_nb;
    t->op_rope(0, qn.data(), kn.data(), T, 0);
    const std::vector<float> rot = rope_ref(s, a.q_nb.data(), T, s.n_heads, 0, a.q_norm, RopeVariant{});
    std::vector<float> rot_plus = rot;
    for (int64_t r = 0; r < T; ++r)
      for (int64_t i = 0; i < Q; ++i) rot_plus[size_t(r * Q + i)] += a.q_bias[size_t(i)];
    Hypothesis after = judge("q/k bias added after RoPE instead of in the projection", "qkv-bias-after-rope", qn, rot_plus, rot);
    after.evidence = "projection: " + no_bias.evidence + "; RoPE of it: " + after.evidence;
    if (no_bias.verdict != "confirmed" && after.verdict == "confirmed") after.verdict = "ruled out";
    Hypothesis dropped{"q/k/v bias dropped", "drop-qkv-bias", no_bias.verdict, no_bias.evidence};
    if (after.verdict == "confirmed") dropped.verdict = "ruled out";  // not dropped: moved
    out.push_back(dropped);
    out.push_back(after);
  }
  {  // Each head's rows in the GGUF llama order: output (half, i) at 2i + half.
    const int64_t hd = s.head_dim;
    std::vector<float> perm(a.q_raw.size());
    for (int64_t r = 0; r < T; ++r)
      for (int64_t h = 0; h < s.n_heads; ++h)
        for (int64_t half = 0; half < 2; ++half)
          for (int64_t i = 0; i < hd / 2; ++i)
            perm[size_t(r * Q + h * hd + 2 * i + half)] = a.q_raw[size_t(r * Q + h * hd + half * hd / 2 + i)];
    out.push_back(judge("q/k rows permuted per head (the GGUF order not undone)", "qk-rows-permuted", got, perm, a.q_raw));
  }

  {  // The DMA (or a loader) walking W [N, K] as if it were [K, N]: element (n, k) read at k*N + n.
    const std::vector<float> w = ctx.model.get(wq).to_f32();
    const std::vector<float>& x = a.probe.at("attn_norm");
    std::vector<float> y(size_t(T * Q));
    for (int64_t r = 0; r < T; ++r)
      for (int64_t n = 0; n < Q; ++n) {
        double acc = a.q_bias.empty() ? 0.0 : a.q_bias[size_t(n)];
        for (int64_t k = 0; k < H; ++k) acc += double(x[size_t(r * H + k)]) * w[size_t(k * Q + n)];
        y[size_t(r * Q + n)] = float(acc);
      }
    out.push_back(judge("weight walked transposed (a wrong access pattern)", "bad-access-pattern", got, y, a.q_raw));
  }

  {  // The composed block: does the fused q|k|v path hand the keys to v?
    std::vector<float> h = a.probe.at("embed");
    std::map<std::string, std::vector<float>> probes;
    t->reset();
    t->forward_layers(
        h.data(), T, 1,
        [&](const std::string& name, const float* data, int64_t rows, int64_t cols) {
          if (name == "layers.0.v") probes[name].assign(data, data + rows * cols);
        },
        ProbeLevel::All);
    t->reset();
    if (!probes.count("layers.0.v"))
      out.push_back(not_applicable("fused q|k|v outputs swapped", "fused-qkv-swap", "the target does not probe v"));
    else
      out.push_back(judge("fused q|k|v outputs swapped (keys in v)", "fused-qkv-swap", probes["layers.0.v"], a.k_raw, a.v_raw));
  }
  return out;
}

}  // namespace tessera
