// The stage vocabulary every target shares: the forward pass cut into the kernel calls a
// target makes, in execution order. Phase 1 names its cases by kernel class, phase 2's
// bisect swaps one stage at a time for the oracle's kernel, plans list one op per stage,
// and op counters are keyed by stage name.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/spec.h"

namespace tessera {

// The stages of the forward pass in execution order; each is one target kernel call (or a
// small fixed group: qkv_proj is three GEMMs, rope also applies Qwen3's q/k norm first).
enum class Stage : int {
  Embedding, AttnNorm, QkvProj, Rope, KvWrite, Attention, OProj, AttnResidual, MlpNorm, GateUpProj,
  SiluMul, DownProj, MlpResidual, FinalNorm, LmHead, Count
};
constexpr int kStageCount = int(Stage::Count);
const char* stage_name(Stage s);
const char* stage_kernel(Stage s);  // the kernel class: "gemm", "rmsnorm", "rope", ...
Stage stage_from_name(const std::string& name);  // throws naming the stages
const std::vector<Stage>& layer_stages();         // the per-layer stages, in order

// A stage's operand shapes for this model, as plans show them ("[T,576] x [576+192+192,576]^T").
std::string stage_shape(Stage s, const ModelSpec& spec);
// The first plan's dispatch list: every stage of every layer, one op per dispatch, each op
// {"op", "kernel", "on": `on`, "shape", "layer" (per-layer stages)}.
nlohmann::json one_op_per_dispatch(const ModelSpec& spec, const std::string& on);

}  // namespace tessera
