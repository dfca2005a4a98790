#include "pipeline/phases.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <atomic>
#include <chrono>
#include <limits>
#include <map>
#include <optional>

#include "model/tensors.h"
#include "oracle/ops.h"
#include "pipeline/capture.h"
#include "pipeline/op_table.h"
#include "pipeline/perturb.h"
#include "pipeline/plan.h"
#include "runtime/generate.h"
#include "targets/registry.h"
#include "util/error.h"
#include "util/half.h"
#include "util/npy.h"
#include "util/parallel.h"
#include "util/sha256.h"

namespace tessera {

namespace fs = std::filesystem;
using gates::GateResult;
using gates::GuardedBuffer;
using gates::TensorMetrics;

// ---------------------------------------------------------------- context, prompts

PhaseContext::PhaseContext(Deployment& d, const Model& m, const DeployOptions& o) : dep(d), model(m), opts(o) {}
PhaseContext::~PhaseContext() = default;

const Tokenizer& PhaseContext::tokenizer() {
  if (!tokenizer_) {
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::for_model(model));
    if (opts.faults.count("double-bos")) tokenizer_->inject_double_bos();
  }
  return *tokenizer_;
}
OracleRunner& PhaseContext::oracle() {
  if (!oracle_) oracle_ = std::make_unique<OracleRunner>(model, opts.threads);
  return *oracle_;
}
TargetOptions target_options(const DeployOptions& opts) {
  TargetOptions o;
  o.threads = opts.threads;
  o.faults = opts.faults;
  o.plan_name = opts.plan_name;
  o.device = opts.device;
  return o;
}

StagedRunner& PhaseContext::target() {
  if (!target_) {
    TargetOptions o = target_options(opts);
    o.plan = plan_;
    target_ = make_target_runner(opts.target, model, o);
    target_->set_output_tap(perturbation_tap(opts.perturbations));
  }
  return *target_;
}

void PhaseContext::use_plan(const nlohmann::json& plan) {
  plan_ = plan;
  target_.reset();
}

std::unique_ptr<StagedRunner> PhaseContext::make_runner(const nlohmann::json& plan) const {
  TargetOptions o = target_options(opts);
  o.plan = plan;
  std::unique_ptr<StagedRunner> r = make_target_runner(opts.target, model, o);
  r->set_output_tap(perturbation_tap(opts.perturbations));
  return r;
}
void PhaseContext::progress(const std::string& line) const {
  if (!opts.quiet) fmt::print(stderr, "  {}\n", line);
}

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

namespace {

std::string fmt_metric(double v) { return fmt::format("{:.6g}", v); }

}  // namespace

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
std::vector<int32_t> long_prompt(const Tokenizer& tok, size_t cap) {
  std::vector<int32_t> ids;
  for (const CanonicalPrompt& p : canonical_prompts(tok)) ids.insert(ids.end(), p.ids.begin(), p.ids.end());
  if (ids.size() > cap) ids.resize(cap);
  return ids;
}
std::vector<int32_t> long_prompt(PhaseContext& ctx, size_t cap) { return long_prompt(ctx.tokenizer(), cap); }

// ---------------------------------------------------------------- phase 0: oracle

std::vector<std::string> reference_search_path() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("TESSERA_REFERENCES"); env && *env) {
    std::string s = env;
    for (size_t at = 0;;) {
      const size_t colon = s.find(':', at);
      const std::string part = s.substr(at, colon == std::string::npos ? std::string::npos : colon - at);
      if (!part.empty()) out.push_back(part);
      if (colon == std::string::npos) break;
      at = colon + 1;
    }
  }
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg && *xdg) out.push_back((fs::path(xdg) / "tessera" / "references").string());
  else if (home && *home) out.push_back((fs::path(home) / ".cache" / "tessera" / "references").string());
  return out;
}


namespace {

struct FixtureMatch {
  fs::path dir;
  nlohmann::json fixture;
};

// References made with transformers (tools/reference) identify their checkpoint by
// SHA-256; a cheap pre-filter (synth marker or file name) avoids hashing a multi-GB model
// that no reference could match. A root is a reference directory (fixture.json) or a
// directory of them.
// The checkpoint's digest as tools/reference/make_reference.py computes it: a GGUF file's, or
// a directory's single model.safetensors's sha256; for shards, the sha256 of the lines
// "<name> <sha256>\n" over its *.safetensors files sorted by name.
std::string checkpoint_digest(const Model& model, const std::vector<fs::path>& shards) {
  if (model.format() == "gguf") return sha256_file_hex(model.path());
  if (shards.size() == 1 && shards[0].filename() == "model.safetensors") return sha256_file_hex(shards[0].string());
  std::string lines;
  for (const fs::path& f : shards) lines += f.filename().string() + " " + sha256_file_hex(f.string()) + "\n";
  return sha256_hex(lines);
}

std::optional<FixtureMatch> find_fixture(const Model& model, const std::vector<fs::path>& roots, std::string* why) {
  const fs::path mpath(model.path());
  std::vector<fs::path> shards;  // a directory's weight files, sorted
  std::map<std::string, uintmax_t> sizes;
  nlohmann::json marker;
  if (model.format() != "gguf") {
    for (const auto& e : fs::directory_iterator(mpath))
      if (e.path().extension() == ".safetensors") shards.push_back(e.path());
    std::sort(shards.begin(), shards.end());
    for (const fs::path& f : shards) sizes[f.filename().string()] = fs::file_size(f);
    if (fs::exists(mpath / "tessera_synth.json")) marker = read_json_file(mpath / "tessera_synth.json");
  }
  std::string digest;
  std::vector<fs::path> candidates;
  for (const fs::path& root : roots) {
    std::error_code ec;
    if (fs::exists(root / "fixture.json")) candidates.push_back(root);
    else if (fs::is_directory(root, ec))
      for (const auto& e : fs::directory_iterator(root, ec))
        if (fs::exists(e.path() / "fixture.json")) candidates.push_back(e.path());
  }
  std::sort(candidates.begin(), candidates.end());
  for (const fs::path& dir : candidates) {
    nlohmann::json fx = read_json_file(dir / "fixture.json");
    const nlohmann::json& src = fx["source"];
    // A cheap pre-filter before hashing a checkpoint of gigabytes: the file name, the synth
    // marker, or the weight files' names and sizes must agree.
    bool candidate = false;
    if (src.contains("gguf")) candidate = model.format() == "gguf" && mpath.filename() == src["gguf"].get<std::string>();
    else if (model.format() == "gguf") candidate = false;
    else if (src.contains("files")) candidate = src["files"].get<std::map<std::string, uintmax_t>>() == sizes;
    else if (!marker.is_null())
      candidate = marker.value("preset", "") == src.value("preset", "") && marker.value("tiny", false) == src.value("tiny", false) &&
                  marker.value("seed", -1) == src.value("seed", -2);
    if (!candidate || (model.format() != "gguf" && shards.empty())) continue;
    if (digest.empty()) digest = checkpoint_digest(model, shards);
    if (digest == fx.value("checkpoint_sha256", "")) return FixtureMatch{dir, fx};
  }
  std::vector<std::string> names;
  for (const fs::path& r : roots) names.push_back(r.string());
  *why = fmt::format("no reference for this checkpoint in {} (tools/reference/make_reference.py makes one)",
                     names.empty() ? std::string("the search path (empty)") : fmt::format("{}", fmt::join(names, ", ")));
  return std::nullopt;
}

}  // namespace

PhaseOutcome run_phase0_oracle(PhaseContext& ctx) {
  PhaseOutcome out;
  const ModelSpec& s = ctx.model.spec();

  // 1. every weight loads and is finite (upcast row by row: never a full fp32 copy)
  GateResult weights;
  weights.gate = "phase0.weights";
  weights.subject = fmt::format("{} tensors", ctx.model.weights().size());
  int64_t nonfinite = 0, values = 0;
  size_t done = 0;
  for (const auto& [name, w] : ctx.model.weights()) {
    std::atomic<int64_t> bad{0};
    parallel_for(w.rows(), default_threads(), [&](int64_t r0, int64_t r1) {
      std::vector<float> row(size_t(w.cols()));
      int64_t b = 0;
      for (int64_t r = r0; r < r1; ++r) {
        w.row_f32(r, row.data());
        for (float x : row) b += !std::isfinite(x);
      }
      bad += b;
    });
    nonfinite += bad;
    values += w.info.numel();
    if (bad) out.details["nonfinite_tensors"].push_back({{"tensor", name}, {"count", int64_t(bad)}});
    if (++done % 64 == 0) ctx.progress(fmt::format("[phase 0] scanned {}/{} tensors", done, ctx.model.weights().size()));
  }
  weights.require_fixed("nonfinite_weights", double(nonfinite), "<=", 0);
  weights.note = fmt::format("{} values scanned", values);
  out.gates.push_back(weights);

  // 2. logits finite and not degenerate on a canonical prompt
  const auto prompts = canonical_prompts(ctx.tokenizer());
  OracleRunner& oracle = ctx.oracle();
  oracle.reset();
  const std::vector<float> logits = oracle.forward(prompts[0].ids, false);
  double mean = 0, sq = 0;
  int64_t bad = 0;
  for (float x : logits) {
    if (!std::isfinite(x)) ++bad;
    else mean += x;
  }
  mean /= double(logits.size());
  for (float x : logits)
    if (std::isfinite(x)) sq += (x - mean) * (x - mean);
  GateResult sane;
  sane.gate = "phase0.logits";
  sane.subject = fmt::format("logits of \"{}\"", prompts[0].text);
  sane.require_fixed("nonfinite_logits", double(bad), "<=", 0);
  sane.require("logits_std", std::sqrt(sq / double(logits.size())), ">=", "phase0.logits_std_min");
  out.gates.push_back(sane);

  // 3. an independent reference, where one exists for this checkpoint
  std::string why;
  std::vector<fs::path> roots;
  if (!ctx.opts.reference_dir.empty()) roots.push_back(ctx.opts.reference_dir);
  else
    for (const std::string& d : reference_search_path()) roots.push_back(d);
  const auto match = find_fixture(ctx.model, roots, &why);
  if (!match && !ctx.opts.reference_dir.empty())
    fail("--reference {}: {}", ctx.opts.reference_dir, why);  // asked for one: its absence is an error
  if (match) {
    const NpyArray hidden = read_npy((match->dir / "hidden.npy").string());
    const NpyArray ref_logits = read_npy((match->dir / "logits.npy").string());
    if (hidden.shape.size() != 4 || hidden.shape[1] != s.n_layers + 1 || hidden.shape[3] != s.hidden)
      fail("fixture {} does not fit this model's shape", match->dir.string());
    const int64_t n_pos = hidden.shape[2];
    for (size_t p = 0; p < match->fixture["prompts"].size(); ++p) {
      const auto& prompt = match->fixture["prompts"][p];
      const auto ids = prompt["ids"].get<std::vector<int32_t>>();
      const auto positions = prompt["positions"].get<std::vector<int64_t>>();
      Capture cap;
      oracle.reset();
      const std::vector<float> lg = oracle.forward(
          ids, false, cap.fn([](const std::string& n) { return n.ends_with(".out") || n == "final_norm"; }), ProbeLevel::Layers);
      double min_cos = 1.0;
      for (int64_t l = 0; l <= s.n_layers; ++l) {
        const auto& ours = cap.at(l == s.n_layers ? "final_norm" : fmt::format("layers.{}.out", l));
        std::vector<float> picked;
        for (int64_t pos : positions) picked.insert(picked.end(), ours.begin() + pos * s.hidden, ours.begin() + (pos + 1) * s.hidden);
        const float* ref = hidden.data.data() + (int64_t(p) * (s.n_layers + 1) + l) * n_pos * s.hidden;
        min_cos = std::min(min_cos, gates::cosine(ref, picked.data(), n_pos * s.hidden));
      }
      const float* ref_last = ref_logits.data.data() + int64_t(p) * s.vocab;
      GateResult g;
      g.gate = "phase0.reference";
      g.subject = fmt::format("transformers fixture {} prompt {}", match->dir.filename().string(), p);
      g.require("min_layer_cosine", min_cos, ">=", "phase0.layer_cosine_min");
      g.require("logits_cosine", gates::cosine(ref_last, lg.data(), s.vocab), ">=", "phase0.logits_cosine_min");
      g.require_fixed("top1_match", gates::top1_match(ref_last, lg.data(), s.vocab) ? 1 : 0, "==", 1);
      out.gates.push_back(g);
    }
    out.details["reference"] = {{"fixture", match->dir.string()},
                                {"transformers_version", match->fixture.value("transformers_version", "")}};
  } else {
    out.details["reference"] = {{"fixture", nullptr}, {"why", why}};
  }

  // 4. the ids every phase feeds (porting pitfall 12): a prompt starts with at most one BOS,
  // and where a fixture exists the tokenizer gives transformers' ids for its texts.
  {
    const Tokenizer& tok = ctx.tokenizer();
    int64_t most = 0;
    nlohmann::json leading = nlohmann::json::array();
    for (const CanonicalPrompt& p : prompts) {
      int64_t n = 0;
      while (tok.bos_id() && n < int64_t(p.ids.size()) && p.ids[size_t(n)] == *tok.bos_id()) ++n;
      most = std::max(most, n);
      leading.push_back({{"text", p.text}, {"ids", p.ids}, {"leading_bos", n}});
    }
    GateResult g;
    g.gate = "phase0.prompt_ids";
    g.subject = fmt::format("{} canonical prompts: at most one BOS first", prompts.size());
    g.require_fixed("leading_bos_max", double(most), "<=", 1);
    g.note = tok.bos_id() ? fmt::format("BOS {}; the family {} one", *tok.bos_id(), tok.adds_bos() ? "adds" : "does not add")
                          : "no BOS token";
    out.gates.push_back(g);
    out.details["prompt_ids"] = leading;
    if (match) {
      const std::vector<TokenizedDifferently> diff = tokenized_differently(tok, match->fixture);
      GateResult t;
      t.gate = "phase0.prompt_ids";
      t.subject = fmt::format("tokenizer vs transformers fixture {} ({} texts)", match->dir.filename().string(),
                              match->fixture["prompts"].size());
      t.require_fixed("texts_tokenized_differently", double(diff.size()), "==", 0);
      if (!diff.empty())
        t.note = fmt::format("\"{}\": tessera [{}], transformers [{}]", diff[0].text, fmt::join(diff[0].ours, ","),
                             fmt::join(diff[0].theirs, ","));
      out.gates.push_back(t);
    }
  }
  out.pass = std::all_of(out.gates.begin(), out.gates.end(), [](const GateResult& g) { return g.pass(); });
  // Without an independent reference the oracle checked only itself: its own status, never PASS.
  if (out.pass && !match) out.status = "unverified";
  out.details["reference"]["status"] = match ? "verified" : "unverified";
  if (match) out.details["reference"]["dir"] = match->dir.string();
  out.summary = fmt::format("{}: {} values finite; logits std {}; reference: {}", match ? "verified" : "unverified", values,
                            fmt_metric(std::sqrt(sq / double(logits.size()))),
                            match ? "transformers " + match->fixture.value("transformers_version", std::string("?")) +
                                        " at " + match->dir.string()
                                  : "none (" + why + ")");
  if (!out.pass) out.diagnosis = "the oracle itself, or the ids it is fed, is not trustworthy for this checkpoint: see the failing rows";
  return out;
}

// ---------------------------------------------------------------- phase 2: one block

namespace {

struct BlockScenario {
  std::string name;
  int64_t start;
  std::vector<int32_t> ids;
  int64_t prefill;  // the rest are decoded one at a time
  std::vector<float> embed, expected;  // [T, H] from the oracle
};

std::vector<BlockScenario> block_scenarios(PhaseContext& ctx) {
  const ModelSpec& s = ctx.model.spec();
  const std::vector<int32_t> ids = long_prompt(ctx, 24);
  const int64_t T = int64_t(ids.size());
  const int64_t decode = std::min<int64_t>(4, T - 1);
  std::vector<BlockScenario> out = {{"position 0", 0, ids, T - decode, {}, {}},
                                    {"", long_position(s, T), ids, T - decode, {}, {}}};
  out[1].name = fmt::format("position {}", out[1].start);
  OracleRunner& oracle = ctx.oracle();
  for (BlockScenario& sc : out) {
    Capture cap;
    const ProbeFn fn = cap.fn([](const std::string& n) { return n == "embed" || n == "layers.0.out"; });
    oracle.reset(sc.start);
    oracle.forward(std::span(sc.ids).first(size_t(sc.prefill)), false, fn, ProbeLevel::All);
    for (size_t i = size_t(sc.prefill); i < sc.ids.size(); ++i) oracle.forward(std::span(sc.ids).subspan(i, 1), false, fn, ProbeLevel::All);
    sc.embed = cap.at("embed");
    sc.expected = cap.at("layers.0.out");
  }
  return out;
}

// Layer 0 on the target, fed the oracle's embeddings: prefill, then decode steps.
std::vector<float> run_block(StagedRunner& target, const BlockScenario& sc, int64_t H) {
  std::vector<float> h = sc.embed;
  target.reset(sc.start);
  target.forward_layers(h.data(), sc.prefill, 1);
  for (int64_t t = sc.prefill; t < int64_t(sc.ids.size()); ++t) target.forward_layers(h.data() + t * H, 1, 1);
  return h;
}

GateResult block_gate(const BlockScenario& sc, const std::vector<float>& got, const ModelSpec& s, TensorMetrics* m_out) {
  const int64_t T = int64_t(sc.ids.size());
  const TensorMetrics m = gates::compare(sc.expected.data(), got.data(), T, s.hidden);
  GateResult g;
  g.gate = "phase2.block";
  g.subject = fmt::format("layer 0, {} tokens ({} prefill + {} decode) at {}", T, sc.prefill, T - sc.prefill, sc.name);
  g.require("cosine", m.cosine, ">=", "phase2.cosine_min");
  const int64_t hd = s.head_dim;
  g.require("min_row_cosine", m.min_row_cosine, ">=",
            hd <= 64 ? "phase2.row_cosine_min.hd64" : hd <= 128 ? "phase2.row_cosine_min.hd128" : "phase2.row_cosine_min.hd256");
  g.require_fixed("nonfinite", double(m.nan_got + m.inf_got), "<=", double(m.nan_ref + m.inf_ref));
  if (m_out) *m_out = m;
  return g;
}

}  // namespace

std::string BisectResult::text() const {
  std::string t = named ? fmt::format("bisect names stage '{}' (kernel {}): swapping it alone for the oracle's kernel makes the block pass.",
                                      stage, kernel)
                        : fmt::format("bisect: no single stage explains the failure; the closest swap is '{}' (kernel {}).",
                                      stage, kernel);
  t += "\n\n| swapped stage | kernel | worst cosine | worst nmse | block gate |\n|---|---|---|---|---|\n";
  for (const auto& tr : trials)
    t += fmt::format("| {} | {} | {:.6g} | {:.6g} | {} |\n", tr["stage"].get<std::string>(), tr["kernel"].get<std::string>(),
                     tr["cosine"].get<double>(), tr["nmse"].get<double>(), tr["pass"].get<bool>() ? "PASS" : "FAIL");
  return t;
}

BisectResult bisect_block(PhaseContext& ctx) {
  const ModelSpec& s = ctx.model.spec();
  const auto scenarios = block_scenarios(ctx);
  StagedRunner& target = ctx.target();
  BisectResult r;
  r.trials = nlohmann::json::array();
  double best = INFINITY;
  for (Stage st : layer_stages()) {
    target.set_oracle_stages({st});
    bool pass = true;
    double worst_cos = 1, worst_nmse = 0;
    for (const BlockScenario& sc : scenarios) {
      TensorMetrics m;
      pass = block_gate(sc, run_block(target, sc, s.hidden), s, &m).pass() && pass;
      worst_cos = std::min(worst_cos, m.cosine);
      worst_nmse = std::max(worst_nmse, std::isfinite(m.nmse) ? m.nmse : 1e300);
    }
    r.trials.push_back({{"stage", stage_name(st)}, {"kernel", stage_kernel(st)}, {"cosine", worst_cos}, {"nmse", worst_nmse}, {"pass", pass}});
    // The culprit is the swap that passes; among several (or none), the lowest error.
    const double score = (pass ? 0.0 : 1e6) + worst_nmse;
    if (score < best) {
      best = score;
      r.stage = stage_name(st);
      r.kernel = stage_kernel(st);
      r.named = pass;
    }
  }
  target.set_oracle_stages({});
  return r;
}

std::vector<GateResult> block_rows(PhaseContext& ctx, StagedRunner& target, const std::string& gate,
                                   nlohmann::json* scenario_details) {
  const ModelSpec& s = ctx.model.spec();
  std::vector<GateResult> rows;
  target.set_oracle_stages({});
  for (const BlockScenario& sc : block_scenarios(ctx)) {
    ctx.progress(fmt::format("[{}] layer 0 at {}", gate, sc.name));
    TensorMetrics m;
    rows.push_back(block_gate(sc, run_block(target, sc, s.hidden), s, &m));
    rows.back().gate = gate;
    if (scenario_details) scenario_details->push_back({{"scenario", sc.name}, {"metrics", m.to_json()}});
  }
  return rows;
}

PhaseOutcome run_phase2_block(PhaseContext& ctx) {
  PhaseOutcome out;
  out.details["scenarios"] = nlohmann::json::array();
  out.gates = block_rows(ctx, ctx.target(), "phase2.block", &out.details["scenarios"]);
  const size_t n_scenarios = out.gates.size();
  out.pass = std::all_of(out.gates.begin(), out.gates.end(), [](const GateResult& g) { return g.pass(); });
  if (!out.pass) {
    ctx.progress("[phase 2] block gate failed: bisecting (one stage at a time swapped for the oracle's kernel)");
    const BisectResult b = bisect_block(ctx);
    out.details["bisect"] = {{"named", b.named}, {"stage", b.stage}, {"kernel", b.kernel}, {"trials", b.trials}};
    out.diagnosis = b.text();
  }
  double worst = 1;
  for (const auto& d : out.details["scenarios"]) {
    const double c = gates::read_json_number(d["metrics"]["cosine"]);
    worst = std::isnan(c) || std::isnan(worst) ? std::nan("") : std::min(worst, c);
  }
  out.summary = fmt::format("layer 0 over {} scenarios, worst cosine {}{}", n_scenarios, fmt_metric(worst),
                            out.pass ? "" : "; " + out.details["bisect"]["stage"].get<std::string>() + " named by bisect");
  return out;
}

// ---------------------------------------------------------------- phase 3: the model

namespace {
// Phase 3's gate compares every layer's output ("layers.N.out").
bool is_layer_output(const std::string& probe_name) { return probe_name.ends_with(".out"); }
}  // namespace

const PhaseContext::OracleRun& PhaseContext::oracle_run(const std::vector<int32_t>& ids) {
  auto it = oracle_runs_.find(ids);
  if (it != oracle_runs_.end()) return it->second;
  Capture ref;
  OracleRunner& o = oracle();
  o.reset();
  OracleRun run;
  run.logits = o.forward(ids, false, ref.fn(is_layer_output), ProbeLevel::Layers);
  for (int64_t l = 0; l < model.spec().n_layers; ++l) run.layers.push_back(ref.at(fmt::format("layers.{}.out", l)));
  return oracle_runs_.emplace(ids, std::move(run)).first->second;
}

nlohmann::json model_gate_record(PhaseContext& ctx, StagedRunner& target, const CanonicalPrompt& p, bool last_as_decode) {
  const ModelSpec& s = ctx.model.spec();
  const PhaseContext::OracleRun& ref = ctx.oracle_run(p.ids);
  const std::vector<float>& lr = ref.logits;
  Capture got;
  const ProbeFn probe = got.fn(is_layer_output);
  target.reset();
  std::vector<float> lg;
  if (last_as_decode && p.ids.size() > 1) {
    // The prompt but its last token as a prefill, then the last token as a decode step: the
    // capture appends the step's rows, so the comparison is the same [T, hidden] per layer.
    target.forward(std::span<const int32_t>(p.ids.data(), p.ids.size() - 1), false, probe, ProbeLevel::Layers);
    lg = target.forward(std::span<const int32_t>(&p.ids.back(), 1), false, probe, ProbeLevel::Layers);
  } else {
    lg = target.forward(p.ids, false, probe, ProbeLevel::Layers);
  }
  const int64_t T = int64_t(p.ids.size());
  std::vector<double> cos;
  double cliff = 0;
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string n = fmt::format("layers.{}.out", l);
    cos.push_back(gates::compare(ref.layers[size_t(l)].data(), got.at(n).data(), T, s.hidden).cosine);
    if (l > 0) cliff = std::max(cliff, cos[size_t(l - 1)] - cos[size_t(l)]);
  }
  nlohmann::json cosines_json = nlohmann::json::array();
  for (double c : cos) cosines_json.push_back(gates::json_number(c));
  const double p1 = gates::softmax_max_prob(lr.data(), s.vocab);
  const bool is_decisive = p1 > gates::threshold("phase3.decisive_prob");
  GateResult g;
  g.gate = "phase3.model";
  g.subject = fmt::format("\"{}\" ({} tokens{}, {} p={:.3f})", p.text, T, last_as_decode && T > 1 ? ", the last as a decode step" : "",
                          is_decisive ? "decisive" : "competitive", p1);
  // A NaN cosine (a non-finite layer output) is the minimum: it must fail the check.
  double min_cos = 1;
  for (double c : cos) min_cos = std::isnan(c) || std::isnan(min_cos) ? std::nan("") : std::min(min_cos, c);
  if (std::isnan(cliff)) cliff = std::numeric_limits<double>::infinity();
  g.require("min_layer_cosine", min_cos, ">=", "phase3.layer_cosine_min");
  g.require("cliff", cliff, "<=", "phase3.cliff_max");
  g.require("logits_cosine", gates::cosine(lr.data(), lg.data(), s.vocab), ">=", "phase3.logits_cosine_min");
  if (is_decisive) g.require_fixed("top1_match", gates::top1_match(lr.data(), lg.data(), s.vocab) ? 1 : 0, "==", 1);
  else
    g.require_fixed("top5_two_way", gates::topk_two_way(lr.data(), lg.data(), s.vocab, int(gates::threshold("phase3.topk"))) ? 1 : 0,
                    "==", 1);
  return {{"ids", p.ids}, {"text", p.text}, {"decisive", is_decisive}, {"top1_prob", p1}, {"layer_cosines", cosines_json},
          {"gate", g.to_json()}};
}

PhaseOutcome run_phase3_model(PhaseContext& ctx) {
  PhaseOutcome out;
  const auto prompts = canonical_prompts(ctx.tokenizer());
  const fs::path resume_dir = ctx.dep.file("phase3");
  fs::create_directories(resume_dir);
  int decisive = 0, resumed = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const CanonicalPrompt& p = prompts[i];
    const fs::path item = resume_dir / fmt::format("prompt_{}.json", i);
    nlohmann::json rec;
    if (fs::exists(item) && (rec = read_json_file(item)).value("ids", std::vector<int32_t>{}) == p.ids) {
      ++resumed;  // done before an interruption: the gate row is on disk
    } else {
      ctx.progress(fmt::format("[phase 3] prompt {}/{}: \"{}\" ({} tokens)", i + 1, prompts.size(), p.text, p.ids.size()));
      rec = model_gate_record(ctx, ctx.target(), p);
      write_json_atomic(item, rec);  // one prompt at a time: an interruption loses at most this one
    }
    decisive += rec["decisive"].get<bool>();
    out.gates.push_back(GateResult::from_json(rec["gate"]));
    out.details["prompts"].push_back(rec);
  }
  out.pass = std::all_of(out.gates.begin(), out.gates.end(), [](const GateResult& g) { return g.pass(); });
  out.summary = fmt::format("{} prompts ({} decisive, {} competitive){}: {}", prompts.size(), decisive,
                            prompts.size() - size_t(decisive), resumed ? fmt::format(", {} resumed from disk", resumed) : "",
                            out.pass ? "all pass" : "failures");
  if (!out.pass) {
    // Where along the depth does it go wrong? The first layer under the threshold.
    for (const auto& rec : out.details["prompts"]) {
      std::vector<double> cos;
      for (const auto& c : rec["layer_cosines"]) cos.push_back(gates::read_json_number(c));
      for (size_t l = 0; l < cos.size(); ++l)
        if (!(cos[l] >= gates::threshold("phase3.layer_cosine_min"))) {
          out.diagnosis = fmt::format("\"{}\": hidden states first fall below the cosine limit at layer {} ({:.4f}); "
                                      "phases 1-2 passed, so suspect state carried across layers or positions",
                                      rec["text"].get<std::string>(), l, cos[l]);
          break;
        }
      if (!out.diagnosis.empty()) break;
    }
    if (out.diagnosis.empty()) out.diagnosis = "layers agree but the logits or tokens do not: suspect the final norm or LM head";
  }
  return out;
}

// ---------------------------------------------------------------- phase 6: integrate

std::vector<CanonicalPrompt> phase6_prompts(const Tokenizer& tok) {
  const size_t n_prompts = size_t(gates::threshold("phase6.prompts_min")) + 1;
  const auto all = canonical_prompts(tok);
  return {all.begin(), all.begin() + long(std::min(n_prompts, all.size()))};
}

Greedy greedy(ModelRunner& r, const std::vector<int32_t>& prompt, int n, int k) {
  Greedy g;
  r.reset();
  const int64_t vocab = r.spec().vocab;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits = r.forward(prompt, false);
  auto t1 = std::chrono::steady_clock::now();
  g.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  for (int i = 0; i < n; ++i) {
    g.topk.push_back(gates::top_k(logits.data(), vocab, k));
    const int32_t next = g.topk.back()[0];
    g.tokens.push_back(next);
    if (i + 1 == n || r.position() + 1 >= r.spec().max_position) break;
    logits = r.forward(std::span(&next, 1), false);
  }
  g.decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return g;
}

std::vector<DeclaredEos> declared_eos_ids(const Model& model, const Tokenizer& tok) {
  std::vector<DeclaredEos> out;
  auto add = [&](int64_t id, const std::string& source) {
    if (id < 0) return;
    for (DeclaredEos& d : out)
      if (d.id == id) {
        d.source += ", " + source;
        return;
      }
    out.push_back({int32_t(id), source});
  };
  if (const GgufFile* g = model.gguf()) {
    for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
      if (const GgufValue* v = g->find(key)) add(v->as_int(), key);
    return out;
  }
  const std::filesystem::path dir(model.path());
  auto ids_of = [&](const char* file, const char* key) {
    const std::filesystem::path f = dir / file;
    if (!std::filesystem::exists(f)) return;
    const nlohmann::json j = read_json_file(f);
    const auto it = j.find(key);
    if (it == j.end()) return;
    const std::string source = fmt::format("{} {}", file, key);
    if (it->is_number_integer()) add(it->get<int64_t>(), source);
    else if (it->is_array())
      for (const auto& x : *it)
        if (x.is_number_integer()) add(x.get<int64_t>(), source);
  };
  ids_of("config.json", "eos_token_id");
  ids_of("generation_config.json", "eos_token_id");
  if (const std::filesystem::path f = dir / "tokenizer_config.json"; std::filesystem::exists(f)) {
    const nlohmann::json j = read_json_file(f);
    if (const auto it = j.find("eos_token"); it != j.end()) {
      const std::string text = it->is_string() ? it->get<std::string>() : it->is_object() ? it->value("content", "") : "";
      if (const std::optional<int32_t> id = text.empty() ? std::nullopt : tok.token_id(text))
        add(*id, fmt::format("tokenizer_config.json eos_token {}", text));
    }
  }
  return out;
}

std::vector<TokenizedDifferently> tokenized_differently(const Tokenizer& tok, const nlohmann::json& fixture) {
  std::vector<TokenizedDifferently> out;
  for (const auto& p : fixture.at("prompts")) {
    TokenizedDifferently d{p.at("text").get<std::string>(), {}, p.at("ids").get<std::vector<int32_t>>()};
    d.ours = tok.encode(d.text);
    if (d.ours != d.theirs) out.push_back(std::move(d));
  }
  return out;
}

PhaseOutcome run_phase6_integrate(PhaseContext& ctx) {
  // The executed plan is the gated plan: every op-table row (fused kernels included) and
  // phase 2's block, re-run on the plan phases 4 and 5 produced, before the greedy match.
  ctx.progress("[phase 6] the op table on the frozen plan");
  PhaseOutcome out = kernel_rows_outcome(ctx.target(), ctx.op_inputs(), "phase6.kernel",
                                         [&](const std::string& line) { ctx.progress("[phase 6] " + line); });
  const std::string kernel_summary = out.summary;
  const std::string kernel_diagnosis = out.diagnosis;
  for (GateResult& g : block_rows(ctx, ctx.target(), "phase6.block", nullptr)) out.gates.push_back(std::move(g));
  const int n = int(gates::threshold("phase6.tokens"));
  const int k = int(gates::threshold("phase6.topk"));
  const std::vector<CanonicalPrompt> prompts = phase6_prompts(ctx.tokenizer());
  double prefill_tokens = 0, prefill_s = 0, decode_tokens = 0, decode_s = 0;
  for (const CanonicalPrompt& p : prompts) {
    ctx.progress(fmt::format("[phase 6] greedy {} tokens: \"{}\"", n, p.text));
    const Greedy ref = greedy(ctx.oracle(), p.ids, n, k);
    const Greedy got = greedy(ctx.target(), p.ids, n, k);
    const gates::GreedyMatch m = gates::greedy_match(ref.tokens, got.tokens, ref.topk, got.topk);
    GateResult g;
    g.gate = "phase6.greedy";
    g.subject = fmt::format("\"{}\" greedy {} tokens", p.text, n);
    g.require("tokens_generated", double(std::min(ref.tokens.size(), got.tokens.size())), ">=", "phase6.tokens");
    g.require_fixed("greedy_match", m.pass ? 1 : 0, "==", 1);
    g.note = m.first_divergence < 0 ? "identical"
                                    : fmt::format("first divergence at step {} (within top-{}: {})", m.first_divergence, k,
                                                  m.divergence_within_topk ? "yes" : "no");
    out.gates.push_back(g);
    out.details["prompts"].push_back({{"text", p.text}, {"oracle_tokens", ref.tokens}, {"target_tokens", got.tokens},
                                      {"match", m.to_json()}});
    prefill_tokens += double(p.ids.size());
    prefill_s += got.prefill_s;
    decode_tokens += double(got.tokens.size() - 1);
    decode_s += got.decode_s;
  }
  // Porting pitfall 13: the runtime `tessera run` uses must stop on every end-of-sequence id
  // the checkpoint declares (read here from its files, not through the loader).
  {
    Generator gen(ctx.target(), ctx.tokenizer());
    const std::vector<int32_t>& stops = gen.stop_ids();
    const std::vector<DeclaredEos> declared = declared_eos_ids(ctx.model, ctx.tokenizer());
    std::vector<std::string> missing;
    nlohmann::json declared_j = nlohmann::json::array();
    for (const DeclaredEos& d : declared) {
      declared_j.push_back({{"id", d.id}, {"source", d.source}});
      if (!std::binary_search(stops.begin(), stops.end(), d.id)) missing.push_back(fmt::format("{} ({})", d.id, d.source));
    }
    GateResult g;
    g.gate = "phase6.stop_set";
    g.subject = fmt::format("generation stops on the {} declared end-of-sequence id(s)", declared.size());
    g.require_fixed("declared_ids_not_stopping", double(missing.size()), "==", 0);
    g.note = missing.empty() ? fmt::format("stop set {}", fmt::join(stops, ", "))
                             : fmt::format("does not stop on {}", fmt::join(missing, "; "));
    out.gates.push_back(g);
    out.details["stop_set"] = {{"declared", declared_j}, {"runtime", stops}, {"missing", missing}};
  }
  out.pass = std::all_of(out.gates.begin(), out.gates.end(), [](const GateResult& g) { return g.pass(); });
  out.details["target_timing"] = {{"prefill_tokens_per_s", prefill_s > 0 ? prefill_tokens / prefill_s : 0},
                                  {"decode_tokens_per_s", decode_s > 0 ? decode_tokens / decode_s : 0},
                                  {"note", "short canonical prompts; `tessera bench` measures throughput properly"}};
  out.details["op_counters"] = ctx.target().op_counters();
  if (const nlohmann::json predicted = ctx.target().predicted_figures(); !predicted.empty())
    out.details["target_predicted"] = predicted;
  const bool greedy_ok = std::all_of(out.gates.begin(), out.gates.end(),
                                     [](const GateResult& g) { return g.gate != "phase6.greedy" || g.pass(); });
  const auto failed_in = [&](const char* gate) {
    return std::count_if(out.gates.begin(), out.gates.end(), [&](const GateResult& g) { return g.gate == gate && !g.pass(); });
  };
  out.summary = fmt::format("{} prompts x {} greedy tokens: {}; stop set: {}; frozen plan: {}, block {}", prompts.size(), n,
                            greedy_ok ? "match" : "mismatch",
                            out.details["stop_set"]["missing"].empty() ? "every declared EOS id" : "ids missing",
                            kernel_summary, failed_in("phase6.block") ? "fails" : "passes");
  if (failed_in("phase6.kernel"))
    out.diagnosis = "on the frozen plan, " + kernel_diagnosis + " (a rewrite of phases 4-5 changed a kernel phase 1 passed)";
  else if (failed_in("phase6.block"))
    out.diagnosis = "on the frozen plan, layer 0 disagrees with the oracle's block while every kernel passes: suspect how "
                    "the rewritten plan wires the kernels (shared buffers, syncs)";
  else if (!out.details["stop_set"]["missing"].empty())
    out.diagnosis = "generation would not stop on every end-of-sequence id the checkpoint declares (the runtime's stop set)";
  else if (!out.pass)
    out.diagnosis = "the integrated prefill+decode runner diverges from the oracle beyond the top-k rule; phases 1-3 "
                    "passed, so suspect state that only decode touches (KV cache writes, positions, buffer reuse)";
  return out;
}

}  // namespace tessera
