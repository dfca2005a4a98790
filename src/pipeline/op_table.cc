#include "pipeline/op_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "model/tensors.h"
#include "oracle/emulate.h"
#include "oracle/ops.h"
#include "pipeline/capture.h"
#include "pipeline/phases.h"
#include "util/error.h"
#include "util/stats.h"

namespace tessera {

using gates::GateResult;
using gates::GuardedBuffer;
using gates::TensorMetrics;
namespace em = oracle::emulated;

const std::vector<float>& OpInputs::at(const std::string& name) const {
  auto it = probe.find(name);
  if (it == probe.end()) fail("internal: op table input '{}' was not captured", name);
  return it->second;
}

OpInputs OpInputs::decoy() const {
  OpInputs d = *this;
  if (T < 2) return d;  // one row: nothing to rotate (a decode-only input set)
  std::rotate(d.ids.begin(), d.ids.begin() + 1, d.ids.end());
  for (auto& [name, v] : d.probe)
    if (v.size() % size_t(T) == 0) std::rotate(v.begin(), v.begin() + long(v.size() / size_t(T)), v.end());
  return d;
}

OpInputs op_inputs(const Model& model, OracleRunner& oracle, std::vector<int32_t> ids, int host_threads) {
  OpInputs in;
  in.model = &model;
  in.T = int64_t(ids.size());
  in.ids = std::move(ids);
  in.host_threads = host_threads;
  Capture cap;
  oracle.reset();
  oracle.forward(in.ids, false, cap.fn([](const std::string& n) { return n == "embed" || n.starts_with("layers.0."); }),
                 ProbeLevel::All);
  oracle.reset();
  for (auto& [name, v] : cap.values) in.probe[name == "embed" ? name : name.substr(9)] = std::move(v);
  return in;
}

namespace {

// ---- helpers the rows share -----------------------------------------------------------

std::vector<float> f32_or_empty(const Model& m, const std::string& name) {
  const Weight* w = m.find(name);
  return w ? w->to_f32() : std::vector<float>{};
}

std::vector<int64_t> all_columns(int64_t n) { return em::sample_columns(n, n); }

// Positions the every-position LM head row runs (its cost is rows x vocab x hidden).
constexpr int64_t kLmHeadRows = 8;

// Every value of an output (elementwise ops are emulated in full).
std::vector<std::vector<float>> whole(std::vector<std::vector<int64_t>>& cols, const std::vector<OpOutput>& outs,
                                      std::vector<std::vector<float>> values) {
  cols.clear();
  for (const OpOutput& o : outs) cols.push_back(all_columns(o.cols));
  return values;
}

// The linears of one stage, run as the forward pass runs them (op_linears: the fused kernel
// where the plan fuses), at `rows` tokens (the last rows of x).
struct LinearSpec {
  std::string role, weight, bias;
};
OpCase linear_case(const OpInputs& in, Stage stage, const std::string& x_probe, std::vector<LinearSpec> specs,
                   int64_t rows, std::vector<float> x_override = {}) {
  const Model& m = *in.model;
  auto x_all = std::make_shared<std::vector<float>>(x_override.empty() ? in.at(x_probe) : std::move(x_override));
  const int64_t K = m.get(specs[0].weight).cols();
  const int64_t avail = int64_t(x_all->size()) / K;
  auto x = std::make_shared<std::vector<float>>(x_all->end() - rows * K, x_all->end());
  OpCase c;
  c.kernel = "gemm";
  c.stage = stage;
  c.tokens = rows;
  (void)avail;
  auto biases = std::make_shared<std::vector<std::vector<float>>>();
  for (const LinearSpec& sp : specs) {
    const Weight& w = m.get(sp.weight);
    biases->push_back(sp.bias.empty() ? std::vector<float>{} : f32_or_empty(m, sp.bias));
    OpOutput o;
    o.role = sp.role + (biases->back().empty() ? "" : "+bias");
    o.rows = rows;
    o.cols = w.rows();
    o.shape = fmt::format("[{},{}]x[{},{}]^T", rows, K, w.rows(), K);
    o.ref.resize(size_t(rows * w.rows()));
    oracle::linear(x->data(), rows, w, biases->back().empty() ? nullptr : biases->back().data(), o.ref.data(), in.host_threads);
    c.outputs.push_back(std::move(o));
  }
  auto weights = std::make_shared<std::vector<std::string>>();
  for (const LinearSpec& sp : specs) weights->push_back(sp.weight);
  c.run = [x, weights, biases, stage, rows](StagedRunner& t, const std::vector<float*>& outs) {
    if (stage == Stage::QkvProj || stage == Stage::GateUpProj) {
      std::vector<StagedRunner::LinearOut> lo;
      for (size_t i = 0; i < weights->size(); ++i)
        lo.push_back({(*weights)[i], (*biases)[i].empty() ? nullptr : (*biases)[i].data(), outs[i]});
      t.op_linears(stage, x->data(), rows, lo);
    } else {
      t.op_linear(stage, x->data(), rows, (*weights)[0], (*biases)[0], outs[0]);
    }
  };
  const Model* mp = &m;
  c.emulate = [x, weights, biases, rows, mp](const oracle::Numerics& num, std::vector<std::vector<int64_t>>& cols) {
    std::vector<std::vector<float>> out;
    cols.clear();
    for (size_t i = 0; i < weights->size(); ++i) {
      const Weight& w = mp->get((*weights)[i]);
      // A large matrix's expected error is a statistic: 2048 of its output columns give it.
      cols.push_back(em::sample_columns(w.rows(), 2048));
      std::vector<float> y(size_t(rows) * cols.back().size());
      em::linear(num, x->data(), rows, w, (*biases)[i].empty() ? nullptr : (*biases)[i].data(), cols.back(), y.data());
      out.push_back(std::move(y));
    }
    return out;
  };
  return c;
}

OpOutput output(std::string role, std::string shape, int64_t rows, int64_t cols, std::vector<float> ref) {
  return {std::move(role), std::move(shape), rows, cols, std::move(ref)};
}

// ---- the rows ----------------------------------------------------------------------------

std::vector<OpCase> embedding_cases(const OpInputs& in) {
  const ModelSpec& s = in.model->spec();
  const int64_t T = in.T, H = s.hidden;
  OpCase c;
  c.kernel = "embedding";
  c.stage = Stage::Embedding;
  c.tokens = T;
  c.outputs.push_back(output("embed_tokens", fmt::format("[{},{}]", T, H), T, H, in.at("embed")));
  auto ids = std::make_shared<std::vector<int32_t>>(in.ids);
  c.run = [ids](StagedRunner& t, const std::vector<float*>& o) { t.op_embedding(ids->data(), int64_t(ids->size()), o[0]); };
  const Model* m = in.model;
  c.emulate = [ids, m, H, c_outs = c.outputs](const oracle::Numerics& num, std::vector<std::vector<int64_t>>& cols) {
    std::vector<float> y(ids->size() * size_t(H));
    const Weight& e = m->get("model.embed_tokens.weight");
    for (size_t t = 0; t < ids->size(); ++t) e.row_f32((*ids)[t], y.data() + t * size_t(H));
    em::round_all(num.weights, y.data(), int64_t(y.size()));
    em::round_all(num.activations, y.data(), int64_t(y.size()));
    return whole(cols, c_outs, {std::move(y)});
  };
  return {c};
}

// The layers whose own weights and cache every per-layer row runs with (on layer 0's
// activations: the kernel and what it indexes are what is checked): the first, a middle and
// the last, so that a kernel reading another layer's weights, norm or cache slot, or one
// right for layer 0 alone, disagrees somewhere.
std::vector<int64_t> gated_layers(const ModelSpec& s) {
  std::set<int64_t> out = {0, s.n_layers / 2, s.n_layers - 1};
  out.erase(-1);
  return {out.begin(), out.end()};
}

// " (layer l)" for a case of a layer other than 0 (layer 0's roles read as before).
std::string layer_suffix(int64_t l) { return l == 0 ? std::string() : fmt::format(" (layer {})", l); }

// Other values for the other gated layers' cache slots (keys rotated by one row, values
// negated), written after `layer`'s own: a kernel that writes or reads another layer's slot
// then sees these instead of its layer's.
struct CacheDecoys {
  std::vector<int64_t> layers;
  std::shared_ptr<std::vector<float>> k, v;
  CacheDecoys(const ModelSpec& s, const std::vector<float>& keys, const std::vector<float>& values, int64_t T)
      : layers(gated_layers(s)), k(std::make_shared<std::vector<float>>(keys)),
        v(std::make_shared<std::vector<float>>(values)) {
    const int64_t KV = s.kv_dim();
    if (T > 1) std::rotate(k->begin(), k->begin() + KV, k->end());
    for (float& x : *v) x = -x;
  }
  void write_others(StagedRunner& t, int64_t layer, int64_t T) const {
    for (const int64_t m : layers)
      if (m != layer) t.op_kv_write(m, 0, k->data(), v->data(), T);
  }
};

std::vector<OpCase> rmsnorm_cases(const OpInputs& in) {
  const ModelSpec& s = in.model->spec();
  const int64_t T = in.T, H = s.hidden;
  std::vector<OpCase> out;
  auto one = [&](const std::string& role, Stage which, int64_t layer, const std::string& weight,
                 const std::vector<float>& x, std::vector<float> ref) {
    OpCase c;
    c.kernel = "rmsnorm";
    c.stage = which;
    c.tokens = T;
    c.layer = layer;
    c.outputs.push_back(output(role, fmt::format("[{},{}]", T, H), T, H, std::move(ref)));
    auto xs = std::make_shared<std::vector<float>>(x);
    auto w = std::make_shared<std::vector<float>>(in.model->get(weight).to_f32());
    c.run = [xs, which, layer, T](StagedRunner& t, const std::vector<float*>& o) {
      t.op_rmsnorm(which, layer, xs->data(), T, o[0]);
    };
    const double eps = s.rms_eps;
    c.emulate = [xs, w, T, H, eps, outs = c.outputs](const oracle::Numerics& num, std::vector<std::vector<int64_t>>& cols) {
      std::vector<float> y(size_t(T * H));
      em::rmsnorm(num, xs->data(), w->data(), y.data(), T, H, eps);
      return whole(cols, outs, {std::move(y)});
    };
    out.push_back(std::move(c));
  };
  // Each gated layer's norms on layer 0's inputs, with that layer's weights.
  auto norm_ref = [&](const std::vector<float>& x, const std::string& weight) {
    std::vector<float> ref(size_t(T * H));
    const std::vector<float> w = in.model->get(weight).to_f32();
    oracle::rmsnorm(x.data(), w.data(), ref.data(), T, H, s.rms_eps);
    return ref;
  };
  for (const int64_t l : gated_layers(s)) {
    const std::string attn_w = layer_tensor(l, "input_layernorm.weight");
    const std::string mlp_w = layer_tensor(l, "post_attention_layernorm.weight");
    one("attn_norm" + layer_suffix(l), Stage::AttnNorm, l, attn_w, in.at("embed"),
        l == 0 ? in.at("attn_norm") : norm_ref(in.at("embed"), attn_w));
    one("mlp_norm" + layer_suffix(l), Stage::MlpNorm, l, mlp_w, in.at("attn_residual"),
        l == 0 ? in.at("mlp_norm") : norm_ref(in.at("attn_residual"), mlp_w));
  }
  one("final_norm", Stage::FinalNorm, 0, "model.norm.weight", in.at("out"), norm_ref(in.at("out"), "model.norm.weight"));
  return out;
}

// Layer 0, then the first layer of each other combination of storage types the stage's
// matrices have (a Q4_K_M file keeps some layers' v_proj and down_proj in Q6_K or Q8_0): a
// case per (op, weight format) the model runs, each with its own error model; and the gated
// layers (gated_layers).
std::vector<int64_t> layers_per_format(const Model& m, const std::vector<std::string>& suffixes) {
  std::set<int64_t> out;
  std::set<std::vector<DType>> seen;
  for (int64_t l = 0; l < m.spec().n_layers; ++l) {
    std::vector<DType> types;
    for (const std::string& sfx : suffixes) types.push_back(m.get(layer_tensor(l, sfx.c_str())).info.dtype);
    if (seen.insert(types).second) out.insert(l);
  }
  for (const int64_t l : gated_layers(m.spec())) out.insert(l);  // and the gated layers' own matrices
  return {out.begin(), out.end()};
}

std::vector<OpCase> projection_cases(const OpInputs& in) {
  const ModelSpec& s = in.model->spec();
  std::vector<OpCase> out;
  struct Proj {
    Stage stage;
    const char* x_probe;
    std::vector<std::pair<const char*, const char*>> outs;  // role, tensor (without .weight)
    bool bias;
  };
  const Proj projs[] = {
      {Stage::QkvProj, "attn_norm", {{"q_proj", "self_attn.q_proj"}, {"k_proj", "self_attn.k_proj"}, {"v_proj", "self_attn.v_proj"}}, s.qkv_bias},
      {Stage::OProj, "attn", {{"o_proj", "self_attn.o_proj"}}, s.o_bias},
      {Stage::GateUpProj, "mlp_norm", {{"gate_proj", "mlp.gate_proj"}, {"up_proj", "mlp.up_proj"}}, s.mlp_bias},
      {Stage::DownProj, "act", {{"down_proj", "mlp.down_proj"}}, s.mlp_bias},
  };
  for (int64_t rows : {in.T, int64_t(1)})
    for (const Proj& p : projs) {
      std::vector<std::string> weights;
      for (const auto& [role, t] : p.outs) weights.push_back(std::string(t) + ".weight");
      // Other layers' matrices run on layer 0's activations: the kernel is what is checked.
      for (const int64_t l : layers_per_format(*in.model, weights)) {
        std::vector<LinearSpec> specs;
        for (const auto& [role, t] : p.outs) {
          const std::string w = layer_tensor(l, (std::string(t) + ".weight").c_str());
          std::string r = role;
          if (l > 0) r += fmt::format(" (layer {}: {})", l, dtype_name(in.model->get(w).info.dtype));
          specs.push_back({r, w, p.bias ? layer_tensor(l, (std::string(t) + ".bias").c_str()) : std::string()});
        }
        OpCase c = linear_case(in, p.stage, p.x_probe, std::move(specs), rows);
        c.layer = l;
        out.push_back(std::move(c));
      }
    }
  // The LM head on the final norm of layer 0's last rows: at the decode shape (generation's
  // prefill needs only the last row too), and over several positions as a forward pass that
  // returns every position's logits (its default; a perplexity run) takes it: a GEMM.
  const std::vector<float> w = in.model->get("model.norm.weight").to_f32();
  std::vector<int64_t> head_rows = {1};
  if (in.T > 1) head_rows.push_back(std::min<int64_t>(in.T, kLmHeadRows));
  for (const int64_t rows : head_rows) {
    std::vector<float> x(size_t(rows * s.hidden));
    oracle::rmsnorm(in.at("out").data() + (in.T - rows) * s.hidden, w.data(), x.data(), rows, s.hidden, s.rms_eps);
    out.push_back(linear_case(in, Stage::LmHead, "", {{"lm_head", in.model->lm_head().name, ""}}, rows, std::move(x)));
  }
  return out;
}

std::vector<OpCase> rope_cases(const OpInputs& in) {
  const ModelSpec& s = in.model->spec();
  const Model& m = *in.model;
  const int64_t T = in.T, Q = s.q_dim(), KV = s.kv_dim(), hd = s.head_dim;
  const std::vector<float> qb = f32_or_empty(m, layer_tensor(0, "self_attn.q_proj.bias"));
  const std::vector<float> kb = f32_or_empty(m, layer_tensor(0, "self_attn.k_proj.bias"));
  auto q_raw = std::make_shared<std::vector<float>>(size_t(T * Q));
  auto k_raw = std::make_shared<std::vector<float>>(size_t(T * KV));
  oracle::linear(in.at("attn_norm").data(), T, m.get(layer_tensor(0, "self_attn.q_proj.weight")), qb.empty() ? nullptr : qb.data(),
                 q_raw->data(), in.host_threads);
  oracle::linear(in.at("attn_norm").data(), T, m.get(layer_tensor(0, "self_attn.k_proj.weight")), kb.empty() ? nullptr : kb.data(),
                 k_raw->data(), in.host_threads);
  auto inv_freq = std::make_shared<std::vector<float>>(oracle::rope_inv_freq(s));
  std::vector<OpCase> out;
  // Layer 0 at the prefill and decode shapes; the other gated layers (their own q/k norms)
  // at the decode shape, far into the context.
  for (const int64_t layer : gated_layers(s))
  for (auto [rows, pos] : {std::pair<int64_t, int64_t>{T, 0}, {1, long_position(s, 1)}}) {
    if (layer != 0 && rows != 1) continue;
    auto qn = std::make_shared<std::vector<float>>(f32_or_empty(m, layer_tensor(layer, "self_attn.q_norm.weight")));
    auto kn = std::make_shared<std::vector<float>>(f32_or_empty(m, layer_tensor(layer, "self_attn.k_norm.weight")));
    const std::string role = (s.qk_norm ? "qk_norm+rope" : "rope") + layer_suffix(layer);
    auto qin = std::make_shared<std::vector<float>>(q_raw->end() - rows * Q, q_raw->end());
    auto kin = std::make_shared<std::vector<float>>(k_raw->end() - rows * KV, k_raw->end());
    std::vector<float> qref = *qin, kref = *kin;
    if (s.qk_norm) {
      oracle::rmsnorm(qref.data(), qn->data(), qref.data(), rows * s.n_heads, hd, s.rms_eps);
      oracle::rmsnorm(kref.data(), kn->data(), kref.data(), rows * s.n_kv_heads, hd, s.rms_eps);
    }
    oracle::rope(qref.data(), rows, s.n_heads, hd, pos, *inv_freq);
    oracle::rope(kref.data(), rows, s.n_kv_heads, hd, pos, *inv_freq);
    OpCase c;
    c.kernel = "rope";
    c.stage = Stage::Rope;
    c.tokens = rows;
    c.layer = layer;
    c.outputs.push_back(output(role + " q", fmt::format("[{},{}] at position {}", rows, Q, pos), rows, Q, std::move(qref)));
    c.outputs.push_back(output(role + " k", fmt::format("[{},{}] at position {}", rows, KV, pos), rows, KV, std::move(kref)));
    // rows = rows: a structured binding is captured by init-capture (clang < 16 refuses it by name).
    c.run = [qin, kin, layer, rows = rows, pos = pos](StagedRunner& t, const std::vector<float*>& o) {
      std::copy(qin->begin(), qin->end(), o[0]);
      std::copy(kin->begin(), kin->end(), o[1]);
      t.op_rope(layer, o[0], o[1], rows, pos);
    };
    const ModelSpec spec = s;
    c.emulate = [qin, kin, qn, kn, inv_freq, rows = rows, pos = pos, spec, outs = c.outputs](const oracle::Numerics& num,
                                                                              std::vector<std::vector<int64_t>>& cols) {
      std::vector<float> q = *qin, k = *kin;
      if (spec.qk_norm) {
        em::rmsnorm(num, q.data(), qn->data(), q.data(), rows * spec.n_heads, spec.head_dim, spec.rms_eps);
        em::rmsnorm(num, k.data(), kn->data(), k.data(), rows * spec.n_kv_heads, spec.head_dim, spec.rms_eps);
      }
      em::rope(num, q.data(), rows, spec.n_heads, spec.head_dim, pos, *inv_freq);
      em::rope(num, k.data(), rows, spec.n_kv_heads, spec.head_dim, pos, *inv_freq);
      return whole(cols, outs, {std::move(q), std::move(k)});
    };
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<OpCase> kv_write_cases(const OpInputs& in) {
  const ModelSpec& s = in.model->spec();
  const int64_t T = in.T, KV = s.kv_dim();
  std::vector<OpCase> out;
  auto k = std::make_shared<std::vector<float>>(in.at("k"));
  auto v = std::make_shared<std::vector<float>>(in.at("v"));
  const CacheDecoys decoys(s, in.at("k"), in.at("v"), T);
  for (const int64_t layer : gated_layers(s)) {  // each layer's own cache slot, the others' holding decoys
    OpCase c;
    c.kernel = "kv_write";
    c.stage = Stage::KvWrite;
    c.tokens = T;
    c.layer = layer;
    c.outputs.push_back(output("keys round trip" + layer_suffix(layer), fmt::format("[{},{}]", T, KV), T, KV, in.at("k")));
    c.outputs.push_back(output("values round trip" + layer_suffix(layer), fmt::format("[{},{}]", T, KV), T, KV, in.at("v")));
    c.run = [k, v, T, layer, decoys](StagedRunner& t, const std::vector<float*>& o) {
      t.reset();
      t.op_kv_write(layer, 0, k->data(), v->data(), T);
      decoys.write_others(t, layer, T);
      t.kv_read(layer, 0, T, o[0], o[1]);
      t.reset();
    };
    c.emulate = [k, v, outs = c.outputs](const oracle::Numerics& num, std::vector<std::vector<int64_t>>& cols) {
      std::vector<float> kk = *k, vv = *v;
      em::round_all(num.kv_cache, kk.data(), int64_t(kk.size()));
      em::round_all(num.kv_cache, vv.data(), int64_t(vv.size()));
      return whole(cols, outs, {std::move(kk), std::move(vv)});
    };
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<OpCase> attention_cases(const OpInputs& in) {
  const ModelSpec& s = in.model->spec();
  const int64_t T = in.T, Q = s.q_dim();
  std::vector<OpCase> out;
  const CacheDecoys decoys(s, in.at("k"), in.at("v"), T);
  // rows: the last `rows` queries, at cache rows T - rows .. T - 1, over a cache of T rows.
  auto one = [&](std::string role, std::string shape, std::vector<float> q_all, std::vector<float> k, std::vector<float> v,
                 int64_t rows, std::vector<float> ref, int64_t layer) {
    OpCase c;
    c.kernel = "attention";
    c.stage = Stage::Attention;
    c.tokens = rows;
    c.layer = layer;
    c.outputs.push_back(output(std::move(role), std::move(shape), rows, Q, std::move(ref)));
    auto q = std::make_shared<std::vector<float>>(q_all.end() - rows * Q, q_all.end());
    auto kk = std::make_shared<std::vector<float>>(std::move(k));
    auto vv = std::make_shared<std::vector<float>>(std::move(v));
    c.run = [q, kk, vv, rows, T, layer, decoys](StagedRunner& t, const std::vector<float*>& o) {
      t.reset();
      t.op_kv_write(layer, 0, kk->data(), vv->data(), T);
      decoys.write_others(t, layer, T);
      t.op_attention(layer, q->data(), rows, T - rows, o[0]);
      t.reset();
    };
    const ModelSpec spec = s;
    c.emulate = [q, kk, vv, rows, T, spec, outs = c.outputs](const oracle::Numerics& num, std::vector<std::vector<int64_t>>& cols) {
      std::vector<float> y(size_t(rows * spec.q_dim()));
      em::attention(num, q->data(), rows, T - rows, kk->data(), vv->data(), spec, y.data());
      return whole(cols, outs, {std::move(y)});
    };
    out.push_back(std::move(c));
  };
  const std::string gqa = fmt::format("gqa {}/{}", s.n_heads, s.n_kv_heads);
  one("prefill causal " + gqa, fmt::format("[{},{}]", T, Q), in.at("q"), in.at("k"), in.at("v"), T, in.at("attn"), 0);
  // The decode shape in every gated layer: each reads its own layer's cache.
  for (const int64_t layer : gated_layers(s))
    one("decode " + gqa + layer_suffix(layer), fmt::format("[1,{}] over {} cached", Q, T), in.at("q"), in.at("k"),
        in.at("v"), 1, std::vector<float>(in.at("attn").end() - Q, in.at("attn").end()), layer);
  // The same attention with scores past exp's fp32 range: finite only if the kernel
  // subtracts the row max (the reference is the oracle's on the same bf16 inputs).
  const StressAttention st = stress_attention_inputs(s, in.at("q"), in.at("k"), in.at("v"), T, kStressScore);
  std::vector<float> ref(size_t(T * Q));
  oracle::attention(st.q.data(), T, 0, st.k.data(), st.v.data(), s, ref.data(), in.host_threads);
  one(fmt::format("prefill, largest score {:.0f}", kStressScore), fmt::format("[{},{}]", T, Q), st.q, st.k, st.v, T,
      std::move(ref), 0);
  return out;
}

std::vector<OpCase> silu_mul_cases(const OpInputs& in) {
  const ModelSpec& s = in.model->spec();
  const int64_t T = in.T, I = s.intermediate;
  OpCase c;
  c.kernel = "silu_mul";
  c.stage = Stage::SiluMul;
  c.tokens = T;
  c.outputs.push_back(output("mlp act", fmt::format("[{},{}]", T, I), T, I, in.at("act")));
  auto g = std::make_shared<std::vector<float>>(in.at("gate"));
  auto u = std::make_shared<std::vector<float>>(in.at("up"));
  c.run = [g, u, T](StagedRunner& t, const std::vector<float*>& o) { t.op_silu_mul(g->data(), u->data(), T, o[0]); };
  c.emulate = [g, u, outs = c.outputs](const oracle::Numerics& num, std::vector<std::vector<int64_t>>& cols) {
    std::vector<float> y(g->size());
    em::silu_mul(num, g->data(), u->data(), y.data(), int64_t(y.size()));
    return whole(cols, outs, {std::move(y)});
  };
  return {c};
}

std::vector<OpCase> add_cases(const OpInputs& in) {
  const ModelSpec& s = in.model->spec();
  const int64_t T = in.T, H = s.hidden;
  std::vector<OpCase> out;
  auto one = [&](const std::string& role, Stage which, const std::string& acc, const std::string& x, const std::string& ref) {
    OpCase c;
    c.kernel = "add";
    c.stage = which;
    c.tokens = T;
    c.outputs.push_back(output(role, fmt::format("[{},{}]", T, H), T, H, in.at(ref)));
    auto a = std::make_shared<std::vector<float>>(in.at(acc));
    auto b = std::make_shared<std::vector<float>>(in.at(x));
    c.run = [a, b, which, T](StagedRunner& t, const std::vector<float*>& o) {
      std::copy(a->begin(), a->end(), o[0]);
      t.op_add(which, o[0], b->data(), T);
    };
    c.emulate = [a, b, outs = c.outputs](const oracle::Numerics& num, std::vector<std::vector<int64_t>>& cols) {
      std::vector<float> y = *a;
      em::add(num, y.data(), b->data(), int64_t(y.size()));
      return whole(cols, outs, {std::move(y)});
    };
    out.push_back(std::move(c));
  };
  one("attn_residual", Stage::AttnResidual, "embed", "o_proj", "attn_residual");
  one("mlp_residual", Stage::MlpResidual, "attn_residual", "down", "out");
  return out;
}

// The reference's values at the emulated columns.
std::vector<float> pick_columns(const OpOutput& o, const std::vector<int64_t>& cols) {
  if (int64_t(cols.size()) == o.cols) return o.ref;
  std::vector<float> out;
  out.reserve(size_t(o.rows) * cols.size());
  for (int64_t r = 0; r < o.rows; ++r)
    for (int64_t c : cols) out.push_back(o.ref[size_t(r * o.cols + c)]);
  return out;
}

// ---- what each row needs from a model, from its spec alone ---------------------------------

std::vector<KernelNeed> embedding_needs(const ModelSpec& s) {
  return {{"embedding", "embed_tokens", fmt::format("[{},{}] gather T rows", s.vocab, s.hidden)}};
}
std::vector<KernelNeed> rmsnorm_needs(const ModelSpec& s) {
  std::vector<KernelNeed> k;
  for (const char* r : {"attn_norm", "mlp_norm", "final_norm"}) k.push_back({"rmsnorm", r, fmt::format("[T,{}]", s.hidden)});
  return k;
}
std::vector<KernelNeed> projection_needs(const ModelSpec& s) {
  auto gemm = [](int64_t k, int64_t n, bool bias) { return fmt::format("[T,{}] x [{},{}]^T{}", k, n, k, bias ? " + bias" : ""); };
  return {{"gemm", "q_proj", gemm(s.hidden, s.q_dim(), s.qkv_bias)},
          {"gemm", "k_proj", gemm(s.hidden, s.kv_dim(), s.qkv_bias)},
          {"gemm", "v_proj", gemm(s.hidden, s.kv_dim(), s.qkv_bias)},
          {"gemm", "o_proj", gemm(s.q_dim(), s.hidden, s.o_bias)},
          {"gemm", "gate_proj", gemm(s.hidden, s.intermediate, s.mlp_bias)},
          {"gemm", "up_proj", gemm(s.hidden, s.intermediate, s.mlp_bias)},
          {"gemm", "down_proj", gemm(s.intermediate, s.hidden, s.mlp_bias)},
          {"gemv", "lm_head", fmt::format("[1,{}] x [{},{}]^T{}", s.hidden, s.vocab, s.hidden, s.tie_embeddings ? " (tied)" : "")},
          {"gemm", "lm_head (every position)",
           fmt::format("[{},{}] x [{},{}]^T{}", kLmHeadRows, s.hidden, s.vocab, s.hidden, s.tie_embeddings ? " (tied)" : "")}};
}
std::vector<KernelNeed> rope_needs(const ModelSpec& s) {
  const std::string k = std::string(s.qk_norm ? "qk_norm+" : "") +
                        (s.rope_scaling.type == RopeScaling::Type::Llama3 ? "rope_llama3" : "rope");
  return {{k, "q", fmt::format("[T,{},{}]", s.n_heads, s.head_dim)}, {k, "k", fmt::format("[T,{},{}]", s.n_kv_heads, s.head_dim)}};
}
std::vector<KernelNeed> kv_write_needs(const ModelSpec& s) {
  return {{"kv_write", "keys and values", fmt::format("[T,{}] x 2 into the cache", s.kv_dim())}};
}
std::vector<KernelNeed> attention_needs(const ModelSpec& s) {
  return {{"attention", "prefill", fmt::format("q [T,{},{}] kv [T,{},{}] causal, group {}", s.n_heads, s.head_dim, s.n_kv_heads,
                                               s.head_dim, s.gqa_group())},
          {"attention", "decode", fmt::format("q [1,{},{}] kv cache [ctx,{},{}], group {}", s.n_heads, s.head_dim,
                                              s.n_kv_heads, s.head_dim, s.gqa_group())}};
}
std::vector<KernelNeed> silu_mul_needs(const ModelSpec& s) { return {{"silu_mul", "act", fmt::format("[T,{}]", s.intermediate)}}; }
std::vector<KernelNeed> add_needs(const ModelSpec& s) {
  return {{"add", "attn_residual", fmt::format("[T,{}]", s.hidden)}, {"add", "mlp_residual", fmt::format("[T,{}]", s.hidden)}};
}

}  // namespace

std::vector<OpRow>& op_table() {
  static std::vector<OpRow> table = {
      {"embedding", "the token embedding gather", {Stage::Embedding}, embedding_needs, embedding_cases},
      {"rmsnorm", "attn_norm, mlp_norm and the final norm", {Stage::AttnNorm, Stage::MlpNorm, Stage::FinalNorm},
       rmsnorm_needs, rmsnorm_cases},
      {"projections", "q|k|v, o, gate|up and down at the prefill and decode shapes as the plan runs them (fused where "
                      "it fuses), and the LM head",
       {Stage::QkvProj, Stage::OProj, Stage::GateUpProj, Stage::DownProj, Stage::LmHead}, projection_needs,
       projection_cases},
      {"rope", "RoPE (with Qwen3's q/k norm first) at position 0 and one decode row far out", {Stage::Rope}, rope_needs,
       rope_cases},
      {"kv_write", "the KV cache write, read back", {Stage::KvWrite}, kv_write_needs, kv_write_cases},
      {"attention", "causal GQA attention: prefill, decode over the cache, and scores past exp's fp32 range",
       {Stage::Attention}, attention_needs, attention_cases},
      {"silu_mul", "silu(gate) * up", {Stage::SiluMul}, silu_mul_needs, silu_mul_cases},
      {"add", "the two residual adds", {Stage::AttnResidual, Stage::MlpResidual}, add_needs, add_cases},
  };
  return table;
}

std::vector<KernelNeed> op_table_needs(const ModelSpec& spec) {
  std::vector<KernelNeed> out;
  for (const OpRow& row : op_table())
    if (row.needs)
      for (KernelNeed& k : row.needs(spec)) out.push_back(std::move(k));
  return out;
}

// ---- the tolerance model and the harness --------------------------------------------------

GateResult op_gate(const std::string& gate, const std::string& subject, const std::string& kernel,
                   const TensorMetrics& expected, const TensorMetrics& measured, int64_t guard_bytes) {
  GateResult g;
  g.gate = gate;
  g.subject = subject;
  const std::string cls = kernel == "gemm" ? "phase1.gemm" : "phase1.kernel";
  const double M = gates::threshold("phase1.margin");
  // limit = max(margin x expected, floor), never looser than the outer bound.
  auto derived = [&](const char* metric, double value, double margin_times_expected, const char* floor_key,
                     const std::string& outer_key) {
    g.require_derived(metric, value, "<=", std::max(margin_times_expected, gates::threshold(floor_key)), outer_key);
  };
  g.require("pearson", measured.pearson, ">=", cls + ".pearson_min");
  // Error magnitudes: a margin above what the declared numerics give.
  derived("nmse", measured.nmse, M * M * expected.nmse, "phase1.nmse_floor", cls + ".nmse_max");  // a squared error
  const double exp_err = expected.ref_max > 0 ? expected.max_abs / expected.ref_max : 0;
  derived("max_err", measured.ref_max > 0 ? measured.max_abs / measured.ref_max : measured.max_abs, M * exp_err,
          "phase1.max_err_floor", "phase1.max_err_max");
  // Systematic errors: the declared numerics predict the kernel's gain and offset (an
  // approximate 1/sqrt has a bias of its own); the kernel must show that line, within the
  // sampling noise of the estimates (about sqrt(nmse / n) each) times the margin.
  const double noise = std::sqrt(std::max(expected.nmse, 0.0) / double(std::max<int64_t>(expected.count, 1))) +
                       std::sqrt(std::max(measured.nmse, 0.0) / double(std::max<int64_t>(measured.count, 1)));
  derived("gain_error", std::fabs(measured.gain - expected.gain), M * noise, "phase1.err_floor", "phase1.gain_error_max");
  derived("offset_error", std::fabs(measured.offset - expected.offset), M * noise, "phase1.err_floor", "phase1.offset_max");
  g.require_fixed("nonfinite_mismatch",
                  double(std::abs((measured.nan_ref + measured.inf_ref) - (measured.nan_got + measured.inf_got))), "<=", 0);
  g.require_fixed("guard_bytes_changed", double(guard_bytes), "<=", 0);
  return g;
}

nlohmann::json OpResult::to_json() const {
  nlohmann::json limits = nlohmann::json::object(), values = nlohmann::json::object();
  for (const gates::Check& c : gate.checks) {
    limits[c.metric] = gates::json_number(c.limit);
    values[c.metric] = gates::json_number(c.value);
  }
  nlohmann::json j = {{"kernel", kernel},     {"role", role},
                      {"shape", shape},       {"op", op},
                      {"stage", stage_name(stage)}, {"tokens", tokens},
                      {"fused", fused},       {"numerics", numerics},
                      {"expected", expected.to_json()}, {"metrics", measured.to_json()},
                      {"limits", limits},     {"values", values},
                      {"margin", gates::threshold("phase1.margin")},
                      {"pass", gate.pass()}};
  if (seconds > 0) j["seconds"] = seconds;
  return j;
}

std::vector<OpResult> run_op_table(StagedRunner& target, const OpInputs& in, const OpHarnessOptions& opt) {
  std::vector<OpResult> results;
  const OpInputs decoy_in = in.decoy();
  for (const OpRow& row : op_table()) {
    // A row none of whose stages is asked for is skipped before its references are computed.
    if (!opt.only_stages.empty() && std::none_of(row.stages.begin(), row.stages.end(),
                                                 [&](Stage s) { return opt.only_stages.count(s) > 0; }))
      continue;
    if (opt.progress) opt.progress(fmt::format("{}: {}", row.op, row.what));
    std::vector<OpCase> cases = row.cases(in), decoys = row.cases(decoy_in);
    if (decoys.size() != cases.size()) fail("internal: op table row '{}' makes other cases on its decoy inputs", row.op);
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const OpCase& c = cases[ci];
      if (!opt.only_stages.empty() && !opt.only_stages.count(c.stage)) continue;
      oracle::Numerics num = target.numerics(c.stage, c.tokens, c.layer);
      if (opt.numerics_variant) num = opt.numerics_variant(num);
      std::vector<GuardedBuffer> bufs;
      std::vector<float*> ptrs;
      for (const OpOutput& o : c.outputs) bufs.emplace_back(o.rows * o.cols);
      for (GuardedBuffer& b : bufs) ptrs.push_back(b.data());
      decoys[ci].run(target, ptrs);  // ungated: leaves other values in the buffers and in the target
      c.run(target, ptrs);
      double seconds = 0;
      if (opt.perf_repeats > 0) {
        std::vector<double> times;
        for (int r = 0; r < opt.perf_repeats; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          c.run(target, ptrs);
          times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        seconds = median(times);
      }
      std::vector<std::vector<int64_t>> cols;
      const std::vector<std::vector<float>> emulated = c.emulate(num, cols);
      const bool fused = target.fuses_linears(c.stage, c.tokens) && c.outputs.size() > 1;
      std::string fused_names;
      for (const OpOutput& o : c.outputs) fused_names += (fused_names.empty() ? "" : "|") + o.role.substr(0, o.role.find('_'));
      for (size_t i = 0; i < c.outputs.size(); ++i) {
        const OpOutput& o = c.outputs[i];
        OpResult r;
        r.kernel = c.kernel;
        r.role = o.role + (fused ? fmt::format(" (fused {})", fused_names) : "");
        r.shape = o.shape;
        r.op = row.op;
        r.stage = c.stage;
        r.tokens = c.tokens;
        r.layer = c.layer;
        r.fused = fused;
        r.numerics = num.name;
        const std::vector<float> ref_cols = pick_columns(o, cols[i]);
        r.expected = gates::compare(ref_cols.data(), emulated[i].data(), o.rows, int64_t(cols[i].size()));
        r.measured = gates::compare(o.ref.data(), bufs[i].data(), o.rows, o.cols);
        r.gate = op_gate(opt.gate, fmt::format("{} {} {}", r.kernel, r.role, r.shape), r.kernel, r.expected, r.measured,
                         bufs[i].corrupted_bytes());
        r.seconds = seconds;
        r.rows = o.rows;
        r.cols = o.cols;
        if (opt.keep_outputs) {
          r.ref = o.ref;
          r.got.assign(bufs[i].data(), bufs[i].data() + o.rows * o.cols);
          r.emulated = emulated[i];
          r.emulated_cols = cols[i];
        }
        results.push_back(std::move(r));
      }
    }
  }
  return results;
}

std::map<Stage, double> expected_stage_errors(const StagedRunner& target, const OpInputs& in) {
  std::map<Stage, double> out;
  for (const OpRow& row : op_table())
    for (const OpCase& c : row.cases(in)) {
      std::vector<std::vector<int64_t>> cols;
      const std::vector<std::vector<float>> emulated = c.emulate(target.numerics(c.stage, c.tokens, c.layer), cols);
      for (size_t i = 0; i < c.outputs.size(); ++i) {
        const std::vector<float> ref = pick_columns(c.outputs[i], cols[i]);
        const double nmse = gates::compare(ref.data(), emulated[i].data(), c.outputs[i].rows, int64_t(cols[i].size())).nmse;
        double& e = out[c.stage];
        e = std::max(e, std::isfinite(nmse) ? std::sqrt(std::max(nmse, 0.0)) : 0.0);
      }
    }
  return out;
}

}  // namespace tessera
