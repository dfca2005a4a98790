// npusim plans (design section 4): where each op of a layer runs (the NPU or the host) and
// how the NPU's ops are grouped into dispatches (one host call each), with the residency
// of weights and intermediates. Functional results depend only on placement (which ops run
// on the host, in fp32); grouping and residency change the predicted time.
//
// Named plans for every model (ARCHITECTURE section 4; issue 5):
//   baseline  the first plan phases 1 to 3 validate: every op on the NPU, one op per
//             dispatch, weights sent with every call, every intermediate synced to the host.
//   naive     the reference deployment's naive plan: one op per dispatch, weights sent every
//             call, the prefill attention's softmax and the whole decode attention on the
//             host, the LM head on the host.
//   merged    the reference deployment's optimized plan: prefill in three dispatches per
//             layer (norm + QKV + RoPE; attention; O projection + residual + norm +
//             gate/up + SiLU x mul + down + residual), decode in two dispatches per layer
//             around attention on the host, the LM head a GEMV over 8 columns on the NPU;
//             weights resident, intermediates never synced inside a dispatch.
// Every plan also carries its tuned tiles (none in the named plans).
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "targets/npusim/mappings.h"
#include "targets/stages.h"

namespace tessera::npusim {

// How a stage runs. Attention may be split: the scores and context GEMMs on the NPU with
// the softmax on the host (naive prefill).
enum class Placement { Npu, Host, NpuWithHostSoftmax };
const char* placement_name(Placement p);

struct PlanStep {
  Stage stage = Stage::Count;
  Placement placement = Placement::Npu;
};

// One host call (or, for host-placed steps, one stretch of host work between calls).
struct PlanDispatch {
  std::string name;
  std::vector<PlanStep> steps;
  bool host() const;  // every step on the host: no dispatch, host time only
};

struct NpuPlan {
  std::string name;
  std::string description;
  // Per pass: the dispatches of one layer (repeated for every layer), and of the model's
  // head (final norm + LM head) and embedding.
  struct Pass {
    std::vector<PlanDispatch> embedding, layer, head;
  } prefill, decode;
  bool weights_resident = false;         // weights kept in device memory across calls
  bool intermediates_on_device = false;  // buffers between a dispatch's launches never synced
  bool zero_copy = false;                // host buffers mapped, not copied
  // GEMV tiles by weight shape (N, K) and the weight's element type (a quantized weight's
  // best tiles differ), set by tile-tune; a shape not listed runs the mapping's default
  // tiles. Not for L1-resident weights (loaded once: nothing to tune).
  std::map<std::tuple<int64_t, int64_t, ElemType>, GemvTiles> gemv_tiles;
  GemvTiles gemv_tiles_for(const GemvShape& s, const Device& d) const;

  const Pass& pass(bool decode_step) const { return decode_step ? decode : prefill; }
  // Where `stage` runs in a prefill (T > 1) or decode (T == 1) step.
  Placement placement(Stage stage, bool decode_step) const;
  // The stages a pass leaves on the host, by plan choice (the report lists them).
  std::vector<std::string> host_stages(bool decode_step) const;
  int dispatches_per_layer(bool decode_step) const;  // NPU dispatches only
  // Whether stages a and b run in the same NPU dispatch of a pass.
  bool shares_dispatch(Stage a, Stage b, bool decode_step) const;
  nlohmann::json to_json() const;
};

const std::vector<std::string>& plan_names();  // "baseline", "naive", "merged"
const std::string& default_plan_name();        // "baseline"
NpuPlan named_plan(const std::string& name);   // throws naming the plans
NpuPlan plan_from_json(const nlohmann::json& j);  // a plan as to_json wrote it (frozen plans)

}  // namespace tessera::npusim
