// Debug skill stop-set: the runtime's stop set against the declared end-of-sequence ids (porting-pitfalls row 13).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "pipeline/skill_support.h"
#include "runtime/generate.h"

namespace tessera {

// "tokenizer_config / generation config": which declared ids the runtime's stop set misses,
// and where each is declared: the runtime's stop set as phase 6 took it.
std::vector<Hypothesis> stop_set(PhaseContext& ctx, const Failure&) {
  const Tokenizer& tok = ctx.tokenizer();
  const std::vector<int32_t> stops = ctx.stop_ids();
  const std::vector<DeclaredEos> declared = declared_eos_ids(ctx.model, tok);
  std::vector<std::string> missing, only_generation_config;
  for (const DeclaredEos& d : declared)
    if (!std::binary_search(stops.begin(), stops.end(), d.id)) {
      missing.push_back(fmt::format("{} ({})", d.id, d.source));
      if (d.source == "generation_config.json eos_token_id") only_generation_config.push_back(std::to_string(d.id));
    }
  const std::string facts = fmt::format("runtime stop set {{{}}}; declared {}; missing: {}", fmt::join(stops, ", "),
                                        declared.size(), missing.empty() ? "none" : fmt::format("{}", fmt::join(missing, "; ")));
  std::vector<Hypothesis> out;
  const std::optional<int32_t> eos = tok.token_id(tok.eos_token());
  Hypothesis first{"only the tokenizer's eos_token stops generation", "eos-first-only", "", facts};
  if (declared.size() < 2) first.verdict = "not applicable";
  else first.verdict = !missing.empty() && eos && stops == std::vector<int32_t>{*eos} ? "confirmed" : "ruled out";
  out.push_back(first);
  Hypothesis gen{"generation_config.json's ids not read", "generation_config.json ignored", "", facts};
  if (!std::filesystem::exists(std::filesystem::path(ctx.model.path()) / "generation_config.json"))
    gen.verdict = "not applicable";
  else gen.verdict = !missing.empty() && only_generation_config.size() == missing.size() ? "confirmed" : "ruled out";
  out.push_back(gen);
  return out;
}

bool stop_set_failed(const Failure& f) { return failed_gates(f).count("phase6.stop_set") > 0; }

}  // namespace tessera
