#include "targets/cpu/cpu_runner.h"

#include <array>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string_view>

#include "model/layer_params.h"
#include "model/tensors.h"
#include "oracle/ops.h"
#include "util/error.h"
#include "util/half.h"
#include "util/json_fields.h"
#include "util/mapped_file.h"
#include "util/parallel.h"
#include "util/stats.h"

namespace tessera {

const std::vector<std::string>& cpu_plan_names() {
  static const std::vector<std::string> names = {"cpu-fused", "cpu-naive"};
  return names;
}

std::string cpu_plan_name(bool fused_prefill, bool fused_decode) {
  if (fused_prefill == fused_decode) return fused_prefill ? "cpu-fused" : "cpu-naive";
  return fused_prefill ? "cpu-fused-prefill" : "cpu-fused-decode";
}

namespace {

void check_cpu_plan(const std::string& name) {
  const auto& names = cpu_plan_names();
  if (std::find(names.begin(), names.end(), name) == names.end())
    fail("target cpu has no plan '{}' (plans: {})", name, fmt::join(names, ", "));
}

// The fusion a plan asks for, per pass: plan["cpu"]["kernels"]["fused_linears"]. Plans
// written before the fusion existed have no such entry and ran one kernel per matrix.
void fusion_from_plan(const nlohmann::json& plan, CpuOptions& o) {
  if (!plan.contains("cpu") || !plan["cpu"].contains("kernels")) {
    o.fused_prefill = o.fused_decode = false;
    return;
  }
  try {
    const nlohmann::json& k = plan.at("cpu").at("kernels");
    const nlohmann::json& f = k.at("fused_linears");
    o.fused_prefill = f.at("prefill").get<bool>();
    o.fused_decode = f.at("decode").get<bool>();
    // Plans written before tile-tune have no blocking: the kernel's defaults.
    if (k.contains("gemm_blocking")) {
      o.blocking.kc = json_integer(k["gemm_blocking"].at("kc"), "cpu plan: GEMM blocking 'kc'");
      o.blocking.tc = json_integer(k["gemm_blocking"].at("tc"), "cpu plan: GEMM blocking 'tc'");
      if (!o.blocking.valid())
        fail("cpu plan: GEMM blocking kc {} must be a positive multiple of 32 and tc {} positive", o.blocking.kc,
             o.blocking.tc);
    }
  } catch (const nlohmann::json::exception& e) {
    fail("cpu plan: no kernel fusion recorded (cpu.kernels.fused_linears: {})", e.what());
  }
}

// tile-tune on the cpu: a cache-blocking search for the prefill GEMM, one candidate per
// rewrite, each kept only if measured faster (phase 4 alternates current and candidate).
// The K panel is what the L1 holds; the token block what the L2 holds.
std::vector<PlanRewrite> propose_tile_tune(const nlohmann::json& plan, Pass pass, std::string& why_not) {
  if (pass == Pass::Decode) {
    why_not = "decode runs GEMVs, one weight row at a time: no cache blocking to search";
    return {};
  }
  if (!cpu::gemm_has_cache_blocking()) {
    why_not = fmt::format("the {} GEMM has no cache blocking to tune (the AVX-512 BF16 and AMX paths have)", cpu::isa());
    return {};
  }
  CpuOptions o;
  fusion_from_plan(plan, o);
  std::vector<PlanRewrite> out;
  // Each candidate is named by itself (not by the current choice), so that after a kept one
  // the others are not tried again on timing noise.
  for (const int64_t kc : {128, 256, 512}) {  // 1024: wider than most models' K per L1 panel
    if (kc == o.blocking.kc) continue;
    nlohmann::json next = plan;
    next["cpu"]["kernels"]["gemm_blocking"] = {{"kc", kc}, {"tc", o.blocking.tc}};
    out.push_back({fmt::format("prefill GEMM panels of {} K, {} token rows per block", kc, o.blocking.tc), next});
  }
  if (out.empty()) why_not = "no other blocking to try";
  return out;
}

// merge on the cpu: the linears of a stage that share their input (q|k|v, gate|up) run as
// one kernel: the activations rounded once and, in decode, one parallel region (one
// barrier) over all the matrices' rows instead of one per matrix.
std::vector<PlanRewrite> propose_merge(const nlohmann::json& plan, Pass pass, std::string& why_not) {
  CpuOptions o;
  fusion_from_plan(plan, o);
  const bool fused = pass == Pass::Prefill ? o.fused_prefill : o.fused_decode;
  if (fused) {
    why_not = fmt::format("q|k|v and gate|up already run fused in {}", pass_name(pass));
    return {};
  }
  nlohmann::json next = plan;
  next["cpu"]["kernels"]["fused_linears"][pass_name(pass)] = true;
  return {{fmt::format("fuse q|k|v and gate|up into one kernel each ({})", pass_name(pass)), next}};
}

}  // namespace

TargetDef cpu_target_def() {
  TargetDef d;
  d.name = "cpu";
  d.serves = true;
  d.check_options = [](const TargetOptions& t) {
    if (!t.plan_name.empty()) check_cpu_plan(t.plan_name);
    if (!t.device.empty()) fail("target cpu has no devices to choose (asked for '{}')", t.device);
  };
  d.make = [](const Model& model, const TargetOptions& t) -> std::unique_ptr<StagedRunner> {
    CpuOptions o;
    o.threads = t.threads;
    o.oracle_stages = t.oracle_stages;
    o.profile = t.profile;
    if (!t.plan.is_null()) {
      fusion_from_plan(t.plan, o);
    } else {
      const std::string name = t.plan_name.empty() ? cpu_plan_names().front() : t.plan_name;
      check_cpu_plan(name);
      o.fused_prefill = o.fused_decode = name != "cpu-naive";
    }
    return std::make_unique<CpuRunner>(model, std::move(o));
  };
  d.faults = []() -> const std::vector<FaultInfo>& {
    static const std::vector<FaultInfo> none;
    return none;
  };
  d.options_from_plan = [](const nlohmann::json& plan, TargetOptions& o) {
    // A deployment runs with the threads it was gated with, unless asked otherwise, and
    // exactly the plan it froze.
    if (o.threads <= 0)
      o.threads = int(json_integer_or(plan.value("cpu", nlohmann::json::object()), "threads", "plan.json: cpu 'threads'",
                                      0, 0, 4096));
    o.plan = plan;
  };
  d.skills = []() -> const std::vector<OptSkill>& {
    static const std::vector<OptSkill> skills = {
        {"merge", "run the linears that share an input (q|k|v, gate|up) as one kernel", propose_merge},
        {"tile-tune", "search the prefill GEMM's cache blocking (K per L1 panel), keep the fastest measured",
         propose_tile_tune},
    };
    return skills;
  };
  return d;
}

CpuRunner::CpuRunner(const Model& model, CpuOptions options)
    : LayeredRunner(model, options.oracle_stages, options.profile), options_(std::move(options)) {
  pool_ = std::make_unique<cpu::ThreadPool>(options_.threads > 0 ? options_.threads : default_threads());
  auto store = std::make_unique<CpuWeightStore>(
      [this](int64_t n, const std::function<void(int64_t, int64_t)>& body) { pool_->parallel_for(n, body); });
  kv_select(0);  // sequence 0's cache
  store->reserve(matrix_weights());
  load_matrices(*store);
  weights_ = std::move(store);
  release_copied_file_pages();
}

// Every tensor the cpu reads is now its own copy (tiles, bf16 conversions, the fp32 norms
// and biases LayeredRunner holds) except bf16 matrices used straight from the mapping. The
// store releases each matrix's pages as it copies them, but only pages wholly inside that
// matrix: the pages it shares with a neighbour, the norms', the metadata's and those of
// tensors no stage reads stay resident (about 1 MB on the 135M model). So give back every
// page of the model's files outside the mapped matrices; a later reader (the oracle's
// twins) faults them in again from the page cache.
void CpuRunner::release_copied_file_pages() const {
  std::map<const MappedFile*, std::vector<std::pair<const uint8_t*, const uint8_t*>>> keep;
  for (const auto& [name, w] : model_.weights())
    if (w.info.file) keep[w.info.file.get()];
  for (const Weight* w : matrix_weights()) {
    const MappedFile* f = w->info.file.get();
    const auto* p = static_cast<const uint8_t*>(matrix(w->name).data);
    if (f && p >= f->data() && p < f->data() + f->size()) keep[f].push_back({p, p + matrix(w->name).bytes()});
  }
  for (auto& [f, ranges] : keep) {
    std::sort(ranges.begin(), ranges.end());
    const uint8_t* at = f->data();
    for (const auto& [b, e] : ranges) {
      if (b > at) f->release(at, uint64_t(b - at));
      at = std::max(at, e);
    }
    const uint8_t* end = f->data() + f->size();
    if (end > at) f->release(at, uint64_t(end - at));
  }
}

CpuRunner::~CpuRunner() = default;

int CpuRunner::threads() const { return pool_->size(); }

std::string CpuRunner::description() const { return fmt::format("cpu ({}, {} threads)", cpu::isa(), threads()); }

std::string CpuRunner::isa() const { return cpu::isa(); }

oracle::Numerics CpuRunner::numerics(Stage s, int64_t T, int64_t layer) const {
  oracle::Numerics n;
  n.name = "cpu " + cpu::isa();  // each path declares what it computes
  // The weights are bf16 (mapped or converted once at load); the AVX-512 BF16 and AMX paths
  // round the activations to bf16 once per call, the portable path multiplies them in fp32;
  // everything else runs in fp32; the KV cache stores fp16.
  n.weights = oracle::Precision::BF16;
  n.matmul_inputs = cpu::matmul_rounds_activations_to_bf16() ? oracle::Precision::BF16 : oracle::Precision::F32;
  n.kv_cache = oracle::Precision::F16;
  // Quantized weights: the blocks are multiplied exactly by x quantized per 32-value block
  // to two int8 terms (cpu/quant.h), at every T (prefill computes each row as the decode GEMV
  // does). A stage whose matrices mix tiles and bf16 (a file storing q and v differently)
  // declares bf16, the larger of the two errors, for all of them.
  if (s == Stage::Embedding && stage_matrix_quantized(s, layer)) n.weights = oracle::Precision::F32;  // rows dequantized
  if (s != Stage::Embedding && stage_matrix_quantized(s, layer)) {
    n.weights = oracle::Precision::F32;
    n.matmul_inputs = oracle::Precision::Q8x2_32;
  }
  return n;
}

bool CpuRunner::stage_matrix_quantized(Stage s, int64_t l) const {
  std::vector<const Weight*> ws;
  switch (s) {
    case Stage::QkvProj: ws = {layer(l).q, layer(l).k, layer(l).v}; break;
    case Stage::OProj: ws = {layer(l).o}; break;
    case Stage::GateUpProj: ws = {layer(l).gate, layer(l).up}; break;
    case Stage::DownProj: ws = {layer(l).down}; break;
    case Stage::LmHead: ws = {&model_.lm_head()}; break;
    case Stage::Embedding: ws = {&model_.get("model.embed_tokens.weight")}; break;
    default: return false;
  }
  for (const Weight* w : ws)
    if (!matrix(w->name).quantized()) return false;
  return true;
}

bool CpuRunner::fuses_linears(Stage s, int64_t T) const {
  if (s != Stage::QkvProj && s != Stage::GateUpProj) return false;
  return T == 1 || batched_rows() ? options_.fused_decode : options_.fused_prefill;
}

nlohmann::json CpuRunner::build_plan(const Model& model) const {
  const ModelSpec& s = model.spec();
  nlohmann::json plan;
  plan["format"] = "tessera-plan/1";
  plan["name"] = cpu_plan_name(options_.fused_prefill, options_.fused_decode);
  plan["target"] = "cpu";
  plan["model"] = {{"path", model.path()}, {"format", model.format()}, {"arch", arch_name(s.arch)}, {"spec", s.to_json()}};
  plan["cpu"] = {{"isa", cpu::isa()},
                 {"threads", threads()},
                 {"kernels",
                  {{"fused_linears", {{"prefill", options_.fused_prefill}, {"decode", options_.fused_decode}}},
                   {"gemm_blocking", {{"kc", options_.blocking.kc}, {"tc", options_.blocking.tc}}}}}};
  std::vector<std::string> formats;
  for (const auto& [f, n] : weights_->formats()) formats.push_back(fmt::format("{} {}", n, f));
  plan["weights"] = {{"dtype", fmt::format("{}", fmt::join(formats, ", "))},
                     {"mapped_bytes", weights_->mapped_bytes()},
                     {"tiled_bytes", weights_->tiled_bytes()},
                     {"converted_bytes", weights_->converted_bytes()},
                     {"residency", "bf16 mapped from the checkpoint; block formats the cpu reads (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) "
                                   "re-laid as 16-row tiles of the same bytes; anything else converted to bf16 once"}};
  plan["kv_cache"] = {{"bytes_per_position", kv_bytes_per_position()}, {"growth", "on demand"}};
  plan["dispatches"] = one_op_per_dispatch(s, "cpu");
  plan["host_ops"] = nlohmann::json::array();  // the cpu target is the host: nothing is left behind
  plan["frozen"] = false;
  return plan;
}

const cpu::WeightMatrix& CpuRunner::matrix(const std::string& name) const { return weights_->get(name); }

int64_t CpuRunner::weight_bytes_per_token() const { return decode_weight_bytes(*weights_); }

int64_t CpuRunner::kv_bytes_per_position() const { return cache_->bytes_per_position(); }

void CpuRunner::kernel_embedding(const int32_t* ids, int64_t T, float* out) {
  cpu::embedding(matrix("model.embed_tokens.weight"), ids, T, out);
}

void CpuRunner::kernel_rmsnorm(Stage, int64_t, const float* w, const float* x, int64_t T, float* out) {
  cpu::rmsnorm(x, w, out, T, spec().hidden, float(spec().rms_eps));
}

void CpuRunner::kernel_silu_mul(const float* gate, const float* up, int64_t T, float* out) {
  cpu::silu_mul(gate, up, out, T * spec().intermediate, *pool_);
}

void CpuRunner::kernel_add(Stage, float* acc, const float* x, int64_t T) { cpu::add(acc, x, T * spec().hidden); }

void CpuRunner::kv_read(int64_t l, int64_t rel, int64_t T, float* k, float* v) {
  const int64_t KV = spec().kv_dim();
  for (int64_t j = 0; j < T; ++j) {
    cache_->read_k(l, rel + j, k + j * KV);
    cache_->read_v(l, rel + j, v + j * KV);
  }
}

namespace {
// A batched decode step's rows (one per sequence), cpu::kMaxGemvRows at a time: each row
// exactly its sequence's one-row GEMV.
void matmul_sequence_rows(const float* x, int64_t T, std::span<const cpu::MatmulOut> outs, cpu::ThreadPool& pool) {
  const int64_t K = outs[0].w->cols;
  std::array<cpu::MatmulOut, 8> part;
  for (int64_t t0 = 0; t0 < T; t0 += cpu::kMaxGemvRows) {
    for (size_t i = 0; i < outs.size(); ++i) part[i] = {outs[i].w, outs[i].bias, outs[i].y + t0 * outs[i].w->rows};
    cpu::matmul_rows(x + t0 * K, std::min(cpu::kMaxGemvRows, T - t0), std::span(part.data(), outs.size()), pool);
  }
}
}  // namespace

void CpuRunner::kernel_linear(Stage, const float* x, int64_t T, const std::string& weight, const float* bias, float* y) {
  if (batched_rows()) {
    const cpu::MatmulOut one[] = {{&matrix(weight), bias, y}};
    return matmul_sequence_rows(x, T, one, *pool_);
  }
  cpu::matmul(x, T, matrix(weight), bias, y, *pool_, options_.blocking);
}

void CpuRunner::kernel_linears(Stage s, const float* x, int64_t T, std::span<const LinearOut> outs) {
  const bool fused = T == 1 || batched_rows() ? options_.fused_decode : options_.fused_prefill;
  if (!fused || outs.size() > 8) return LayeredRunner::kernel_linears(s, x, T, outs);
  std::array<cpu::MatmulOut, 8> mm;
  for (size_t i = 0; i < outs.size(); ++i) mm[i] = {&matrix(outs[i].weight), outs[i].bias, outs[i].y};
  if (batched_rows()) return matmul_sequence_rows(x, T, std::span(mm.data(), outs.size()), *pool_);
  cpu::matmul_shared_input(x, T, std::span(mm.data(), outs.size()), *pool_, options_.blocking);
}

void CpuRunner::kv_select(int seq) {
  const ModelSpec& s = spec();
  while (caches_.size() <= size_t(seq))
    caches_.push_back(std::make_unique<cpu::KvCache>(s.n_layers, s.n_kv_heads, s.head_dim));
  cache_ = caches_[size_t(seq)].get();
}

double CpuRunner::measure_gemm_gflops() {
  constexpr int64_t T = 256, N = 2048, K = 2048;
  const std::vector<uint16_t> w(size_t(N * K), 0x3C24);  // bf16 0.01
  const std::vector<float> x(size_t(T * K), 0.5f);
  std::vector<float> y(size_t(T * N));
  const cpu::WeightMatrix wm(Bf16Matrix{w.data(), N, K});
  double best = 1e300;
  for (int r = 0; r < 4; ++r) {  // the first call warms the caches and the pool
    const auto t0 = std::chrono::steady_clock::now();
    cpu::matmul(x.data(), T, wm, nullptr, y.data(), *pool_);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);
  }
  return 2.0 * double(T) * double(N) * double(K) / best / 1e9;
}

PassFigure CpuRunner::measure(Pass pass) {
  // A fixed token sequence (any ids: the weights are read the same whatever they are).
  const int64_t P = std::max<int64_t>(1, std::min<int64_t>(128, spec().max_position - 9));
  std::vector<int32_t> ids(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) ids[size_t(i)] = int32_t((i * 7919 + 13) % spec().vocab);
  constexpr int kReps = 5, kSteps = 8;
  std::vector<double> samples;
  if (pass == Pass::Decode) {
    // One prefill, then each repeat decodes the same kSteps positions after it (the cache cut
    // back to the prompt in between: the same work as a fresh prefill's, without redoing it).
    reset();
    forward(ids, false);
    const int32_t next = ids.back();
    for (int r = 0; r < kReps; ++r) {
      truncate(P);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kSteps; ++i) forward(std::span<const int32_t>(&next, 1), false);
      samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kSteps);
    }
  } else {
    for (int r = 0; r < kReps; ++r) {
      reset();
      const auto t0 = std::chrono::steady_clock::now();
      forward(ids, false);
      samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  reset();
  PassFigure f;
  f.seconds = median(samples);
  f.what = pass == Pass::Prefill ? fmt::format("prefill of {} tokens, wall time (median of {})", P, kReps)
                                 : fmt::format("decode step after {} tokens, wall time (median of {} x {} steps)", P, kReps, kSteps);
  return f;
}

void CpuRunner::kernel_rope(int64_t l, float* q, float* k, int64_t T, int64_t pos) {
  const ModelSpec& s = spec();
  if (s.qk_norm) {  // Qwen3: each head's q and k RMS-normalized before rotating
    const LayerParams& L = layer(l);
    cpu::rmsnorm(q, L.q_norm.data(), q, T * s.n_heads, s.head_dim, float(s.rms_eps));
    cpu::rmsnorm(k, L.k_norm.data(), k, T * s.n_kv_heads, s.head_dim, float(s.rms_eps));
  }
  cpu::rope(q, T, s.n_heads, s.head_dim, pos, inv_freq().data());
  cpu::rope(k, T, s.n_kv_heads, s.head_dim, pos, inv_freq().data());
}

void CpuRunner::kv_store(int64_t l, int64_t rel, const float* k, const float* v, int64_t T) {
  cache_->write(l, rel, k, v, T);
}

void CpuRunner::kernel_attention_rows(int64_t l, std::span<const AttentionRowJob> rows) {
  const ModelSpec& s = spec();
  std::vector<cpu::AttentionRow> jobs;
  jobs.reserve(rows.size());
  for (const AttentionRowJob& a : rows)  // each row's sequence was selected (its cache made) before
    jobs.push_back({a.q, caches_.at(size_t(a.seq)).get(), a.rel, a.out});
  cpu::attention_rows(jobs, l, s.n_heads, s.n_kv_heads, s.head_dim, float(s.attn_scale()), *pool_);
}

void CpuRunner::kernel_attention(int64_t l, const float* q, int64_t T, int64_t rel, float* out) {
  const ModelSpec& s = spec();
  cpu::attention(q, T, rel, *cache_, l, s.n_heads, s.n_kv_heads, s.head_dim, float(s.attn_scale()), out, *pool_);
}

}  // namespace tessera
