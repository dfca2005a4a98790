#include "targets/cpu/cpu_runner.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <string_view>

#include "io/layer_params.h"
#include "model/tensors.h"
#include "oracle/ops.h"
#include "targets/cpu/faulty_kernels.h"
#include "util/error.h"
#include "util/half.h"
#include "util/parallel.h"

namespace tessera {

namespace {
void grow(std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
}
}  // namespace

TargetDef cpu_target_def() {
  TargetDef d;
  d.name = "cpu";
  d.check_options = [](const TargetOptions& t) {
    if (!t.plan_name.empty() && t.plan_name != "cpu-naive")
      fail("target cpu has no plan '{}' (plans: cpu-naive)", t.plan_name);
    if (!t.device.empty()) fail("target cpu has no devices to choose (asked for '{}')", t.device);
  };
  d.make = [](const Model& model, const TargetOptions& t) -> std::unique_ptr<StagedRunner> {
    CpuOptions o;
    o.threads = t.threads;
    o.faults = t.faults;
    o.oracle_stages = t.oracle_stages;
    o.profile = t.profile;
    return std::make_unique<CpuRunner>(model, std::move(o));
  };
  d.faults = []() -> const std::vector<FaultInfo>& { return known_faults(); };
  d.options_from_plan = [](const nlohmann::json& plan, TargetOptions& o) {
    // A deployment runs with the threads it was gated with, unless asked otherwise.
    if (o.threads <= 0) o.threads = plan.value("cpu", nlohmann::json::object()).value("threads", 0);
  };
  return d;
}

struct CpuRunner::Layer : LayerParams {};

const cpu::Bf16Matrix& CpuRunner::load_matrix(const Weight& w) {
  if (auto it = matrices_.find(w.name); it != matrices_.end()) return it->second;
  cpu::Bf16Matrix m;
  m.rows = w.rows();
  m.cols = w.cols();
  const int64_t bytes = m.rows * m.cols * 2;
  if (w.info.dtype == DType::BF16 && w.unpermute_head_dim == 0) {
    // Already what the kernels read: use the file's pages, no copy.
    m.data = reinterpret_cast<const uint16_t*>(w.info.data);
    mapped_bytes_ += bytes;
  } else {
    // Quantized, fp16/fp32 or permuted on disk: convert once to BF16 (round to nearest even).
    owned_.emplace_back(size_t(m.rows * m.cols));
    uint16_t* dst = owned_.back().data();
    pool_->parallel_for(m.rows, [&](int64_t r0, int64_t r1) {
      std::vector<float> row(size_t(m.cols));
      for (int64_t r = r0; r < r1; ++r) {
        w.row_f32(r, row.data());
        for (int64_t c = 0; c < m.cols; ++c) dst[r * m.cols + c] = f32_to_bf16(row[size_t(c)]);
      }
    });
    m.data = dst;
    owned_bytes_ += bytes;
  }
  return matrices_[w.name] = m;
}

CpuRunner::CpuRunner(const Model& model, CpuOptions options) : model_(model), options_(std::move(options)) {
  for (const std::string& f : options_.faults) fault_info(f);  // refuses unknown names
  pool_ = std::make_unique<cpu::ThreadPool>(options_.threads > 0 ? options_.threads : default_threads());
  const ModelSpec& s = model.spec();
  cache_ = std::make_unique<cpu::KvCache>(s.n_layers, s.kv_dim());
  layers_.resize(size_t(s.n_layers));
  for (int64_t l = 0; l < s.n_layers; ++l) {
    Layer& L = layers_[size_t(l)];
    static_cast<LayerParams&>(L) = load_layer_params(model, l);
    for (const Weight* w : {L.q, L.k, L.v, L.o, L.gate, L.up, L.down}) load_matrix(*w);
  }
  load_matrix(model.get("model.embed_tokens.weight"));
  load_matrix(model.lm_head());
  final_norm_ = model.get("model.norm.weight").to_f32();
  inv_freq_ = oracle::rope_inv_freq(s);
  ModelSpec unscaled = s;
  unscaled.rope_scaling = RopeScaling{};
  unscaled.rope_freq_factors.clear();
  inv_freq_unscaled_ = oracle::rope_inv_freq(unscaled);
}

CpuRunner::~CpuRunner() = default;

int CpuRunner::threads() const { return pool_->size(); }

std::string CpuRunner::description() const { return fmt::format("cpu ({}, {} threads)", cpu::isa(), threads()); }

std::string CpuRunner::isa() const { return cpu::isa(); }

nlohmann::json CpuRunner::build_plan(const Model& model) const {
  const ModelSpec& s = model.spec();
  nlohmann::json plan;
  plan["format"] = "tessera-plan/1";
  plan["name"] = "cpu-naive";
  plan["target"] = "cpu";
  plan["model"] = {{"path", model.path()}, {"format", model.format()}, {"arch", arch_name(s.arch)}, {"spec", s.to_json()}};
  plan["cpu"] = {{"isa", cpu::isa()}, {"threads", threads()}};
  plan["weights"] = {{"dtype", "bf16"},
                     {"mapped_bytes", mapped_weight_bytes()},
                     {"converted_bytes", owned_weight_bytes()},
                     {"residency", owned_weight_bytes() == 0 ? "memory-mapped from the checkpoint"
                                                             : "converted to bf16 once at load (the file is not bf16 in HF layout)"}};
  plan["kv_cache"] = {{"bytes_per_position", kv_bytes_per_position()}, {"growth", "on demand"}};
  plan["dispatches"] = one_op_per_dispatch(s, "cpu");
  plan["host_ops"] = nlohmann::json::array();  // the cpu target is the host: nothing is left behind
  plan["frozen"] = false;
  return plan;
}

const cpu::Bf16Matrix& CpuRunner::matrix(const std::string& name) const {
  auto it = matrices_.find(name);
  if (it == matrices_.end()) fail("cpu target: no matrix '{}'", name);
  return it->second;
}

int64_t CpuRunner::weight_bytes_per_token() const {
  // Every layer matrix once, plus the LM head (the embedding row read is negligible).
  int64_t bytes = 0;
  for (const Layer& L : layers_)
    for (const Weight* w : {L.q, L.k, L.v, L.o, L.gate, L.up, L.down}) {
      const cpu::Bf16Matrix& m = matrix(w->name);
      bytes += m.rows * m.cols * 2;
    }
  const cpu::Bf16Matrix& head = matrix(model_.lm_head().name);
  return bytes + head.rows * head.cols * 2;
}

int64_t CpuRunner::kv_bytes_per_position() const { return cache_->bytes_per_position(); }

void CpuRunner::reset(int64_t start_position) {
  if (start_position < 0 || start_position >= spec().max_position)
    fail("cpu target: start position {} is outside the model's context of {}", start_position, spec().max_position);
  position_ = base_ = start_position;
}

void CpuRunner::truncate(int64_t positions) {
  if (positions < base_ || positions > position_)
    fail("cpu target: cannot truncate {} cached positions to {}", position_, positions);
  position_ = positions;  // later writes overwrite the dropped rows
}

void CpuRunner::count(Stage s) {
  (by_oracle(s) ? oracle_calls_ : target_calls_)[size_t(s)]++;
  if (options_.profile) lap(s);
}

void CpuRunner::lap(Stage next) {
  // Stages run back to back, so the time since the last lap belongs to the stage before.
  const auto now = std::chrono::steady_clock::now();
  if (current_ != Stage::Count) stage_seconds_[size_t(current_)] += std::chrono::duration<double>(now - last_lap_).count();
  current_ = next;
  last_lap_ = now;
}

std::map<std::string, double> CpuRunner::stage_seconds() const {
  std::map<std::string, double> out;
  for (int i = 0; i < kStageCount; ++i)
    if (stage_seconds_[size_t(i)] > 0) out[stage_name(Stage(i))] = stage_seconds_[size_t(i)];
  return out;
}

std::map<std::string, int64_t> CpuRunner::op_counters() const {
  std::map<std::string, int64_t> out;
  for (int i = 0; i < kStageCount; ++i) {
    if (target_calls_[size_t(i)]) out[stage_name(Stage(i))] = target_calls_[size_t(i)];
    if (oracle_calls_[size_t(i)]) out[std::string("oracle:") + stage_name(Stage(i))] = oracle_calls_[size_t(i)];
  }
  return out;
}

const std::vector<float>& CpuRunner::norm_weight(Stage which, int64_t layer) const {
  switch (which) {
    case Stage::FinalNorm: return final_norm_;
    case Stage::AttnNorm:
    case Stage::MlpNorm:
      if (layer < 0 || layer >= int64_t(layers_.size())) fail("cpu target: no layer {}", layer);
      return which == Stage::AttnNorm ? layers_[size_t(layer)].attn_norm : layers_[size_t(layer)].mlp_norm;
    default: fail("cpu target: stage '{}' is not an rmsnorm", stage_name(which));
  }
}

void CpuRunner::op_embedding(const int32_t* ids, int64_t T, float* out) {
  if (by_oracle(Stage::Embedding)) {
    const Weight& embed = model_.get("model.embed_tokens.weight");
    const int64_t H = spec().hidden;
    for (int64_t t = 0; t < T; ++t) embed.row_f32(ids[t], out + t * H);
  } else {
    cpu::embedding(matrix("model.embed_tokens.weight"), ids, T, out);
  }
}

void CpuRunner::op_rmsnorm(Stage which, int64_t layer, const float* x, int64_t T, float* out) {
  const ModelSpec& s = spec();
  const std::vector<float>& w = norm_weight(which, layer);
  if (by_oracle(which)) oracle::rmsnorm(x, w.data(), out, T, s.hidden, s.rms_eps);
  else cpu::rmsnorm(x, w.data(), out, T, s.hidden, float(s.rms_eps));
}

void CpuRunner::op_silu_mul(const float* gate, const float* up, int64_t T, float* out) {
  const int64_t n = T * spec().intermediate;
  if (by_oracle(Stage::SiluMul)) oracle::silu_mul(gate, up, out, n);
  else cpu::silu_mul(gate, up, out, n);
}

void CpuRunner::op_add(Stage which, float* acc, const float* x, int64_t T) {
  const int64_t n = T * spec().hidden;
  if (by_oracle(which))
    for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
  else
    cpu::add(acc, x, n);
}

void CpuRunner::kv_read(int64_t l, int64_t rel, int64_t T, float* k, float* v) {
  const int64_t KV = spec().kv_dim();
  for (int64_t j = 0; j < T; ++j) {
    cache_->read_k(l, rel + j, k + j * KV);
    cache_->read_v(l, rel + j, v + j * KV);
  }
}

void CpuRunner::op_linear(Stage s, const float* x, int64_t T, const std::string& weight, const std::vector<float>& bias,
                       float* y) {
  // drop-qkv-bias: the projection runs as if the checkpoint had no bias.
  const bool drop = s == Stage::QkvProj && fault("drop-qkv-bias") && !by_oracle(s);
  const float* b = (bias.empty() || drop) ? nullptr : bias.data();
  if (by_oracle(s)) {
    oracle::linear(x, T, model_.get(weight), b, y, pool_->size());
  } else if (fault("bf16-accumulate")) {
    cpu::faulty::matmul_bf16_accumulate(x, T, matrix(weight), b, y, *pool_);
  } else {
    cpu::matmul(x, T, matrix(weight), b, y, *pool_);
  }
}

void CpuRunner::op_rope(int64_t l, float* q, float* k, int64_t T, int64_t pos) {
  const ModelSpec& s = spec();
  const Layer& L = layers_[size_t(l)];
  const int64_t hd = s.head_dim;
  const float eps = float(s.rms_eps);
  count(Stage::Rope);
  if (by_oracle(Stage::Rope)) {
    if (s.qk_norm) {
      oracle::rmsnorm(q, L.q_norm.data(), q, T * s.n_heads, hd, s.rms_eps);
      oracle::rmsnorm(k, L.k_norm.data(), k, T * s.n_kv_heads, hd, s.rms_eps);
    }
    oracle::rope(q, T, s.n_heads, hd, pos, inv_freq_);
    oracle::rope(k, T, s.n_kv_heads, hd, pos, inv_freq_);
    return;
  }
  const bool norm_after = s.qk_norm && fault("qk-norm-after-rope");
  auto qk_norm = [&] {
    cpu::rmsnorm(q, L.q_norm.data(), q, T * s.n_heads, hd, eps);
    cpu::rmsnorm(k, L.k_norm.data(), k, T * s.n_kv_heads, hd, eps);
  };
  if (s.qk_norm && !norm_after) qk_norm();
  // The decode step (one token) is where a prefill-only scaling bug shows.
  const float* freqs = (fault("rope-scaling-prefill-only") && T == 1) ? inv_freq_unscaled_.data() : inv_freq_.data();
  if (fault("rope-interleaved")) {
    cpu::faulty::rope_interleaved(q, T, s.n_heads, hd, pos, freqs);
    cpu::faulty::rope_interleaved(k, T, s.n_kv_heads, hd, pos, freqs);
  } else {
    cpu::rope(q, T, s.n_heads, hd, pos, freqs);
    cpu::rope(k, T, s.n_kv_heads, hd, pos, freqs);
  }
  if (norm_after) qk_norm();
}

void CpuRunner::op_kv_write(int64_t l, int64_t rel, const float* k, const float* v, int64_t T) {
  count(Stage::KvWrite);
  if (!by_oracle(Stage::KvWrite) && fault("stale-kv") && T == 1 && rel > 0) {
    // stale-kv: the decode step's row is filled from a buffer that was never updated (it
    // still holds the previous step's keys and values).
    grow(scratch_, 2 * spec().kv_dim());
    float *sk = scratch_.data(), *sv = scratch_.data() + spec().kv_dim();
    cache_->read_k(l, rel - 1, sk);
    cache_->read_v(l, rel - 1, sv);
    cache_->write(l, rel, sk, sv, 1);
    return;
  }
  cache_->write(l, rel, k, v, T);
}

void CpuRunner::op_attention(int64_t l, const float* q, int64_t T, int64_t rel, float* out) {
  const ModelSpec& s = spec();
  const int64_t KV = s.kv_dim(), hd = s.head_dim;
  count(Stage::Attention);
  if (by_oracle(Stage::Attention)) {
    const int64_t ctx = rel + T;
    grow(scratch_, 2 * ctx * KV);
    float *kk = scratch_.data(), *vv = scratch_.data() + ctx * KV;
    for (int64_t j = 0; j < ctx; ++j) {
      cache_->read_k(l, j, kk + j * KV);
      cache_->read_v(l, j, vv + j * KV);
    }
    oracle::attention(q, T, rel, kk, vv, s, out, pool_->size());
  } else if (fault("gqa-modulo")) {
    cpu::faulty::attention_gqa_modulo(q, T, rel, *cache_, l, s.n_heads, s.n_kv_heads, hd, float(s.attn_scale()), out);
  } else {
    const float scale = fault("attn-scale-hidden") ? float(1.0 / std::sqrt(double(s.hidden) / double(s.n_heads)))
                                                   : float(s.attn_scale());
    cpu::attention(q, T, rel, *cache_, l, s.n_heads, s.n_kv_heads, hd, scale, out, *pool_);
  }
}

void CpuRunner::run_layer(int64_t l, float* h, int64_t T, const ProbeFn& probe, ProbeLevel level) {
  const ModelSpec& s = spec();
  const Layer& L = layers_[size_t(l)];
  const int64_t H = s.hidden, Q = s.q_dim(), KV = s.kv_dim(), I = s.intermediate;
  const std::string p = probe ? fmt::format("layers.{}.", l) : std::string();
  auto emit = [&](ProbeLevel needed, std::string_view name, const float* data, int64_t cols) {
    if (probe && level >= needed) probe(p + std::string(name), data, T, cols);
  };
  auto norm = [&](Stage st, const float* in, float* out) {
    count(st);
    op_rmsnorm(st, l, in, T, out);
  };
  auto add = [&](Stage st, float* acc, const float* x) {
    count(st);
    op_add(st, acc, x, T);
  };
  float *x = x_.data(), *q = q_.data(), *k = k_.data(), *v = v_.data(), *attn = attn_.data(), *o = o_.data();
  float *gate = gate_.data(), *up = up_.data(), *act = act_.data(), *down = down_.data();

  norm(Stage::AttnNorm, h, x);
  emit(ProbeLevel::All, "attn_norm", x, H);

  count(Stage::QkvProj);
  op_linear(Stage::QkvProj, x, T, L.q->name, L.q_bias, q);
  op_linear(Stage::QkvProj, x, T, L.k->name, L.k_bias, k);
  op_linear(Stage::QkvProj, x, T, L.v->name, L.v_bias, v);

  op_rope(l, q, k, T, position_);
  emit(ProbeLevel::All, "q", q, Q);
  emit(ProbeLevel::All, "k", k, KV);
  emit(ProbeLevel::All, "v", v, KV);

  const int64_t rel = position_ - base_;  // the cache holds positions [base_, position_)
  op_kv_write(l, rel, k, v, T);
  op_attention(l, q, T, rel, attn);
  emit(ProbeLevel::All, "attn", attn, Q);

  count(Stage::OProj);
  op_linear(Stage::OProj, attn, T, L.o->name, L.o_bias, o);
  emit(ProbeLevel::All, "o_proj", o, H);
  add(Stage::AttnResidual, h, o);
  emit(ProbeLevel::All, "attn_residual", h, H);

  norm(Stage::MlpNorm, h, x);
  emit(ProbeLevel::All, "mlp_norm", x, H);
  count(Stage::GateUpProj);
  op_linear(Stage::GateUpProj, x, T, L.gate->name, L.gate_bias, gate);
  op_linear(Stage::GateUpProj, x, T, L.up->name, L.up_bias, up);
  emit(ProbeLevel::All, "gate", gate, I);
  emit(ProbeLevel::All, "up", up, I);
  count(Stage::SiluMul);
  op_silu_mul(gate, up, T, act);
  emit(ProbeLevel::All, "act", act, I);
  count(Stage::DownProj);
  op_linear(Stage::DownProj, act, T, L.down->name, L.down_bias, down);
  emit(ProbeLevel::All, "down", down, H);
  add(Stage::MlpResidual, h, down);
  emit(ProbeLevel::Layers, "out", h, H);
}

void CpuRunner::forward_layers(float* h, int64_t T, int64_t n_layers, const ProbeFn& probe, ProbeLevel level) {
  const ModelSpec& s = spec();
  if (T <= 0) fail("cpu target: no tokens to run");
  if (n_layers < 0 || n_layers > s.n_layers) fail("cpu target: {} layers requested, the model has {}", n_layers, s.n_layers);
  if (position_ + T > s.max_position)
    fail("cpu target: {} tokens at position {} exceed the model's context of {}", T, position_, s.max_position);
  grow(x_, T * s.hidden);
  grow(q_, T * s.q_dim());
  grow(k_, T * s.kv_dim());
  grow(v_, T * s.kv_dim());
  grow(attn_, T * s.q_dim());
  grow(o_, T * s.hidden);
  grow(gate_, T * s.intermediate);
  grow(up_, T * s.intermediate);
  grow(act_, T * s.intermediate);
  grow(down_, T * s.hidden);
  for (int64_t l = 0; l < n_layers; ++l) run_layer(l, h, T, probe, level);
  position_ += T;
}

std::vector<float> CpuRunner::forward(std::span<const int32_t> ids, bool all_logits, const ProbeFn& probe,
                                      ProbeLevel level) {
  const ModelSpec& s = spec();
  const int64_t T = int64_t(ids.size());
  if (T == 0) fail("cpu target: no tokens to run");
  for (int32_t id : ids)
    if (id < 0 || id >= s.vocab) fail("cpu target: token id {} is outside the vocabulary [0, {})", id, s.vocab);
  const int64_t H = s.hidden;
  std::vector<float> h(size_t(T * H));
  count(Stage::Embedding);
  op_embedding(ids.data(), T, h.data());
  if (probe && level >= ProbeLevel::All) probe("embed", h.data(), T, H);

  forward_layers(h.data(), T, s.n_layers, probe, level);

  const int64_t rows = all_logits ? T : 1;
  const float* last = h.data() + (T - rows) * H;
  std::vector<float> x(size_t(rows * H));
  count(Stage::FinalNorm);
  op_rmsnorm(Stage::FinalNorm, -1, last, rows, x.data());
  if (probe && level >= ProbeLevel::Layers) {
    // The probe sees every position's final norm, as the oracle's does.
    std::vector<float> all(size_t(T * H));
    cpu::rmsnorm(h.data(), final_norm_.data(), all.data(), T, H, float(s.rms_eps));
    probe("final_norm", all.data(), T, H);
  }
  std::vector<float> logits(size_t(rows * s.vocab));
  count(Stage::LmHead);
  static const std::vector<float> kNoBias;
  op_linear(Stage::LmHead, x.data(), rows, model_.lm_head().name, kNoBias, logits.data());
  if (probe && level >= ProbeLevel::Layers) probe("logits", logits.data(), rows, s.vocab);
  if (options_.profile) lap(Stage::Count);
  return logits;
}

}  // namespace tessera
