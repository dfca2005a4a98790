// The plan (design section 4): the deployment's mapping as data. Each target builds its
// first plan (StagedRunner::build_plan: on the cpu, every op on the target, one op per
// dispatch, with the ISA, threads, the weights' residency and the KV cache); optimization
// skills will merge and fuse. Phase 6 freezes it and records its SHA-256 in state.json;
// `tessera run DIR` refuses a plan whose hash no longer matches.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace tessera {

std::string plan_markdown(const nlohmann::json& plan, const nlohmann::json& state);
// Canonical text a plan's hash is taken over (sorted keys, no whitespace).
std::string plan_hash(const nlohmann::json& plan);

}  // namespace tessera
