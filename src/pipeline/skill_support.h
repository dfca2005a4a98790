// What the debug skills share (pipeline/diagnose.h has the catalogue): the oracle's layer-0
// evidence, the verdict rule of "the target did what this variant does", and reading a
// failure's record; and each skill's experiments, one file each (skill_*.cc).
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gates/gates.h"
#include "pipeline/diagnose.h"

namespace tessera {

// The oracle's layer 0 on the long prompt (the op table's inputs) and the projections the
// RoPE and q/k/v experiments start from.
struct Acts {
  int64_t T = 0;
  std::map<std::string, std::vector<float>> probe;  // "embed", "attn_norm", "q", "k", "v", "attn", ...
  std::vector<float> q_raw, k_raw, v_raw;  // projections with bias, before q/k norm and RoPE
  std::vector<float> q_nb, k_nb;           // the same without bias
  std::vector<float> q_bias, k_bias, q_norm, k_norm;
};
Acts layer0_acts(PhaseContext& ctx);

// A RoPE as a variant computes it (rope-variant, qkv-projection).
struct RopeVariant {
  bool interleaved = false;
  bool scaled = true;
  enum Norm { Before, After, None, WholeProjection } norm = Before;  // q/k norm (Qwen3) relative to RoPE
};
// rows of x (heads of head_dim each) at positions pos.. as the variant computes them.
std::vector<float> rope_ref(const ModelSpec& s, const float* x, int64_t rows, int64_t heads, int64_t pos,
                            const std::vector<float>& norm_w, const RopeVariant& v);
bool has_rope_scaling(const ModelSpec& s);

double nmse(const std::vector<float>& ref, const std::vector<float>& got);
// The verdict of "the target did what `variant` does" (diagnose.h states the rule).
Hypothesis judge(std::string name, std::string cause, const std::vector<float>& got, const std::vector<float>& variant,
                 const std::vector<float>& correct);
Hypothesis not_applicable(std::string name, std::string cause, std::string why);

// The gates of the record's failing rows ("phase0.prompt_ids", "phase6.stop_set", ...).
std::set<std::string> failed_gates(const Failure& f);
// Whether the failure is in the numbers (any failing row but the stop-set check).
bool numbers_failed(const Failure& f);
bool prompt_ids_failed(const Failure& f);
// The phase failed because the target refused to read a layer's KV cache back (a row of a
// later layer finding it empty): the kv-cache-state skill's matcher.
bool refused_reading_the_cache(const Failure& f);
bool stop_set_failed(const Failure& f);

// The skills' experiments.
std::vector<Hypothesis> rope_variant(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> qkv_projection(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> attention_variant(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> numeric_range(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> gemm_precision(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> kv_cache_state(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> stale_operand(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> stale_intermediate(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> unsynced_handover(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> reused_live_buffer(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> lm_head(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> prompt_ids(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> dispatch_overhead(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> stop_set(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> refusal(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> audit_findings(PhaseContext& ctx, const Failure& f);
std::vector<Hypothesis> error_shape(PhaseContext& ctx, const Failure& f);

}  // namespace tessera
