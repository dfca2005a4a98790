// What the debug skills share: the oracle's layer-0 evidence, the verdict rule, and reading a
// failure's record.
#include "pipeline/skill_support.h"

#include <fmt/format.h>

#include "model/tensors.h"
#include "oracle/ops.h"
#include "pipeline/op_table.h"

namespace tessera {

Acts layer0_acts(PhaseContext& ctx) {
  const ModelSpec& s = ctx.model.spec();
  Acts a;
  // The op table's inputs: the oracle's layer 0 on the long prompt, computed once per run.
  const OpInputs& in = ctx.op_inputs();
  a.T = in.T;
  a.probe = in.probe;
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


// The gates of the record's failing rows ("phase0.prompt_ids", "phase6.stop_set", ...).
std::set<std::string> failed_gates(const Failure& f) {
  std::set<std::string> out;
  if (!f.record.is_object()) return out;
  for (const auto& g : f.record.value("gates", nlohmann::json::array()))
    if (!g.value("pass", true)) out.insert(g.value("gate", ""));
  return out;
}


// Whether the failure is in the numbers: any failing row but the stop-set check (every gate
// but that one measures them).
bool numbers_failed(const Failure& f) {
  if (!f.record.is_object()) return false;
  std::set<std::string> g = failed_gates(f);
  const bool stop_set = g.erase("phase6.stop_set") > 0;
  return !g.empty() || !stop_set;
}


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

}  // namespace tessera
