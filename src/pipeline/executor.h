// Opens what `tessera run`, `chat` and `bench` execute: a deployment directory (its frozen
// plan on its target, refused unless phase 6 passed and the plan is the one it froze) or
// a model file/directory on a named target (one of target_names(), or "oracle" for the
// FP32 reference).
#pragma once
#include <memory>
#include <string>

#include "targets/target.h"

namespace tessera {

struct Executor {
  std::unique_ptr<Model> model;
  std::unique_ptr<ModelRunner> runner;  // a StagedRunner for every target but "oracle"
  std::string source;       // the deployment directory or the model path
  std::string description;  // "cpu, deployment DIR (plan ... frozen, sha256 ...)"
  bool deployment = false;
};

struct ExecutorOptions {
  std::string target;     // empty: a deployment's own target, or "cpu" for a model
  int threads = 0;        // 0: a deployment's recorded threads, else default_threads()
  bool profile = false;   // per-stage wall time, where the target keeps it (CpuRunner::stage_seconds)
  std::string plan_name;  // for a model: "" the target's default plan
  std::string device;     // for a model: "" the target's default device
};

Executor open_executor(const std::string& model_or_deployment, const ExecutorOptions& options);
// The same with the common options only.
Executor open_executor(const std::string& model_or_deployment, const std::string& target, int threads,
                       bool profile = false);

bool is_deployment_dir(const std::string& path);

}  // namespace tessera
