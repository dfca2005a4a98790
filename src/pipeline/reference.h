// Phase 0's independent reference (tools/reference/make_reference.py): a directory with
// fixture.json, hidden.npy and logits.npy made by transformers for one checkpoint, matched
// by the checkpoint's digest.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/weights.h"
#include "pipeline/phases.h"

namespace tessera {

struct FixtureMatch {
  std::filesystem::path dir;
  nlohmann::json fixture;
};
// The reference made for `model` among `roots` (each a reference directory or a directory
// of them); nullopt with `why` when none matches.
std::optional<FixtureMatch> find_fixture(const Model& model, const std::vector<std::filesystem::path>& roots,
                                         std::string* why);

}  // namespace tessera
