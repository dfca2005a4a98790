#include "targets/npusim/npusim_runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "oracle/ops.h"
#include "targets/cpu/kernels.h"
#include "targets/npusim/numerics.h"
#include "targets/npusim/ops.h"
#include "targets/npusim/predict.h"
#include "targets/stages.h"
#include "util/error.h"
#include "util/half.h"
#include "util/parallel.h"

namespace tessera {

using npusim::Placement;

const std::vector<FaultInfo>& npusim_faults() {
  // Mapping bugs (design section 5's refusals and stale/aliased buffers). Each names the
  // stage whose kernel carries it and the first phase whose gate must catch it.
  static const std::vector<FaultInfo> faults = {
      {"merged-stale-intermediate", "attn_residual", 4,
       "a dispatch that merges the O projection with the residual add hands the add the previous call's output (plans "
       "without that merge are unaffected: phase 4's gate catches the merge rewrite and reverts it)"},
      {"l1-overflow", "qkv_proj", 1,
       "the projection's streamed tile is enlarged past the 64 KiB L1: the checker refuses the mapping with the numbers"},
      {"bd-exhaustion", "qkv_proj", 1,
       "the projection's weight transfer is cut into one buffer descriptor per run: more BDs than the shim tile has"},
      {"bad-access-pattern", "qkv_proj", 1,
       "the projection's weight is walked transposed by the DMA (a wrong n-D access pattern): wrong numbers"},
      {"stale-buffer", "mlp_norm", 1,
       "the norm's input fifo is marked resident, so later calls compute on the first call's activations"},
      {"merge-skipped", "dispatch", -1,
       "phases 4 and 5 never try the merge skill: every gate passes with one op per dispatch while the NPU's time goes to "
       "dispatch overhead (porting pitfall 14: no gate fails; `tessera diagnose` names it)"},
      {"dma-channels", "qkv_proj", 1,
       "the projection's input is sent twice through column 0's shim tile: one more MM2S channel than the tile has"},
  };
  return faults;
}

TargetDef npusim_target_def() {
  TargetDef d;
  d.name = "npusim";
  d.check_options = [](const TargetOptions& t) {
    if (!t.plan_name.empty()) npusim::named_plan(t.plan_name);  // throws naming the plans
    npusim::load_device(t.device.empty() ? "xdna2" : t.device);  // throws naming the profiles
  };
  d.make = [](const Model& model, const TargetOptions& t) -> std::unique_ptr<StagedRunner> {
    return std::make_unique<NpuSimRunner>(model, t);
  };
  d.faults = []() -> const std::vector<FaultInfo>& { return npusim_faults(); };
  d.options_from_plan = [](const nlohmann::json& plan, TargetOptions& o) {
    // A deployment runs exactly the plan and the device it was gated with.
    o.plan = plan;
    if (o.device.empty()) o.device = plan.value("npusim", nlohmann::json::object()).value("device", "");
  };
  d.skills = []() -> const std::vector<OptSkill>& { return npusim_skills(); };
  return d;
}

namespace {

// The device asked for, else the one a given plan was made for, else xdna2.
std::string device_name(const TargetOptions& o) {
  if (!o.device.empty()) return o.device;
  if (!o.plan.is_null()) return o.plan.value("npusim", nlohmann::json::object()).value("device", "xdna2");
  return "xdna2";
}

// A given plan as written, else the named plan (the default when none is named).
npusim::NpuPlan plan_for(const TargetOptions& o) {
  if (!o.plan.is_null()) return npusim::plan_from_json(o.plan.at("npusim").at("plan"));
  return npusim::named_plan(o.plan_name.empty() ? npusim::default_plan_name() : o.plan_name);
}

}  // namespace

NpuSimRunner::NpuSimRunner(const Model& model, const TargetOptions& options)
    : LayeredRunner(model, options.oracle_stages, options.profile),
      faults_(options.faults),
      device_(npusim::load_device(device_name(options))),
      plan_(plan_for(options)),
      threads_(options.threads > 0 ? options.threads : default_threads()) {
  ops_ = std::make_unique<npusim::NpuOps>(device_, threads_);
  ops_->set_gemv_tiles(plan_.gemv_tiles);
  host_pool_ = std::make_unique<cpu::ThreadPool>(threads_);
  weights_ = std::make_unique<Bf16WeightStore>(
      [this](int64_t n, const std::function<void(int64_t, int64_t)>& body) { host_pool_->parallel_for(n, body); });
  const ModelSpec& s = model.spec();
  load_matrices(*weights_);
  kv_.resize(size_t(s.n_layers));

  // The faults, as mapping bugs of one op's launches.
  npusim::MappingFaults f;
  f.l1_overflow = fault("l1-overflow");
  f.bd_exhaustion = fault("bd-exhaustion");
  f.transposed_pattern = fault("bad-access-pattern");
  f.dma_oversubscribed = fault("dma-channels");
  if (f.any()) ops_->set_faults("gemv", f), ops_->set_faults("gemm", f);
  if (fault("stale-buffer")) {
    npusim::MappingFaults stale;
    stale.stale_buffer = true;
    ops_->set_faults("rmsnorm", stale);
  }
}

NpuSimRunner::~NpuSimRunner() = default;

std::string NpuSimRunner::description() const {
  return fmt::format("npusim ({} model, plan {}, {} host threads)", device_.name, plan_.name, threads_);
}

std::string NpuSimRunner::isa() const { return "aie2p (modelled)"; }

oracle::Numerics NpuSimRunner::numerics(Stage s, int64_t T) const {
  using oracle::Precision;
  oracle::Numerics n;
  n.weights = n.matmul_inputs = Precision::BF16;  // the weight store is bf16 wherever it runs
  const Placement p = where(s, T);
  if (p == Placement::Host) {
    n.name = "npusim host (fp32)";
    n.kv_cache = Precision::BF16;
    return n;
  }
  // On the array (npusim/numerics.h): bf16 in and out of every tile, fp32 accumulators,
  // the aie2p kernels' exp, 1/sqrt and SiLU.
  n.name = p == Placement::Npu ? "npusim array" : "npusim array, host softmax";
  n.activations = n.kv_cache = n.norm_weights = n.norm_scale = n.rope_table = Precision::BF16;
  n.norm_rounds_product = true;
  // The residual stream stays fp32 in DDR: the add tiles read and write fp32.
  if (s == Stage::AttnResidual || s == Stage::MlpResidual) n.activations = Precision::F32;
  n.rsqrt = npusim::rsqrt_approx;
  n.silu = npusim::silu_bf16;
  n.approximations = "1/sqrt: bit-trick + one Newton step; SiLU: x * 0.5 * (1 + tanh(x/2)) in bf16";
  if (p == Placement::Npu) {
    n.softmax_probs = Precision::BF16;
    n.exp = npusim::exp_bf16;
    n.approximations += "; exp: 2^(x * bf16 log2e) by a bf16 cubic";
  } else if (s == Stage::Attention) {
    // Scores and the value product as array GEMMs around an fp32 host softmax: bf16 queries
    // and normalized probabilities in, fp32 out of the accumulator.
    n.attention_q = n.softmax_probs = Precision::BF16;
    n.probs_normalized = true;
    n.activations = Precision::F32;
  }
  return n;
}

int64_t NpuSimRunner::weight_bytes_per_token() const { return decode_weight_bytes(*weights_); }

int64_t NpuSimRunner::kv_bytes_per_position() const { return spec().n_layers * 2 * spec().kv_dim() * 2; }

PassFigure NpuSimRunner::measure(Pass pass) {
  PassFigure f;
  f.predicted = true;
  if (pass == Pass::Prefill) {
    f.seconds = npusim::predict_prefill(plan_, spec(), device_, prefill_tokens()).total_us / 1e6;
    f.what = fmt::format("predicted prefill of {} tokens on {}", prefill_tokens(), device_.name);
  } else {
    f.seconds = npusim::predict_decode(plan_, spec(), device_, decode_context()).total_us / 1e6;
    f.what = fmt::format("predicted decode step at context {} on {}", decode_context(), device_.name);
  }
  return f;
}

nlohmann::json NpuSimRunner::predicted_figures() const {
  const int64_t T = prefill_tokens(), C = decode_context();
  const npusim::PassPrediction p = npusim::predict_prefill(plan_, spec(), device_, T);
  const npusim::PassPrediction d = npusim::predict_decode(plan_, spec(), device_, C);
  return {{"device", device_.name},
          {"plan", plan_.name},
          {"prefill_tokens", T},
          {"prefill_ms", p.total_us / 1e3},
          {"prefill_tokens_per_s", double(T) / (p.total_us / 1e6)},
          {"decode_context", C},
          {"decode_ms_per_token", d.total_us / 1e3},
          {"decode_tokens_per_s", 1e6 / d.total_us},
          {"npu_dispatches_per_layer", {{"prefill", plan_.dispatches_per_layer(false)}, {"decode", plan_.dispatches_per_layer(true)}}},
          {"note", "predicted by the device profile's timing model (calibrated on kernel-level measurements), not measured"}};
}

std::map<std::string, int64_t> NpuSimRunner::op_counters() const {
  std::map<std::string, int64_t> out = LayeredRunner::op_counters();
  for (const auto& [stage, n] : host_calls_) {
    // A stage the plan put on the host ran there, not on the target: move its count.
    const std::string name = stage_name(stage);
    out["host:" + name] += n;
    if (auto it = out.find(name); it != out.end() && (it->second -= n) <= 0) out.erase(it);
  }
  if (host_softmax_calls_) out["host:attention.softmax"] = host_softmax_calls_;
  return out;
}

nlohmann::json NpuSimRunner::build_plan(const Model& model) const {
  const ModelSpec& s = model.spec();
  nlohmann::json plan;
  plan["format"] = "tessera-plan/1";
  plan["name"] = plan_.name;
  plan["target"] = "npusim";
  plan["model"] = {{"path", model.path()}, {"format", model.format()}, {"arch", arch_name(s.arch)}, {"spec", s.to_json()}};
  plan["description"] = description();
  plan["npusim"] = {{"device", device_.name}, {"plan", plan_.to_json()}, {"host_threads", threads_}};
  plan["weights"] = {{"dtype", "bf16"},
                     {"mapped_bytes", weights_->mapped_bytes()},
                     {"converted_bytes", weights_->owned_bytes()},
                     {"residency", plan_.weights_resident ? "resident in device memory per layer"
                                                          : "sent with every call"}};
  plan["kv_cache"] = {{"dtype", "bf16"}, {"layout", "per layer, one [K | V] row per position"},
                      {"bytes_per_position", kv_bytes_per_position()}};
  // The grouping in the pipeline's generic form: every dispatch of each pass, in order,
  // each op with its kernel, shape, layer and where it runs.
  nlohmann::json dispatches = nlohmann::json::array();
  for (const bool decode : {false, true}) {
    const npusim::NpuPlan::Pass& pass = plan_.pass(decode);
    auto add = [&](const npusim::PlanDispatch& d, int64_t layer) {
      nlohmann::json ops = nlohmann::json::array();
      for (const npusim::PlanStep& st : d.steps) {
        nlohmann::json op = {{"op", stage_name(st.stage)}, {"kernel", stage_kernel(st.stage)},
                             {"on", npusim::placement_name(st.placement)}, {"shape", stage_shape(st.stage, s)}};
        if (layer >= 0) op["layer"] = layer;
        ops.push_back(op);
      }
      dispatches.push_back({{"id", dispatches.size()}, {"pass", decode ? "decode" : "prefill"}, {"name", d.name}, {"ops", ops}});
    };
    for (const npusim::PlanDispatch& d : pass.embedding) add(d, -1);
    for (int64_t l = 0; l < s.n_layers; ++l)
      for (const npusim::PlanDispatch& d : pass.layer) add(d, l);
    for (const npusim::PlanDispatch& d : pass.head) add(d, -1);
  }
  plan["dispatches"] = dispatches;
  std::vector<std::string> host = plan_.host_stages(false);
  for (const std::string& h : plan_.host_stages(true))
    if (std::find(host.begin(), host.end(), h) == host.end()) host.push_back(h);
  plan["host_ops"] = host;  // by the plan's choice; the runner never moves an op by itself
  plan["frozen"] = false;
  return plan;
}

// --- kernels -----------------------------------------------------------------------------

void NpuSimRunner::kernel_embedding(const int32_t* ids, int64_t T, float* out) {
  const Bf16Matrix& e = weights_->get("model.embed_tokens.weight");
  if (where(Stage::Embedding, T) == Placement::Host) {
    on_host(Stage::Embedding);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < e.cols; ++c) out[t * e.cols + c] = bf16_to_f32(e.data[int64_t(ids[t]) * e.cols + c]);
    return;
  }
  ops_->embedding(e.data, e.rows, e.cols, ids, T, out);
}

void NpuSimRunner::kernel_rmsnorm(Stage which, int64_t, const float* w, const float* x, int64_t T, float* out) {
  if (where(which, T) == Placement::Host) {
    on_host(which);
    return oracle::rmsnorm(x, w, out, T, spec().hidden, spec().rms_eps);
  }
  ops_->rmsnorm(x, w, out, T, spec().hidden, spec().rms_eps);
}

void NpuSimRunner::kernel_linear(Stage s, const float* x, int64_t T, const std::string& weight, const float* bias,
                                 float* y) {
  const Bf16Matrix& w = weights_->get(weight);
  if (where(s, T) == Placement::Host) {
    on_host(s);
    return cpu::matmul(x, T, w, bias, y, *host_pool_);
  }
  if (s == Stage::LmHead && T == 1) return ops_->lm_head(w.data, w.rows, w.cols, x, y);
  ops_->linear(w.data, w.rows, w.cols, x, T, bias, y, weight, plan_.weights_resident);
}

void NpuSimRunner::kernel_rope(int64_t l, float* q, float* k, int64_t T, int64_t pos) {
  const ModelSpec& s = spec();
  if (where(Stage::Rope, T) == Placement::Host) {
    on_host(Stage::Rope);
    const LayerParams& L = layer(l);
    if (s.qk_norm) {
      oracle::rmsnorm(q, L.q_norm.data(), q, T * s.n_heads, s.head_dim, s.rms_eps);
      oracle::rmsnorm(k, L.k_norm.data(), k, T * s.n_kv_heads, s.head_dim, s.rms_eps);
    }
    oracle::rope(q, T, s.n_heads, s.head_dim, pos, inv_freq());
    oracle::rope(k, T, s.n_kv_heads, s.head_dim, pos, inv_freq());
    return;
  }
  if (s.qk_norm) {  // Qwen3: per-head RMSNorm before RoPE, on the NPU as a row op
    const LayerParams& L = layer(l);
    ops_->rmsnorm(q, L.q_norm.data(), q, T * s.n_heads, s.head_dim, s.rms_eps);
    ops_->rmsnorm(k, L.k_norm.data(), k, T * s.n_kv_heads, s.head_dim, s.rms_eps);
  }
  ops_->rope(q, T, s.n_heads, s.head_dim, pos, inv_freq());
  ops_->rope(k, T, s.n_kv_heads, s.head_dim, pos, inv_freq());
}

uint16_t* NpuSimRunner::kv_layer(int64_t l, int64_t rows_needed) {
  std::vector<uint16_t>& kv = kv_[size_t(l)];
  const int64_t rows = npusim::NpuOps::kv_rows_for(rows_needed);
  const int64_t row_elems = 2 * spec().kv_dim();
  if (int64_t(kv.size()) < rows * row_elems) {
    // Grown rows start as NaN (bf16 0x7FC0): a kernel reading an unwritten row shows it.
    kv.resize(size_t(rows * row_elems), uint16_t(0x7FC0));
  }
  return kv.data();
}

void NpuSimRunner::kv_store(int64_t l, int64_t rel, const float* k, const float* v, int64_t T) {
  if (where(Stage::KvWrite, T) == Placement::Host) on_host(Stage::KvWrite);
  npusim::NpuOps::kv_store(kv_layer(l, rel + T), spec().kv_dim(), rel, k, v, T);
}

void NpuSimRunner::kv_read(int64_t l, int64_t rel, int64_t T, float* k, float* v) {
  const int64_t KV = spec().kv_dim();
  const uint16_t* kv = kv_layer(l, rel + T);
  for (int64_t j = 0; j < T; ++j) {
    const uint16_t* row = kv + (rel + j) * 2 * KV;
    for (int64_t c = 0; c < KV; ++c) {
      k[j * KV + c] = bf16_to_f32(row[c]);
      v[j * KV + c] = bf16_to_f32(row[KV + c]);
    }
  }
}

void NpuSimRunner::host_attention(int64_t l, const float* q, int64_t T, int64_t rel, float* out) {
  const int64_t KV = spec().kv_dim(), ctx = rel + T;
  if (int64_t(scratch_.size()) < 2 * ctx * KV) scratch_.resize(size_t(2 * ctx * KV));
  float *kk = scratch_.data(), *vv = scratch_.data() + ctx * KV;
  kv_read(l, 0, ctx, kk, vv);
  oracle::attention(q, T, rel, kk, vv, spec(), out, threads_);
}

// Naive prefill: the scores and the context products on the NPU (GEMMs per query head),
// the scaled, masked softmax on the host in fp32.
void NpuSimRunner::split_attention(int64_t l, const float* q, int64_t T, int64_t rel, float* out) {
  const ModelSpec& s = spec();
  const int64_t hd = s.head_dim, KV = s.kv_dim(), ctx = rel + T, group = s.n_heads / s.n_kv_heads;
  // Keys padded to whole key tiles (the GEMM mapping takes whole tiles); padded keys are
  // zero and masked out of the softmax.
  const int64_t cp = npusim::NpuOps::kv_rows_for(ctx);
  const uint16_t* kv = kv_layer(l, ctx);
  std::vector<uint16_t> kh(size_t(cp * hd), 0), vt(size_t(hd * cp), 0);
  std::vector<float> qh(size_t(T * hd)), scores(size_t(T * cp)), probs(size_t(T * cp)), oh(size_t(T * hd));
  const float scale = float(s.attn_scale());
  for (int64_t g = 0; g < s.n_kv_heads; ++g) {
    // The kv head's keys as a [keys, hd] "weight" and its values transposed to [hd, keys].
    for (int64_t j = 0; j < ctx; ++j)
      for (int64_t d = 0; d < hd; ++d) {
        kh[size_t(j * hd + d)] = kv[j * 2 * KV + g * hd + d];
        vt[size_t(d * cp + j)] = kv[j * 2 * KV + KV + g * hd + d];
      }
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t t = 0; t < T; ++t) std::copy_n(q + t * s.q_dim() + h * hd, hd, qh.data() + t * hd);
      ops_->gemm(kh.data(), cp, hd, qh.data(), T, nullptr, scores.data(), fmt::format("keys.{}", g));
      for (int64_t t = 0; t < T; ++t) {
        const float* row = scores.data() + t * cp;
        float* p = probs.data() + t * cp;
        const int64_t visible = rel + t + 1;  // causal: keys [0, rel + t]
        float m = -INFINITY;
        for (int64_t j = 0; j < visible; ++j) m = std::max(m, row[j] * scale);
        double sum = 0;
        for (int64_t j = 0; j < visible; ++j) sum += p[j] = std::exp(row[j] * scale - m);
        for (int64_t j = 0; j < cp; ++j) p[j] = j < visible ? float(p[j] / sum) : 0.0f;
      }
      ops_->gemm(vt.data(), hd, cp, probs.data(), T, nullptr, oh.data(), fmt::format("values.{}", g));
      for (int64_t t = 0; t < T; ++t) std::copy_n(oh.data() + t * hd, hd, out + t * s.q_dim() + h * hd);
    }
  }
}

void NpuSimRunner::kernel_attention(int64_t l, const float* q, int64_t T, int64_t rel, float* out) {
  const ModelSpec& s = spec();
  switch (where(Stage::Attention, T)) {
    case Placement::Host:
      on_host(Stage::Attention);
      return host_attention(l, q, T, rel, out);
    case Placement::NpuWithHostSoftmax:
      ++host_softmax_calls_;  // the products ran on the NPU, the softmax on the host
      return split_attention(l, q, T, rel, out);
    case Placement::Npu: break;
  }
  const int64_t ctx = rel + T;
  const uint16_t* kv = kv_layer(l, ctx);
  const int64_t rows = npusim::NpuOps::kv_rows_for(ctx);
  if (T == 1) ops_->attention_decode(q, rel, s.n_heads, s.n_kv_heads, s.head_dim, kv, rows, out);
  else ops_->attention_prefill(q, T, rel, s.n_heads, s.n_kv_heads, s.head_dim, kv, rows, out);
}

void NpuSimRunner::kernel_silu_mul(const float* gate, const float* up, int64_t T, float* out) {
  const int64_t n = T * spec().intermediate;
  if (where(Stage::SiluMul, T) == Placement::Host) {
    on_host(Stage::SiluMul);
    return oracle::silu_mul(gate, up, out, n);
  }
  ops_->silu_mul(gate, up, out, n);
}

void NpuSimRunner::kernel_add(Stage which, float* acc, const float* x, int64_t T) {
  const int64_t n = T * spec().hidden;
  if (which == Stage::AttnResidual && fault("merged-stale-intermediate") &&
      plan_.shares_dispatch(Stage::OProj, Stage::AttnResidual, T == 1)) {
    // The add reads what the O projection left in the buffer on the previous call.
    std::vector<float> now(x, x + n);
    stale_o_.resize(size_t(n));
    std::swap(stale_o_, now);
    ops_->add(acc, now.data(), n);
    return;
  }
  if (where(which, T) == Placement::Host) {
    on_host(which);
    for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
    return;
  }
  ops_->add(acc, x, n);
}

}  // namespace tessera
