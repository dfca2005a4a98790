#include "model/default_model.h"

#include <cstdlib>
#include <filesystem>

#include "util/data_paths.h"
#include "util/error.h"

namespace tessera {

namespace fs = std::filesystem;

std::vector<std::string> default_model_candidates() {
  if (const char* env = std::getenv("TESSERA_DEFAULT_MODEL"); env && *env) return {env};
  std::vector<std::string> out;
  if (const fs::path cache = cache_dir(); !cache.empty()) out.push_back((cache / "models" / kDefaultModelFile).string());
  for (const fs::path& p : data_candidates(fs::path("models") / kDefaultModelFile)) out.push_back(p.string());
  return out;
}

std::string default_model_path() {
  const std::vector<std::string> candidates = default_model_candidates();
  for (const std::string& c : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(c, ec)) return c;
  }
  return candidates.empty() ? std::string(kDefaultModelFile) : candidates.front();
}

std::string resolve_model_path(const std::string& path) {
  if (!path.empty()) return path;
  std::string def = default_model_path();
  if (!fs::exists(def)) {
    std::vector<fs::path> places;
    for (const std::string& c : default_model_candidates()) places.emplace_back(c);
    fail("no model given and the default model ({}) is missing; looked in: {}: run scripts/setup.sh "
         "(or set TESSERA_DEFAULT_MODEL)",
         kDefaultModelFile, list_places(places));
  }
  return def;
}

}  // namespace tessera
