// Debug skill attention-variant: attention against its variants (kv-head mapping, score scale, mask).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "oracle/ops.h"
#include "pipeline/skill_support.h"

namespace tessera {

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

}  // namespace tessera
