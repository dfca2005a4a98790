// Debug skill kv-cache-state: the KV cache across calls (decode steps).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "pipeline/skill_support.h"

namespace tessera {

std::vector<Hypothesis> kv_cache_state(PhaseContext& ctx, const Failure&) {
  const ModelSpec& s = ctx.model.spec();
  const Acts a = layer0_acts(ctx);
  const int64_t T = a.T, KV = s.kv_dim();
  std::unique_ptr<StagedRunner> t = ctx.fresh_target();
  const std::vector<float>&k = a.probe.at("k"), &v = a.probe.at("v");
  // "Run the same call twice": a prefill write, then the last two rows one decode step each.
  t->reset();
  t->op_kv_write(0, 0, k.data(), v.data(), T - 2);
  t->op_kv_write(0, T - 2, k.data() + (T - 2) * KV, v.data() + (T - 2) * KV, 1);
  t->op_kv_write(0, T - 1, k.data() + (T - 1) * KV, v.data() + (T - 1) * KV, 1);
  std::vector<float> kb(size_t(T * KV)), vb(size_t(T * KV));
  t->kv_read(0, 0, T, kb.data(), vb.data());
  t->reset();
  const std::vector<float> last_read(kb.end() - KV, kb.end()), prev_read(kb.end() - 2 * KV, kb.end() - KV),
      last_written(k.end() - KV, k.end());
  Hypothesis h = judge("a decode step writes the previous step's row (stale buffer)", "stale-kv", last_read, prev_read,
                       last_written);
  h.evidence = "last decode row read back vs the row before it: " + h.evidence;
  if (s.n_layers < 2) return {h, not_applicable("layers share cache rows", "kv-layer-aliased", "one layer")};
  // "Compare buffer keys": layer 0 written, then layer 1 with the negated rows; layer 0 read back.
  std::vector<float> nk(k.begin(), k.begin() + T * KV), nv(v.begin(), v.begin() + T * KV);
  for (float& x : nk) x = -x;
  for (float& x : nv) x = -x;
  t->op_kv_write(0, 0, k.data(), v.data(), T);
  t->op_kv_write(1, 0, nk.data(), nv.data(), T);
  t->kv_read(0, 0, T, kb.data(), vb.data());
  t->reset();
  Hypothesis alias = judge("layers share cache rows (layer 1's write lands in layer 0)", "kv-layer-aliased", kb, nk,
                           std::vector<float>(k.begin(), k.begin() + T * KV));
  alias.evidence = "layer 0 read back after layer 1 wrote the negated rows: " + alias.evidence;
  return {h, alias};
}

bool refused_reading_the_cache(const Failure& f) {
  if (!f.record.contains("details") || !f.record["details"].contains("refused")) return false;
  std::string text = f.record["details"]["refused"].get<std::string>();
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return text.find("cache") != std::string::npos && text.find("layer") != std::string::npos;
}

}  // namespace tessera
