#include "pipeline/diagnose.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "gates/gates.h"
#include "model/tensors.h"
#include "oracle/ops.h"
#include "runtime/generate.h"
#include "targets/registry.h"
#include "util/error.h"
#include "util/half.h"

namespace tessera {

namespace {

// ---- shared evidence: the oracle's layer 0 on the long prompt, as phase 1 takes it -------

struct Acts {
  int64_t T = 0;
  std::map<std::string, std::vector<float>> probe;  // "embed", "attn_norm", "q", "k", "v", "attn", ...
  std::vector<float> q_raw, k_raw, v_raw;  // projections with bias, before q/k norm and RoPE
  std::vector<float> q_nb, k_nb;           // the same without bias
  std::vector<float> q_bias, k_bias, q_norm, k_norm;
};

Acts layer0_acts(PhaseContext& ctx) {
  const ModelSpec& s = ctx.model.spec();
  Acts a;
  const std::vector<int32_t> ids = long_prompt(ctx, 64);
  a.T = int64_t(ids.size());
  OracleRunner& oracle = ctx.oracle();
  oracle.reset();
  oracle.forward(
      ids, false,
      [&](const std::string& name, const float* data, int64_t rows, int64_t cols) {
        if (name == "embed" || name.starts_with("layers.0.")) {
          const std::string key = name == "embed" ? name : name.substr(9);
          a.probe[key].assign(data, data + rows * cols);
        }
      },
      ProbeLevel::All);
  oracle.reset();
  auto f32 = [&](const std::string& n) {
    const Weight* w = ctx.model.find(n);
    return w ? w->to_f32() : std::vector<float>{};
  };
  a.q_bias = f32(layer_tensor(0, "self_attn.q_proj.bias"));
  a.k_bias = f32(layer_tensor(0, "self_attn.k_proj.bias"));
  a.q_norm = f32(layer_tensor(0, "self_attn.q_norm.weight"));
  a.k_norm = f32(layer_tensor(0, "self_attn.k_norm.weight"));
  const std::vector<float> v_bias = f32(layer_tensor(0, "self_attn.v_proj.bias"));
  auto lin = [&](const char* w, const std::vector<float>& bias, int64_t n) {
    std::vector<float> y(size_t(a.T * n));
    oracle::linear(a.probe.at("attn_norm").data(), a.T, ctx.model.get(layer_tensor(0, w)), bias.empty() ? nullptr : bias.data(),
                   y.data(), 0);
    return y;
  };
  a.q_raw = lin("self_attn.q_proj.weight", a.q_bias, s.q_dim());
  a.k_raw = lin("self_attn.k_proj.weight", a.k_bias, s.kv_dim());
  a.v_raw = lin("self_attn.v_proj.weight", v_bias, s.kv_dim());
  a.q_nb = lin("self_attn.q_proj.weight", {}, s.q_dim());
  a.k_nb = lin("self_attn.k_proj.weight", {}, s.kv_dim());
  return a;
}

double nmse(const std::vector<float>& ref, const std::vector<float>& got) {
  return gates::compare(ref.data(), got.data(), 1, int64_t(ref.size())).nmse;
}

// The verdict of "the target did what `variant` does": the target matches the variant
// (NMSE within the match limit) and is `separation` times closer to it than to the correct
// reference. A variant closer to the correct reference than match / separation (within a
// bf16 target's own rounding) cannot be told apart: not applicable.
Hypothesis judge(std::string name, std::string cause, const std::vector<float>& got, const std::vector<float>& variant,
                 const std::vector<float>& correct) {
  const double match = gates::threshold("diagnose.match_nmse_max"), sep = gates::threshold("diagnose.separation_min");
  const double to_variant = nmse(variant, got), apart = nmse(correct, variant), to_correct = nmse(correct, got);
  Hypothesis h{std::move(name), std::move(cause), "", ""};
  h.evidence = fmt::format("NMSE target vs this variant {:.3g}, vs the correct reference {:.3g}; the variant is {:.3g} "
                           "from the correct one",
                           to_variant, to_correct, apart);
  if (!(apart >= match / sep)) h.verdict = "not applicable";
  else h.verdict = to_variant <= match && to_correct >= sep * to_variant ? "confirmed" : "ruled out";
  return h;
}

Hypothesis not_applicable(std::string name, std::string cause, std::string why) {
  return {std::move(name), std::move(cause), "not applicable", std::move(why)};
}

// ---- RoPE references -------------------------------------------------------------------

struct RopeVariant {
  bool interleaved = false;
  bool scaled = true;
  enum Norm { Before, After, None, WholeProjection } norm = Before;  // q/k norm (Qwen3) relative to RoPE
};

// rows of x (heads of hd each) at positions pos.. as the variant computes them.
std::vector<float> rope_ref(const ModelSpec& s, const float* x, int64_t rows, int64_t heads, int64_t pos,
                            const std::vector<float>& norm_w, const RopeVariant& v) {
  const int64_t hd = s.head_dim;
  std::vector<float> y(x, x + rows * heads * hd);
  const bool norm = s.qk_norm && v.norm != RopeVariant::None;
  if (norm && v.norm == RopeVariant::Before) oracle::rmsnorm(y.data(), norm_w.data(), y.data(), rows * heads, hd, s.rms_eps);
  if (norm && v.norm == RopeVariant::WholeProjection) {  // one RMS over the row, the weight tiled
    std::vector<float> w(static_cast<size_t>(heads * hd));
    for (int64_t h = 0; h < heads; ++h) std::copy(norm_w.begin(), norm_w.end(), w.begin() + h * hd);
    oracle::rmsnorm(y.data(), w.data(), y.data(), rows, heads * hd, s.rms_eps);
  }
  ModelSpec unscaled = s;
  unscaled.rope_scaling = RopeScaling{};
  unscaled.rope_freq_factors.clear();
  const std::vector<float> inv = oracle::rope_inv_freq(v.scaled ? s : unscaled);
  if (v.interleaved) {  // pairs (x[2i], x[2i+1]): permute into half-split order, rotate, permute back
    std::vector<float> tmp(static_cast<size_t>(hd));
    auto permute = [&](bool forward) {
      for (int64_t r = 0; r < rows * heads; ++r) {
        float* h = y.data() + r * hd;
        for (int64_t i = 0; i < hd / 2; ++i) {
          if (forward) tmp[size_t(i)] = h[2 * i], tmp[size_t(i + hd / 2)] = h[2 * i + 1];
          else tmp[size_t(2 * i)] = h[i], tmp[size_t(2 * i + 1)] = h[i + hd / 2];
        }
        std::copy(tmp.begin(), tmp.end(), h);
      }
    };
    permute(true);
    oracle::rope(y.data(), rows, heads, hd, pos, inv);
    permute(false);
  } else {
    oracle::rope(y.data(), rows, heads, hd, pos, inv);
  }
  if (norm && v.norm == RopeVariant::After) oracle::rmsnorm(y.data(), norm_w.data(), y.data(), rows * heads, hd, s.rms_eps);
  return y;
}

bool has_rope_scaling(const ModelSpec& s) {
  return s.rope_scaling.type != RopeScaling::Type::None || !s.rope_freq_factors.empty();
}

// S1: RoPE pairing, frequency scaling (in which pass), q/k norm order.
std::vector<Hypothesis> rope_variant(PhaseContext& ctx, const Failure&) {
  const ModelSpec& s = ctx.model.spec();
  const Acts a = layer0_acts(ctx);
  const int64_t T = a.T, Q = s.q_dim(), KV = s.kv_dim();
  std::unique_ptr<StagedRunner> t = ctx.fresh_target();
  // The target's RoPE on the raw projections at three call shapes: T rows from position 0,
  // two rows far out (a prefill shape) and one row far out (a decode step).
  const int64_t far = long_position(s, 2);
  auto run = [&](int64_t first_row, int64_t rows, int64_t pos) {
    std::vector<float> q(a.q_raw.begin() + first_row * Q, a.q_raw.begin() + (first_row + rows) * Q);
    std::vector<float> k(a.k_raw.begin() + first_row * KV, a.k_raw.begin() + (first_row + rows) * KV);
    t->op_rope(0, q.data(), k.data(), rows, pos);
    return q;
  };
  auto ref = [&](int64_t first_row, int64_t rows, int64_t pos, const RopeVariant& v) {
    return rope_ref(s, a.q_raw.data() + first_row * Q, rows, s.n_heads, pos, a.q_norm, v);
  };
  const std::vector<float> got0 = run(0, T, 0), got_pf = run(T - 2, 2, far - 1), got_d = run(T - 1, 1, far);
  const RopeVariant ok;
  std::vector<Hypothesis> out;
  {
    RopeVariant v;
    v.interleaved = true;
    out.push_back(judge("pairs interleaved (x[2i], x[2i+1]) instead of half-split", "rope-interleaved", got0, ref(0, T, 0, v),
                        ref(0, T, 0, ok)));
  }
  RopeVariant unscaled;
  unscaled.scaled = false;
  if (!has_rope_scaling(s)) {
    out.push_back(not_applicable("frequency scaling applied in prefill only", "rope-scaling-prefill-only",
                                 "the model has no RoPE frequency scaling"));
    out.push_back(not_applicable("frequency scaling missing", "rope-scaling-missing", "the model has no RoPE frequency scaling"));
  } else {
    // Prefill-only: the prefill shape is right and the decode step runs unscaled.
    Hypothesis d = judge("frequency scaling applied in prefill only", "rope-scaling-prefill-only", got_d,
                         ref(T - 1, 1, far, unscaled), ref(T - 1, 1, far, ok));
    const double pf_ok = nmse(ref(T - 2, 2, far - 1, ok), got_pf);
    d.evidence = fmt::format("decode step: {}; prefill shape at {}: NMSE vs the scaled reference {:.3g}", d.evidence,
                             far - 1, pf_ok);
    const bool prefill_right = pf_ok <= gates::threshold("diagnose.match_nmse_max");
    Hypothesis m = judge("frequency scaling missing", "rope-scaling-missing", got_pf, ref(T - 2, 2, far - 1, unscaled),
                         ref(T - 2, 2, far - 1, ok));
    if (d.verdict == "confirmed" && !prefill_right) d.verdict = "ruled out";
    if (m.verdict == "confirmed" && d.verdict == "confirmed") m.verdict = "ruled out";
    out.push_back(d);
    out.push_back(m);
  }
  if (!s.qk_norm) {
    out.push_back(not_applicable("q/k norm applied after RoPE", "qk-norm-after-rope", "the model has no q/k norm"));
    out.push_back(not_applicable("q/k norm missing", "q/k norm missing", "the model has no q/k norm"));
    out.push_back(not_applicable("q/k norm over the whole projection", "qk-norm-whole-projection",
                                 "the model has no q/k norm"));
  } else {
    RopeVariant after, none, whole;
    after.norm = RopeVariant::After;
    none.norm = RopeVariant::None;
    whole.norm = RopeVariant::WholeProjection;
    out.push_back(judge("q/k norm applied after RoPE", "qk-norm-after-rope", got0, ref(0, T, 0, after), ref(0, T, 0, ok)));
    out.push_back(judge("q/k norm missing", "q/k norm missing", got0, ref(0, T, 0, none), ref(0, T, 0, ok)));
    out.push_back(judge("q/k norm over each token's whole projection instead of per head", "qk-norm-whole-projection",
                        got0, ref(0, T, 0, whole), ref(0, T, 0, ok)));
  }
  return out;
}

// ---- S2: the q/k/v projections ------------------------------------------------------------

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

// ---- S3: attention ----------------------------------------------------------------------

std::vector<Hypothesis> attention_variant(PhaseContext& ctx, const Failure&) {
  const ModelSpec& s = ctx.model.spec();
  const Acts a = layer0_acts(ctx);
  const int64_t T = a.T, Q = s.q_dim(), KV = s.kv_dim(), hd = s.head_dim, nh = s.n_heads, nkv = s.n_kv_heads;
  std::unique_ptr<StagedRunner> t = ctx.fresh_target();
  const std::vector<float>&q = a.probe.at("q"), &k = a.probe.at("k"), &v = a.probe.at("v");
  t->reset();
  t->op_kv_write(0, 0, k.data(), v.data(), T);
  std::vector<float> got(size_t(T * Q));
  t->op_attention(0, q.data(), T, 0, got.data());
  t->reset();
  // One head's reference: query head h over kv head g with scores scaled by `scale`
  // (scores are linear in q, so the query is pre-multiplied).
  ModelSpec one = s;
  one.n_heads = one.n_kv_heads = 1;
  auto head_ref = [&](int64_t h, int64_t g, double scale) {
    std::vector<float> qh(size_t(T * hd)), kg(size_t(T * hd)), vg(size_t(T * hd)), o(size_t(T * hd));
    const double f = scale / s.attn_scale();
    for (int64_t r = 0; r < T; ++r)
      for (int64_t i = 0; i < hd; ++i) {
        qh[size_t(r * hd + i)] = float(q[size_t(r * Q + h * hd + i)] * f);
        kg[size_t(r * hd + i)] = k[size_t(r * KV + g * hd + i)];
        vg[size_t(r * hd + i)] = v[size_t(r * KV + g * hd + i)];
      }
    oracle::attention(qh.data(), T, 0, kg.data(), vg.data(), one, o.data(), 0);
    return o;
  };
  auto assemble = [&](const std::function<int64_t(int64_t)>& map, double scale) {
    std::vector<float> out(size_t(T * Q));
    for (int64_t h = 0; h < nh; ++h) {
      const std::vector<float> o = head_ref(h, map(h), scale);
      for (int64_t r = 0; r < T; ++r) std::copy_n(o.begin() + r * hd, hd, out.begin() + r * Q + h * hd);
    }
    return out;
  };
  const int64_t group = nh / nkv;
  auto right = [&](int64_t h) { return h / group; };
  const std::vector<float> correct = assemble(right, s.attn_scale());
  std::vector<Hypothesis> out;
  if (nkv == nh || nkv == 1)
    out.push_back(not_applicable("GQA head mapping h % n_kv", "gqa-modulo",
                                 fmt::format("{} kv heads for {} query heads: every mapping is the same", nkv, nh)));
  else
    out.push_back(judge("GQA head mapping h % n_kv instead of h / group", "gqa-modulo", got,
                        assemble([&](int64_t h) { return h % nkv; }, s.attn_scale()), correct));
  const double hidden_scale = 1.0 / std::sqrt(double(s.hidden) / double(nh));
  if (s.hidden / nh == hd)
    out.push_back(not_applicable("scale from hidden / heads", "attn-scale-hidden",
                                 "head_dim equals hidden / heads: the two scales agree"));
  else
    out.push_back(judge("scores scaled by (hidden / heads)^-0.5 instead of head_dim^-0.5", "attn-scale-hidden", got,
                        assemble(right, hidden_scale), correct));
  out.push_back(judge("scores scaled by 1 / head_dim (no square root)", "attn-scale-no-sqrt", got,
                      assemble(right, 1.0 / double(hd)), correct));
  if (nkv == 1)
    out.push_back(not_applicable("every query head reads kv head 0", "gqa-head0", "one kv head: every head reads it"));
  else
    out.push_back(judge("every query head reads kv head 0 (the kv-head offset missing)", "gqa-head0", got,
                        assemble([](int64_t) { return int64_t(0); }, s.attn_scale()), correct));
  {  // "Mask coverage per row": row t sees keys [0, t) instead of [0, t]; row 0 sees none.
    std::vector<float> masked(size_t(T * Q), std::numeric_limits<float>::quiet_NaN());
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t r = 1; r < T; ++r) {
        const int64_t g = right(h);
        std::vector<float> qh(static_cast<size_t>(hd)), kg(static_cast<size_t>(r * hd)), vg(static_cast<size_t>(r * hd)),
            o(static_cast<size_t>(hd));
        std::copy_n(q.begin() + r * Q + h * hd, hd, qh.begin());
        for (int64_t j = 0; j < r; ++j) {
          std::copy_n(k.begin() + j * KV + g * hd, hd, kg.begin() + j * hd);
          std::copy_n(v.begin() + j * KV + g * hd, hd, vg.begin() + j * hd);
        }
        oracle::attention(qh.data(), 1, r - 1, kg.data(), vg.data(), one, o.data(), 0);
        std::copy(o.begin(), o.end(), masked.begin() + r * Q + h * hd);
      }
    out.push_back(judge("the causal mask hides each row's own position (the first row sees no key: NaN)",
                        "mask-off-by-one", got, masked, correct));
  }
  return out;
}

// ---- S8: numeric range (porting-pitfalls row 8) ------------------------------------------

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

// ---- S4: accumulation precision ----------------------------------------------------------

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

// ---- S5: the KV cache across calls --------------------------------------------------------

std::vector<Hypothesis> kv_cache_state(PhaseContext& ctx, const Failure&) {
  const ModelSpec& s = ctx.model.spec();
  const Acts a = layer0_acts(ctx);
  const int64_t T = a.T, KV = s.kv_dim();
  std::unique_ptr<StagedRunner> t = ctx.fresh_target();
  const std::vector<float>&k = a.probe.at("k"), &v = a.probe.at("v");
  // "Run the same call twice": a prefill write, then the last two rows one decode step each.
  t->reset();
  t->op_kv_write(0, 0, k.data(), v.data(), T - 2);
  t->op_kv_write(0, T - 2, k.data() + (T - 2) * KV, v.data() + (T - 2) * KV, 1);
  t->op_kv_write(0, T - 1, k.data() + (T - 1) * KV, v.data() + (T - 1) * KV, 1);
  std::vector<float> kb(size_t(T * KV)), vb(size_t(T * KV));
  t->kv_read(0, 0, T, kb.data(), vb.data());
  t->reset();
  const std::vector<float> last_read(kb.end() - KV, kb.end()), prev_read(kb.end() - 2 * KV, kb.end() - KV),
      last_written(k.end() - KV, k.end());
  Hypothesis h = judge("a decode step writes the previous step's row (stale buffer)", "stale-kv", last_read, prev_read,
                       last_written);
  h.evidence = "last decode row read back vs the row before it: " + h.evidence;
  if (s.n_layers < 2) return {h, not_applicable("layers share cache rows", "kv-layer-aliased", "one layer")};
  // "Compare buffer keys": layer 0 written, then layer 1 with the negated rows; layer 0 read back.
  std::vector<float> nk(k.begin(), k.begin() + T * KV), nv(v.begin(), v.begin() + T * KV);
  for (float& x : nk) x = -x;
  for (float& x : nv) x = -x;
  t->op_kv_write(0, 0, k.data(), v.data(), T);
  t->op_kv_write(1, 0, nk.data(), nv.data(), T);
  t->kv_read(0, 0, T, kb.data(), vb.data());
  t->reset();
  Hypothesis alias = judge("layers share cache rows (layer 1's write lands in layer 0)", "kv-layer-aliased", kb, nk,
                           std::vector<float>(k.begin(), k.begin() + T * KV));
  alias.evidence = "layer 0 read back after layer 1 wrote the negated rows: " + alias.evidence;
  return {h, alias};
}

// ---- S6: an operand that is not refreshed between calls ------------------------------------

std::vector<Hypothesis> stale_operand(PhaseContext& ctx, const Failure&) {
  const ModelSpec& s = ctx.model.spec();
  const Acts a = layer0_acts(ctx);
  const int64_t T = a.T, H = s.hidden;
  std::unique_ptr<StagedRunner> t = ctx.fresh_target();
  // Two calls of the same kernel and shape on different inputs: the second must not see the first's.
  std::vector<float> first(size_t(T * H)), second(size_t(T * H));
  t->op_rmsnorm(Stage::AttnNorm, 0, a.probe.at("embed").data(), T, first.data());
  const std::vector<float>& in2 = a.probe.at("attn_residual");
  t->op_rmsnorm(Stage::MlpNorm, 0, in2.data(), T, second.data());
  const std::vector<float> w = ctx.model.get(layer_tensor(0, "post_attention_layernorm.weight")).to_f32();
  std::vector<float> correct(size_t(T * H)), stale(size_t(T * H));
  oracle::rmsnorm(in2.data(), w.data(), correct.data(), T, H, s.rms_eps);
  oracle::rmsnorm(a.probe.at("embed").data(), w.data(), stale.data(), T, H, s.rms_eps);
  Hypothesis h = judge("the second call computes on the first call's input (an input buffer not refreshed)", "stale-buffer",
                       second, stale, correct);
  return {h};
}

// An intermediate a merged dispatch does not refresh: layer 0 run twice on different inputs,
// as a prefill and as decode steps (a rewrite may merge either pass); the second call's
// residual add must use the second call's O projection.
std::vector<Hypothesis> stale_intermediate(PhaseContext& ctx, const Failure&) {
  const ModelSpec& s = ctx.model.spec();
  const Acts a = layer0_acts(ctx);
  const int64_t H = s.hidden;
  std::unique_ptr<StagedRunner> t = ctx.fresh_target();
  auto run = [&](const float* in, int64_t T) {
    std::map<std::string, std::vector<float>> p;
    std::vector<float> h(in, in + T * H);
    t->reset(T == 1 ? a.T : 0);  // a decode step: one row after a cached prompt's worth of positions
    t->forward_layers(h.data(), T, 1, [&](const std::string& name, const float* d, int64_t rows, int64_t cols) {
      if (name == "layers.0.o_proj" || name == "layers.0.attn_residual") p[name.substr(9)].assign(d, d + rows * cols);
    }, ProbeLevel::All);
    return p;
  };
  const std::vector<float>& in1 = a.probe.at("embed");
  const std::vector<float>& in2 = a.probe.at("attn_residual");  // another input of the same shape
  std::vector<Hypothesis> out;
  for (const int64_t T : {a.T, int64_t(1)}) {
    const std::string name = fmt::format("{}: a merged dispatch hands the residual add the previous call's O output (an "
                                         "intermediate not refreshed)", T == 1 ? "decode steps" : "prefill calls");
    const int64_t off = (a.T - T) * H;
    auto p1 = run(in1.data() + off, T), p2 = run(in2.data() + off, T);
    if (!p1.count("o_proj") || !p2.count("attn_residual")) {
      out.push_back(not_applicable(name, "merged-stale-intermediate", "the forward pass exposes no o_proj and attn_residual"));
      continue;
    }
    std::vector<float> correct(size_t(T * H)), stale(size_t(T * H));
    for (int64_t i = 0; i < T * H; ++i) {
      correct[size_t(i)] = in2[size_t(off + i)] + p2["o_proj"][size_t(i)];
      stale[size_t(i)] = in2[size_t(off + i)] + p1["o_proj"][size_t(i)];
    }
    out.push_back(judge(name, "merged-stale-intermediate", p2["attn_residual"], stale, correct));
  }
  t->reset();
  return out;
}

// ---- S9: the LM head ------------------------------------------------------------------------

std::vector<Hypothesis> lm_head(PhaseContext& ctx, const Failure&) {
  const ModelSpec& s = ctx.model.spec();
  if (ctx.model.find("lm_head.weight"))
    return {not_applicable("the head is not the tied embedding", "lm-head-untied",
                           "the checkpoint has its own lm_head.weight (not tied)")};
  const Acts a = layer0_acts(ctx);
  std::unique_ptr<StagedRunner> t = ctx.fresh_target();
  const std::vector<float>& x = a.probe.at("attn_norm");  // any normalized row will do
  std::vector<float> got(static_cast<size_t>(s.vocab)), ref(static_cast<size_t>(s.vocab));
  static const std::vector<float> none;
  t->op_linear(Stage::LmHead, x.data(), 1, ctx.model.lm_head().name, none, got.data());
  oracle::linear(x.data(), 1, ctx.model.lm_head(), nullptr, ref.data(), 0);
  const double r = gates::compare(ref.data(), got.data(), 1, s.vocab).pearson;
  const double unrelated = gates::threshold("diagnose.unrelated_pearson_max");
  // A head unrelated to the embedding gives logits uncorrelated with the tied product.
  return {{"the head is not the tied embedding (another matrix)", "lm-head-untied", r < unrelated ? "confirmed" : "ruled out",
           fmt::format("checkpoint tensor list: no lm_head.weight (tied to model.embed_tokens.weight); Pearson of the "
                       "target's logits with the tied product {:.3f} (unrelated below {})",
                       r, unrelated)}};
}

// ---- S12: the prompt ids (porting-pitfalls row 12) ------------------------------------------

// "Token ids side by side with the reference tokenizer": the prompt path's ids against the
// tokenizer's own encoding (BOS rule) and, where phase 0 had a transformers fixture, against
// transformers' ids for the same texts.
std::vector<Hypothesis> prompt_ids(PhaseContext& ctx, const Failure& f) {
  const Tokenizer& tok = ctx.tokenizer();
  std::vector<Hypothesis> out;
  const std::string text = canonical_prompts(tok).front().text;
  const std::vector<int32_t> prompt = tok.encode_prompt(text), raw = tok.encode_raw(text);
  const auto bos = tok.bos_id();
  Hypothesis dbl{"a second BOS before the prompt", "double-bos", "", ""};
  if (!bos || !tok.adds_bos()) {
    dbl.verdict = "not applicable";
    dbl.evidence = "the family adds no BOS";
  } else {
    std::vector<int32_t> two = raw;
    two.insert(two.begin(), 2, *bos);
    dbl.evidence = fmt::format("\"{}\": prompt ids [{}], tokenizer ids [{}]", text, fmt::join(prompt, ","), fmt::join(raw, ","));
    dbl.verdict = prompt == two ? "confirmed" : "ruled out";
  }
  out.push_back(dbl);
  // The fixture's texts, re-encoded (phase 0 recorded which fixture it used).
  const nlohmann::json ref = f.record.value("details", nlohmann::json::object()).value("reference", nlohmann::json::object());
  Hypothesis pre{"the tokenizer splits text differently from transformers (pre-tokenizer regex, normalizer)",
                 "tokenizer differs from transformers", "", ""};
  if (!ref.contains("fixture") || !ref["fixture"].is_string()) {
    pre.verdict = "not applicable";
    pre.evidence = "no transformers fixture matches this checkpoint";
  } else {
    const nlohmann::json fx = read_json_file(std::filesystem::path(ref["fixture"].get<std::string>()) / "fixture.json");
    const std::vector<TokenizedDifferently> diff = tokenized_differently(tok, fx);
    if (!diff.empty()) {
      const std::vector<int32_t>& ours = diff[0].ours;
      const std::vector<int32_t>& theirs = diff[0].theirs;
      size_t i = 0;
      while (i < ours.size() && i < theirs.size() && ours[i] == theirs[i]) ++i;
      pre.evidence = fmt::format("first difference at id {}: tessera {} \"{}\", transformers {} \"{}\"; ", i,
                                 i < ours.size() ? std::to_string(ours[i]) : "-", i < ours.size() ? tok.token_string(ours[i]) : "",
                                 i < theirs.size() ? std::to_string(theirs[i]) : "-",
                                 i < theirs.size() && theirs[i] < tok.vocab_size() ? tok.token_string(theirs[i]) : "");
    }
    pre.evidence += fmt::format("{} of {} fixture texts tokenized differently", diff.size(), fx["prompts"].size());
    pre.verdict = diff.empty() ? "ruled out" : "confirmed";
  }
  out.push_back(pre);
  return out;
}

// The gates of the record's failing rows ("phase0.prompt_ids", "phase6.stop_set", ...).
std::set<std::string> failed_gates(const Failure& f) {
  std::set<std::string> out;
  if (!f.record.is_object()) return out;
  for (const auto& g : f.record.value("gates", nlohmann::json::array()))
    if (!g.value("pass", true)) out.insert(g.value("gate", ""));
  return out;
}

bool prompt_ids_failed(const Failure& f) { return f.phase == 0 && failed_gates(f).count("phase0.prompt_ids"); }

// ---- S14: dispatch overhead (porting-pitfalls row 14; advisory) ----------------------------

// No gate fails when a modelled NPU spends its time launching small dispatches: on a
// passing deployment, the target's own merge skill is proposed on the frozen plan and both
// plans are priced. Confirmed when merging would make a pass at least
// diagnose.dispatch_gain_min times faster.
std::vector<Hypothesis> dispatch_overhead(PhaseContext& ctx, const Failure&) {
  Hypothesis h{"dispatch overhead not amortized: too many small dispatches", "dispatch-overhead", "ruled out", ""};
  const TargetDef& def = target_def(ctx.opts.target);
  const OptSkill* merge = nullptr;
  if (def.skills)
    for (const OptSkill& s : def.skills())
      if (s.name == "merge") merge = &s;
  if (!merge) return {not_applicable(h.name, h.cause, "the target has no merge skill")};
  std::unique_ptr<StagedRunner> cur = ctx.fresh_target();
  const double min_gain = gates::threshold("diagnose.dispatch_gain_min");
  for (const Pass pass : {Pass::Prefill, Pass::Decode}) {
    const PassFigure before = cur->measure(pass);
    if (!before.predicted)
      return {not_applicable(h.name, h.cause, "a measured target: dispatch overhead is a modelled NPU's figure")};
    std::string why;
    const std::vector<PlanRewrite> rws = merge->propose(ctx.plan(), pass, why);
    if (rws.empty()) {
      h.evidence += fmt::format("{}: {}; ", pass_name(pass), why);
      continue;
    }
    const PassFigure after = ctx.make_runner(rws.front().plan)->measure(pass);
    const double gain = before.seconds / std::max(after.seconds, 1e-12);
    h.evidence += fmt::format("{}: {:.3f} ms, {} would be {:.3f} ms ({:.2f}x); ", pass_name(pass), before.seconds * 1e3,
                              rws.front().what, after.seconds * 1e3, gain);
    if (gain >= min_gain) h.verdict = "confirmed";
  }
  h.evidence += fmt::format("confirmed at {:.2f}x or more", min_gain);
  return {h};
}

// ---- S13: the stop set (porting-pitfalls row 13) -------------------------------------------

// "tokenizer_config / generation config": which declared ids the runtime's stop set misses,
// and where each is declared. Runs the runtime's own Generator on a fresh runner.
std::vector<Hypothesis> stop_set(PhaseContext& ctx, const Failure&) {
  std::unique_ptr<StagedRunner> t = ctx.fresh_target();
  const Tokenizer& tok = ctx.tokenizer();
  const std::vector<int32_t> stops = Generator(*t, tok).stop_ids();
  const std::vector<DeclaredEos> declared = declared_eos_ids(ctx.model, tok);
  std::vector<std::string> missing, only_generation_config;
  for (const DeclaredEos& d : declared)
    if (!std::binary_search(stops.begin(), stops.end(), d.id)) {
      missing.push_back(fmt::format("{} ({})", d.id, d.source));
      if (d.source == "generation_config.json eos_token_id") only_generation_config.push_back(std::to_string(d.id));
    }
  const std::string facts = fmt::format("runtime stop set {{{}}}; declared {}; missing: {}", fmt::join(stops, ", "),
                                        declared.size(), missing.empty() ? "none" : fmt::format("{}", fmt::join(missing, "; ")));
  std::vector<Hypothesis> out;
  const std::optional<int32_t> eos = tok.token_id(tok.eos_token());
  Hypothesis first{"only the tokenizer's eos_token stops generation", "eos-first-only", "", facts};
  if (declared.size() < 2) first.verdict = "not applicable";
  else first.verdict = !missing.empty() && eos && stops == std::vector<int32_t>{*eos} ? "confirmed" : "ruled out";
  out.push_back(first);
  Hypothesis gen{"generation_config.json's ids not read", "generation_config.json ignored", "", facts};
  if (!std::filesystem::exists(std::filesystem::path(ctx.model.path()) / "generation_config.json"))
    gen.verdict = "not applicable";
  else gen.verdict = !missing.empty() && only_generation_config.size() == missing.size() ? "confirmed" : "ruled out";
  out.push_back(gen);
  return out;
}

bool stop_set_failed(const Failure& f) { return failed_gates(f).count("phase6.stop_set") > 0; }

// Whether the failure is in the numbers: any failing row but the stop-set check (every gate
// but that one measures them).
bool numbers_failed(const Failure& f) {
  if (!f.record.is_object()) return false;
  std::set<std::string> g = failed_gates(f);
  const bool stop_set = g.erase("phase6.stop_set") > 0;
  return !g.empty() || !stop_set;
}

// ---- S7: a refused mapping ------------------------------------------------------------------

std::vector<Hypothesis> refusal(PhaseContext&, const Failure& f) {
  const std::string text = f.record.at("details").value("refused", "");
  std::vector<Hypothesis> out;
  for (const char* code : {"l1-overflow", "l2-overflow", "bd-exhaustion", "bd-repeat", "bd-dims", "dma-channels",
                           "lock-exhaustion", "vector-length", "placement", "fifo-shape"}) {
    const size_t at = text.find(std::string(code) + ":");
    if (at == std::string::npos) continue;
    const size_t end = text.find('\n', at);
    out.push_back({fmt::format("the checker refuses with {}", code), code, "confirmed",
                   text.substr(at, end == std::string::npos ? std::string::npos : end - at)});
  }
  if (out.empty()) out.push_back({"a refusal code of the checker", "unknown refusal", "ruled out", text.substr(0, 300)});
  return out;
}

// ---- S8: the evaluator's findings (phase 7) ------------------------------------------------

std::vector<Hypothesis> audit_findings(PhaseContext&, const Failure& f) {
  std::vector<Hypothesis> out;
  for (const auto& finding : f.record.value("findings", nlohmann::json::array())) {
    if (finding.value("verdict", "") != "fail") continue;
    const std::string check = finding.value("check", ""), detail = finding.value("detail", "");
    if (check == "op-counters" && detail.find("by the oracle") != std::string::npos)
      out.push_back({"a stage silently computed by the oracle", "oracle-fallback", "confirmed", detail});
    else if (check == "determinism")
      out.push_back({"output differs between identical runs", "nondeterministic", "confirmed", detail});
    else if (check == "hashes")
      out.push_back({"files edited after the deploy", "edited after deploy", "confirmed", detail});
    else if (check == "thresholds")
      out.push_back({"a stored gate row loosened", "threshold loosened", "confirmed", detail});
    else
      out.push_back({"finding " + check, check, "confirmed", detail});
  }
  return out;
}

std::string stage_of_kernel_row(const nlohmann::json& row) {
  if (row.contains("stage")) return row["stage"].get<std::string>();  // op-table rows name their stage
  const std::string kernel = row.value("kernel", ""), role = row.value("role", "");
  if (kernel == "gemm") {
    for (const char* r : {"q_proj", "k_proj", "v_proj"})
      if (role.starts_with(r)) return "qkv_proj";
    if (role.starts_with("gate_proj") || role.starts_with("up_proj")) return "gate_up_proj";
    if (role.starts_with("down_proj")) return "down_proj";
    if (role.starts_with("o_proj")) return "o_proj";
    if (role.starts_with("lm_head")) return "lm_head";
  }
  if (kernel == "rmsnorm") return role;  // attn_norm, mlp_norm, final_norm
  if (kernel == "add") return role;
  return kernel;  // embedding, rope, kv_write, attention, silu_mul
}

}  // namespace

std::set<Stage> Failure::suspects() const {
  std::set<Stage> out;
  if (!record.is_object()) return out;
  const nlohmann::json d = record.value("details", nlohmann::json::object());
  for (const auto& row : d.value("kernels", nlohmann::json::array()))
    if (!row.value("pass", true)) {
      const std::string name = stage_of_kernel_row(row);
      for (int i = 0; i < kStageCount; ++i)
        if (name == stage_name(Stage(i))) out.insert(Stage(i));
    }
  if (d.contains("bisect") && d["bisect"].value("named", false)) {
    const std::string name = d["bisect"].value("stage", "");
    for (int i = 0; i < kStageCount; ++i)
      if (name == stage_name(Stage(i))) out.insert(Stage(i));
  }
  return out;
}

std::vector<std::string> Diagnosis::confirmed_causes() const {
  std::vector<std::string> out;
  for (const Hypothesis& h : hypotheses)
    if (h.verdict == "confirmed") out.push_back(h.cause);
  return out;
}

nlohmann::json Diagnosis::to_json() const {
  nlohmann::json j = {{"skill", skill}, {"symptom", symptom}, {"where", where}, {"hypotheses", nlohmann::json::array()}};
  for (const Hypothesis& h : hypotheses)
    j["hypotheses"].push_back({{"name", h.name}, {"cause", h.cause}, {"verdict", h.verdict}, {"evidence", h.evidence}});
  return j;
}

std::string Diagnosis::markdown() const {
  std::string md = fmt::format("### Debug skill `{}`\n\nSymptom: {}. Where to look: {}.\n\n| hypothesis | cause | verdict | evidence |\n"
                               "|---|---|---|---|\n",
                               skill, symptom, where);
  for (const Hypothesis& h : hypotheses)
    md += fmt::format("| {} | `{}` | {} | {} |\n", h.name, h.cause, h.verdict == "confirmed" ? "**confirmed**" : h.verdict,
                      h.evidence);
  return md;
}

const std::vector<DebugSkill>& debug_skills() {
  static const std::vector<DebugSkill> skills = {
      {"rope-variant", "RoPE output wrong (phase 1 rope rows, or bisect names rope): from position 1, only far out, or only in decode",
       "the target's RoPE kernel and the inverse frequencies it was given", {Stage::Rope}, nullptr, rope_variant},
      {"qkv-projection", "q/k/v projections wrong (phase 1 gemm rows of q/k/v_proj, or bisect names qkv_proj)",
       "the target's linear / fused shared-input kernels, bias handling, weight access pattern", {Stage::QkvProj}, nullptr,
       qkv_projection},
      {"attention-variant", "attention output wrong (phase 1 attention rows, or bisect names attention)",
       "the target's attention kernel: kv-head index, score scale", {Stage::Attention}, nullptr, attention_variant},
      {"numeric-range", "NaN or inf from an attention kernel right on the model's own scores (phase 1's large-score row)",
       "the softmax's max subtraction; accumulator and storage types along the graph", {Stage::Attention}, nullptr,
       numeric_range},
      {"gemm-precision", "every projection off by a smooth, K-dependent error (phase 1 gemm rows)",
       "the target's GEMM/GEMV accumulator type",
       {Stage::QkvProj, Stage::OProj, Stage::GateUpProj, Stage::DownProj, Stage::LmHead}, nullptr, gemm_precision},
      {"kv-cache-state", "right on the first call, wrong after (decode scenarios, or bisect names kv_write)",
       "the target's KV write path for single-row (decode) steps", {Stage::KvWrite, Stage::Attention}, nullptr,
       kv_cache_state},
      {"stale-operand", "a kernel right on its first call and wrong on a later call of the same shape",
       "input fifos marked resident, buffers reused across calls", {Stage::AttnNorm, Stage::MlpNorm}, nullptr,
       stale_operand},
      {"stale-intermediate", "right on the first call, wrong after, only in a plan that merges the O projection with the "
       "residual add (a phase 4/5 rewrite reverted by the gate)",
       "the merged dispatch's intermediate buffers: which are refreshed per call", {Stage::OProj, Stage::AttnResidual},
       nullptr, stale_intermediate},
      {"lm-head", "the LM head's logits wrong (phase 1 lm_head row)", "which matrix the head reads; tie_word_embeddings",
       {Stage::LmHead}, nullptr, lm_head},
      {"mapping-refused", "the target refused a mapping (npusim checker)", "the refusal's tile and numbers; the mapping's tiles",
       {}, [](const Failure& f) { return f.record.contains("details") && f.record["details"].contains("refused"); },
       refusal},
      {"prompt-ids", "phase 0's prompt-ids rows fail: a prompt starts with two BOS, or the tokenizer disagrees with "
       "transformers' ids", "Tokenizer::encode_prompt (the BOS rule), the pre-tokenizer and normalizer", {},
       prompt_ids_failed, prompt_ids},
      {"stop-set", "phase 6's stop-set row fails: generation would not stop on a declared end-of-sequence id",
       "tokenizer_config.json / generation_config.json / config.json eos ids; runtime/generate.cc stop_ids", {},
       stop_set_failed, stop_set},
      {"dispatch-overhead", "a passing deployment on a modelled NPU whose passes are mostly dispatch overhead (advisory: "
       "no gate fails)", "dispatches per layer in plan.md; the merge rows of perf_opt_traj.md", {},
       [](const Failure& f) { return f.phase < 0; }, dispatch_overhead},
      {"audit-finding", "the independent evaluator (phase 7) failed the deployment", "evaluation_report.md; the named check",
       {}, [](const Failure& f) { return f.phase == 7; }, audit_findings},
      // Last: the fault-specific skills name a cause first; error-shape describes the error's shape.
      {"error-shape", "a kernel row fails its limits (phase 1, a rewrite's op table, or the frozen plan's in phase 6)",
       "the failing kernel: its constants and scales, per-head and per-position indexing, loop bounds, layout",
       {Stage::Embedding, Stage::AttnNorm, Stage::QkvProj, Stage::Rope, Stage::KvWrite, Stage::Attention, Stage::OProj,
        Stage::AttnResidual, Stage::MlpNorm, Stage::GateUpProj, Stage::SiluMul, Stage::DownProj, Stage::MlpResidual,
        Stage::FinalNorm, Stage::LmHead},
       nullptr, error_shape},
  };
  return skills;
}

std::vector<Diagnosis> run_debug_skills(PhaseContext& ctx, const Failure& f) {
  const std::set<Stage> suspects = f.suspects();
  const bool refused = f.record.contains("details") && f.record["details"].contains("refused");
  std::vector<Diagnosis> out;
  for (const DebugSkill& skill : debug_skills()) {
    bool match = skill.matches ? skill.matches(f) : false;
    if (!skill.stages.empty() && f.phase >= 1 && f.phase <= 6 && !refused && numbers_failed(f)) {
      // A record that names stages picks the skills for them; one that names none (phases
      // 3 and later, a bisect without a verdict) runs every stage skill.
      match = suspects.empty() ||
              std::any_of(skill.stages.begin(), skill.stages.end(), [&](Stage s) { return suspects.count(s) > 0; });
    }
    if (!match) continue;
    ctx.progress(fmt::format("[diagnose] {}", skill.name));
    Diagnosis d{skill.name, skill.symptom, skill.where, {}};
    try {
      d.hypotheses = skill.run(ctx, f);
    } catch (const Error& e) {
      d.hypotheses.push_back({"the experiment itself", "experiment failed", "ruled out", e.what()});
    }
    out.push_back(std::move(d));
  }
  return out;
}

std::string diagnoses_markdown(const std::vector<Diagnosis>& ds) {
  std::vector<std::string> causes;
  for (const Diagnosis& d : ds)
    for (const std::string& c : d.confirmed_causes())
      if (std::find(causes.begin(), causes.end(), c) == causes.end()) causes.push_back(c);
  std::string md = causes.empty() ? "Debug skills ran; no hypothesis was confirmed (see the tables).\n"
                                  : fmt::format("Named cause(s): {}\n", fmt::join(causes, "; "));
  for (const Diagnosis& d : ds) md += "\n" + d.markdown();
  return md;
}

}  // namespace tessera
