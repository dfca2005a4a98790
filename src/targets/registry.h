// The targets tessera can deploy to, by name. The pipeline, `run`, `chat` and `bench` make
// runners only through here. Adding a target is one #include and one entry in registry.cc.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "targets/staged_runner.h"

namespace tessera {

// Registered targets in registration order ("cpu" first: the default).
const std::vector<TargetDef>& target_defs();
std::vector<std::string> target_names();
// Adds a target after the built-in ones (a test's toy target); a name taken is refused.
void register_target(const TargetDef& def);
// For help texts: "cpu (default)", "cpu (default), npusim".
std::string target_choices();
const TargetDef& target_def(const std::string& target);  // throws listing the targets

// A runner for `target` on `model`; refuses unknown targets (listing them) and faults of
// its own the target does not have. The model must outlive the runner. The pipeline makes
// runners through faults/injection.h's make_runner_with_faults, which applies the other faults.
std::unique_ptr<StagedRunner> make_target_runner(const std::string& target, const Model& model,
                                                 const TargetOptions& options);

// Refuses, without loading anything, options `target` cannot honour: an unknown target,
// fault, plan or device (what make_target_runner checks first).
void check_target_options(const std::string& target, const TargetOptions& options);

}  // namespace tessera
