// Where the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) lives once scripts/setup.sh ran.
#pragma once
#include <string>
#include <vector>

namespace tessera {

constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

// The places the default model is looked for, in order: $TESSERA_DEFAULT_MODEL alone when it
// is set; else <cache dir>/models/<file> (scripts/setup.sh puts it there), then models/<file>
// under each data directory (util/data_paths.h; in a build tree, the source tree's models/).
std::vector<std::string> default_model_candidates();
// The first candidate that exists; when none does, the first candidate (where setup.sh puts it).
std::string default_model_path();
// `path` if non-empty, else the default model; throws naming every place searched when it is
// missing.
std::string resolve_model_path(const std::string& path);

}  // namespace tessera
