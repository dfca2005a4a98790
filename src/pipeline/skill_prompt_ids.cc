// Debug skill prompt-ids: the prompt's ids against the tokenizer's rule and transformers' (porting-pitfalls row 12).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "pipeline/skill_support.h"

namespace tessera {

// "Token ids side by side with the reference tokenizer": the prompt path's ids against the
// tokenizer's own encoding (BOS rule) and, where phase 0 had a transformers fixture, against
// transformers' ids for the same texts.
std::vector<Hypothesis> prompt_ids(PhaseContext& ctx, const Failure& f) {
  const Tokenizer& tok = ctx.tokenizer();
  std::vector<Hypothesis> out;
  const CanonicalPrompt first = ctx.prompts().front();  // as the prompt path hands it to the model
  const std::string& text = first.text;
  const std::vector<int32_t>& prompt = first.ids;
  const std::vector<int32_t> raw = tok.encode_raw(text);
  const auto bos = tok.bos_id();
  Hypothesis dbl{"a second BOS before the prompt", "double-bos", "", ""};
  if (!bos || !tok.adds_bos()) {
    dbl.verdict = "not applicable";
    dbl.evidence = "the family adds no BOS";
  } else {
    std::vector<int32_t> two = raw;
    two.insert(two.begin(), 2, *bos);
    dbl.evidence = fmt::format("\"{}\": prompt ids [{}], tokenizer ids [{}]", text, fmt::join(prompt, ","), fmt::join(raw, ","));
    dbl.verdict = prompt == two ? "confirmed" : "ruled out";
  }
  out.push_back(dbl);
  // The fixture's texts, re-encoded (phase 0 recorded which fixture it used).
  const nlohmann::json ref = f.record.value("details", nlohmann::json::object()).value("reference", nlohmann::json::object());
  Hypothesis pre{"the tokenizer splits text differently from transformers (pre-tokenizer regex, normalizer)",
                 "tokenizer differs from transformers", "", ""};
  if (!ref.contains("fixture") || !ref["fixture"].is_string()) {
    pre.verdict = "not applicable";
    pre.evidence = "no transformers fixture matches this checkpoint";
  } else {
    const nlohmann::json fx = read_json_file(std::filesystem::path(ref["fixture"].get<std::string>()) / "fixture.json");
    const std::vector<TokenizedDifferently> diff = tokenized_differently(tok, fx);
    if (!diff.empty()) {
      const std::vector<int32_t>& ours = diff[0].ours;
      const std::vector<int32_t>& theirs = diff[0].theirs;
      size_t i = 0;
      while (i < ours.size() && i < theirs.size() && ours[i] == theirs[i]) ++i;
      pre.evidence = fmt::format("first difference at id {}: tessera {} \"{}\", transformers {} \"{}\"; ", i,
                                 i < ours.size() ? std::to_string(ours[i]) : "-", i < ours.size() ? tok.token_string(ours[i]) : "",
                                 i < theirs.size() ? std::to_string(theirs[i]) : "-",
                                 i < theirs.size() && theirs[i] < tok.vocab_size() ? tok.token_string(theirs[i]) : "");
    }
    pre.evidence += fmt::format("{} of {} fixture texts tokenized differently", diff.size(), fx["prompts"].size());
    pre.verdict = diff.empty() ? "ruled out" : "confirmed";
  }
  out.push_back(pre);
  return out;
}


bool prompt_ids_failed(const Failure& f) { return f.phase == 0 && failed_gates(f).count("phase0.prompt_ids"); }

}  // namespace tessera
