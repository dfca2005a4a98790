#include "model/default_model.h"

#include <cstdlib>
#include <filesystem>

#include "util/error.h"

namespace tessera {

std::string default_model_path() {
  if (const char* env = std::getenv("TESSERA_DEFAULT_MODEL"); env && *env) return env;
  return std::string(TESSERA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string resolve_model_path(const std::string& path) {
  if (!path.empty()) return path;
  std::string def = default_model_path();
  if (!std::filesystem::exists(def))
    fail("no model given and the default model is missing at {}: run scripts/setup.sh", def);
  return def;
}

}  // namespace tessera
