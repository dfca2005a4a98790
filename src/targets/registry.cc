#include "targets/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "targets/cpu/cpu_runner.h"
#include "targets/npusim/npusim_runner.h"
#include "util/error.h"

namespace tessera {

const std::vector<TargetDef>& target_defs() {
  // One entry per target (its header declares the *_target_def() function).
  static const std::vector<TargetDef> defs = {
      cpu_target_def(),
      npusim_target_def(),
  };
  return defs;
}

std::vector<std::string> target_names() {
  std::vector<std::string> names;
  for (const TargetDef& d : target_defs()) names.push_back(d.name);
  return names;
}

std::string target_choices() {
  std::string text;
  for (const std::string& t : target_names()) text += text.empty() ? t + " (default)" : ", " + t;
  return text;
}

const TargetDef& target_def(const std::string& target) {
  for (const TargetDef& d : target_defs())
    if (d.name == target) return d;
  fail("unknown target '{}' (targets: {})", target, fmt::join(target_names(), ", "));
}

const std::vector<FaultInfo>& target_faults(const std::string& target) { return target_def(target).faults(); }

const FaultInfo& target_fault_info(const std::string& target, const std::string& fault) {
  const std::vector<FaultInfo>& faults = target_faults(target);
  for (const FaultInfo& f : faults)
    if (f.name == fault) return f;
  std::string names;
  for (const FaultInfo& f : faults) names += (names.empty() ? "" : ", ") + f.name;
  fail("unknown fault '{}' for target {}; known faults: {}", fault, target, names.empty() ? "none" : names);
}

void check_target_options(const std::string& target, const TargetOptions& options) {
  const TargetDef& def = target_def(target);
  for (const std::string& f : options.faults) target_fault_info(target, f);
  if (def.check_options) def.check_options(options);
}

std::unique_ptr<StagedRunner> make_target_runner(const std::string& target, const Model& model, const TargetOptions& options) {
  check_target_options(target, options);
  return target_def(target).make(model, options);
}

}  // namespace tessera
