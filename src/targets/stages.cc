#include "targets/stages.h"

#include <fmt/format.h>

#include "util/error.h"

namespace tessera {

namespace {
struct StageInfo {
  const char* name;
  const char* kernel;
};
constexpr StageInfo kStages[kStageCount] = {
    {"embedding", "embedding"}, {"attn_norm", "rmsnorm"},    {"qkv_proj", "gemm"},       {"rope", "rope"},
    {"kv_write", "kv_write"},   {"attention", "attention"},  {"o_proj", "gemm"},         {"attn_residual", "add"},
    {"mlp_norm", "rmsnorm"},    {"gate_up_proj", "gemm"},    {"silu_mul", "silu_mul"},   {"down_proj", "gemm"},
    {"mlp_residual", "add"},    {"final_norm", "rmsnorm"},   {"lm_head", "gemm"},
};
}  // namespace

const char* stage_name(Stage s) { return kStages[int(s)].name; }
const char* stage_kernel(Stage s) { return kStages[int(s)].kernel; }

Stage stage_from_name(const std::string& name) {
  std::string names;
  for (int i = 0; i < kStageCount; ++i) {
    if (name == kStages[i].name) return Stage(i);
    names += (i ? ", " : "") + std::string(kStages[i].name);
  }
  fail("unknown stage '{}'; stages: {}", name, names);
}

const std::vector<Stage>& layer_stages() {
  static const std::vector<Stage> stages = {Stage::AttnNorm,     Stage::QkvProj, Stage::Rope,       Stage::KvWrite,
                                            Stage::Attention,    Stage::OProj,   Stage::AttnResidual, Stage::MlpNorm,
                                            Stage::GateUpProj,   Stage::SiluMul, Stage::DownProj,   Stage::MlpResidual};
  return stages;
}

std::string stage_shape(Stage st, const ModelSpec& s) {
  const int64_t H = s.hidden, Q = s.q_dim(), KV = s.kv_dim(), I = s.intermediate;
  switch (st) {
    case Stage::Embedding: return fmt::format("ids[T] -> [T,{}]", H);
    case Stage::AttnNorm:
    case Stage::MlpNorm:
    case Stage::FinalNorm: return fmt::format("[T,{}]", H);
    case Stage::QkvProj: return fmt::format("[T,{}] x [{}+{}+{},{}]^T{}", H, Q, KV, KV, H, s.qkv_bias ? " + bias" : "");
    case Stage::Rope: return fmt::format("q [T,{}], k [T,{}]{}", Q, KV, s.qk_norm ? " (q/k RMSNorm first)" : "");
    case Stage::KvWrite: return fmt::format("k, v [T,{}] -> cache", KV);
    case Stage::Attention: return fmt::format("q [T,{}] over cache, {} heads / {} kv, head_dim {}", Q, s.n_heads, s.n_kv_heads, s.head_dim);
    case Stage::OProj: return fmt::format("[T,{}] x [{},{}]^T", Q, H, Q);
    case Stage::AttnResidual:
    case Stage::MlpResidual: return fmt::format("[T,{}] += [T,{}]", H, H);
    case Stage::GateUpProj: return fmt::format("[T,{}] x [2x{},{}]^T", H, I, H);
    case Stage::SiluMul: return fmt::format("[T,{}]", I);
    case Stage::DownProj: return fmt::format("[T,{}] x [{},{}]^T", I, H, I);
    case Stage::LmHead: return fmt::format("[1,{}] x [{},{}]^T", H, s.vocab, H);
    default: return "";
  }
}

nlohmann::json one_op_per_dispatch(const ModelSpec& s, const std::string& on) {
  nlohmann::json dispatches = nlohmann::json::array();
  auto add = [&](Stage st, int64_t layer) {
    nlohmann::json op = {{"op", stage_name(st)}, {"kernel", stage_kernel(st)}, {"on", on}, {"shape", stage_shape(st, s)}};
    if (layer >= 0) op["layer"] = layer;
    dispatches.push_back({{"id", dispatches.size()}, {"ops", nlohmann::json::array({op})}});
  };
  add(Stage::Embedding, -1);
  for (int64_t l = 0; l < s.n_layers; ++l)
    for (Stage st : layer_stages()) add(st, l);
  add(Stage::FinalNorm, -1);
  add(Stage::LmHead, -1);
  return dispatches;
}

}  // namespace tessera
