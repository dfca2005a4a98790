// Debug skill stale-intermediate: a merged dispatch's intermediate not refreshed per call.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "pipeline/skill_support.h"

namespace tessera {

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
    // Where the target hands o to the add (npusim: the merged dispatch and its buffer).
    const std::string where = t->handover(Stage::OProj, Stage::AttnResidual, T);
    const std::string name = fmt::format("{}: a merged dispatch hands the residual add the previous call's O output (an "
                                         "intermediate not refreshed{})",
                                         T == 1 ? "decode steps" : "prefill calls", where.empty() ? "" : ": " + where);
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

}  // namespace tessera
