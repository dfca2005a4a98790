// Where the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) lives once scripts/setup.sh ran.
#pragma once
#include <string>

namespace tessera {

// $TESSERA_DEFAULT_MODEL if set, else <source dir>/models/SmolLM2-135M-Instruct.Q4_1.gguf.
std::string default_model_path();
// `path` if non-empty, else the default model; throws with the fix when it is missing.
std::string resolve_model_path(const std::string& path);

}  // namespace tessera
