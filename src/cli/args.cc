#include "cli/args.h"

#include <algorithm>
#include <cctype>

#include "util/error.h"

namespace tessera::cli {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string item = text.substr(i, j - i);
    item.erase(std::remove_if(item.begin(), item.end(), [](unsigned char c) { return std::isspace(c); }), item.end());
    if (item.empty() || item.size() > 9 ||
        !std::all_of(item.begin(), item.end(), [](unsigned char c) { return std::isdigit(c); }))
      fail("--ids: '{}' is not a token id (expected comma-separated non-negative integers)", item);
    ids.push_back(std::stoi(item));
    i = j + 1;
  }
  if (ids.empty()) fail("--ids: no token ids given");
  return ids;
}

}  // namespace tessera::cli
