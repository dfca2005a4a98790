#include "util/data_paths.h"

#include <cstdlib>
#include <fstream>
#include <system_error>

namespace tessera {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

}  // namespace

std::vector<fs::path> split_path_list(const std::string& s) {
  std::vector<fs::path> out;
  for (size_t at = 0;;) {
    const size_t colon = s.find(':', at);
    const std::string part = s.substr(at, colon == std::string::npos ? std::string::npos : colon - at);
    if (!part.empty()) out.emplace_back(part);
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  return out;
}

fs::path executable_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec || exe.empty()) return {};
  return exe.parent_path();
}

std::vector<fs::path> data_dirs() {
  std::vector<fs::path> out = split_path_list(env("TESSERA_DATA_DIR"));
  if (const std::string xdg = env("XDG_DATA_HOME"); !xdg.empty()) out.push_back(fs::path(xdg) / "tessera");
  else if (const std::string home = env("HOME"); !home.empty())
    out.push_back(fs::path(home) / ".local" / "share" / "tessera");
  const fs::path exe_dir = executable_dir();
  if (!exe_dir.empty()) {
    out.push_back((exe_dir.parent_path() / "share" / "tessera").lexically_normal());
    // A build tree: CMake lists the source tree's data directories beside the executable.
    std::ifstream f(exe_dir / "tessera-data-dirs.txt");
    for (std::string line; std::getline(f, line);) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty() && line[0] != '#') out.emplace_back(line);
    }
  }
  return out;
}

fs::path cache_dir() {
  if (const std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty()) return fs::path(xdg) / "tessera";
  if (const std::string home = env("HOME"); !home.empty()) return fs::path(home) / ".cache" / "tessera";
  return {};
}

std::vector<fs::path> data_candidates(const fs::path& relative) {
  std::vector<fs::path> out;
  for (const fs::path& d : data_dirs()) out.push_back(d / relative);
  return out;
}

fs::path first_existing(const std::vector<fs::path>& candidates) {
  for (const fs::path& p : candidates) {
    std::error_code ec;
    if (fs::exists(p, ec)) return p;
  }
  return {};
}

std::string list_places(const std::vector<fs::path>& places) {
  if (places.empty()) return "(nowhere: no data directory could be named; set TESSERA_DATA_DIR)";
  std::string s;
  for (const fs::path& p : places) {
    if (!s.empty()) s += ", ";
    s += p.string();
  }
  return s;
}

}  // namespace tessera
