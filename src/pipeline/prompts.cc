#include "pipeline/phases.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "util/error.h"
#include "util/half.h"

namespace tessera {

std::vector<CanonicalPrompt> canonical_prompts(const Tokenizer& tok) {
  // Decisive candidates first (a trained model's top-1 is usually > 0.5 on these), then
  // open-ended ones; each prompt is classified by the oracle's own probability, not by list.
  static const char* texts[] = {"1 + 1 =",
                                "Water freezes at",
                                "The capital of France is",
                                "Monday, Tuesday, Wednesday,",
                                "The opposite of hot is",
                                "The sky is",
                                "Once upon a time, there was a little",
                                "def fibonacci(n):"};
  std::vector<CanonicalPrompt> out;
  for (const char* t : texts) out.push_back({t, tok.encode_prompt(t)});
  return out;
}


// A passage long enough that every layer runs past 256 positions (and past a sliding window
// of that size), prefill and decode: a bug that shows only far into a context is executed.
// Plain prose with digits, a list and a little code, written for tessera.
constexpr const char* kLongContextText =
    "The harbour town kept its records in a ledger that nobody had thrown away in two hundred years. Every ship "
    "that came in was written down: its name, its cargo, the day it arrived and the day it left. In 1843 the "
    "ledger noted forty-one ships, most of them carrying timber, salt and wool; by 1901 the number had grown to "
    "three hundred and twelve, and the cargo had changed to coal, steel rails and tinned fish. The clerk who kept "
    "the book in those years, a careful man named Elias Brand, added a column of his own for the weather, so that "
    "a reader today can tell that the winter of 1895 froze the inner basin for nine days, and that the storm of "
    "12 October 1881 sank two schooners at their moorings. When the railway reached the town, the harbour slowly "
    "lost its trade. The ledger grew thinner: eighty ships in 1930, twenty-six in 1950, and only seven in 1968, "
    "the last year anything was written in it. A museum now keeps the book behind glass, open at a page from "
    "March 1887, when a ship called the Margaret Hale arrived from Lisbon with oranges, cork and a crate of "
    "books for the school. Visitors who want to study it can ask for the scanned copy, which the museum sorted "
    "with a short program:\n\ndef ships_per_year(rows):\n    counts = {}\n    for row in rows:\n        year = "
    "row['arrived'][:4]\n        counts[year] = counts.get(year, 0) + 1\n    return counts\n\nThe results "
    "match the clerk's own yearly totals in all but three years, and in each of those the difference is a ship "
    "that arrived on the last night of December and left in January. Historians who read the weather column "
    "side by side with the cargo lists have noticed something the clerks never wrote down directly: hard winters "
    "were followed by springs with far more grain ships than usual, as the inland farms sold what they could not "
    "store. The museum's guide explains this in a small room at the end of the hall, where a map shows the old "
    "routes in red and the railway in black. Children who visit are given a card with three questions: how many "
    "ships came in the year your grandparents were born, what did they carry, and what was the weather like on "
    "the day they arrived? Most of them find the answers within an hour, and many come back to look again at the "
    "page from 1887.";


// The long position phase 1 and 2 use for RoPE: far enough that frequency scaling matters.
int64_t long_position(const ModelSpec& s, int64_t room) {
  return std::max<int64_t>(0, std::min<int64_t>(8192, s.max_position - room - 1));
}

StressAttention stress_attention_inputs(const ModelSpec& s, const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, int64_t T, double max_score) {
  const int64_t Q = s.q_dim(), KV = s.kv_dim(), hd = s.head_dim, group = s.n_heads / s.n_kv_heads;
  if (int64_t(q.size()) < T * Q || int64_t(k.size()) < T * KV || int64_t(v.size()) < T * KV)
    fail("stress_attention_inputs: {} rows asked, fewer given", T);
  auto bf16 = [](float x) { return bf16_to_f32(f32_to_bf16(x)); };
  StressAttention out;
  out.k.resize(size_t(T * KV));
  out.v.resize(size_t(T * KV));
  for (size_t i = 0; i < out.k.size(); ++i) {
    out.k[i] = bf16(k[i]);
    out.v[i] = bf16(v[i]);
  }
  double largest = 0;  // over causal (row, key) pairs of every head
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < s.n_heads; ++h)
      for (int64_t j = 0; j <= t; ++j) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i) d += double(q[size_t(t * Q + h * hd + i)]) * out.k[size_t(j * KV + (h / group) * hd + i)];
        largest = std::max(largest, std::fabs(d * s.attn_scale()));
      }
  if (!(largest > 0)) fail("stress_attention_inputs: every score is zero");
  out.scaled_by = max_score / largest;
  out.q.resize(size_t(T * Q));
  for (size_t i = 0; i < out.q.size(); ++i) out.q[i] = bf16(float(q[i] * out.scaled_by));
  return out;
}

// All canonical prompts concatenated (with their BOS where the family uses one), capped:
// phase 1 and 2 want one longer sequence so that GEMM tiles and causal masks are exercised.
namespace {
std::vector<int32_t> concatenated(const std::vector<CanonicalPrompt>& prompts, size_t cap) {
  std::vector<int32_t> ids;
  for (const CanonicalPrompt& p : prompts) ids.insert(ids.end(), p.ids.begin(), p.ids.end());
  if (ids.size() > cap) ids.resize(cap);
  return ids;
}
}  // namespace
std::vector<int32_t> long_prompt(const Tokenizer& tok, size_t cap) { return concatenated(canonical_prompts(tok), cap); }
std::vector<int32_t> long_prompt(PhaseContext& ctx, size_t cap) { return concatenated(ctx.prompts(), cap); }


CanonicalPrompt long_context_prompt(const Tokenizer& tok, const ModelSpec& s) {
  CanonicalPrompt p{"(a passage past 256 positions)", tok.encode_prompt(kLongContextText), true};
  // Room for phase 6's greedy tokens after it, within the model's context.
  const int64_t room = int64_t(gates::threshold("phase6.tokens")) + 1;
  // 320 positions: past 256 with 64 rows to spare, at a bit more than half the passage's cost.
  constexpr int64_t kPositions = 320;
  const int64_t keep = std::max<int64_t>(1, std::min({int64_t(p.ids.size()), kPositions, s.max_position - room}));
  p.ids.resize(size_t(keep));
  return p;
}

std::vector<CanonicalPrompt> phase6_prompts(PhaseContext& ctx) {
  const size_t n_prompts = size_t(gates::threshold("phase6.prompts_min")) + 1;
  const auto all = ctx.prompts();  // the short ones, then the long-context one
  std::vector<CanonicalPrompt> out(all.begin(), all.begin() + long(std::min(n_prompts, all.size() - 1)));
  out.push_back(all.back());
  return out;
}

}  // namespace tessera
