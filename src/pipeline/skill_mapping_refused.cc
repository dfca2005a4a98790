// Debug skill mapping-refused: the refusal codes of npusim's checker (reported from its text, not confirmed by an experiment).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "pipeline/skill_support.h"

namespace tessera {

std::vector<Hypothesis> refusal(PhaseContext&, const Failure& f) {
  const std::string text = f.record.at("details").value("refused", "");
  std::vector<Hypothesis> out;
  for (const char* code : {"l1-overflow", "l2-overflow", "bd-exhaustion", "bd-repeat", "bd-dims", "dma-channels",
                           "lock-exhaustion", "vector-length", "placement", "fifo-shape"}) {
    const size_t at = text.find(std::string(code) + ":");
    if (at == std::string::npos) continue;
    const size_t end = text.find('\n', at);
    out.push_back({fmt::format("the checker refuses with {}", code), code, "reported",
                   text.substr(at, end == std::string::npos ? std::string::npos : end - at)});
  }
  if (out.empty()) out.push_back({"a refusal code of the checker", "unknown refusal", "ruled out", text.substr(0, 300)});
  return out;
}

}  // namespace tessera
