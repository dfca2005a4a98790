// The plan (design section 4): the deployment's mapping as data. On the cpu target every op
// runs on the target, one op per dispatch (the first plan; optimization skills will merge
// and fuse); it names each op's kernel and shape, the weights' residency, the KV cache,
// the ISA and threads. Phase 6 freezes it and records its SHA-256 in state.json; `tessera
// run DIR` refuses a plan whose hash no longer matches.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "io/weights.h"
#include "targets/cpu/cpu_runner.h"

namespace tessera {

nlohmann::json build_cpu_plan(const Model& model, const CpuRunner& runner);
std::string plan_markdown(const nlohmann::json& plan, const nlohmann::json& state);
// Canonical text a plan's hash is taken over (sorted keys, no whitespace).
std::string plan_hash(const nlohmann::json& plan);

}  // namespace tessera
