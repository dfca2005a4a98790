// The one gate library every phase, test and the evaluator use: tensor metrics, token
// metrics, guard regions, and gate results that name their thresholds. Every threshold
// lives in thresholds() (one table); a gate never hard-codes its own.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

namespace tessera::gates {

// ---- tensor metrics: `ref` is the oracle's, `got` the target's; rows x cols row-major ----
struct TensorMetrics {
  int64_t count = 0;
  double nmse = 0;      // sum (ref-got)^2 / sum ref^2
  double max_abs = 0;   // max |ref - got|
  double max_rel = 0;   // max |ref - got| / max(|ref|, rel_floor)
  double pearson = 0;
  double cosine = 0;
  int64_t nan_ref = 0, inf_ref = 0, nan_got = 0, inf_got = 0;
  double min_row_cosine = 0;  // per-position minimum
  int64_t worst_row = 0;      // where it is
  // The least-squares line got = gain * ref + offset * rms(ref): a systematic error (a
  // scale or a shift) shows here even when it is far below the noise of single elements.
  // offset is in units of the reference's RMS, so its limit does not depend on the scale.
  double gain = 1, offset = 0;
  double ref_max = 0;  // max |ref| over the finite pairs (the scale max_abs is judged against)
  double ref_rms = 0;  // RMS of ref over the finite pairs
  nlohmann::json to_json() const;
};
// rel_floor < 0: 1e-3 * max |ref| (and at least 1e-6).
// Non-finite values: counted per side (nan_*/inf_*). A pair that is not alike in kind (one
// side NaN/Inf and the other not, or Infs of different sign) fails every metric: nmse,
// max_abs and max_rel become +inf, pearson, cosine, gain, offset and the row cosines NaN
// (a NaN never passes a check), so no metric can score a broken output as good. Pairs where
// both sides are NaN, or both the same Inf, are parity, not error: every metric skips them
// (the counts still report them).
// Cosine of two all-zero vectors is 1, of a zero and a non-zero vector 0; Pearson of two
// constant vectors is 1 when they are equal, else 0, and 0 when just one side is constant.
// gain is 1 and offset 0 when the reference is constant and equal to got.
TensorMetrics compare(const float* ref, const float* got, int64_t rows, int64_t cols, double rel_floor = -1);
// NaN when a pair is not alike in kind (see compare).
double cosine(const float* a, const float* b, int64_t n);
// JSON has no NaN/Inf: metric values travel as numbers or the strings "nan", "inf", "-inf".
nlohmann::json json_number(double v);
double read_json_number(const nlohmann::json& j);
// Text for one Markdown table cell: '|' (as in "q|k|v") escaped, newlines as spaces.
std::string markdown_cell(const std::string& s);

// ---- token metrics over logits rows (vocab values each) ----
std::vector<int32_t> top_k(const float* logits, int64_t vocab, int k);  // best first, ties by lower id
bool top1_match(const float* ref, const float* got, int64_t vocab);
// Two-way overlap: ref's top-1 is in got's top-k AND got's top-1 is in ref's top-k.
bool topk_two_way(const float* ref, const float* got, int64_t vocab, int k);
double softmax_max_prob(const float* logits, int64_t vocab);  // the top-1 probability

// Greedy N-token match: both sides generated `ref_tokens` / `got_tokens` greedily from the
// same prompt; at the first divergence (if any) each side's token must be in the other's
// top-k at that step (topk_ref[i] / topk_got[i]: the top-k ids of step i).
struct GreedyMatch {
  int64_t steps = 0;
  int64_t matched = 0;          // tokens equal before the first divergence
  int64_t first_divergence = -1;  // -1: none
  bool divergence_within_topk = true;
  bool pass = false;
  nlohmann::json to_json() const;
};
// pass = no divergence, or a divergence whose tokens are each in the other's top-k.
// Unequal lengths (one side stopped earlier, e.g. at EOS or a lower token limit): only the
// first min(len) positions are compared and steps = min(len); a length difference alone is
// NOT a divergence, since past the shorter length only one side has a token to compare.
// Callers gate the length by requiring steps >= threshold("phase6.tokens"). A divergence
// whose step has no top-k list on either side counts as outside the top-k (fails).
GreedyMatch greedy_match(const std::vector<int32_t>& ref_tokens, const std::vector<int32_t>& got_tokens,
                         const std::vector<std::vector<int32_t>>& topk_ref,
                         const std::vector<std::vector<int32_t>>& topk_got);

// ---- thresholds: the one table ----
// Keys like "phase1.gemm.pearson_min", "phase2.cosine_min", "phase3.layer_cosine_min".
// Value and a one-line reason each.
struct Threshold {
  double value;
  std::string why;
};
const std::map<std::string, Threshold>& thresholds();
double threshold(const std::string& key);  // throws naming the key
// Phase 2's per-position cosine minimum depends on head_dim (longer dot products in bf16
// drift more): <= 64 -> phase2.row_cosine_min.hd64, <= 128 -> .hd128, else .hd256.
double row_cosine_threshold_for_head_dim(int64_t head_dim);
std::string row_cosine_key_for_head_dim(int64_t head_dim);  // the key of that entry, for require()

// ---- gate results ----
struct Check {
  std::string metric;     // "pearson"
  double value = 0;
  std::string op;         // ">=", "<=", "=="
  double limit = 0;
  std::string threshold;  // the table key the limit came from ("" for fixed rules, e.g. NaN parity)
  bool pass = false;
};
struct GateResult {
  std::string gate;     // "phase1.kernel", "phase2.block", ...
  std::string subject;  // "gemm q_proj [16,576]x[576,576]^T"
  std::vector<Check> checks;
  std::string note;     // diagnosis or context
  bool pass() const;    // every check passes (and there is at least one)
  const Check* check(const std::string& metric) const;  // the check of `metric`, or nullptr
  // Adds a check from the threshold table: op ">=" means value must be >= limit.
  void require(const std::string& metric, double value, const std::string& op, const std::string& threshold_key);
  void require_fixed(const std::string& metric, double value, const std::string& op, double limit);
  // A limit derived for this row (phase 1: a margin above the error the target's declared
  // numerics give), clamped so it is never looser than the table's `outer_key`; recorded
  // with threshold "derived:<outer_key>", which the evaluator holds to that bound.
  void require_derived(const std::string& metric, double value, const std::string& op, double limit,
                       const std::string& outer_key);
  nlohmann::json to_json() const;
  static GateResult from_json(const nlohmann::json& j);
  // "| subject | PASS | pearson 0.99998 >= 0.999 (phase1.gemm.pearson_min); ... |"
  std::string markdown_row() const;
  static std::string markdown_header();  // "| subject | verdict | checks |\n|---|---|---|"
};

// ---- guard regions ----
// A buffer of `count` floats with sentinel bytes before and after it; a kernel writes
// data(), then intact() tells whether anything outside [data, data + count) changed.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(int64_t count, int64_t guard_bytes = 4096);  // data 64-byte aligned, zeroed
  // Copies keep data and guard bytes (corruption included); moves leave the source empty.
  GuardedBuffer(const GuardedBuffer& other);
  GuardedBuffer& operator=(const GuardedBuffer& other);
  GuardedBuffer(GuardedBuffer&& other) noexcept;
  GuardedBuffer& operator=(GuardedBuffer&& other) noexcept;
  float* data();
  const float* data() const;
  int64_t size() const { return count_; }
  bool intact() const;
  int64_t corrupted_bytes() const;  // how many sentinel bytes changed
  int64_t guard_bytes() const { return guard_; }

 private:
  uint8_t* base();              // first byte of the front guard
  const uint8_t* base() const;
  void layout();  // allocate bytes_, place the guards around a 64-aligned, zeroed data region
  int64_t count_, guard_;
  std::vector<uint8_t> bytes_;
  int64_t offset_ = 0;  // where the front guard starts in bytes_ (chosen so data() is 64-aligned)
};

}  // namespace tessera::gates
