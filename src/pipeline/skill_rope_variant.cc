// Debug skill rope-variant: RoPE against its variants (pairing, scaling, q/k norm order).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "oracle/ops.h"
#include "pipeline/skill_support.h"

namespace tessera {

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

}  // namespace tessera
