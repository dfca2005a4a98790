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


std::vector<CanonicalPrompt> phase6_prompts(PhaseContext& ctx) {
  const size_t n_prompts = size_t(gates::threshold("phase6.prompts_min")) + 1;
  const auto all = ctx.prompts();
  return {all.begin(), all.begin() + long(std::min(n_prompts, all.size()))};
}

}  // namespace tessera
