// `tessera deploy`: runs the implemented phases in order over a deployment directory,
// resuming at the first phase that has not passed, and stops at the first failing gate
// with its diagnosis written to issues.md.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pipeline/phases.h"

namespace tessera {

struct DeployResult {
  bool pass = false;
  int failed_phase = -1;
  std::string diagnosis;
};

// The identity a deployment directory is bound to: the model (path and a cheap
// fingerprint of its files), the target and the injected faults.
nlohmann::json deployment_identity(const Model& model, const DeployOptions& opts);
nlohmann::json model_fingerprint(const std::string& model_path);
// The files a model is read from (a .gguf, or a directory's config.json and safetensors).
std::vector<std::filesystem::path> model_files(const std::string& model_path);
// manifest.json, written when every phase passed: sha256 of plan.json, report.json and
// every model file. Phase 7 (`tessera audit`) recomputes them.
nlohmann::json deployment_manifest(const Deployment& dep, const std::string& model_path);

DeployResult deploy(const DeployOptions& opts);
// The options a deployment was made with, from its identity (model, target, faults, plan,
// device): how `audit` and `diagnose` rebuild what was gated.
DeployOptions options_from_identity(const nlohmann::json& identity);

// Renders every phase's gate rows (phaseN.json) as one Markdown summary.
std::string gate_summary_markdown(const Deployment& dep);

}  // namespace tessera
