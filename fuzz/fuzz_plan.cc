// A deployment's plan.json as `tessera run`, `bench` and `audit` read it back: its hash, its
// Markdown rendering, the options each target takes from it, npusim's frozen plan and
// weight formats.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "pipeline/plan.h"
#include "targets/npusim/plans.h"
#include "targets/npusim/program.h"
#include "targets/registry.h"
#include "util/error.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json plan = nlohmann::json::parse(fuzz::as_view(data, size), nullptr, false);
  if (plan.is_discarded()) return 0;
  auto guarded = [](auto&& f) {
    try {
      f();
    } catch (const Error&) {
    } catch (const nlohmann::json::exception&) {
    }
  };
  guarded([&] { (void)plan_hash(plan); });
  // The state beside it: the input's own "phases" (when it has one) as state.json's.
  guarded([&] { (void)plan_markdown(plan, {{"phases", plan.value("phases", nlohmann::json::object())}}); });
  for (const TargetDef& def : target_defs())
    if (def.options_from_plan)
      guarded([&] {
        TargetOptions o;
        def.options_from_plan(plan, o);
      });
  guarded([&] { (void)npusim::plan_from_json(plan.at("npusim").at("plan")); });
  guarded([&] { (void)npusim::WeightFormats::from_json(plan.at("npusim").value("weight_formats", nlohmann::json())); });
  return 0;
}
