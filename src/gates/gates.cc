// The gate library: tensor metrics, token metrics, the threshold table, gate results and
// guard regions. All sums are in double so that the metric's own rounding stays far below
// the tolerances it is used to judge.
#include "gates/gates.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "util/error.h"

namespace tessera::gates {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// JSON has no NaN/Inf (nlohmann writes them as null, which then fails to read back as a
// number), so non-finite values travel as the strings "nan", "inf", "-inf".
nlohmann::json num(double v) { return json_number(v); }
double read_num(const nlohmann::json& j) { return read_json_number(j); }

}  // namespace

nlohmann::json json_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

double read_json_number(const nlohmann::json& j) {
  if (j.is_number()) return j.get<double>();
  if (j.is_null()) return kNaN;
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    if (s == "nan") return kNaN;
    if (s == "inf") return kInf;
    if (s == "-inf") return -kInf;
  }
  fail("gate JSON: expected a number, got {}", j.dump());
}

namespace {

// Cosine from the three dot products, with the zero-vector conventions of the header.
double cosine_from(double ab, double aa, double bb) {
  if (aa == 0 && bb == 0) return 1;
  if (aa == 0 || bb == 0) return 0;
  double c = ab / (std::sqrt(aa) * std::sqrt(bb));
  return std::clamp(c, -1.0, 1.0);  // rounding can step just past +-1
}

// Same non-finite kind on both sides: both NaN, or the same Inf. Such a pair is parity, not error.
bool same_nonfinite(float r, float g) {
  if (std::isnan(r) && std::isnan(g)) return true;
  return std::isinf(r) && std::isinf(g) && (r > 0) == (g > 0);
}

bool evaluate(double value, const std::string& op, double limit) {
  if (std::isnan(value) || std::isnan(limit)) return false;  // a NaN never passes a check
  if (op == ">=") return value >= limit;
  if (op == "<=") return value <= limit;
  if (op == "==") return value == limit;
  if (op == ">") return value > limit;
  if (op == "<") return value < limit;
  fail("gate check: unknown comparison '{}' (use >=, <=, ==, > or <)", op);
}

}  // namespace

std::string markdown_cell(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n' || c == '\r') out += ' ';  // a newline would end the table row
    else out += c;
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// tensor metrics

nlohmann::json TensorMetrics::to_json() const {
  return {{"count", count},     {"nmse", num(nmse)},       {"max_abs", num(max_abs)},
          {"max_rel", num(max_rel)}, {"pearson", num(pearson)}, {"cosine", num(cosine)},
          {"nan_ref", nan_ref}, {"inf_ref", inf_ref},      {"nan_got", nan_got},
          {"inf_got", inf_got}, {"min_row_cosine", num(min_row_cosine)}, {"worst_row", worst_row},
          {"gain", num(gain)},  {"offset", num(offset)}, {"ref_max", num(ref_max)}, {"ref_rms", num(ref_rms)}};
}

double cosine(const float* a, const float* b, int64_t n) {
  if (n < 0) fail("cosine: negative length {}", n);
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      if (!same_nonfinite(a[i], b[i])) return kNaN;  // a NaN or Inf against a value: no agreement
      continue;
    }
    double x = a[i], y = b[i];
    ab += x * y;
    aa += x * x;
    bb += y * y;
  }
  return cosine_from(ab, aa, bb);
}

TensorMetrics compare(const float* ref, const float* got, int64_t rows, int64_t cols, double rel_floor) {
  if (rows < 0 || cols < 0) fail("compare: negative shape [{}, {}]", rows, cols);
  TensorMetrics m;
  m.count = rows * cols;
  if (m.count > 0 && (ref == nullptr || got == nullptr)) fail("compare: null data for {} values", m.count);

  // Pass 1: counts, the finite pairs' means and max |ref| (for the default rel floor).
  double max_abs_ref = 0, sum_r = 0, sum_g = 0;
  int64_t finite_pairs = 0;
  bool nonfinite_mismatch = false;
  for (int64_t i = 0; i < m.count; ++i) {
    float r = ref[i], g = got[i];
    m.nan_ref += std::isnan(r);
    m.inf_ref += std::isinf(r);
    m.nan_got += std::isnan(g);
    m.inf_got += std::isinf(g);
    if (std::isfinite(r) && std::isfinite(g)) {
      ++finite_pairs;
      sum_r += r;
      sum_g += g;
      max_abs_ref = std::max(max_abs_ref, std::fabs(double(r)));
    } else if (!same_nonfinite(r, g)) {
      nonfinite_mismatch = true;
    }
  }
  const double floor = rel_floor >= 0 ? rel_floor : std::max(1e-3 * max_abs_ref, 1e-6);
  m.ref_max = max_abs_ref;

  // Pass 2: errors, centred moments (two-pass for an accurate Pearson) and dot products.
  const double mean_r = finite_pairs ? sum_r / double(finite_pairs) : 0;
  const double mean_g = finite_pairs ? sum_g / double(finite_pairs) : 0;
  double err2 = 0, ref2 = 0, got2 = 0, dot = 0, cov = 0, var_r = 0, var_g = 0;
  bool all_equal = true;
  for (int64_t i = 0; i < m.count; ++i) {
    if (!std::isfinite(ref[i]) || !std::isfinite(got[i])) continue;
    double r = ref[i], g = got[i], d = r - g, ad = std::fabs(d);
    all_equal = all_equal && d == 0;
    err2 += d * d;
    ref2 += r * r;
    got2 += g * g;
    dot += r * g;
    double cr = r - mean_r, cg = g - mean_g;
    cov += cr * cg;
    var_r += cr * cr;
    var_g += cg * cg;
    m.max_abs = std::max(m.max_abs, ad);
    double denom = std::max(std::fabs(r), floor);
    double rel = denom > 0 ? ad / denom : (ad == 0 ? 0 : kInf);  // floor 0 and ref 0
    m.max_rel = std::max(m.max_rel, rel);
  }
  m.nmse = ref2 > 0 ? err2 / ref2 : (all_equal ? 0 : kInf);
  m.cosine = cosine_from(dot, ref2, got2);
  if (var_r > 0 && var_g > 0) {
    m.pearson = std::clamp(cov / (std::sqrt(var_r) * std::sqrt(var_g)), -1.0, 1.0);
  } else if (var_r == 0 && var_g == 0) {
    m.pearson = all_equal ? 1 : 0;  // both constant: correlated only if identical
  } else {
    m.pearson = 0;  // one side constant: it carries none of the other's variation
  }
  // Least-squares line through the finite pairs: gain = cov / var(ref); the offset in units
  // of the reference's RMS.
  const double rms_r = finite_pairs ? std::sqrt(ref2 / double(finite_pairs)) : 0;
  m.ref_rms = rms_r;
  if (var_r > 0) {
    m.gain = cov / var_r;
    m.offset = (mean_g - m.gain * mean_r) / rms_r;
  } else {
    m.gain = all_equal ? 1 : kNaN;  // a constant reference fixes no slope
    m.offset = all_equal ? 0 : (rms_r > 0 ? (mean_g - mean_r) / rms_r : kNaN);
  }
  if (nonfinite_mismatch) {
    m.nmse = m.max_abs = m.max_rel = kInf;
    m.pearson = m.cosine = m.gain = m.offset = kNaN;
  }

  // Per-row (per-position) cosine minimum; the first worst row on ties.
  m.min_row_cosine = 1;
  m.worst_row = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double c = cosine(ref + r * cols, got + r * cols, cols);
    if (std::isnan(c)) {  // a broken row is the worst row
      m.min_row_cosine = kNaN;
      m.worst_row = r;
      break;
    }
    if (c < m.min_row_cosine) {
      m.min_row_cosine = c;
      m.worst_row = r;
    }
  }
  return m;
}

// ---------------------------------------------------------------------------------------
// token metrics

std::vector<int32_t> top_k(const float* logits, int64_t vocab, int k) {
  if (vocab < 0) fail("top_k: negative vocab {}", vocab);
  const int64_t kk = std::clamp<int64_t>(k, 0, vocab);
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) ids[size_t(i)] = int32_t(i);
  // Best first, ties by lower id; NaN ranks below everything (a NaN logit is never "best").
  auto better = [logits](int32_t a, int32_t b) {
    float x = logits[a], y = logits[b];
    bool xn = std::isnan(x), yn = std::isnan(y);
    if (xn != yn) return yn;
    if (!xn && x != y) return x > y;
    return a < b;
  };
  std::partial_sort(ids.begin(), ids.begin() + kk, ids.end(), better);
  ids.resize(size_t(kk));
  return ids;
}

bool top1_match(const float* ref, const float* got, int64_t vocab) {
  if (vocab <= 0) return false;  // nothing to compare is not a match
  return top_k(ref, vocab, 1)[0] == top_k(got, vocab, 1)[0];
}

bool topk_two_way(const float* ref, const float* got, int64_t vocab, int k) {
  if (vocab <= 0 || k <= 0) return false;
  auto tr = top_k(ref, vocab, k), tg = top_k(got, vocab, k);
  auto in = [](const std::vector<int32_t>& v, int32_t id) { return std::find(v.begin(), v.end(), id) != v.end(); };
  return in(tg, tr[0]) && in(tr, tg[0]);
}

double softmax_max_prob(const float* logits, int64_t vocab) {
  // NaN or +Inf logits make the distribution meaningless: NaN, so any check on it fails.
  // -Inf is a legitimate "masked" logit with probability 0.
  double mx = -kInf;
  for (int64_t i = 0; i < vocab; ++i) {
    float x = logits[i];
    if (std::isnan(x) || (std::isinf(x) && x > 0)) return kNaN;
    mx = std::max(mx, double(x));
  }
  if (vocab <= 0 || std::isinf(mx)) return kNaN;
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  return 1.0 / sum;  // exp(max - max) / sum
}

nlohmann::json GreedyMatch::to_json() const {
  return {{"steps", steps},
          {"matched", matched},
          {"first_divergence", first_divergence},
          {"divergence_within_topk", divergence_within_topk},
          {"pass", pass}};
}

GreedyMatch greedy_match(const std::vector<int32_t>& ref_tokens, const std::vector<int32_t>& got_tokens,
                         const std::vector<std::vector<int32_t>>& topk_ref,
                         const std::vector<std::vector<int32_t>>& topk_got) {
  GreedyMatch g;
  // Only positions both sides generated are compared (see the header on unequal lengths).
  g.steps = int64_t(std::min(ref_tokens.size(), got_tokens.size()));
  g.matched = g.steps;
  for (int64_t i = 0; i < g.steps; ++i) {
    if (ref_tokens[size_t(i)] == got_tokens[size_t(i)]) continue;
    g.first_divergence = i;
    g.matched = i;
    auto has = [i](const std::vector<std::vector<int32_t>>& lists, int32_t id) {
      if (size_t(i) >= lists.size()) return false;  // no evidence of the top-k: not within it
      const auto& l = lists[size_t(i)];
      return std::find(l.begin(), l.end(), id) != l.end();
    };
    g.divergence_within_topk = has(topk_ref, got_tokens[size_t(i)]) && has(topk_got, ref_tokens[size_t(i)]);
    break;
  }
  g.pass = g.first_divergence < 0 || g.divergence_within_topk;
  return g;
}

// ---------------------------------------------------------------------------------------
// thresholds: the one table

const std::map<std::string, Threshold>& thresholds() {
  static const std::map<std::string, Threshold> table = {
      // phase 0: the FP32 oracle against an independent reference (HF transformers fixtures)
      {"phase0.layer_cosine_min", {0.9999, "FP32 vs FP32 reference: only summation order may differ"}},
      {"phase0.logits_cosine_min", {0.9999, "FP32 vs FP32 reference: only summation order may differ"}},
      {"phase0.logits_std_min", {1e-6, "logits not degenerate (a constant row means a broken model)"}},
      // phase 1: each kernel against the oracle's kernel, bf16 targets
      {"phase1.gemm.pearson_min", {0.999, "GEMM/GEMV with bf16 weights and fp32 accumulation correlate almost perfectly"}},
      {"phase1.gemm.nmse_max",
       {1e-4, "bf16 weights with fp32 accumulation sit near 1e-5; accumulating in bf16 lands near 1e-3"}},
      {"phase1.kernel.pearson_min", {0.99, "non-GEMM kernels use hardware approximations (exp, rsqrt, silu)"}},
      {"phase1.kernel.nmse_max", {1e-3, "bf16 inputs/outputs plus approximate transcendentals"}},
      // phase 1's derived limits: a margin above the error of the target's declared numerics,
      // emulated in the oracle's twin (pipeline/op_table.h); the bounds below are outer bounds.
      {"phase1.margin", {4, "limit = margin x the expected error (x margin^2 for NMSE, a squared error)"}},
      {"phase1.nmse_floor", {1e-10, "fp32 evaluation-order noise: the least NMSE limit of an exact kernel"}},
      {"phase1.err_floor", {1e-5, "fp32 evaluation-order noise: the least limit of gain and offset"}},
      {"phase1.max_err_floor", {2e-5, "the least limit of max_err, 2 x sqrt(phase1.nmse_floor): noise at half the NMSE "
                                      "floor stays under it (its largest value is ~1e-5 of the peak), and one element "
                                      "per row at half of it stays under the NMSE floor"}},
      {"phase1.max_err_max", {0.1, "outer bound: the largest error, in units of the reference's largest value"}},
      {"phase1.gain_error_max", {1e-2, "outer bound: |least-squares gain - the gain the declared numerics give|"}},
      {"phase1.offset_max", {1e-2, "outer bound: |least-squares offset - the declared numerics' offset|, in units of the reference's RMS"}},
      // phase 2: layer 0 wired on the target
      {"phase2.cosine_min", {0.99, "one block in bf16 stays close to the FP32 block"}},
      {"phase2.row_cosine_min.hd64", {0.99, "per-position minimum, head_dim <= 64"}},
      {"phase2.row_cosine_min.hd128", {0.98, "per-position minimum, head_dim <= 128: longer bf16 dot products"}},
      {"phase2.row_cosine_min.hd256", {0.97, "per-position minimum, head_dim > 128: longest bf16 dot products"}},
      // phase 3: the whole model on the target
      {"phase3.layer_cosine_min", {0.95, "bf16 error grows with depth but every layer stays aligned"}},
      // phase 3's layer-scoped rows: each layer started from the oracle's input (sublayer_check.h)
      {"phase3.sublayer_margin", {3, "limit = margin x the sum of the sublayer's kernels' expected relative errors (layer 0's "
                                     "op-table cases); npusim's bf16 attention measures up to 1.7x that sum in deep layers"}},
      {"phase3.sublayer_error_floor", {0.01, "the least limit of a sublayer's relative error: fp32, fp16-cache and "
                                             "block-quantized paths measure up to 0.0011 (default model, cpu)"}},
      {"phase3.sublayer_error_max", {0.04, "outer bound: one layer's attention or MLP contribution 4% off the oracle's "
                                           "is a bug on any numerics tessera has (npusim's bf16 array measures up to 0.023)"}},
      {"phase3.cliff_max", {0.05, "a drop this large between adjacent layers points at one broken layer"}},
      {"phase3.logits_cosine_min", {0.99, "final logits close to the oracle's"}},
      {"phase3.decisive_prob", {0.5, "oracle top-1 probability above this makes a prompt decisive (same top-1 required)"}},
      {"phase3.topk", {5, "competitive prompts: two-way top-k overlap"}},
      // phase 6: the integrated runner
      {"phase6.tokens", {32, "greedy tokens generated and matched per prompt"}},
      {"phase6.prompts_min", {2, "at least this many prompts in the greedy match"}},
      {"phase6.tie_margin", {3, "a greedy divergence passes only where the oracle's logit gap between the two tokens is "
                                 "under this x sqrt(2) x the RMS logit difference on the first step (a near-tie)"}},
      {"phase6.topk", {5, "at the first divergence each side's token is in the other's top-k"}},
      // debug skills: when an experiment's reference variant counts as matching the target
      {"diagnose.match_nmse_max", {1e-4, "the target matches a reference variant (bf16 rounding stays ~1e-5)"}},
      {"diagnose.separation_min", {10, "the target must be this many times closer to a variant than to the correct "
                                       "reference for the variant to be confirmed"}},
      {"diagnose.confined_fraction_min", {0.9, "error-shape: the share of a row's error energy a set of heads, columns "
                                               "or positions must hold to be called the place of the error"}},
      {"diagnose.unrelated_pearson_max", {0.1, "lm-head: logits this little correlated with the tied product come from "
                                               "another matrix"}},
      {"diagnose.dispatch_gain_min", {1.25, "merging the frozen plan's dispatches would make a pass this many times "
                                            "faster: dispatch overhead not amortized (advisory)"}},
  };
  return table;
}

double threshold(const std::string& key) {
  const auto& t = thresholds();
  auto it = t.find(key);
  if (it == t.end()) fail("unknown gate threshold '{}'", key);
  return it->second.value;
}

std::string row_cosine_key_for_head_dim(int64_t head_dim) {
  if (head_dim <= 64) return "phase2.row_cosine_min.hd64";
  if (head_dim <= 128) return "phase2.row_cosine_min.hd128";
  return "phase2.row_cosine_min.hd256";
}

double row_cosine_threshold_for_head_dim(int64_t head_dim) {
  return threshold(row_cosine_key_for_head_dim(head_dim));
}

// ---------------------------------------------------------------------------------------
// gate results

const Check* GateResult::check(const std::string& metric) const {
  for (const Check& c : checks)
    if (c.metric == metric) return &c;
  return nullptr;
}

bool GateResult::pass() const {
  if (checks.empty()) return false;  // a gate that checked nothing has shown nothing
  return std::all_of(checks.begin(), checks.end(), [](const Check& c) { return c.pass; });
}

void GateResult::require(const std::string& metric, double value, const std::string& op,
                         const std::string& threshold_key) {
  double limit = threshold(threshold_key);
  checks.push_back({metric, value, op, limit, threshold_key, evaluate(value, op, limit)});
}

void GateResult::require_derived(const std::string& metric, double value, const std::string& op, double limit,
                                 const std::string& outer_key) {
  const double outer = threshold(outer_key);
  if (op == "<=" || op == "<") limit = std::min(limit, outer);
  else if (op == ">=" || op == ">") limit = std::max(limit, outer);
  else fail("gate check: a derived limit needs an ordering comparison, not '{}'", op);
  checks.push_back({metric, value, op, limit, "derived:" + outer_key, evaluate(value, op, limit)});
}

void GateResult::require_fixed(const std::string& metric, double value, const std::string& op, double limit) {
  checks.push_back({metric, value, op, limit, "", evaluate(value, op, limit)});
}

nlohmann::json GateResult::to_json() const {
  nlohmann::json cs = nlohmann::json::array();
  for (const auto& c : checks) {
    cs.push_back({{"metric", c.metric},
                  {"value", num(c.value)},
                  {"op", c.op},
                  {"limit", num(c.limit)},
                  {"threshold", c.threshold},
                  {"pass", c.pass}});
  }
  return {{"gate", gate}, {"subject", subject}, {"pass", pass()}, {"checks", cs}, {"note", note}};
}

GateResult GateResult::from_json(const nlohmann::json& j) {
  try {
    GateResult r;
    r.gate = j.at("gate").get<std::string>();
    r.subject = j.at("subject").get<std::string>();
    r.note = j.value("note", std::string());
    for (const auto& c : j.at("checks")) {
      Check k;
      k.metric = c.at("metric").get<std::string>();
      k.value = read_num(c.at("value"));
      k.op = c.at("op").get<std::string>();
      k.limit = read_num(c.at("limit"));
      k.threshold = c.value("threshold", std::string());
      // Re-judged from value/op/limit rather than trusted: an edited "pass" cannot flip a verdict.
      k.pass = evaluate(k.value, k.op, k.limit);
      r.checks.push_back(std::move(k));
    }
    return r;
  } catch (const nlohmann::json::exception& e) {
    fail("gate JSON: {}", e.what());
  }
}

std::string GateResult::markdown_header() { return "| subject | verdict | checks |\n|---|---|---|"; }

std::string GateResult::markdown_row() const {
  std::string cells;
  for (const auto& c : checks) {
    if (!cells.empty()) cells += "; ";
    cells += fmt::format("{} {:.6g} {} {:.6g}", c.metric, c.value, c.op, c.limit);
    if (!c.threshold.empty()) cells += fmt::format(" ({})", c.threshold);
    if (!c.pass) cells += " FAIL";
  }
  if (checks.empty()) cells = "no checks";
  if (!note.empty()) cells += "; note: " + markdown_cell(note);
  return fmt::format("| {} | {} | {} |", markdown_cell(subject), pass() ? "PASS" : "FAIL", cells);
}

// ---------------------------------------------------------------------------------------
// guard regions
//
// Layout inside bytes_: [slack][front guard][data][back guard][slack]. The slack (< 64 bytes)
// exists only to place data() on a 64-byte boundary, since std::vector<uint8_t> storage has
// no alignment promise beyond malloc's. The sentinel pattern is a function of the distance
// from the front guard's start, so that a copy (with a different slack) keeps it intact.

namespace {
constexpr int64_t kAlign = 64;
// Byte i of the guards: a counter folded to a byte, xor 0xA5. Consecutive bytes differ (no
// zero or 0xFF runs), so a float written over the guard matches it only by accident.
inline uint8_t sentinel(int64_t i) { return uint8_t((i ^ (i >> 8)) & 0xFF) ^ 0xA5; }
}  // namespace

GuardedBuffer::GuardedBuffer(int64_t count, int64_t guard_bytes) : count_(count), guard_(guard_bytes) {
  if (count < 0) fail("GuardedBuffer: negative count {}", count);
  if (guard_bytes <= 0) fail("GuardedBuffer: guard_bytes must be positive, got {}", guard_bytes);
  layout();
}

void GuardedBuffer::layout() {
  const int64_t span = 2 * guard_ + count_ * int64_t(sizeof(float));
  bytes_.assign(size_t(span + kAlign), 0);
  // Choose offset_ so that base() + guard_ (the data) is 64-byte aligned.
  auto addr = reinterpret_cast<uintptr_t>(bytes_.data()) + uintptr_t(guard_);
  offset_ = int64_t((kAlign - addr % kAlign) % kAlign);
  uint8_t* b = base();
  for (int64_t i = 0; i < guard_; ++i) b[i] = sentinel(i);
  for (int64_t i = 0; i < guard_; ++i) {
    int64_t at = guard_ + count_ * int64_t(sizeof(float)) + i;
    b[at] = sentinel(at);
  }
  // The data itself stays all-zero bytes: 0.0f, NaN-free.
}

GuardedBuffer::GuardedBuffer(const GuardedBuffer& other) : count_(other.count_), guard_(other.guard_) {
  if (other.bytes_.empty()) return;  // a moved-from source copies as empty
  layout();
  std::memcpy(base(), other.base(), size_t(2 * guard_ + count_ * int64_t(sizeof(float))));
}

GuardedBuffer& GuardedBuffer::operator=(const GuardedBuffer& other) {
  if (this != &other) *this = GuardedBuffer(other);
  return *this;
}

// The vector's heap block moves with it, so offset_ stays valid; the source becomes empty.
GuardedBuffer::GuardedBuffer(GuardedBuffer&& other) noexcept
    : count_(other.count_), guard_(other.guard_), bytes_(std::move(other.bytes_)), offset_(other.offset_) {
  other.count_ = other.guard_ = other.offset_ = 0;
  other.bytes_.clear();
}

GuardedBuffer& GuardedBuffer::operator=(GuardedBuffer&& other) noexcept {
  if (this != &other) {
    count_ = other.count_;
    guard_ = other.guard_;
    bytes_ = std::move(other.bytes_);
    offset_ = other.offset_;
    other.count_ = other.guard_ = other.offset_ = 0;
    other.bytes_.clear();
  }
  return *this;
}

uint8_t* GuardedBuffer::base() { return bytes_.data() + offset_; }
const uint8_t* GuardedBuffer::base() const { return bytes_.data() + offset_; }

float* GuardedBuffer::data() { return reinterpret_cast<float*>(base() + guard_); }
const float* GuardedBuffer::data() const { return reinterpret_cast<const float*>(base() + guard_); }

int64_t GuardedBuffer::corrupted_bytes() const {
  if (bytes_.empty()) return 0;  // moved-from
  const uint8_t* b = base();
  const int64_t back = guard_ + count_ * int64_t(sizeof(float));
  int64_t bad = 0;
  for (int64_t i = 0; i < guard_; ++i) bad += b[i] != sentinel(i);
  for (int64_t i = back; i < back + guard_; ++i) bad += b[i] != sentinel(i);
  return bad;
}

bool GuardedBuffer::intact() const { return corrupted_bytes() == 0; }

}  // namespace tessera::gates
