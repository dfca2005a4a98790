// SHA-256 (OpenSSL) for content identity: fixture matching, frozen plans.
#pragma once
#include <string>

namespace tessera {
std::string sha256_hex(const std::string& bytes);
std::string sha256_file_hex(const std::string& path);  // streams the file; throws naming it
}  // namespace tessera
