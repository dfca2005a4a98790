// What each layer adds to the residual stream, target against oracle, one layer at a time
// (phase 3's layer-scoped gate, and its diagnosis). The target runs the prompt with its
// residual stream snapped back to the oracle's after every layer (teacher forcing), so each
// layer starts from the oracle's input: a bug confined to one layer shows at that layer
// alone, undiluted by the few very large channels that dominate the residual stream and by
// the error the layers before it accumulated. Each sublayer's contribution (the attention
// block's and the MLP's, as they reach the stream, residual add included) is compared.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "pipeline/phases.h"

namespace tessera {

// How far each sublayer's contribution may be from the oracle's: a margin above the sum of its
// kernels' expected relative errors under the target's declared numerics (a first-order bound
// on the chain: attention = norm, q|k|v, RoPE, KV write, attention, o, add; MLP = norm,
// gate|up, SiLU*up, down, add), never under a floor, never looser than the table's outer bound.
struct SublayerLimits {
  double attention_expected = 0, mlp_expected = 0;
  double attention = 0, mlp = 0;  // the limits (before the outer bound's clamp)
};
SublayerLimits sublayer_limits(PhaseContext& ctx, const StagedRunner& target);

struct SublayerErrors {
  // Per layer: ||target's contribution - oracle's|| / ||oracle's||, over every position.
  std::vector<double> attn, mlp;
  // Per layer: the same over the positions past the first `kFarPositions` only (a bug that
  // shows only far into a context is diluted over a long prompt's early rows); NaN when the
  // prompt is not that long.
  std::vector<double> attn_far, mlp_far;
  static constexpr int64_t kFarPositions = 256;
  // The worst (layer, sublayer) and its error: "layer 7 attention".
  struct Worst {
    int64_t layer = -1;
    std::string sublayer;  // "attention" or "mlp"
    double error = 0;
    bool far = false;      // found over the far positions
  };
  Worst worst() const;  // error 0 and layer -1 when every series is empty
  struct Series {
    const std::vector<double>* errors;
    const char* sublayer;
    bool far;
  };
  std::vector<Series> series() const;
  // The first layer in depth order whose attention or MLP error passes its limit (layer -1 when none).
  Worst first_over(const SublayerLimits& limits) const;
  double attention_max() const;  // over every layer, all positions and the far ones
  double mlp_max() const;
  nlohmann::json to_json() const;
};

// Adds the layer-scoped checks (attention_error, mlp_error: the worst layer against its
// derived limit) to a gate row: phase 3's and phase 6's rows hold the same two.
void require_sublayer_limits(gates::GateResult& g, const SublayerErrors& errors, const SublayerLimits& limits);

// The diagnosis naming `first` (SublayerErrors::first_over) on prompt `prompt_text`; "" when
// no layer is over its limit (layer -1).
std::string sublayer_diagnosis(const std::string& prompt_text, const SublayerErrors::Worst& first);

// Runs `p` (the last token as a decode step when last_as_decode) on `target`, teacher-forced
// by the oracle's residual stream, and compares every layer's two contributions. The
// target's own output tap (perturbations) stays in force, ahead of the snapping.
SublayerErrors sublayer_errors(PhaseContext& ctx, StagedRunner& target, const CanonicalPrompt& p, bool last_as_decode);

}  // namespace tessera
