// Debug skill stale-operand: an operand not refreshed between calls.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "oracle/ops.h"
#include "model/tensors.h"
#include "pipeline/skill_support.h"

namespace tessera {

std::vector<Hypothesis> stale_operand(PhaseContext& ctx, const Failure&) {
  const ModelSpec& s = ctx.model.spec();
  const Acts a = layer0_acts(ctx);
  const int64_t T = a.T, H = s.hidden;
  std::unique_ptr<StagedRunner> t = ctx.fresh_target();
  // The same call twice (one kernel, one shape, one weight) on different inputs: the second
  // must not see the first's.
  std::vector<float> first(size_t(T * H)), second(size_t(T * H));
  t->op_rmsnorm(Stage::AttnNorm, 0, a.probe.at("embed").data(), T, first.data());
  const std::vector<float>& in2 = a.probe.at("attn_residual");
  t->op_rmsnorm(Stage::AttnNorm, 0, in2.data(), T, second.data());
  const std::vector<float> w = ctx.model.get(layer_tensor(0, "input_layernorm.weight")).to_f32();
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

}  // namespace tessera
