// `tessera perplexity` and eval/perplexity.h: llama.cpp's perplexity, checked three ways.
//   - PerplexityMath: the chunking, BOS, scoring range and formulas on a fake runner whose
//     logits have closed-form log-softmaxes;
//   - PerplexityVsTransformers: the oracle and cpu targets on tiny synth checkpoints against
//     tests/fixtures/perplexity/perplexity.json, computed from transformers' logits by
//     tools/reference/perplexity_reference.py (independent of tessera's code);
//   - PerplexityCli: the command's output and its refusals (one line, exit 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "eval/perplexity.h"
#include "gates/gates.h"
#include "model/weights.h"
#include "targets/registry.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"
#include "util/sha256.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing_support::run_tessera;
using testing_support::ScratchDir;
using testing_support::write_file;

// ---- a fake runner: logits depend only on the position, z[k] = (k == pos % vocab) ? kPeak : 0 ----
constexpr float kPeak = 3.0f;

class FakeRunner final : public ModelRunner {
 public:
  explicit FakeRunner(int64_t vocab, int64_t max_position = 1024) {
    spec_.vocab = vocab;
    spec_.max_position = max_position;
  }
  std::string target() const override { return "fake"; }
  const ModelSpec& spec() const override { return spec_; }
  std::vector<float> forward(std::span<const int32_t> ids, bool all_logits, const ProbeFn&, ProbeLevel) override {
    calls.push_back({pos_, std::vector<int32_t>(ids.begin(), ids.end()), all_logits});
    const int64_t rows = all_logits ? int64_t(ids.size()) : 1;
    std::vector<float> out(size_t(rows * spec_.vocab), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = pos_ + (all_logits ? r : int64_t(ids.size()) - 1);
      out[size_t(r * spec_.vocab + p % spec_.vocab)] = uniform ? 0.0f : kPeak;
    }
    pos_ += int64_t(ids.size());
    return out;
  }
  int64_t position() const override { return pos_; }
  void reset(int64_t start) override {
    pos_ = start;
    ++resets;
  }
  void truncate(int64_t positions) override { pos_ = positions; }

  struct Call {
    int64_t position;
    std::vector<int32_t> ids;
    bool all_logits;
  };
  std::vector<Call> calls;
  int resets = 0;
  bool uniform = false;

 private:
  ModelSpec spec_;
  int64_t pos_ = 0;
};

// nll of the fake's row at position p for `target`, in closed form.
double fake_nll(int64_t p, int32_t target, int64_t vocab) {
  const double lse = std::log(std::exp(double(kPeak)) + double(vocab - 1));
  return (target == p % vocab ? -double(kPeak) : 0.0) + lse;
}

std::vector<int32_t> counting_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  // Every third token is the one the fake predicts at its chunk position (n_ctx = 8 below), the others not.
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t(i % 3 == 0 ? (i % 8) % vocab : (i * 5 + 1) % vocab);
  return t;
}

TEST(PerplexityMath, LlamaNllIsMinusLogSoftmax) {
  const std::vector<float> z = {1.5f, -2.0f, 0.25f, 3.0f, 3.0f};
  double lse = 0;
  for (float v : z) lse += std::exp(double(v));
  lse = std::log(lse);
  for (int32_t t = 0; t < int32_t(z.size()); ++t) EXPECT_NEAR(llama_nll(z.data(), int64_t(z.size()), t), lse - z[size_t(t)], 1e-6);
  // Shift-invariant and finite for large logits (the max is subtracted first).
  const std::vector<float> big = {1000.0f, 999.0f};
  EXPECT_NEAR(llama_nll(big.data(), 2, 1), std::log(1 + std::exp(1.0)), 1e-6);
}

TEST(PerplexityMath, UniformLogitsGiveTheVocabularySize) {
  FakeRunner fake(100);
  fake.uniform = true;
  PerplexityOptions o;
  o.n_ctx = 8;
  const PerplexityResult r = perplexity(fake, counting_tokens(40, 100), o);
  EXPECT_NEAR(r.ppl, 100.0, 1e-9);
  EXPECT_TRUE(std::isnan(r.ppl_error)) << "every nll equal: no spread (llama.cpp prints no estimate)";
}

TEST(PerplexityMath, ChunksScoreTheSecondHalfAgainstTheNextToken) {
  const int64_t vocab = 50, n_ctx = 8;
  FakeRunner fake(vocab);
  const std::vector<int32_t> tokens = counting_tokens(8 * 5 + 3, vocab);  // 5 chunks, 3 tokens dropped
  PerplexityOptions o;
  o.n_ctx = n_ctx;
  std::vector<double> progress;
  const PerplexityResult r = perplexity(fake, tokens, o, [&](int64_t i, int64_t n, double running) {
    EXPECT_EQ(i, int64_t(progress.size()));
    EXPECT_EQ(n, 5);
    progress.push_back(running);
  });
  // Expected, independently: chunk c scores positions 4..6, targets tokens[8c + p + 1].
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  std::vector<double> running;
  for (int64_t c = 0; c < 5; ++c) {
    for (int64_t p = 4; p <= 6; ++p) {
      const double v = fake_nll(p, tokens[size_t(8 * c + p + 1)], vocab);
      nll += v;
      nll2 += v * v;
      ++count;
    }
    running.push_back(std::exp(nll / double(count)));
  }
  const double mean = nll / double(count), var = nll2 / double(count) - mean * mean;
  EXPECT_EQ(r.chunks, 5);
  EXPECT_EQ(r.tokens_scored, 15);
  EXPECT_EQ(r.tokens_evaluated, 40);
  EXPECT_EQ(r.n_tokens, 43);
  EXPECT_NEAR(r.ppl, std::exp(mean), 2e-7 * std::exp(mean));  // llama_nll's expf: 2^-24 relative
  ASSERT_GT(var, 0);
  EXPECT_NEAR(r.ppl_error, std::exp(mean) * std::sqrt(var / double(count - 1)), 1e-6 * r.ppl_error);
  ASSERT_EQ(r.running_ppl.size(), running.size());
  for (size_t i = 0; i < running.size(); ++i) EXPECT_NEAR(r.running_ppl[i], running[i], 2e-7 * running[i]);
  EXPECT_EQ(progress, r.running_ppl);

  // Each chunk: a reset, then positions 0..3 without logits and 4..7 with them; no BOS asked.
  EXPECT_EQ(fake.resets, 5);
  ASSERT_EQ(fake.calls.size(), 10u);
  for (int64_t c = 0; c < 5; ++c) {
    const auto& a = fake.calls[size_t(2 * c)];
    const auto& b = fake.calls[size_t(2 * c + 1)];
    EXPECT_EQ(a.position, 0);
    EXPECT_FALSE(a.all_logits);
    EXPECT_EQ(a.ids, std::vector<int32_t>(tokens.begin() + 8 * c, tokens.begin() + 8 * c + 4));
    EXPECT_EQ(b.position, 4);
    EXPECT_TRUE(b.all_logits);
    EXPECT_EQ(b.ids, std::vector<int32_t>(tokens.begin() + 8 * c + 4, tokens.begin() + 8 * c + 8));
  }
}

TEST(PerplexityMath, BosReplacesEachChunksFirstTokenInTheInputOnly) {
  const int64_t vocab = 50;
  FakeRunner fake(vocab);
  const std::vector<int32_t> tokens = counting_tokens(24, vocab);
  PerplexityOptions o;
  o.n_ctx = 8;
  o.bos_id = 49;
  o.max_chunks = 2;  // of 3
  const PerplexityResult r = perplexity(fake, tokens, o);
  EXPECT_EQ(r.chunks, 2);
  ASSERT_EQ(fake.calls.size(), 4u);
  EXPECT_EQ(fake.calls[0].ids[0], 49);
  EXPECT_EQ(fake.calls[2].ids[0], 49);
  EXPECT_EQ(std::vector<int32_t>(fake.calls[2].ids.begin() + 1, fake.calls[2].ids.end()),
            std::vector<int32_t>(tokens.begin() + 9, tokens.begin() + 12));
}

TEST(PerplexityMath, BatchSizeDoesNotChangeTheResult) {
  FakeRunner one(50), split(50);
  const std::vector<int32_t> tokens = counting_tokens(40, 50);
  PerplexityOptions o;
  o.n_ctx = 8;
  const PerplexityResult a = perplexity(one, tokens, o);
  o.batch = 3;
  const PerplexityResult b = perplexity(split, tokens, o);
  EXPECT_EQ(a.ppl, b.ppl);
  EXPECT_EQ(a.ppl_error, b.ppl_error);
  // 5 chunks x (4 unscored tokens in 2 calls + 4 scored in 2 calls), never more than 3 tokens a call.
  EXPECT_EQ(split.calls.size(), 20u);
  for (const auto& c : split.calls) EXPECT_LE(c.ids.size(), 3u);
}

TEST(PerplexityMath, RefusesWhatLlamaCppRefuses) {
  ModelSpec spec;
  spec.vocab = 50;
  spec.max_position = 64;
  PerplexityOptions o;
  auto refused = [&](int64_t n_tokens, const std::string& needle) {
    try {
      check_perplexity_options(spec, n_tokens, o);
      ADD_FAILURE() << "accepted n_ctx " << o.n_ctx << " with " << n_tokens << " tokens";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  o.n_ctx = 3;
  refused(100, "at least 4");
  o.n_ctx = 65;
  refused(1000, "model's context of 64");
  o.n_ctx = 16;
  refused(31, "needs at least 32");
  EXPECT_NO_THROW(check_perplexity_options(spec, 32, o));  // exactly 2 x n_ctx: llama.cpp runs it
  o.max_chunks = 0;
  refused(100, "--chunks");
}

// ---- against transformers -----------------------------------------------------------------

const nlohmann::json& fixture() {
  static const nlohmann::json fx = [] {
    const fs::path p = fs::path(TESSERA_SOURCE_DIR) / "tests" / "fixtures" / "perplexity" / "perplexity.json";
    std::ifstream in(p);
    if (!in) throw std::runtime_error("missing " + p.string() + ": run tools/reference/perplexity_reference.py");
    return nlohmann::json::parse(in);
  }();
  return fx;
}

// The oracle matches transformers' logits to 1e-4 of their range (test_oracle_fixtures.cc's
// acceptance). A logit error of at most d moves each -log_softmax by at most 2d (the target's
// logit and the log-sum-exp each move by at most d), hence ln(ppl), the mean nll, by at most 2d,
// and the population standard deviation of the nll by at most 2d too (|sd(a) - sd(b)| <= sd(a - b)
// <= max |a - b|): llama.cpp's ppl_error / ppl = sd / sqrt(count - 1) by 2d / sqrt(count - 1).
constexpr double kOracleLogitErrorOfRange = 1e-4;
// llama_nll works in float where llama.cpp does (max, differences, expf): 2^-24 relative per
// term, far below this, on nll values of about 10.
constexpr double kFloatSlack = 1e-6;

// Where a target's figures may lie around transformers', in ln(ppl) per chunk prefix (each
// chunk's running ppl, the last being the final one) and in ppl_error / ppl.
struct Tolerance {
  std::vector<double> ln_lo, ln_hi;  // offsets from ln(transformers' running ppl)
  double rel_error = 0;              // |ppl_error / ppl - transformers'| at most
};

Tolerance oracle_tolerance(const nlohmann::json& c) {
  const double d = kOracleLogitErrorOfRange * c["max_scored_logit_range"].get<double>();
  Tolerance t;
  t.ln_lo.assign(c["chunks"].get<size_t>(), -2 * d - kFloatSlack);
  t.ln_hi.assign(c["chunks"].get<size_t>(), 2 * d + kFloatSlack);
  t.rel_error = 2 * d / std::sqrt(c["tokens_scored"].get<double>() - 1) + kFloatSlack;
  return t;
}

struct Scored {
  std::vector<std::vector<float>> chunks;  // each chunk's scored logits
};

PerplexityResult run_case(ModelRunner& runner, const nlohmann::json& c, Scored* scored) {
  PerplexityOptions o;
  o.n_ctx = c["n_ctx"];
  if (c["add_bos"].get<bool>()) o.bos_id = c["bos_id"].get<int32_t>();
  if (scored)
    o.on_scored_logits = [scored](int64_t, const float* z, int64_t rows, int64_t vocab) {
      scored->chunks.emplace_back(z, z + rows * vocab);
    };
  return perplexity(runner, c["ids"].get<std::vector<int32_t>>(), o);
}

void expect_matches(const PerplexityResult& r, const nlohmann::json& c, const Tolerance& tol, const std::string& what) {
  const double ppl = c["ppl"], err = c["ppl_error"];
  const int64_t count = c["tokens_scored"];
  EXPECT_EQ(r.chunks, c["chunks"].get<int64_t>()) << what;
  EXPECT_EQ(r.tokens_scored, count) << what;
  EXPECT_EQ(r.n_tokens, int64_t(c["ids"].size())) << what;
  const auto running = c["running_ppl"].get<std::vector<double>>();
  ASSERT_EQ(r.running_ppl.size(), running.size()) << what;
  ASSERT_EQ(tol.ln_lo.size(), running.size()) << what;
  EXPECT_DOUBLE_EQ(running.back(), ppl);
  EXPECT_DOUBLE_EQ(r.running_ppl.back(), r.ppl);
  for (size_t i = 0; i < running.size(); ++i) {
    const double off = std::log(r.running_ppl[i]) - std::log(running[i]);
    EXPECT_GE(off, tol.ln_lo[i]) << what << " chunk " << i + 1 << ": ppl " << r.running_ppl[i] << " vs transformers "
                                 << running[i];
    EXPECT_LE(off, tol.ln_hi[i]) << what << " chunk " << i + 1 << ": ppl " << r.running_ppl[i] << " vs transformers "
                                 << running[i];
  }
  EXPECT_LE(std::abs(r.ppl_error / r.ppl - err / ppl), tol.rel_error)
      << what << ": +/- " << r.ppl_error << " vs transformers " << err;
}

// The tolerance must tell the right answer from each mistake the reference computed (the error
// formula's only where `error_formula`: the cpu's bound on the spread of its nll shift is wider
// than that mistake, whose formula the oracle's check already holds to the reference).
void expect_tells_mistakes_apart(const nlohmann::json& c, const Tolerance& tol, const std::string& what,
                                 bool error_formula) {
  const double ppl = c["ppl"], err = c["ppl_error"];
  for (const auto& [name, v] : c["variants"].items()) {
    if (name == "ppl_error_without_count_minus_1") {
      if (!error_formula) continue;
      EXPECT_GT(std::abs(v.get<double>() / ppl - err / ppl), 2 * tol.rel_error)
          << what << ": " << name << " lies within the tolerance";
    } else {
      // Outside the tolerance interval widened to twice its width about its centre.
      const double off = std::log(v.get<double>()) - std::log(ppl);
      const double centre = 0.5 * (tol.ln_lo.back() + tol.ln_hi.back()), half = 0.5 * (tol.ln_hi.back() - tol.ln_lo.back());
      EXPECT_GT(std::abs(off - centre), 2 * half)
          << what << ": " << name << " (" << off << " in ln ppl) lies within the tolerance [" << tol.ln_lo.back() << ", "
          << tol.ln_hi.back() << "]";
    }
  }
}

class PerplexityVsTransformers : public ::testing::TestWithParam<int> {
 protected:
  const nlohmann::json& c() const { return fixture()["cases"][size_t(GetParam())]; }
  std::string model_dir() const {
    const std::string dir = testing_support::tiny_model(c()["source"]["preset"].get<std::string>());
    EXPECT_EQ(c()["source"]["seed"].get<int>(), 0);
    return dir;
  }
};

TEST_P(PerplexityVsTransformers, SameCheckpointAndTokens) {
  const std::string dir = model_dir();
  ASSERT_EQ(sha256_file_hex(dir + "/model.safetensors"), c()["checkpoint_sha256"].get<std::string>())
      << "tessera synth changed: regenerate the fixture (tools/reference/perplexity_reference.py)";
  const Model model = Model::open(dir);
  const PerplexityTokens t = perplexity_tokens(Tokenizer::for_model(model), fixture()["text"].get<std::string>());
  EXPECT_EQ(t.ids, c()["ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(t.bos_id.has_value(), c()["add_bos"].get<bool>());
  EXPECT_EQ(t.special_tokens_in_text, 0);
}

TEST_P(PerplexityVsTransformers, OracleTarget) {
  const Model model = Model::open(model_dir());
  OracleRunner oracle(model, 2);
  const PerplexityResult r = run_case(oracle, c(), nullptr);
  const Tolerance tol = oracle_tolerance(c());
  expect_matches(r, c(), tol, "oracle");
  expect_tells_mistakes_apart(c(), tol, "oracle", /*error_formula=*/true);
}

// The cpu rounds weights and matmul inputs to bf16, so its logits z' differ from the oracle's z.
// How much that moves each nll follows from the two sets of logits on the rows scored, by the
// convexity of LSE = log-sum-exp: E_p[z' - z] <= LSE(z') - LSE(z) <= E_p'[z' - z] (p, p' the
// softmaxes of z, z'), so nll' - nll = (LSE(z') - LSE(z)) - (z'_t - z_t) lies in a known
// interval per token; their means (per chunk prefix) bound ln(ppl') - ln(ppl), widened by the
// oracle's own tolerance against transformers. Each scored row must also pass phase 3's
// logits gate (the cpu's acceptance against the oracle).
TEST_P(PerplexityVsTransformers, CpuTarget) {
  const Model model = Model::open(model_dir());
  OracleRunner oracle(model, 2);
  TargetOptions to;
  to.threads = 2;
  std::unique_ptr<StagedRunner> cpu = make_target_runner("cpu", model, to);
  Scored ref, got;
  run_case(oracle, c(), &ref);
  const PerplexityResult r = run_case(*cpu, c(), &got);
  ASSERT_EQ(ref.chunks.size(), got.chunks.size());

  const int64_t vocab = model.spec().vocab, n_ctx = c()["n_ctx"], first = n_ctx / 2;
  const std::vector<int32_t> ids = c()["ids"].get<std::vector<int32_t>>();
  Tolerance tol = oracle_tolerance(c());
  double lo = 0, hi = 0, sq = 0, d_max = 0;
  int64_t count = 0;
  for (size_t k = 0; k < ref.chunks.size(); ++k) {
    ASSERT_EQ(ref.chunks[k].size(), size_t((n_ctx - 1 - first) * vocab));
    ASSERT_EQ(got.chunks[k].size(), ref.chunks[k].size());
    for (int64_t row = 0; row < n_ctx - 1 - first; ++row) {
      const float* z = ref.chunks[k].data() + row * vocab;
      const float* zc = got.chunks[k].data() + row * vocab;
      EXPECT_GE(gates::cosine(z, zc, vocab), gates::threshold("phase3.logits_cosine_min")) << "chunk " << k << " row " << row;
      const double mz = *std::max_element(z, z + vocab), mc = *std::max_element(zc, zc + vocab);
      double sz = 0, sc = 0, ez = 0, ec = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        const double d = double(zc[v]) - double(z[v]);
        const double wz = std::exp(double(z[v]) - mz), wc = std::exp(double(zc[v]) - mc);
        sz += wz;
        sc += wc;
        ez += wz * d;
        ec += wc * d;
        d_max = std::max(d_max, std::abs(d));
      }
      const int32_t target = ids[size_t(int64_t(k) * n_ctx + first + row + 1)];
      const double dt = double(zc[target]) - double(z[target]);
      const double b_lo = ez / sz - dt, b_hi = ec / sc - dt;
      ASSERT_LE(b_lo, b_hi + 1e-12);
      lo += b_lo;
      hi += b_hi;
      sq += std::max(b_lo * b_lo, b_hi * b_hi);
      ++count;
    }
    tol.ln_lo[k] += lo / double(count);
    tol.ln_hi[k] += hi / double(count);
  }
  // |sd(nll') - sd(nll)| <= sd(nll' - nll) <= rms(nll' - nll).
  tol.rel_error += std::sqrt(sq / double(count)) / std::sqrt(double(count - 1));
  RecordProperty("cpu_max_logit_diff", std::to_string(d_max));
  RecordProperty("cpu_ln_ppl_shift", std::to_string(0.5 * (lo + hi) / double(count)));
  expect_matches(r, c(), tol, "cpu");
  expect_tells_mistakes_apart(c(), tol, "cpu", /*error_formula=*/false);
}

INSTANTIATE_TEST_SUITE_P(Fixture, PerplexityVsTransformers, ::testing::Values(0, 1), [](const auto& info) {
  std::string name = fixture()["cases"][size_t(info.param)]["source"]["preset"].get<std::string>();
  std::replace_if(name.begin(), name.end(), [](char ch) { return !std::isalnum(static_cast<unsigned char>(ch)); }, '_');
  return name;
});

TEST(PerplexityFixture, HasTheTwoCases) {
  ASSERT_EQ(fixture()["cases"].size(), 2u);
  EXPECT_FALSE(fixture()["cases"][0]["add_bos"].get<bool>());
  EXPECT_TRUE(fixture()["cases"][1]["add_bos"].get<bool>()) << "one case must exercise the BOS replacement";
}

// ---- the command ----------------------------------------------------------------------------

// Expects exit code 1 and exactly one line on stderr that contains `needle`.
void expect_one_line_error(const std::string& args, const std::string& needle) {
  const auto r = run_tessera(args);
  EXPECT_EQ(r.exit_code, 1) << args << "\nstderr: " << r.err;
  ASSERT_FALSE(r.err.empty()) << args;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line: " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
}

TEST(PerplexityCli, JsonMatchesTheFixtureOnTheOracle) {
  const nlohmann::json& c = fixture()["cases"][0];
  const std::string dir = testing_support::tiny_model(c["source"]["preset"].get<std::string>());
  ScratchDir scratch("ppl_cli");
  // A file ends with a newline that llama.cpp drops: the fixture's text is the file less it.
  write_file(scratch.path() / "text.txt", fixture()["text"].get<std::string>() + "\n");
  const auto r = run_tessera("perplexity " + dir + " --file " + scratch.str("text.txt") + " --ctx " +
                             std::to_string(c["n_ctx"].get<int>()) + " --target oracle --threads 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["target"], "oracle");
  EXPECT_EQ(j["n_ctx"], c["n_ctx"]);
  EXPECT_EQ(j["chunks"], c["chunks"]);
  EXPECT_EQ(j["tokens"], c["ids"].size());
  EXPECT_EQ(j["tokens_scored"], c["tokens_scored"]);
  EXPECT_EQ(j["threads"], 2);
  EXPECT_GT(j["tokens_per_second"].get<double>(), 0);
  const double ln_tol = 2 * kOracleLogitErrorOfRange * c["max_scored_logit_range"].get<double>();
  EXPECT_LE(std::abs(std::log(j["ppl"].get<double>()) - std::log(c["ppl"].get<double>())), ln_tol);
  EXPECT_NEAR(j["stderr"].get<double>(), c["ppl_error"].get<double>(), 0.01 * c["ppl_error"].get<double>());
  // Progress on stderr, llama.cpp style.
  EXPECT_NE(r.err.find("[1]"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[" + std::to_string(c["chunks"].get<int>()) + "]"), std::string::npos) << r.err;
}

TEST(PerplexityCli, TextOutputEndsWithTheEstimate) {
  const std::string dir = testing_support::tiny_model(fixture()["cases"][0]["source"]["preset"].get<std::string>());
  ScratchDir scratch("ppl_cli");
  write_file(scratch.path() / "text.txt", fixture()["text"].get<std::string>());
  const auto r = run_tessera("perplexity " + dir + " --file " + scratch.str("text.txt") + " --ctx 16 --chunks 2 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Final estimate: PPL = ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(" +/- "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 chunks x 16 tokens = 32 tokens evaluated (14 scored)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
}

TEST(PerplexityCli, Refusals) {
  const std::string dir = testing_support::tiny_model("SmolLM2-360M");
  ScratchDir scratch("ppl_cli_err");
  write_file(scratch.path() / "short.txt", "Just a few words.\n");
  write_file(scratch.path() / "long.txt", fixture()["text"].get<std::string>());
  const std::string longf = " --file " + scratch.str("long.txt");
  expect_one_line_error("perplexity " + dir + " --file " + scratch.str("missing.txt"), "no such file");
  expect_one_line_error("perplexity " + dir, "--file is required");
  expect_one_line_error("perplexity " + dir + " --file " + scratch.str("short.txt") + " --ctx 16",
                        "needs at least 32");
  expect_one_line_error("perplexity " + dir + longf + " --ctx 3", "--ctx must be at least 4");
  expect_one_line_error("perplexity " + dir + longf + " --ctx 9000", "model's context of 8192");
  expect_one_line_error("perplexity " + dir + longf + " --ctx 16 --chunks 0", "--chunks must be at least 1");
  expect_one_line_error("perplexity " + dir + longf + " --ctx 16 --target nosuch", "unknown target");
}

}  // namespace
}  // namespace tessera
