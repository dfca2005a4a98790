#include "targets/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "targets/cpu/cpu_runner.h"
#include "targets/npusim/npusim_runner.h"
#include "util/error.h"

namespace tessera {

namespace {
std::vector<TargetDef>& target_registry() {
  // One entry per target (its header declares the *_target_def() function).
  static std::vector<TargetDef> defs = {
      cpu_target_def(),
      npusim_target_def(),
  };
  return defs;
}
}  // namespace

const std::vector<TargetDef>& target_defs() { return target_registry(); }

void register_target(const TargetDef& def) {
  for (const TargetDef& d : target_registry())
    if (d.name == def.name) fail("target '{}' is already registered", def.name);
  if (!def.make || !def.faults) fail("target '{}': a TargetDef needs make and faults", def.name);
  target_registry().push_back(def);
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

void check_target_options(const std::string& target, const TargetOptions& options) {
  const TargetDef& def = target_def(target);
  for (const std::string& f : options.faults) {
    const std::vector<FaultInfo>& own = def.faults();
    if (std::none_of(own.begin(), own.end(), [&](const FaultInfo& i) { return i.name == f; }))
      fail("target {} has no fault '{}' of its own", target, f);
  }
  if (def.check_options) def.check_options(options);
}

std::unique_ptr<StagedRunner> make_target_runner(const std::string& target, const Model& model, const TargetOptions& options) {
  check_target_options(target, options);
  return target_def(target).make(model, options);
}

}  // namespace tessera
