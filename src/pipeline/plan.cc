#include "pipeline/plan.h"

#include <fmt/format.h>

#include "pipeline/deployment.h"
#include "targets/cpu/kernels.h"
#include "util/sha256.h"

namespace tessera {

nlohmann::json build_cpu_plan(const Model& model, const CpuRunner& runner) {
  const ModelSpec& s = model.spec();
  nlohmann::json plan;
  plan["format"] = "tessera-plan/1";
  plan["name"] = "cpu-naive";
  plan["target"] = "cpu";
  plan["model"] = {{"path", model.path()}, {"format", model.format()}, {"arch", arch_name(s.arch)}, {"spec", s.to_json()}};
  plan["cpu"] = {{"isa", cpu::isa()}, {"threads", runner.threads()}};
  plan["weights"] = {{"dtype", "bf16"},
                     {"mapped_bytes", runner.mapped_weight_bytes()},
                     {"converted_bytes", runner.owned_weight_bytes()},
                     {"residency", runner.owned_weight_bytes() == 0 ? "memory-mapped from the checkpoint"
                                                                     : "converted to bf16 once at load (the file is not bf16 in HF layout)"}};
  plan["kv_cache"] = {{"bytes_per_position", runner.kv_bytes_per_position()}, {"growth", "on demand"}};
  const std::string T = "T";
  auto shape_of = [&](Stage st) -> std::string {
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
  };
  nlohmann::json dispatches = nlohmann::json::array();
  auto add = [&](Stage st, int64_t layer) {
    nlohmann::json op = {{"op", stage_name(st)}, {"kernel", stage_kernel(st)}, {"on", "cpu"}, {"shape", shape_of(st)}};
    if (layer >= 0) op["layer"] = layer;
    dispatches.push_back({{"id", dispatches.size()}, {"ops", nlohmann::json::array({op})}});
  };
  add(Stage::Embedding, -1);
  for (int64_t l = 0; l < s.n_layers; ++l)
    for (Stage st : layer_stages()) add(st, l);
  add(Stage::FinalNorm, -1);
  add(Stage::LmHead, -1);
  plan["dispatches"] = dispatches;
  plan["host_ops"] = nlohmann::json::array();  // the cpu target is the host: nothing is left behind
  plan["frozen"] = false;
  return plan;
}

std::string plan_hash(const nlohmann::json& plan) { return sha256_hex(plan.dump()); }

std::string plan_markdown(const nlohmann::json& plan, const nlohmann::json& state) {
  const nlohmann::json& spec = plan["model"]["spec"];
  std::string md = "# Deployment plan\n\n";
  md += fmt::format("- model: `{}` ({}, {})\n", plan["model"]["path"].get<std::string>(), plan["model"]["arch"].get<std::string>(),
                    plan["model"]["format"].get<std::string>());
  md += fmt::format("- shape: hidden {}, {} layers, {} heads / {} kv heads, head_dim {}, intermediate {}, vocab {}\n",
                    spec.value("hidden", 0), spec.value("n_layers", 0), spec.value("n_heads", 0), spec.value("n_kv_heads", 0),
                    spec.value("head_dim", 0), spec.value("intermediate", 0), spec.value("vocab", 0));
  md += fmt::format("- target: {} ({}, {} threads)\n", plan["target"].get<std::string>(), plan["cpu"]["isa"].get<std::string>(),
                    plan["cpu"]["threads"].get<int>());
  md += fmt::format("- weights: bf16, {}; {} bytes mapped, {} bytes converted\n", plan["weights"]["residency"].get<std::string>(),
                    plan["weights"]["mapped_bytes"].get<int64_t>(), plan["weights"]["converted_bytes"].get<int64_t>());
  md += fmt::format("- plan: {} ({} dispatches, one op each){}\n\n", plan["name"].get<std::string>(), plan["dispatches"].size(),
                    plan.value("frozen", false) ? ", frozen by phase 6" : "");
  md += "## Kernels (one layer)\n\n| op | kernel | shape |\n|---|---|---|\n";
  for (const auto& d : plan["dispatches"]) {
    const auto& op = d["ops"][0];
    if (op.contains("layer") && op["layer"].get<int64_t>() != 0) continue;
    md += fmt::format("| {} | {} | {} |\n", op["op"].get<std::string>(), op["kernel"].get<std::string>(), op["shape"].get<std::string>());
  }
  md += "\n## Phases\n\n";
  for (const PhaseDef& p : phase_defs()) {
    const nlohmann::json r = state["phases"].value(std::to_string(p.id), nlohmann::json::object());
    const std::string status = r.value("status", "pending");
    md += fmt::format("- [{}] {} {}: {}{}\n", status == "passed" ? "x" : " ", p.id, p.name, status,
                      r.contains("summary") ? " — " + r["summary"].get<std::string>() : "");
  }
  return md;
}

}  // namespace tessera
