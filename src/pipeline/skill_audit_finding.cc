// Debug skill audit-finding: the evaluator's failing findings (reported from its report, not confirmed by an experiment).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "pipeline/skill_support.h"

namespace tessera {

std::vector<Hypothesis> audit_findings(PhaseContext&, const Failure& f) {
  std::vector<Hypothesis> out;
  for (const auto& finding : f.record.value("findings", nlohmann::json::array())) {
    if (finding.value("verdict", "") != "fail") continue;
    const std::string check = finding.value("check", ""), detail = finding.value("detail", "");
    // How the deployment was made is not a symptom to explain: `diagnose` states it first, on its own.
    if (check == "provenance") continue;
    if (check == "op-counters" && detail.find("by the oracle") != std::string::npos)
      out.push_back({"a stage silently computed by the oracle", "oracle-fallback", "reported", detail});
    else if (check == "determinism")
      out.push_back({"output differs between identical runs", "nondeterministic", "reported", detail});
    else if (check == "hashes")
      out.push_back({"files edited after the deploy", "edited after deploy", "reported", detail});
    else if (check == "thresholds")
      out.push_back({"a stored gate row loosened", "threshold loosened", "reported", detail});
    else
      out.push_back({"finding " + check, check, "reported", detail});
  }
  return out;
}

}  // namespace tessera
