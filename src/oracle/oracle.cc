#include "oracle/oracle.h"

#include <string_view>

#include "model/layer_params.h"
#include "oracle/ops.h"
#include "util/error.h"
#include "util/parallel.h"

namespace tessera {

const std::vector<std::string>& layer_probe_suffixes() {
  static const std::vector<std::string> names = {"attn_norm", "q",        "k",     "v",  "attn",
                                                 "o_proj",    "attn_residual", "mlp_norm", "gate",
                                                 "up",        "act",      "down",  "out"};
  return names;
}

namespace {
const float* ptr_or_null(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }
}  // namespace

Oracle::Oracle(const Model& model, int threads)
    : model_(model), threads_(threads > 0 ? threads : default_threads()) {
  const ModelSpec& s = model.spec();
  layers_.resize(static_cast<size_t>(s.n_layers));
  for (int64_t l = 0; l < s.n_layers; ++l) layers_[size_t(l)].p = load_layer_params(model, l);
  final_norm_ = model.get("model.norm.weight").to_f32();
  inv_freq_ = oracle::rope_inv_freq(s);
}

void Oracle::reset(int64_t start_position) {
  if (start_position < 0 || start_position >= model_.spec().max_position)
    fail("oracle: start position {} is outside the model's context of {}", start_position, model_.spec().max_position);
  position_ = start_position;
  base_ = start_position;
  for (Layer& L : layers_) {
    L.k_cache.clear();
    L.v_cache.clear();
  }
}

void Oracle::truncate(int64_t positions) {
  if (positions < base_ || positions > position_) fail("oracle: cannot truncate {} cached positions to {}", position_, positions);
  position_ = positions;
  for (Layer& L : layers_) {
    L.k_cache.resize(size_t((positions - base_) * model_.spec().kv_dim()));
    L.v_cache.resize(size_t((positions - base_) * model_.spec().kv_dim()));
  }
}

std::vector<float> Oracle::forward(std::span<const int32_t> ids, bool all_logits, const ProbeFn& probe,
                                   ProbeLevel level) {
  const ModelSpec& s = model_.spec();
  const int64_t T = int64_t(ids.size());
  if (T == 0) fail("oracle: no tokens to run");
  if (position_ + T > s.max_position)
    fail("oracle: {} tokens at position {} exceed the model's context of {}", T, position_, s.max_position);
  for (int32_t id : ids)
    if (id < 0 || id >= s.vocab) fail("oracle: token id {} is outside the vocabulary [0, {})", id, s.vocab);

  const int64_t H = s.hidden, Q = s.q_dim(), KV = s.kv_dim(), I = s.intermediate, hd = s.head_dim;
  // Probe names are built only when a probe asks for them: decode stays free of string work.
  auto emit = [&](ProbeLevel needed, std::string_view prefix, std::string_view name, const std::vector<float>& v,
                  int64_t cols) {
    if (probe && level >= needed) probe(std::string(prefix) + std::string(name), v.data(), int64_t(v.size()) / cols, cols);
  };

  std::vector<float> h(static_cast<size_t>(T * H));
  const Weight& embed = model_.get("model.embed_tokens.weight");
  for (int64_t t = 0; t < T; ++t) embed.row_f32(ids[size_t(t)], h.data() + t * H);
  emit(ProbeLevel::All, "", "embed", h, H);

  std::vector<float> x(static_cast<size_t>(T * H)), q(static_cast<size_t>(T * Q)), k(static_cast<size_t>(T * KV)), v(static_cast<size_t>(T * KV));
  std::vector<float> attn(static_cast<size_t>(T * Q)), o(static_cast<size_t>(T * H));
  std::vector<float> gate(static_cast<size_t>(T * I)), up(static_cast<size_t>(T * I)), act(static_cast<size_t>(T * I)), down(static_cast<size_t>(T * H));

  for (int64_t l = 0; l < s.n_layers; ++l) {
    Layer& layer = layers_[size_t(l)];
    const LayerParams& L = layer.p;
    const std::string p = probe ? fmt::format("layers.{}.", l) : std::string();

    oracle::rmsnorm(h.data(), L.attn_norm.data(), x.data(), T, H, s.rms_eps);
    emit(ProbeLevel::All, p, "attn_norm", x, H);
    oracle::linear(x.data(), T, *L.q, ptr_or_null(L.q_bias), q.data(), threads_);
    oracle::linear(x.data(), T, *L.k, ptr_or_null(L.k_bias), k.data(), threads_);
    oracle::linear(x.data(), T, *L.v, ptr_or_null(L.v_bias), v.data(), threads_);
    if (s.qk_norm) {  // per head, after bias, before RoPE
      oracle::rmsnorm(q.data(), L.q_norm.data(), q.data(), T * s.n_heads, hd, s.rms_eps);
      oracle::rmsnorm(k.data(), L.k_norm.data(), k.data(), T * s.n_kv_heads, hd, s.rms_eps);
    }
    oracle::rope(q.data(), T, s.n_heads, hd, position_, inv_freq_);
    oracle::rope(k.data(), T, s.n_kv_heads, hd, position_, inv_freq_);
    emit(ProbeLevel::All, p, "q", q, Q);
    emit(ProbeLevel::All, p, "k", k, KV);
    emit(ProbeLevel::All, p, "v", v, KV);

    layer.k_cache.insert(layer.k_cache.end(), k.begin(), k.end());
    layer.v_cache.insert(layer.v_cache.end(), v.begin(), v.end());
    oracle::attention(q.data(), T, position_ - base_, layer.k_cache.data(), layer.v_cache.data(), s, attn.data(), threads_);
    emit(ProbeLevel::All, p, "attn", attn, Q);
    oracle::linear(attn.data(), T, *L.o, ptr_or_null(L.o_bias), o.data(), threads_);
    emit(ProbeLevel::All, p, "o_proj", o, H);
    for (size_t i = 0; i < h.size(); ++i) h[i] += o[i];
    emit(ProbeLevel::All, p, "attn_residual", h, H);

    oracle::rmsnorm(h.data(), L.mlp_norm.data(), x.data(), T, H, s.rms_eps);
    emit(ProbeLevel::All, p, "mlp_norm", x, H);
    oracle::linear(x.data(), T, *L.gate, ptr_or_null(L.gate_bias), gate.data(), threads_);
    oracle::linear(x.data(), T, *L.up, ptr_or_null(L.up_bias), up.data(), threads_);
    emit(ProbeLevel::All, p, "gate", gate, I);
    emit(ProbeLevel::All, p, "up", up, I);
    oracle::silu_mul(gate.data(), up.data(), act.data(), T * I);
    emit(ProbeLevel::All, p, "act", act, I);
    oracle::linear(act.data(), T, *L.down, ptr_or_null(L.down_bias), down.data(), threads_);
    emit(ProbeLevel::All, p, "down", down, H);
    for (size_t i = 0; i < h.size(); ++i) h[i] += down[i];
    emit(ProbeLevel::Layers, p, "out", h, H);
  }
  position_ += T;

  oracle::rmsnorm(h.data(), final_norm_.data(), x.data(), T, H, s.rms_eps);
  emit(ProbeLevel::Layers, "", "final_norm", x, H);
  const int64_t rows = all_logits ? T : 1;
  const float* last = x.data() + (T - rows) * H;
  std::vector<float> logits(static_cast<size_t>(rows * s.vocab));
  oracle::linear(last, rows, model_.lm_head(), nullptr, logits.data(), threads_);
  emit(ProbeLevel::Layers, "", "logits", logits, s.vocab);
  return logits;
}

}  // namespace tessera
