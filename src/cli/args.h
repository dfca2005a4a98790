// Argument parsing shared by several subcommands.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::cli {

// "1, 2,3" -> {1, 2, 3}; throws tessera::Error naming the first item that is not a token id.
std::vector<int32_t> parse_ids(const std::string& text);

}  // namespace tessera::cli
