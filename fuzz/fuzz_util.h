// Helpers the harnesses share: a private temporary directory per process (for the APIs that
// take a path) and the data directory (data/tokenizers in the source tree, fetched by scripts/setup.sh).
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace tessera::fuzz {

inline const std::filesystem::path& temp_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = std::filesystem::temp_directory_path() /
                              ("tessera-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline std::filesystem::path write_temp(const std::string& name, std::string_view bytes) {
  std::filesystem::path p = temp_dir() / name;
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return p;
}

inline std::string_view as_view(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// TESSERA_FUZZ_TOKENIZERS overrides the compiled-in data/tokenizers.
inline std::string tokenizers_dir() {
  if (const char* e = std::getenv("TESSERA_FUZZ_TOKENIZERS")) return e;
  return TESSERA_FUZZ_TOKENIZERS_DIR;
}

}  // namespace tessera::fuzz
