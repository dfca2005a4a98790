#include "pipeline/plan.h"

#include <fmt/format.h>

#include "pipeline/deployment.h"
#include "util/sha256.h"

namespace tessera {

std::string plan_hash(const nlohmann::json& plan) { return sha256_hex(plan.dump()); }

std::string plan_markdown(const nlohmann::json& plan, const nlohmann::json& state) {
  const nlohmann::json& spec = plan["model"]["spec"];
  std::string md = "# Deployment plan\n\n";
  md += fmt::format("- model: `{}` ({}, {})\n", plan["model"]["path"].get<std::string>(), plan["model"]["arch"].get<std::string>(),
                    plan["model"]["format"].get<std::string>());
  md += fmt::format("- shape: hidden {}, {} layers, {} heads / {} kv heads, head_dim {}, intermediate {}, vocab {}\n",
                    spec.value("hidden", 0), spec.value("n_layers", 0), spec.value("n_heads", 0), spec.value("n_kv_heads", 0),
                    spec.value("head_dim", 0), spec.value("intermediate", 0), spec.value("vocab", 0));
  // The target line: the cpu's section (ISA, threads), else the plan's own description.
  const std::string target = plan["target"].get<std::string>();
  if (plan.contains("cpu"))
    md += fmt::format("- target: {} ({}, {} threads)\n", target, plan["cpu"]["isa"].get<std::string>(), plan["cpu"]["threads"].get<int>());
  else
    md += fmt::format("- target: {}\n", plan.value("description", target));
  const nlohmann::json weights = plan.value("weights", nlohmann::json::object());
  if (weights.contains("mapped_bytes"))
    md += fmt::format("- weights: {}, {}; {} bytes mapped, {} bytes converted\n", weights.value("dtype", "bf16"),
                      weights["residency"].get<std::string>(), weights["mapped_bytes"].get<int64_t>(),
                      weights["converted_bytes"].get<int64_t>());
  else if (weights.contains("held")) {  // npusim: how each weight buffer is held (blocks or bf16) and why
    md += fmt::format("- weights: {}\n", weights.value("residency", "?"));
    for (const auto& [buffer, how] : weights["held"].items()) md += fmt::format("  - `{}`: {}\n", buffer, how.get<std::string>());
  } else if (!weights.empty())
    md += fmt::format("- weights: {}, {}\n", weights.value("dtype", "?"), weights.value("residency", "?"));
  size_t n_ops = 0;
  for (const auto& d : plan["dispatches"]) n_ops += d["ops"].size();
  md += fmt::format("- plan: {} ({} dispatches, {}){}\n\n", plan["name"].get<std::string>(), plan["dispatches"].size(),
                    n_ops == plan["dispatches"].size() ? std::string("one op each") : fmt::format("{} ops", n_ops),
                    plan.value("frozen", false) ? ", frozen by phase 6" : "");
  md += "## Kernels (one layer)\n\n| op | kernel | shape |\n|---|---|---|\n";
  for (const auto& d : plan["dispatches"])
    for (const auto& op : d["ops"]) {
      if (op.contains("layer") && op["layer"].get<int64_t>() != 0) continue;
      md += fmt::format("| {} | {} | {} |\n", op["op"].get<std::string>(), op["kernel"].get<std::string>(), op["shape"].get<std::string>());
    }
  md += "\n## Phases\n\n";
  for (const PhaseDef& p : phase_defs()) {
    const nlohmann::json r = state["phases"].value(std::to_string(p.id), nlohmann::json::object());
    const std::string status = r.value("status", "pending");
    md += fmt::format("- [{}] {} {}: {}{}\n", phase_done(status) ? "x" : " ", p.id, p.name, status,
                      r.contains("summary") ? " — " + r["summary"].get<std::string>() : "");
  }
  return md;
}

}  // namespace tessera
