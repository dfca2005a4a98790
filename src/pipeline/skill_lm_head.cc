// Debug skill lm-head: which matrix the LM head reads.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "oracle/ops.h"
#include "pipeline/skill_support.h"

namespace tessera {

std::vector<Hypothesis> lm_head(PhaseContext& ctx, const Failure&) {
  const ModelSpec& s = ctx.model.spec();
  if (ctx.model.find("lm_head.weight"))
    return {not_applicable("the head is not the tied embedding", "lm-head-untied",
                           "the checkpoint has its own lm_head.weight (not tied)")};
  const Acts a = layer0_acts(ctx);
  std::unique_ptr<StagedRunner> t = ctx.fresh_target();
  const std::vector<float>& x = a.probe.at("attn_norm");  // any normalized row will do
  std::vector<float> got(static_cast<size_t>(s.vocab)), ref(static_cast<size_t>(s.vocab));
  static const std::vector<float> none;
  t->op_linear(Stage::LmHead, x.data(), 1, ctx.model.lm_head().name, none, got.data());
  oracle::linear(x.data(), 1, ctx.model.lm_head(), nullptr, ref.data(), 0);
  const double r = gates::compare(ref.data(), got.data(), 1, s.vocab).pearson;
  const double unrelated = gates::threshold("diagnose.unrelated_pearson_max");
  // A head unrelated to the embedding gives logits uncorrelated with the tied product.
  return {{"the head is not the tied embedding (another matrix)", "lm-head-untied", r < unrelated ? "confirmed" : "ruled out",
           fmt::format("checkpoint tensor list: no lm_head.weight (tied to model.embed_tokens.weight); Pearson of the "
                       "target's logits with the tied product {:.3f} (unrelated below {})",
                       r, unrelated)}};
}

}  // namespace tessera
