// The gate library: every metric against values worked out by hand for small inputs, and for
// every rule a gate relies on a bad input that must fail it (a gate that cannot fail is a defect).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "gates/gates.h"
#include "util/error.h"

namespace tessera::gates {
namespace {

constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();
constexpr float kInff = std::numeric_limits<float>::infinity();

// Deterministic "activations": smooth, signed, not constant.
std::vector<float> signal(int64_t n, double phase = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(std::sin(0.37 * double(i) + phase) + 0.25 * std::cos(1.3 * double(i)));
  return v;
}

// ref plus Gaussian noise of `rel` times ref's RMS.
std::vector<float> perturbed(const std::vector<float>& ref, double rel, unsigned seed) {
  double rms = 0;
  for (float x : ref) rms += double(x) * x;
  rms = std::sqrt(rms / double(ref.size()));
  std::mt19937 rng(seed);
  std::normal_distribution<double> noise(0.0, rel * rms);
  std::vector<float> got = ref;
  for (auto& x : got) x = float(x + noise(rng));
  return got;
}

// ---------------------------------------------------------------------------------------
// tensor metrics

TEST(GatesCompare, MetricsMatchHandComputedValues) {
  // 2 x 2; row 0 equal, row 1 differs by one in the last element.
  std::vector<float> ref = {1, 2, 3, 4}, got = {1, 2, 3, 5};
  TensorMetrics m = compare(ref.data(), got.data(), 2, 2);
  EXPECT_EQ(m.count, 4);
  // sum (ref-got)^2 = 1, sum ref^2 = 1+4+9+16 = 30.
  EXPECT_DOUBLE_EQ(m.nmse, 1.0 / 30.0);
  EXPECT_DOUBLE_EQ(m.max_abs, 1.0);
  // default floor = max(1e-3 * 4, 1e-6) = 0.004 < |4|: 1 / 4.
  EXPECT_DOUBLE_EQ(m.max_rel, 0.25);
  // ref.got = 1+4+9+20 = 34, got.got = 1+4+9+25 = 39.
  EXPECT_NEAR(m.cosine, 34.0 / std::sqrt(30.0 * 39.0), 1e-15);
  // means 2.5 and 2.75; centred: (-1.5,-.5,.5,1.5) and (-1.75,-.75,.25,2.25):
  // cov = 2.625+.375+.125+3.375 = 6.5, var_ref = 5, var_got = 3.0625+.5625+.0625+5.0625 = 8.75.
  EXPECT_NEAR(m.pearson, 6.5 / std::sqrt(5.0 * 8.75), 1e-15);
  // row 1: (3,4).(3,5) = 29, |(3,4)|^2 = 25, |(3,5)|^2 = 34.
  EXPECT_NEAR(m.min_row_cosine, 29.0 / std::sqrt(25.0 * 34.0), 1e-15);
  EXPECT_EQ(m.worst_row, 1);
  EXPECT_EQ(m.nan_ref + m.inf_ref + m.nan_got + m.inf_got, 0);
}

TEST(GatesCompare, IdenticalTensorsArePerfect) {
  auto ref = signal(96);
  TensorMetrics m = compare(ref.data(), ref.data(), 8, 12);
  EXPECT_EQ(m.nmse, 0);
  EXPECT_EQ(m.max_abs, 0);
  EXPECT_EQ(m.max_rel, 0);
  EXPECT_DOUBLE_EQ(m.pearson, 1);
  EXPECT_DOUBLE_EQ(m.cosine, 1);
  EXPECT_DOUBLE_EQ(m.min_row_cosine, 1);
}

TEST(GatesCompare, MaxRelUsesTheFloor) {
  std::vector<float> ref = {0.0f, 0.5f}, got = {0.1f, 0.5f};
  // explicit floor 1: |0 - 0.1| / max(0, 1) = 0.1
  EXPECT_NEAR(compare(ref.data(), got.data(), 1, 2, 1.0).max_rel, double(0.1f), 1e-12);
  // default floor 1e-3 * 0.5 = 5e-4: 0.1 / 5e-4 = 200
  EXPECT_NEAR(compare(ref.data(), got.data(), 1, 2).max_rel, double(0.1f) / 5e-4, 1e-9);
  // default floor never below 1e-6 (all-zero ref)
  std::vector<float> z = {0.0f, 0.0f}, small = {1e-6f, 0.0f};
  EXPECT_NEAR(compare(z.data(), small.data(), 1, 2).max_rel, double(1e-6f) / 1e-6, 1e-9);
  // floor 0 and ref 0: equal is 0, different is +inf (not NaN)
  EXPECT_EQ(compare(z.data(), z.data(), 1, 2, 0.0).max_rel, 0);
  EXPECT_TRUE(std::isinf(compare(z.data(), small.data(), 1, 2, 0.0).max_rel));
}

TEST(GatesCompare, NmseWithZeroReference) {
  std::vector<float> z = {0, 0, 0}, nz = {0, 1e-3f, 0};
  EXPECT_EQ(compare(z.data(), z.data(), 1, 3).nmse, 0);
  double n = compare(z.data(), nz.data(), 1, 3).nmse;
  EXPECT_TRUE(std::isinf(n) && n > 0);
}

TEST(GatesCompare, CosineConventions) {
  std::vector<float> z = {0, 0, 0}, a = {1, 2, 3}, neg = {-1, -2, -3}, orth = {3, 0, -1};
  EXPECT_EQ(cosine(z.data(), z.data(), 3), 1);  // two zero vectors: equal
  EXPECT_EQ(cosine(z.data(), a.data(), 3), 0);  // zero vs non-zero: nothing in common
  EXPECT_EQ(cosine(a.data(), z.data(), 3), 0);
  EXPECT_DOUBLE_EQ(cosine(a.data(), neg.data(), 3), -1);
  EXPECT_DOUBLE_EQ(cosine(a.data(), orth.data(), 3), 0);  // 3 + 0 - 3
  // (1,2,3).(2,2,2) = 12, |a|^2 = 14, |b|^2 = 12
  std::vector<float> b = {2, 2, 2};
  EXPECT_NEAR(cosine(a.data(), b.data(), 3), 12.0 / std::sqrt(14.0 * 12.0), 1e-15);
}

TEST(GatesCompare, PearsonConventionsForConstantVectors) {
  std::vector<float> c1 = {2, 2, 2}, c2 = {3, 3, 3}, a = {1, 2, 3};
  EXPECT_EQ(compare(c1.data(), c1.data(), 1, 3).pearson, 1);
  EXPECT_EQ(compare(c1.data(), c2.data(), 1, 3).pearson, 0);
  EXPECT_EQ(compare(a.data(), c1.data(), 1, 3).pearson, 0);
  std::vector<float> rev = {3, 2, 1};
  EXPECT_DOUBLE_EQ(compare(a.data(), rev.data(), 1, 3).pearson, -1);
}

TEST(GatesCompare, ScaledByTwoHasCosineOneButNmseOne) {
  // Why cosine alone is not enough: a 2x scale error is invisible to cosine and Pearson.
  auto ref = signal(64);
  std::vector<float> got = ref;
  for (auto& x : got) x *= 2;
  TensorMetrics m = compare(ref.data(), got.data(), 4, 16);
  EXPECT_NEAR(m.cosine, 1, 1e-12);
  EXPECT_NEAR(m.pearson, 1, 1e-12);
  EXPECT_NEAR(m.min_row_cosine, 1, 1e-12);
  EXPECT_DOUBLE_EQ(m.nmse, 1.0);  // sum (x - 2x)^2 / sum x^2
  GateResult g{"phase1.kernel", "scaled gemm", {}, ""};
  g.require("pearson", m.pearson, ">=", "phase1.gemm.pearson_min");
  g.require("nmse", m.nmse, "<=", "phase1.gemm.nmse_max");
  EXPECT_TRUE(g.checks[0].pass);
  EXPECT_FALSE(g.checks[1].pass);
  EXPECT_FALSE(g.pass());
}

TEST(GatesCompare, PerturbedTensorFailsGemmThresholds) {
  auto ref = signal(4096);
  auto gate = [&](const std::vector<float>& got) {
    TensorMetrics m = compare(ref.data(), got.data(), 64, 64);
    GateResult g{"phase1.kernel", "gemm", {}, ""};
    g.require("pearson", m.pearson, ">=", "phase1.gemm.pearson_min");
    g.require("nmse", m.nmse, "<=", "phase1.gemm.nmse_max");
    return g;
  };
  // bf16-sized error (relative ~3e-3, NMSE ~1e-5) passes ...
  GateResult ok = gate(perturbed(ref, 3e-3, 1));
  EXPECT_TRUE(ok.pass()) << ok.markdown_row();
  // ... 10% noise (NMSE ~1e-2, Pearson ~0.995) fails both checks.
  GateResult bad = gate(perturbed(ref, 0.1, 2));
  EXPECT_FALSE(bad.checks[0].pass) << bad.markdown_row();
  EXPECT_FALSE(bad.checks[1].pass) << bad.markdown_row();
  EXPECT_FALSE(bad.pass());
  // 2% noise: Pearson ~0.9998 still passes, NMSE ~4e-4 does not (each check matters).
  GateResult mid = gate(perturbed(ref, 0.02, 3));
  EXPECT_TRUE(mid.checks[0].pass) << mid.markdown_row();
  EXPECT_FALSE(mid.checks[1].pass) << mid.markdown_row();
}

TEST(GatesCompare, NonFiniteValuesAreCountedAndFailEveryMetric) {
  std::vector<float> ref = {1, 2, 3, 4, 5, 6}, got = {1, 2, kNaNf, 4, 5, 6};
  TensorMetrics m = compare(ref.data(), got.data(), 2, 3);
  EXPECT_EQ(m.nan_got, 1);
  EXPECT_EQ(m.nan_ref, 0);
  EXPECT_EQ(m.inf_got, 0);
  EXPECT_EQ(m.inf_ref, 0);
  // One NaN where the reference is finite: no metric may call the output good.
  EXPECT_TRUE(std::isinf(m.nmse));
  EXPECT_TRUE(std::isinf(m.max_abs));
  EXPECT_TRUE(std::isinf(m.max_rel));
  EXPECT_TRUE(std::isnan(m.cosine));
  EXPECT_TRUE(std::isnan(m.pearson));
  EXPECT_TRUE(std::isnan(m.gain));
  EXPECT_TRUE(std::isnan(m.offset));
  EXPECT_TRUE(std::isnan(m.min_row_cosine));
  EXPECT_EQ(m.worst_row, 0);  // the row that holds the NaN
  EXPECT_TRUE(std::isnan(cosine(ref.data(), got.data(), 6)));
  GateResult g{"phase1.kernel", "rmsnorm", {}, ""};
  g.require_fixed("nan_got", double(m.nan_got), "==", double(m.nan_ref));
  EXPECT_FALSE(g.pass());

  // Inf on the reference side, counted separately; +inf against 2 is a mismatch.
  std::vector<float> ref2 = {1, kInff, -kInff, kNaNf}, got2 = {1, 2, -kInff, kNaNf};
  TensorMetrics m2 = compare(ref2.data(), got2.data(), 1, 4);
  EXPECT_EQ(m2.inf_ref, 2);
  EXPECT_EQ(m2.inf_got, 1);
  EXPECT_EQ(m2.nan_ref, 1);
  EXPECT_EQ(m2.nan_got, 1);
  EXPECT_TRUE(std::isnan(m2.cosine));
  EXPECT_TRUE(std::isinf(m2.nmse));

  // NaN/Inf parity (same kind at the same place on both sides) is not an error.
  std::vector<float> ref3 = {1, kNaNf, -kInff, 2}, got3 = {1, kNaNf, -kInff, 2};
  TensorMetrics m3 = compare(ref3.data(), got3.data(), 1, 4);
  EXPECT_EQ(m3.nmse, 0);
  EXPECT_EQ(m3.max_abs, 0);
  EXPECT_DOUBLE_EQ(m3.cosine, 1);
  EXPECT_DOUBLE_EQ(m3.gain, 1);
  EXPECT_EQ(m3.nan_ref, 1);
  EXPECT_EQ(m3.inf_got, 1);

  // JSON carries the non-finite values as strings, not as null.
  auto j = m.to_json();
  EXPECT_EQ(j.at("nmse"), "inf");
  EXPECT_EQ(j.at("cosine"), "nan");
  EXPECT_EQ(j.at("nan_got"), 1);
}

// Every metric a gate reads fails for all-NaN, one NaN and Inf outputs against a finite
// reference (the acceptance list of issue 16).
TEST(GatesCompare, AllNaNOneNaNAndInfFailEveryMetricCheck) {
  const int64_t rows = 8, cols = 64;
  auto ref = signal(rows * cols);
  std::vector<float> all_nan(ref.size(), kNaNf), one_nan = ref, inf = ref, neg_inf = ref;
  one_nan[77] = kNaNf;
  inf[5] = kInff;
  neg_inf[300] = -kInff;
  for (const auto* got : {&all_nan, &one_nan, &inf, &neg_inf}) {
    TensorMetrics m = compare(ref.data(), got->data(), rows, cols);
    GateResult g{"phase1.kernel", "x", {}, ""};
    g.require_fixed("nmse", m.nmse, "<=", 1e-3);
    g.require_fixed("max_abs", m.max_abs, "<=", 1e3);
    g.require_fixed("max_rel", m.max_rel, "<=", 1e3);
    g.require_fixed("pearson", m.pearson, ">=", -1);
    g.require_fixed("cosine", m.cosine, ">=", -1);
    g.require_fixed("min_row_cosine", m.min_row_cosine, ">=", -1);
    g.require_fixed("gain_error", std::fabs(m.gain - 1), "<=", 1e3);
    g.require_fixed("offset", std::fabs(m.offset), "<=", 1e3);
    for (const auto& c : g.checks) EXPECT_FALSE(c.pass) << c.metric << ": " << g.markdown_row();
    EXPECT_TRUE(std::isnan(cosine(ref.data(), got->data(), rows * cols)));
  }
}

TEST(GatesCompare, GainAndOffsetAreTheLeastSquaresLine) {
  auto ref = signal(4096);
  std::vector<float> got(ref.size());
  double ss = 0;
  for (float r : ref) ss += double(r) * r;
  const double rms = std::sqrt(ss / double(ref.size()));
  for (size_t i = 0; i < ref.size(); ++i) got[i] = float(1.005 * ref[i] + 0.01 * rms);
  TensorMetrics m = compare(ref.data(), got.data(), 1, int64_t(ref.size()));
  EXPECT_NEAR(m.gain, 1.005, 1e-6);
  EXPECT_NEAR(m.offset, 0.01, 1e-6);
  // Pearson is blind to both; the NMSE of a 0.5% gain is only 2.5e-5.
  EXPECT_GT(m.pearson, 0.999999);
  EXPECT_LT(m.nmse, 2e-4);
  TensorMetrics same = compare(ref.data(), ref.data(), 1, int64_t(ref.size()));
  EXPECT_DOUBLE_EQ(same.gain, 1);
  EXPECT_DOUBLE_EQ(same.offset, 0);
}

TEST(GatesCompare, WrongRowDropsRowMinimumWhileWholeCosineStaysHigh) {
  const int64_t rows = 128, cols = 64;
  auto ref = signal(rows * cols);
  std::vector<float> got = ref;
  // Row 77 gets noise as large as itself: its cosine falls near 0.7.
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0.0, 0.75);
  for (int64_t c = 0; c < cols; ++c) got[size_t(77 * cols + c)] += float(noise(rng));
  TensorMetrics m = compare(ref.data(), got.data(), rows, cols);
  EXPECT_EQ(m.worst_row, 77);
  EXPECT_LT(m.min_row_cosine, 0.9);
  EXPECT_GT(m.cosine, 0.99);
  GateResult g{"phase2.block", "layer 0", {}, ""};
  g.require("cosine", m.cosine, ">=", "phase2.cosine_min");
  g.require("min_row_cosine", m.min_row_cosine, ">=", row_cosine_key_for_head_dim(64));
  EXPECT_TRUE(g.checks[0].pass);
  EXPECT_FALSE(g.checks[1].pass);
  EXPECT_FALSE(g.pass());
}

TEST(GatesCompare, RejectsBadShapes) {
  std::vector<float> a = {1};
  EXPECT_THROW(compare(a.data(), a.data(), -1, 1), Error);
  EXPECT_THROW(compare(nullptr, a.data(), 1, 1), Error);
  TensorMetrics empty = compare(nullptr, nullptr, 0, 5);
  EXPECT_EQ(empty.count, 0);
  EXPECT_EQ(empty.nmse, 0);
}

// ---------------------------------------------------------------------------------------
// token metrics

TEST(GatesTokens, TopKBestFirstTiesByLowerId) {
  std::vector<float> l = {1, 3, 3, 2, kNaNf, -kInff};
  EXPECT_EQ(top_k(l.data(), 6, 3), (std::vector<int32_t>{1, 2, 3}));
  // k clamped to vocab; -inf ranks below finite values, NaN below everything
  EXPECT_EQ(top_k(l.data(), 6, 100), (std::vector<int32_t>{1, 2, 3, 0, 5, 4}));
  EXPECT_TRUE(top_k(l.data(), 6, 0).empty());
  std::vector<float> flat = {0, 0, 0, 0};
  EXPECT_EQ(top_k(flat.data(), 4, 2), (std::vector<int32_t>{0, 1}));
}

TEST(GatesTokens, Top1Mismatch) {
  std::vector<float> ref = {0, 5, 1}, same = {0.5f, 4, 3}, other = {0, 1, 5};
  EXPECT_TRUE(top1_match(ref.data(), same.data(), 3));
  EXPECT_FALSE(top1_match(ref.data(), other.data(), 3));
  // a tie resolves to the lower id on both sides
  std::vector<float> tie = {0, 5, 5};
  EXPECT_TRUE(top1_match(ref.data(), tie.data(), 3));
}

TEST(GatesTokens, TwoWayTopK) {
  // ref ranks ids 0 > 1 > ... > 9
  std::vector<float> ref(10);
  for (int i = 0; i < 10; ++i) ref[size_t(i)] = float(10 - i);
  // got's top-1 is 2 (inside ref's top-5) and ref's top-1 (0) is got's second: passes.
  std::vector<float> ok = ref;
  ok[2] = 20;
  EXPECT_TRUE(topk_two_way(ref.data(), ok.data(), 10, 5));
  // got's top-1 is 7: ref's 0 is still in got's top-5, but 7 is outside ref's top-5: fails.
  std::vector<float> bad = ref;
  bad[7] = 20;
  EXPECT_FALSE(topk_two_way(ref.data(), bad.data(), 10, 5));
  EXPECT_TRUE(topk_two_way(ref.data(), bad.data(), 10, 8));  // 7 is in ref's top-8
  // the other direction: ref's top-1 pushed out of got's top-5
  std::vector<float> low = ref;
  low[0] = -1;
  EXPECT_FALSE(topk_two_way(ref.data(), low.data(), 10, 5));
}

TEST(GatesTokens, SoftmaxMaxProb) {
  std::vector<float> two = {0, 0};
  EXPECT_DOUBLE_EQ(softmax_max_prob(two.data(), 2), 0.5);
  // e^{ln 3} / (1 + e^{ln 3}) = 3/4
  std::vector<float> l = {0, float(std::log(3.0))};
  EXPECT_NEAR(softmax_max_prob(l.data(), 2), 0.75, 1e-7);
  std::vector<float> masked = {1, -kInff, 1};
  EXPECT_DOUBLE_EQ(softmax_max_prob(masked.data(), 3), 0.5);
  std::vector<float> nan = {1, kNaNf};
  EXPECT_TRUE(std::isnan(softmax_max_prob(nan.data(), 2)));
  // decisive vs competitive against the table
  std::vector<float> decisive = {5, 0, 0}, competitive = {1, 1, 0.5f};
  EXPECT_GT(softmax_max_prob(decisive.data(), 3), threshold("phase3.decisive_prob"));
  EXPECT_LT(softmax_max_prob(competitive.data(), 3), threshold("phase3.decisive_prob"));
}

TEST(GatesTokens, GreedyMatchWithoutDivergencePasses) {
  std::vector<int32_t> toks = {5, 6, 7, 8};
  GreedyMatch g = greedy_match(toks, toks, {}, {});
  EXPECT_EQ(g.steps, 4);
  EXPECT_EQ(g.matched, 4);
  EXPECT_EQ(g.first_divergence, -1);
  EXPECT_TRUE(g.pass);
  EXPECT_EQ(g.to_json().at("pass"), true);
}

TEST(GatesTokens, GreedyDivergenceInsideTopKPasses) {
  std::vector<int32_t> ref = {5, 6, 7, 8}, got = {5, 6, 9, 1};
  std::vector<std::vector<int32_t>> tr = {{5, 1}, {6, 1}, {7, 9, 3}, {8}};
  std::vector<std::vector<int32_t>> tg = {{5, 1}, {6, 1}, {9, 7, 3}, {1}};
  GreedyMatch g = greedy_match(ref, got, tr, tg);
  EXPECT_EQ(g.first_divergence, 2);
  EXPECT_EQ(g.matched, 2);
  EXPECT_EQ(g.steps, 4);
  EXPECT_TRUE(g.divergence_within_topk);
  EXPECT_TRUE(g.pass);
}

TEST(GatesTokens, GreedyDivergenceOutsideTopKFails) {
  std::vector<int32_t> ref = {5, 6, 7}, got = {5, 4, 7};
  // got's token 4 is not in ref's top-k at step 1
  std::vector<std::vector<int32_t>> tr = {{5}, {6, 1, 2}, {7}};
  std::vector<std::vector<int32_t>> tg = {{5}, {4, 6}, {7}};
  GreedyMatch g = greedy_match(ref, got, tr, tg);
  EXPECT_EQ(g.first_divergence, 1);
  EXPECT_FALSE(g.divergence_within_topk);
  EXPECT_FALSE(g.pass);
  // only one direction holding is not enough: ref's 6 is missing from got's top-k
  tr[1] = {6, 4};
  tg[1] = {4, 1};
  EXPECT_FALSE(greedy_match(ref, got, tr, tg).pass);
  // no top-k recorded at the divergence: cannot be shown to be within it
  EXPECT_FALSE(greedy_match(ref, got, {{5}}, {{5}}).pass);
}

TEST(GatesTokens, GreedyUnequalLengthsCompareTheCommonPrefix) {
  std::vector<int32_t> ref = {1, 2, 3, 4, 5}, got = {1, 2, 3};
  GreedyMatch g = greedy_match(ref, got, {}, {});
  EXPECT_EQ(g.steps, 3);
  EXPECT_EQ(g.matched, 3);
  EXPECT_EQ(g.first_divergence, -1);
  EXPECT_TRUE(g.pass);
  // the length is gated by the caller: 3 steps fall short of phase6.tokens
  GateResult r{"phase6.integrate", "prompt 0", {}, ""};
  r.require("steps", double(g.steps), ">=", "phase6.tokens");
  EXPECT_FALSE(r.pass());
}

// ---------------------------------------------------------------------------------------
// thresholds

TEST(GatesThresholds, TableHoldsExactlyTheAgreedKeys) {
  const std::map<std::string, double> expected = {
      {"phase0.layer_cosine_min", 0.9999},   {"phase0.logits_cosine_min", 0.9999},
      {"phase0.logits_std_min", 1e-6},       {"phase1.gemm.pearson_min", 0.999},
      {"phase1.gemm.nmse_max", 1e-4},        {"phase1.kernel.pearson_min", 0.99},
      {"phase1.kernel.nmse_max", 1e-3},      {"phase1.margin", 4},
      {"phase1.nmse_floor", 1e-10},          {"phase1.err_floor", 1e-5},
      {"phase1.max_err_floor", 2e-5},
      {"phase1.max_err_max", 0.1},           {"phase1.gain_error_max", 1e-2},
      {"phase1.offset_max", 1e-2},           {"phase2.cosine_min", 0.99},
      {"phase2.row_cosine_min.hd64", 0.99},  {"phase2.row_cosine_min.hd128", 0.98},
      {"phase2.row_cosine_min.hd256", 0.97}, {"phase3.layer_cosine_min", 0.95},
      {"phase3.cliff_max", 0.05},            {"phase3.logits_cosine_min", 0.99},
      {"phase3.decisive_prob", 0.5},         {"phase3.topk", 5},
      {"phase3.sublayer_margin", 3},         {"phase3.sublayer_error_floor", 0.01},
      {"phase3.sublayer_error_max", 0.04},   {"phase6.tie_margin", 3},
      {"phase6.tokens", 32},                 {"phase6.prompts_min", 2},
      {"phase6.topk", 5},                    {"diagnose.match_nmse_max", 1e-4},
      {"diagnose.separation_min", 10},       {"diagnose.dispatch_gain_min", 1.25},
      {"diagnose.confined_fraction_min", 0.9}, {"diagnose.unrelated_pearson_max", 0.1}};
  const auto& t = thresholds();
  EXPECT_EQ(t.size(), expected.size());
  for (const auto& [key, value] : expected) {
    ASSERT_TRUE(t.count(key)) << key;
    EXPECT_EQ(t.at(key).value, value) << key;
    EXPECT_FALSE(t.at(key).why.empty()) << key;
    EXPECT_EQ(threshold(key), value) << key;
  }
}

TEST(GatesThresholds, UnknownKeyThrowsNamingIt) {
  try {
    threshold("phase9.nonsense");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("phase9.nonsense"), std::string::npos);
  }
  GateResult g;
  EXPECT_THROW(g.require("pearson", 1.0, ">=", "phase1.gemm.pearson"), Error);
  EXPECT_TRUE(g.checks.empty());
}

TEST(GatesThresholds, RowCosineByHeadDim) {
  EXPECT_EQ(row_cosine_threshold_for_head_dim(32), 0.99);
  EXPECT_EQ(row_cosine_threshold_for_head_dim(64), 0.99);
  EXPECT_EQ(row_cosine_threshold_for_head_dim(65), 0.98);
  EXPECT_EQ(row_cosine_threshold_for_head_dim(128), 0.98);
  EXPECT_EQ(row_cosine_threshold_for_head_dim(256), 0.97);
  EXPECT_EQ(row_cosine_threshold_for_head_dim(512), 0.97);
  EXPECT_EQ(row_cosine_key_for_head_dim(128), "phase2.row_cosine_min.hd128");
}

// ---------------------------------------------------------------------------------------
// gate results

TEST(GatesResult, NoChecksFails) {
  GateResult g{"phase1.kernel", "nothing", {}, ""};
  EXPECT_FALSE(g.pass());
  EXPECT_EQ(g.to_json().at("pass"), false);
  EXPECT_NE(g.markdown_row().find("FAIL"), std::string::npos);
}

TEST(GatesResult, NaNValueFailsItsCheck) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  GateResult g{"phase2.block", "layer 0", {}, ""};
  g.require("cosine", nan, ">=", "phase2.cosine_min");
  g.require("nmse", nan, "<=", "phase1.gemm.nmse_max");
  g.require_fixed("nan_got", nan, "==", 0);
  for (const auto& c : g.checks) EXPECT_FALSE(c.pass) << c.metric;
  EXPECT_FALSE(g.pass());
}

TEST(GatesResult, RequireUsesTheTableAndOps) {
  GateResult g{"phase1.kernel", "gemv", {}, ""};
  g.require("pearson", 0.9995, ">=", "phase1.gemm.pearson_min");
  g.require("nmse", 1e-4, "<=", "phase1.gemm.nmse_max");  // at the limit passes
  g.require_fixed("guard_corrupted", 0, "==", 0);
  ASSERT_EQ(g.checks.size(), 3u);
  EXPECT_EQ(g.checks[0].limit, 0.999);
  EXPECT_EQ(g.checks[0].threshold, "phase1.gemm.pearson_min");
  EXPECT_EQ(g.checks[2].threshold, "");
  EXPECT_TRUE(g.pass());
  g.require_fixed("guard_corrupted", 4, "==", 0);
  EXPECT_FALSE(g.pass());
  EXPECT_THROW(g.require_fixed("x", 1, "~", 1), Error);
}

TEST(GatesResult, JsonRoundTrip) {
  GateResult g{"phase1.kernel", "gemm q_proj [16,576]x[576,576]^T", {}, "bf16 weights"};
  g.require("pearson", 0.99998, ">=", "phase1.gemm.pearson_min");
  g.require("nmse", std::numeric_limits<double>::infinity(), "<=", "phase1.gemm.nmse_max");
  g.require_fixed("nan_got", std::numeric_limits<double>::quiet_NaN(), "==", 0);
  auto j = g.to_json();
  EXPECT_EQ(j.at("pass"), false);
  EXPECT_EQ(j.at("gate"), "phase1.kernel");
  // through text, as it is stored in the deployment directory
  GateResult back = GateResult::from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(back.gate, g.gate);
  EXPECT_EQ(back.subject, g.subject);
  EXPECT_EQ(back.note, g.note);
  ASSERT_EQ(back.checks.size(), g.checks.size());
  for (size_t i = 0; i < g.checks.size(); ++i) {
    const auto &a = g.checks[i], &b = back.checks[i];
    EXPECT_EQ(a.metric, b.metric);
    EXPECT_EQ(a.op, b.op);
    EXPECT_EQ(a.limit, b.limit);
    EXPECT_EQ(a.threshold, b.threshold);
    EXPECT_EQ(a.pass, b.pass);
    if (std::isnan(a.value)) EXPECT_TRUE(std::isnan(b.value));
    else EXPECT_EQ(a.value, b.value);
  }
  EXPECT_EQ(back.pass(), g.pass());
  EXPECT_EQ(back.to_json(), j);

  // A hand-edited "pass" does not survive: checks are re-judged from value, op and limit.
  j["checks"][1]["pass"] = true;
  EXPECT_FALSE(GateResult::from_json(j).checks[1].pass);
  EXPECT_THROW(GateResult::from_json(nlohmann::json{{"gate", "x"}}), Error);
}

TEST(GatesResult, MarkdownRow) {
  GateResult g{"phase1.kernel", "a|b", {}, "see | here"};
  g.require("pearson", 0.999981234, ">=", "phase1.gemm.pearson_min");
  g.require_fixed("nan_got", 0, "==", 0);
  EXPECT_EQ(g.markdown_row(),
            "| a\\|b | PASS | pearson 0.999981 >= 0.999 (phase1.gemm.pearson_min); nan_got 0 == 0; "
            "note: see \\| here |");
  EXPECT_EQ(GateResult::markdown_header(), "| subject | verdict | checks |\n|---|---|---|");
  g.require("nmse", 2e-3, "<=", "phase1.gemm.nmse_max");
  EXPECT_NE(g.markdown_row().find("| FAIL |"), std::string::npos);
  EXPECT_NE(g.markdown_row().find("nmse 0.002 <= 0.0001 (phase1.gemm.nmse_max) FAIL"), std::string::npos);
}

// ---------------------------------------------------------------------------------------
// guard regions

TEST(GatesGuard, FreshBufferIsAlignedZeroedAndIntact) {
  for (int64_t n : {0, 1, 3, 17, 1000}) {
    GuardedBuffer b(n, 64 + n % 7);  // odd guard sizes too: data must still be aligned
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u) << n;
    EXPECT_EQ(b.size(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b.data()[i], 0.0f);
    EXPECT_TRUE(b.intact());
    EXPECT_EQ(b.corrupted_bytes(), 0);
    // writing every element of the data is fine
    for (int64_t i = 0; i < n; ++i) b.data()[i] = float(i) - 0.5f;
    EXPECT_TRUE(b.intact()) << n;
  }
  EXPECT_THROW(GuardedBuffer(-1), Error);
  EXPECT_THROW(GuardedBuffer(4, 0), Error);
}

TEST(GatesGuard, WriteOnePastTheEndIsDetected) {
  GuardedBuffer b(16);
  b.data()[16] = 0.0f;  // the classic off-by-one: lands in the back guard
  EXPECT_FALSE(b.intact());
  EXPECT_GE(b.corrupted_bytes(), 1);
  EXPECT_LE(b.corrupted_bytes(), 4);
}

TEST(GatesGuard, WriteOneBeforeTheStartIsDetected) {
  GuardedBuffer b(16);
  const float v = 1.0f;
  std::memcpy(reinterpret_cast<uint8_t*>(b.data()) - sizeof(float), &v, sizeof v);
  EXPECT_FALSE(b.intact());
  EXPECT_GE(b.corrupted_bytes(), 1);
}

TEST(GatesGuard, FarWriteAndSingleByteAreCounted) {
  GuardedBuffer b(8, 256);
  auto* bytes = reinterpret_cast<uint8_t*>(b.data());
  bytes[8 * 4 + 255] ^= 0x01;  // last byte of the back guard
  bytes[-256] ^= 0x80;         // first byte of the front guard
  EXPECT_EQ(b.corrupted_bytes(), 2);
}

TEST(GatesGuard, CopiesKeepStateAndMovesWork) {
  GuardedBuffer a(10);
  a.data()[3] = 7;
  GuardedBuffer c = a;
  EXPECT_EQ(c.data()[3], 7);
  EXPECT_TRUE(c.intact());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c.data()) % 64, 0u);
  a.data()[10] = 1;  // corrupt a after the copy: c is unaffected
  EXPECT_FALSE(a.intact());
  EXPECT_TRUE(c.intact());
  GuardedBuffer d = a;  // corruption is copied too
  EXPECT_EQ(d.corrupted_bytes(), a.corrupted_bytes());
  GuardedBuffer m = std::move(c);
  EXPECT_EQ(m.data()[3], 7);
  EXPECT_TRUE(m.intact());
  std::vector<GuardedBuffer> many;
  for (int i = 0; i < 9; ++i) many.emplace_back(5 + i);  // reallocation moves them
  for (const auto& g : many) EXPECT_TRUE(g.intact());
}

}  // namespace
}  // namespace tessera::gates
