#include "targets/layered_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "oracle/ops.h"
#include "util/error.h"

namespace tessera {

namespace {
void grow(std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
}
}  // namespace

LayeredRunner::LayeredRunner(const Model& model, std::set<Stage> oracle_stages, bool profile)
    : model_(model), oracle_stages_(std::move(oracle_stages)), profile_(profile) {
  const ModelSpec& s = model.spec();
  layers_.reserve(size_t(s.n_layers));
  for (int64_t l = 0; l < s.n_layers; ++l) layers_.push_back(load_layer_params(model, l));
  final_norm_ = model.get("model.norm.weight").to_f32();
  inv_freq_ = oracle::rope_inv_freq(s);
}

const LayerParams& LayeredRunner::layer(int64_t l) const {
  if (l < 0 || l >= int64_t(layers_.size())) fail("{} target: no layer {}", target(), l);
  return layers_[size_t(l)];
}

std::vector<const Weight*> LayeredRunner::matrix_weights() const {
  std::vector<const Weight*> out;
  for (const LayerParams& L : layers_)
    for (const Weight* w : {L.q, L.k, L.v, L.o, L.gate, L.up, L.down}) out.push_back(w);
  out.push_back(&model_.get("model.embed_tokens.weight"));
  if (&model_.lm_head() != out.back()) out.push_back(&model_.lm_head());
  return out;
}

const std::vector<float>& LayeredRunner::norm_weight(Stage which, int64_t l) const {
  switch (which) {
    case Stage::FinalNorm: return final_norm_;
    case Stage::AttnNorm: return layer(l).attn_norm;
    case Stage::MlpNorm: return layer(l).mlp_norm;
    default: fail("{} target: stage '{}' is not an rmsnorm", target(), stage_name(which));
  }
}

void LayeredRunner::reset(int64_t start_position) {
  if (start_position < 0 || start_position >= spec().max_position)
    fail("{} target: start position {} is outside the model's context of {}", target(), start_position,
         spec().max_position);
  position_ = base_ = start_position;
}

void LayeredRunner::truncate(int64_t positions) {
  if (positions < base_ || positions > position_)
    fail("{} target: cannot truncate {} cached positions to {}", target(), position_, positions);
  position_ = positions;  // later writes overwrite the dropped rows
}

void LayeredRunner::select_sequence(int seq) {
  if (seq < 0 || seq >= max_sequences())
    fail("{} target: sequence {} is outside the {} it holds", target(), seq, max_sequences());
  if (seq == selected_) return;
  seqs_[size_t(selected_)] = {position_, base_};
  if (seqs_.size() <= size_t(seq)) seqs_.resize(size_t(seq) + 1);
  position_ = seqs_[size_t(seq)].position;
  base_ = seqs_[size_t(seq)].base;
  selected_ = seq;
  kv_select(seq);
}

void LayeredRunner::decode_batch(std::span<const int> seqs, std::span<const int32_t> ids, std::vector<float>& logits) {
  const ModelSpec& s = spec();
  const int64_t B = int64_t(seqs.size()), H = s.hidden;
  if (B == 0 || ids.size() != seqs.size())
    fail("{} target: a decode step of {} sequences with {} tokens", target(), seqs.size(), ids.size());
  const int keep = selected_;
  std::vector<int> seen;
  for (int64_t r = 0; r < B; ++r) {
    const int seq = seqs[size_t(r)];
    if (std::find(seen.begin(), seen.end(), seq) != seen.end())
      fail("{} target: sequence {} appears twice in one decode step", target(), seq);
    seen.push_back(seq);
    if (seq < 0 || seq >= max_sequences())
      fail("{} target: sequence {} is outside the {} it holds", target(), seq, max_sequences());
    const int64_t at = seq == selected_ ? position_ : size_t(seq) < seqs_.size() ? seqs_[size_t(seq)].position : 0;
    if (at + 1 > s.max_position)
      fail("{} target: sequence {} is at position {}, the model's context is {}", target(), seq, at, s.max_position);
    if (ids[size_t(r)] < 0 || ids[size_t(r)] >= s.vocab)
      fail("{} target: token id {} is outside the vocabulary [0, {})", target(), ids[size_t(r)], s.vocab);
  }
  begin_pass(B, B);
  in_pass_ = true;
  batch_ = seqs;
  struct PassEnd {
    LayeredRunner* r;
    int keep;
    ~PassEnd() {
      r->batch_ = {};
      r->in_pass_ = false;
      r->current_layer_ = 0;
      r->select_sequence(keep);
      try {
        r->end_pass();
      } catch (...) {  // already unwinding from the pass's own error, or nothing to report
      }
    }
  } pass_end{this, keep};
  std::vector<float> h(size_t(B * H)), x(size_t(B * H));
  for (int64_t r = 0; r < B; ++r) {
    count(Stage::Embedding);
    op_embedding(&ids[size_t(r)], 1, h.data() + r * H);
  }
  grow_buffers(B);
  for (int64_t l = 0; l < s.n_layers; ++l) run_layer(l, h.data(), B, {}, ProbeLevel::None);
  for (int64_t r = 0; r < B; ++r) {
    count(Stage::FinalNorm);
    op_rmsnorm(Stage::FinalNorm, -1, h.data() + r * H, 1, x.data() + r * H);
  }
  logits.resize(size_t(B * s.vocab));  // the LM head writes every element
  count(Stage::LmHead);
  static const std::vector<float> kNoBias;
  op_linear(Stage::LmHead, x.data(), B, model_.lm_head().name, kNoBias, logits.data());
  for (int64_t r = 0; r < B; ++r) {  // every row ran: each sequence moves one position on
    select_sequence(seqs[size_t(r)]);
    ++position_;
  }
  if (profile_) lap(Stage::Count);
}

void LayeredRunner::count(Stage s) {
  (by_oracle(s) ? oracle_calls_ : target_calls_)[size_t(s)]++;
  if (profile_) lap(s);
}

void LayeredRunner::lap(Stage next) {
  // Stages run back to back, so the time since the last lap belongs to the stage before.
  const auto now = std::chrono::steady_clock::now();
  if (current_ != Stage::Count) stage_seconds_[size_t(current_)] += std::chrono::duration<double>(now - last_lap_).count();
  current_ = next;
  last_lap_ = now;
}

std::map<std::string, double> LayeredRunner::stage_seconds() const {
  std::map<std::string, double> out;
  for (int i = 0; i < kStageCount; ++i)
    if (stage_seconds_[size_t(i)] > 0) out[stage_name(Stage(i))] = stage_seconds_[size_t(i)];
  return out;
}

std::map<std::string, int64_t> LayeredRunner::op_counters() const {
  std::map<std::string, int64_t> out;
  for (int i = 0; i < kStageCount; ++i) {
    if (target_calls_[size_t(i)]) out[stage_name(Stage(i))] = target_calls_[size_t(i)];
    if (oracle_calls_[size_t(i)]) out[std::string("oracle:") + stage_name(Stage(i))] = oracle_calls_[size_t(i)];
  }
  return out;
}

// --- the ops: the oracle's twin when the stage is swapped, else the target's kernel -------

void LayeredRunner::tap(Stage s, int64_t layer, int64_t T, const char* name, float* data, int64_t rows, int64_t cols,
                        bool fused) {
  if (tap_) tap_->on_output({s, layer == -2 ? current_layer_ : layer, T, fused, name, data, rows, cols});
}

namespace {
// The layer a canonical tensor name belongs to ("model.layers.3.mlp.up_proj.weight": 3), or -1.
int64_t layer_of(const std::string& weight) {
  constexpr std::string_view prefix = "model.layers.";
  if (!weight.starts_with(prefix)) return -1;
  return std::strtoll(weight.c_str() + prefix.size(), nullptr, 10);
}
}  // namespace

void LayeredRunner::op_embedding(const int32_t* ids, int64_t T, float* out) {
  if (!by_oracle(Stage::Embedding)) {
    kernel_embedding(ids, T, out);
  } else {
    const Weight& embed = model_.get("model.embed_tokens.weight");
    for (int64_t t = 0; t < T; ++t) embed.row_f32(ids[t], out + t * spec().hidden);
  }
  tap(Stage::Embedding, -1, T, "", out, T, spec().hidden);
}

void LayeredRunner::op_rmsnorm(Stage which, int64_t l, const float* x, int64_t T, float* out) {
  const std::vector<float>& w = norm_weight(which, l);
  if (by_oracle(which)) oracle::rmsnorm(x, w.data(), out, T, spec().hidden, spec().rms_eps);
  else kernel_rmsnorm(which, l, w.data(), x, T, out);
  tap(which, which == Stage::FinalNorm ? -1 : l, T, "", out, T, spec().hidden);
}

void LayeredRunner::op_linear(Stage s, const float* x, int64_t T, const std::string& weight,
                              const std::vector<float>& bias, float* y) {
  const float* b = bias.empty() ? nullptr : bias.data();
  if (by_oracle(s)) {
    oracle::linear(x, T, model_.get(weight), b, y, oracle_threads());
  } else if (interceptor_) {
    const LinearOut one[] = {{weight, b, y}};
    interceptor_->linears(*this, s, x, T, one, [&](const float* xx, std::span<const LinearOut> outs) {
      for (const LinearOut& o : outs) kernel_linear(s, xx, T, o.weight, o.bias, o.y);
    });
  } else {
    kernel_linear(s, x, T, weight, b, y);
  }
  if (tap_) tap(s, s == Stage::LmHead ? -1 : layer_of(weight), T, projection_output(weight), y, T, model_.get(weight).rows());
}

void LayeredRunner::op_linears(Stage s, const float* x, int64_t T, std::span<const LinearOut> outs) {
  if (by_oracle(s))
    for (const LinearOut& o : outs) oracle::linear(x, T, model_.get(o.weight), o.bias, o.y, oracle_threads());
  else if (interceptor_)
    interceptor_->linears(*this, s, x, T, outs,
                          [&](const float* xx, std::span<const LinearOut> o) { kernel_linears(s, xx, T, o); });
  else kernel_linears(s, x, T, outs);
  if (!tap_) return;  // the names and shapes below are looked up for a tap only: not on the hot path
  const bool fused = !by_oracle(s) && fuses_linears(s, T);
  for (const LinearOut& o : outs)
    tap(s, layer_of(o.weight), T, projection_output(o.weight), o.y, T, model_.get(o.weight).rows(), fused);
}

void LayeredRunner::op_rope(int64_t l, float* q, float* k, int64_t T, int64_t pos) {
  if (by_oracle(Stage::Rope)) oracle_rope(l, q, k, T, pos);
  else if (interceptor_) interceptor_->rope(*this, l, q, k, T, pos, [&](float* qq, float* kk) { kernel_rope(l, qq, kk, T, pos); });
  else kernel_rope(l, q, k, T, pos);
  tap(Stage::Rope, l, T, "q", q, T, spec().q_dim());
  tap(Stage::Rope, l, T, "k", k, T, spec().kv_dim());
}

void LayeredRunner::oracle_rope(int64_t l, float* q, float* k, int64_t T, int64_t pos) {
  const ModelSpec& s = spec();
  const LayerParams& L = layer(l);
  if (s.qk_norm) {
    oracle::rmsnorm(q, L.q_norm.data(), q, T * s.n_heads, s.head_dim, s.rms_eps);
    oracle::rmsnorm(k, L.k_norm.data(), k, T * s.n_kv_heads, s.head_dim, s.rms_eps);
  }
  oracle::rope(q, T, s.n_heads, s.head_dim, pos, inv_freq_);
  oracle::rope(k, T, s.n_kv_heads, s.head_dim, pos, inv_freq_);
}

void LayeredRunner::op_kv_write(int64_t l, int64_t rel, const float* k, const float* v, int64_t T) {
  std::vector<float> kk, vv;
  if (tap_) {  // what is written is what the tap leaves of k and v
    const int64_t n = T * spec().kv_dim();
    kk.assign(k, k + n);
    vv.assign(v, v + n);
    tap(Stage::KvWrite, l, T, "k", kk.data(), T, spec().kv_dim());
    tap(Stage::KvWrite, l, T, "v", vv.data(), T, spec().kv_dim());
    k = kk.data();
    v = vv.data();
  }
  if (by_oracle(Stage::KvWrite)) kv_store(l, rel, k, v, T);
  else if (interceptor_)
    interceptor_->kv_write(*this, l, rel, k, v, T,
                           [&](int64_t layer, const float* kk, const float* vv) { kernel_kv_write(layer, rel, kk, vv, T); });
  else kernel_kv_write(l, rel, k, v, T);
}

void LayeredRunner::op_attention(int64_t l, const float* q, int64_t T, int64_t rel, float* out) {
  if (!by_oracle(Stage::Attention)) {
    if (interceptor_)
      interceptor_->attention(*this, l, q, T, rel, out, [&](int64_t layer, float* o) { kernel_attention(layer, q, T, rel, o); });
    else kernel_attention(l, q, T, rel, out);
  } else {
    const int64_t KV = spec().kv_dim(), ctx = rel + T;
    grow(scratch_, 2 * ctx * KV);
    float *kk = scratch_.data(), *vv = scratch_.data() + ctx * KV;
    kv_read(l, 0, ctx, kk, vv);
    oracle::attention(q, T, rel, kk, vv, spec(), out, oracle_threads());
  }
  tap(Stage::Attention, l, T, "", out, T, spec().q_dim());
}

void LayeredRunner::op_silu_mul(const float* gate, const float* up, int64_t T, float* out) {
  if (by_oracle(Stage::SiluMul)) oracle::silu_mul(gate, up, out, T * spec().intermediate);
  else kernel_silu_mul(gate, up, T, out);
  tap(Stage::SiluMul, -2, T, "", out, T, spec().intermediate);
}

void LayeredRunner::op_add(Stage which, float* acc, const float* x, int64_t T) {
  if (!by_oracle(which)) {
    kernel_add(which, acc, x, T);
  } else {
    const int64_t n = T * spec().hidden;
    for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
  }
  tap(which, -2, T, "", acc, T, spec().hidden);
}

const char* LayeredRunner::projection_output(const std::string& weight) {
  for (const char* n : {"q", "k", "v", "o", "gate", "up", "down"})
    if (weight.find(std::string(".") + n + "_proj.") != std::string::npos) return n;
  return "";
}

// --- the forward pass ----------------------------------------------------------------------

void LayeredRunner::run_layer(int64_t l, float* h, int64_t T, const ProbeFn& probe, ProbeLevel level) {
  const ModelSpec& s = spec();
  const LayerParams& L = layers_[size_t(l)];
  current_layer_ = l;
  const int64_t H = s.hidden, Q = s.q_dim(), KV = s.kv_dim(), I = s.intermediate;
  const std::string p = probe ? fmt::format("layers.{}.", l) : std::string();
  auto emit = [&](ProbeLevel needed, std::string_view name, const float* data, int64_t cols) {
    if (probe && level >= needed) probe(p + std::string(name), data, T, cols);
  };
  float *x = x_.data(), *q = q_.data(), *k = k_.data(), *v = v_.data(), *attn = attn_.data(), *o = o_.data();
  float *gate = gate_.data(), *up = up_.data(), *act = act_.data(), *down = down_.data();
  // The stages other than the linears: one call for the T tokens of one sequence, or, in a
  // batched decode step, one call per row, each row exactly its own sequence's single step.
  auto each_row = [&](auto&& stage) {
    if (!batched_rows()) return stage(int64_t(0), T);
    for (int64_t r = 0; r < T; ++r) stage(r, int64_t(1));
  };

  each_row([&](int64_t r, int64_t n) {
    count(Stage::AttnNorm);
    op_rmsnorm(Stage::AttnNorm, l, h + r * H, n, x + r * H);
  });
  emit(ProbeLevel::All, "attn_norm", x, H);

  count(Stage::QkvProj);
  auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };
  const LinearOut qkv[] = {{L.q->name, bias(L.q_bias), q}, {L.k->name, bias(L.k_bias), k}, {L.v->name, bias(L.v_bias), v}};
  op_linears(Stage::QkvProj, x, T, qkv);

  auto rope_rows = [&](int64_t r, int64_t n) {
    count(Stage::Rope);
    op_rope(l, q + r * Q, k + r * KV, n, position_);
  };
  // Writes rows [r, r + n)'s k and v at the selected sequence's positions; returns where they
  // went in its cache (which holds positions [base_, position_)).
  auto write_kv_rows = [&](int64_t r, int64_t n) {
    const int64_t rel = position_ - base_;
    count(Stage::KvWrite);
    op_kv_write(l, rel, k + r * KV, v + r * KV, n);
    return rel;
  };
  auto attend_rows = [&](int64_t r, int64_t n) {
    const int64_t rel = write_kv_rows(r, n);
    count(Stage::Attention);
    op_attention(l, q + r * Q, n, rel, attn + r * Q);
  };
  if (!batched_rows()) {
    rope_rows(0, T);
    // The probes see q and k as RoPE leaves them, before anything else reads them (what a
    // debug skill compares a consumer's view with).
    emit(ProbeLevel::All, "q", q, Q);
    emit(ProbeLevel::All, "k", k, KV);
    emit(ProbeLevel::All, "v", v, KV);
    attend_rows(0, T);
  } else if (by_oracle(Stage::Attention) || interceptor_ || tap_) {
    for (int64_t r = 0; r < T; ++r) {  // each row on its own sequence's positions and cache
      select_sequence(batch_[size_t(r)]);
      rope_rows(r, 1);
      attend_rows(r, 1);
    }
  } else {
    // Nothing wraps the attention stage: every row's attention in one kernel call.
    batch_attention_.clear();
    for (int64_t r = 0; r < T; ++r) {
      select_sequence(batch_[size_t(r)]);
      rope_rows(r, 1);
      const int64_t rel = write_kv_rows(r, 1);
      count(Stage::Attention);
      batch_attention_.push_back({batch_[size_t(r)], rel, q + r * Q, attn + r * Q});
    }
    kernel_attention_rows(l, batch_attention_);
  }
  emit(ProbeLevel::All, "attn", attn, Q);

  count(Stage::OProj);
  op_linear(Stage::OProj, attn, T, L.o->name, L.o_bias, o);
  emit(ProbeLevel::All, "o_proj", o, H);
  each_row([&](int64_t r, int64_t n) {
    count(Stage::AttnResidual);
    op_add(Stage::AttnResidual, h + r * H, o + r * H, n);
  });
  emit(ProbeLevel::All, "attn_residual", h, H);

  each_row([&](int64_t r, int64_t n) {
    count(Stage::MlpNorm);
    op_rmsnorm(Stage::MlpNorm, l, h + r * H, n, x + r * H);
  });
  emit(ProbeLevel::All, "mlp_norm", x, H);
  count(Stage::GateUpProj);
  const LinearOut gate_up[] = {{L.gate->name, bias(L.gate_bias), gate}, {L.up->name, bias(L.up_bias), up}};
  op_linears(Stage::GateUpProj, x, T, gate_up);
  emit(ProbeLevel::All, "gate", gate, I);
  emit(ProbeLevel::All, "up", up, I);
  each_row([&](int64_t r, int64_t n) {
    count(Stage::SiluMul);
    op_silu_mul(gate + r * I, up + r * I, n, act + r * I);
  });
  emit(ProbeLevel::All, "act", act, I);
  count(Stage::DownProj);
  op_linear(Stage::DownProj, act, T, L.down->name, L.down_bias, down);
  emit(ProbeLevel::All, "down", down, H);
  each_row([&](int64_t r, int64_t n) {
    count(Stage::MlpResidual);
    op_add(Stage::MlpResidual, h + r * H, down + r * H, n);
  });
  emit(ProbeLevel::Layers, "out", h, H);
}

void LayeredRunner::kernel_attention_rows(int64_t l, std::span<const AttentionRowJob> rows) {
  for (const AttentionRowJob& a : rows) {
    select_sequence(a.seq);
    kernel_attention(l, a.q, 1, a.rel, a.out);
  }
}

void LayeredRunner::grow_buffers(int64_t T) {
  const ModelSpec& s = spec();
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
}

void LayeredRunner::forward_layers(float* h, int64_t T, int64_t n_layers, const ProbeFn& probe, ProbeLevel level) {
  const ModelSpec& s = spec();
  if (T <= 0) fail("{} target: no tokens to run", target());
  if (n_layers < 0 || n_layers > s.n_layers)
    fail("{} target: {} layers requested, the model has {}", target(), n_layers, s.n_layers);
  if (position_ + T > s.max_position)
    fail("{} target: {} tokens at position {} exceed the model's context of {}", target(), T, position_, s.max_position);
  const bool own_pass = !in_pass_;
  if (own_pass) begin_pass(T, 0);
  grow_buffers(T);
  try {
    for (int64_t l = 0; l < n_layers; ++l) run_layer(l, h, T, probe, level);
  } catch (...) {
    current_layer_ = 0;
    if (own_pass) end_pass();
    throw;
  }
  current_layer_ = 0;
  position_ += T;
  if (own_pass) end_pass();
}

std::vector<float> LayeredRunner::forward(std::span<const int32_t> ids, bool all_logits, const ProbeFn& probe,
                                          ProbeLevel level) {
  const ModelSpec& s = spec();
  const int64_t T = int64_t(ids.size());
  if (T == 0) fail("{} target: no tokens to run", target());
  for (int32_t id : ids)
    if (id < 0 || id >= s.vocab) fail("{} target: token id {} is outside the vocabulary [0, {})", target(), id, s.vocab);
  const int64_t H = s.hidden;
  if (position_ + T > s.max_position)
    fail("{} target: {} tokens at position {} exceed the model's context of {}", target(), T, position_, s.max_position);
  const int64_t rows = all_logits ? T : 1;
  begin_pass(T, rows);
  in_pass_ = true;
  struct PassEnd {
    LayeredRunner* r;
    ~PassEnd() {
      r->in_pass_ = false;
      try {
        r->end_pass();
      } catch (...) {  // already unwinding from the pass's own error, or nothing to report
      }
    }
  } pass_end{this};
  std::vector<float> h(size_t(T * H));
  count(Stage::Embedding);
  op_embedding(ids.data(), T, h.data());
  if (probe && level >= ProbeLevel::All) probe("embed", h.data(), T, H);

  forward_layers(h.data(), T, s.n_layers, probe, level);

  const float* last = h.data() + (T - rows) * H;
  std::vector<float> x(size_t(rows * H));
  count(Stage::FinalNorm);
  op_rmsnorm(Stage::FinalNorm, -1, last, rows, x.data());
  if (probe && level >= ProbeLevel::Layers) {
    // The probe sees every position's final norm, as the oracle's does (not counted: the
    // step itself normalizes only the rows whose logits it returns).
    std::vector<float> all(size_t(T * H));
    op_rmsnorm(Stage::FinalNorm, -1, h.data(), T, all.data());
    probe("final_norm", all.data(), T, H);
  }
  std::vector<float> logits(size_t(rows * s.vocab));
  count(Stage::LmHead);
  static const std::vector<float> kNoBias;
  op_linear(Stage::LmHead, x.data(), rows, model_.lm_head().name, kNoBias, logits.data());
  if (probe && level >= ProbeLevel::Layers) probe("logits", logits.data(), rows, s.vocab);
  if (profile_) lap(Stage::Count);
  return logits;
}

}  // namespace tessera
