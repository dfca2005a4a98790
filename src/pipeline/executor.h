// Opens what `tessera run`, `chat` and `bench` execute: a deployment directory (its frozen
// plan on its target, refused unless phase 6 passed and the plan is the one it froze) or
// a model file/directory on a named target ("cpu", or "oracle" for the FP32 reference).
#pragma once
#include <memory>
#include <string>

#include "targets/target.h"

namespace tessera {

struct Executor {
  std::unique_ptr<Model> model;
  std::unique_ptr<ModelRunner> runner;
  std::string source;       // the deployment directory or the model path
  std::string description;  // "cpu (deployment DIR, plan sha256 ...)"
  bool deployment = false;
};

// `target` empty: a deployment's own target, or "cpu" for a model.
// profile: the cpu runner accumulates wall time per stage (CpuRunner::stage_seconds).
Executor open_executor(const std::string& model_or_deployment, const std::string& target, int threads,
                       bool profile = false);

bool is_deployment_dir(const std::string& path);

}  // namespace tessera
