#include "pipeline/plan.h"

#include <fmt/format.h>

#include "pipeline/deployment.h"
#include "util/error.h"
#include "util/json_fields.h"
#include "util/sha256.h"

namespace tessera {

namespace {

// An integer of plan.json (fuzz_plan found "layer": 2.8e34 read as int64_t): util/json_fields.h.
int64_t integer(const nlohmann::json& obj, const char* key) {
  return json_integer(obj.at(key), fmt::format("plan.json: '{}'", key));
}
int64_t integer_or(const nlohmann::json& obj, const char* key, int64_t fallback) {
  return json_integer_or(obj, key, fmt::format("plan.json: '{}'", key), fallback);
}

}  // namespace

std::string plan_hash(const nlohmann::json& plan) { return sha256_hex(plan.dump()); }

std::string plan_markdown(const nlohmann::json& plan, const nlohmann::json& state) {
  const nlohmann::json& spec = plan.at("model").at("spec");
  std::string md = "# Deployment plan\n\n";
  md += fmt::format("- model: `{}` ({}, {})\n", plan.at("model").at("path").get<std::string>(), plan.at("model").at("arch").get<std::string>(),
                    plan.at("model").at("format").get<std::string>());
  md += fmt::format("- shape: hidden {}, {} layers, {} heads / {} kv heads, head_dim {}, intermediate {}, vocab {}\n",
                    integer_or(spec, "hidden", 0), integer_or(spec, "n_layers", 0), integer_or(spec, "n_heads", 0),
                    integer_or(spec, "n_kv_heads", 0), integer_or(spec, "head_dim", 0), integer_or(spec, "intermediate", 0),
                    integer_or(spec, "vocab", 0));
  // The target line: the target's own section where it names an ISA and threads (a host
  // target), else the plan's own description.
  const std::string target = plan.at("target").get<std::string>();
  const nlohmann::json own = plan.value(target, nlohmann::json::object());
  if (own.is_object() && own.contains("isa") && own.contains("threads"))
    md += fmt::format("- target: {} ({}, {} threads)\n", target, own.at("isa").get<std::string>(), integer(own, "threads"));
  else
    md += fmt::format("- target: {}\n", plan.value("description", target));
  const nlohmann::json weights = plan.value("weights", nlohmann::json::object());
  if (weights.contains("mapped_bytes"))
    md += fmt::format("- weights: {}, {}; {} bytes mapped, {} bytes converted\n", weights.value("dtype", "bf16"),
                      weights.at("residency").get<std::string>(), integer(weights, "mapped_bytes"),
                      integer(weights, "converted_bytes"));
  else if (weights.contains("held")) {  // npusim: how each weight buffer is held (blocks or bf16) and why
    md += fmt::format("- weights: {}\n", weights.value("residency", "?"));
    for (const auto& [buffer, how] : weights.at("held").items()) md += fmt::format("  - `{}`: {}\n", buffer, how.get<std::string>());
  } else if (!weights.empty())
    md += fmt::format("- weights: {}, {}\n", weights.value("dtype", "?"), weights.value("residency", "?"));
  size_t n_ops = 0;
  for (const auto& d : plan.at("dispatches")) n_ops += d.at("ops").size();
  md += fmt::format("- plan: {} ({} dispatches, {}){}\n\n", plan.at("name").get<std::string>(), plan.at("dispatches").size(),
                    n_ops == plan.at("dispatches").size() ? std::string("one op each") : fmt::format("{} ops", n_ops),
                    plan.value("frozen", false) ? ", frozen by phase 6" : "");
  md += "## Kernels (one layer)\n\n| op | kernel | shape |\n|---|---|---|\n";
  for (const auto& d : plan.at("dispatches"))
    for (const auto& op : d.at("ops")) {
      if (integer_or(op, "layer", 0) != 0) continue;
      md += fmt::format("| {} | {} | {} |\n", op.at("op").get<std::string>(), op.at("kernel").get<std::string>(), op.at("shape").get<std::string>());
    }
  md += "\n## Phases\n\n";
  for (const PhaseDef& p : phase_defs()) {
    const nlohmann::json r = state.at("phases").value(std::to_string(p.id), nlohmann::json::object());
    const std::string status = r.value("status", "pending");
    md += fmt::format("- [{}] {} {}: {}{}\n", phase_done(status) ? "x" : " ", p.id, p.name, status,
                      r.contains("summary") ? " — " + r.at("summary").get<std::string>() : "");
  }
  return md;
}

}  // namespace tessera
