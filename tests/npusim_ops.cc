#include "npusim_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "targets/npusim/numerics.h"
#include "util/error.h"

namespace tessera::npusim {

namespace {

DdrTensor bf16_in(const uint16_t* p, int64_t n) { return DdrTensor::bf16(const_cast<uint16_t*>(p), n); }

}  // namespace

NpuOps::NpuOps(const Device& device, int threads) : engine_(device, threads) { register_kernel_set(engine_); }

void NpuOps::set_faults(const std::string& op, const MappingFaults& f) { faults_[op] = f; }
void NpuOps::clear_faults() { faults_.clear(); }

MappingFaults NpuOps::faults_for(const std::string& op) const {
  if (auto it = faults_.find(op); it != faults_.end()) return it->second;
  if (auto it = faults_.find("*"); it != faults_.end()) return it->second;
  return {};
}

template <typename Gen>
const Launch& NpuOps::cached(const std::string& key, Gen&& gen) {
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    Launch l = gen();
    l.name = key;  // one device state (L1 rings, resident fifos) per shape and weight
    it = cache_.emplace(key, std::move(l)).first;
  }
  last_ = &it->second;
  return it->second;
}

const Launch& NpuOps::transient(const std::string& op, Launch l) {
  Launch& slot = cache_[op];
  slot = std::move(l);
  last_ = &slot;
  return slot;
}

void NpuOps::run(const Launch& l, const Bindings& b) {
  engine_.run(l, b);
  TimingOptions opt;
  opt.first_call = seen_.insert(l.name).second;
  timings_.push_back(time_launch(l, device(), opt));
}

uint16_t* NpuOps::bf16_scratch(int slot, const float* src, int64_t n) {
  auto& v = scratch_[size_t(slot)];
  if (int64_t(v.size()) < n) v.resize(size_t(n));
  if (src) detail::cast_to_bf16(src, v.data(), n);
  return v.data();
}

void NpuOps::bias_add(float* y, int64_t T, int64_t N, const float* bias) {
  const RowShape s{T, N};
  const Launch& l = cached(fmt::format("bias_add:{}x{}", T, N), [&] {
    RowOptions o;
    o.name = "bias_add";
    return row_launch(RowOp::BiasAdd, s, default_row_tiles(RowOp::BiasAdd, s, device()), device(), o);
  });
  uint16_t* b = bf16_scratch(3, bias, N);
  run(l, {{"X", DdrTensor::f32(y, T * N)}, {"G", bf16_in(b, N)}, {"Y", DdrTensor::f32(y, T * N)}});
}

void NpuOps::gemv(const uint16_t* w, int64_t N, int64_t K, const float* x, const float* bias, float* y,
                  const std::string& weight, bool resident) {
  const GemvShape s{N, K};
  const MappingFaults f = faults_for("gemv");
  resident = resident && !weight.empty() && gemvs_fit_resident({s}, 1, device());
  const std::string name = weight.empty() ? "gemv" : "gemv:" + weight;
  GemvTiles t = default_gemv_tiles(s, device(), resident);
  if (auto it = gemv_tiles_.find({N, K}); it != gemv_tiles_.end() && !resident) t = it->second;
  const Launch& l = cached(fmt::format("{}:{}x{}:{}:{}:rb{}kc{}h{}x{}", name, N, K, resident, f.key(), t.rb, t.kc,
                                       t.herd.cols, t.herd.rows),
                           [&] {
                             GemvOptions o;
                             o.name = name;
                             o.resident = resident;
                             o.faults = f;
                             Launch g = gemv_launch(s, t, device(), o);
                             if (f.dma_oversubscribed) detail::oversubscribe_dma(g, o.x);
                             return g;
                           });
  uint16_t* xb = bf16_scratch(0, x, K);
  run(l, {{"W", bf16_in(w, N * K)}, {"X", bf16_in(xb, K)}, {"Y", DdrTensor::f32(y, N)}});
  if (bias) bias_add(y, 1, N, bias);
}

void NpuOps::gemm(const uint16_t* w, int64_t N, int64_t K, const float* x, int64_t T, const float* bias, float* y,
                  const std::string& weight) {
  const MappingFaults f = faults_for("gemm");
  const GemmPlan p = default_gemm_plan(T, K, N, device(), ElemType::F32);
  const int64_t Mp = p.shape.M;
  const std::string name = weight.empty() ? "gemm" : "gemm:" + weight;
  const Launch& l = cached(fmt::format("{}:{}x{}x{}:{}", name, Mp, K, N, f.key()), [&] {
    GemmOptions o;
    o.name = name;
    o.c_type = ElemType::F32;
    o.b_nk = !f.transposed_pattern;  // the fault walks W as if it were [K, N]
    Launch g = gemm_launch(p.shape, p.tiles, p.herd, device(), o);
    for (auto& fi : g.fifos)
      if (fi.tensor == o.a) detail::apply_fifo_faults(fi, f, device());
    if (f.dma_oversubscribed) detail::oversubscribe_dma(g, o.a);
    return g;
  });
  uint16_t* xb = bf16_scratch(0, nullptr, Mp * K);
  detail::cast_to_bf16(x, xb, T * K);
  std::fill(xb + T * K, xb + Mp * K, uint16_t(0));
  auto& c = fscratch_[0];
  c.resize(size_t(Mp * N));
  run(l, {{"A", bf16_in(xb, Mp * K)}, {"B", bf16_in(w, N * K)}, {"C", DdrTensor::f32(c.data(), Mp * N)}});
  std::memcpy(y, c.data(), size_t(T * N) * sizeof(float));
  if (bias) bias_add(y, T, N, bias);
}

void NpuOps::linear(const uint16_t* w, int64_t N, int64_t K, const float* x, int64_t T, const float* bias, float* y,
                    const std::string& weight, bool resident) {
  if (T == 1)
    gemv(w, N, K, x, bias, y, weight, resident);
  else
    gemm(w, N, K, x, T, bias, y, weight);
}

void NpuOps::lm_head(const uint16_t* w, int64_t vocab, int64_t hidden, const float* x, float* logits) {
  gemv(w, vocab, hidden, x, nullptr, logits, "lm_head", false);
}

void NpuOps::rmsnorm(const float* x, const float* gamma, float* out, int64_t rows, int64_t n, double eps) {
  const RowShape s{rows, n};
  const MappingFaults f = faults_for("rmsnorm");
  const Launch& l = cached(fmt::format("rmsnorm:{}x{}:{}:{}", rows, n, eps, f.key()), [&] {
    RowOptions o;
    o.name = "rmsnorm";
    o.eps = eps;
    o.faults = f;
    return row_launch(RowOp::RmsNorm, s, default_row_tiles(RowOp::RmsNorm, s, device()), device(), o);
  });
  uint16_t* xb = bf16_scratch(0, x, rows * n);
  uint16_t* g = bf16_scratch(1, gamma, n);
  uint16_t* yb = bf16_scratch(2, nullptr, rows * n);
  run(l, {{"X", bf16_in(xb, rows * n)}, {"G", bf16_in(g, n)}, {"Y", DdrTensor::bf16(yb, rows * n)}});
  detail::cast_to_f32(yb, out, rows * n);
}

void NpuOps::rope(float* x, int64_t T, int64_t heads, int64_t head_dim, int64_t pos0,
                  const std::vector<float>& inv_freq) {
  const RopeShape s{T, heads, head_dim};
  const MappingFaults f = faults_for("rope");
  const Launch& l = cached(fmt::format("rope:{}x{}x{}:{}", T, heads, head_dim, f.key()), [&] {
    RopeOptions o;
    o.faults = f;
    return rope_launch(s, default_rope_tiles(s, device()), device(), o);
  });
  const int64_t n = T * heads * head_dim;
  const std::vector<float> cs = rope_table(T, pos0, inv_freq);
  uint16_t* csb = bf16_scratch(1, cs.data(), int64_t(cs.size()));
  uint16_t* xb = bf16_scratch(0, x, n);
  uint16_t* yb = bf16_scratch(2, nullptr, n);
  run(l, {{"X", bf16_in(xb, n)}, {"CS", bf16_in(csb, int64_t(cs.size()))}, {"Y", DdrTensor::bf16(yb, n)}});
  detail::cast_to_f32(yb, x, n);
}

void NpuOps::attention(const float* q, const AttnShape& s, const uint16_t* kv, int64_t kv_rows, float* out) {
  const MappingFaults f = faults_for("attention");
  AttnTiles t = default_attn_tiles(s, device());
  if (attn_kv_rows(s, t) > kv_rows) t.kt = detail::largest_divisor_at_most(s.keys(), t.kt);
  if (s.keys() > kv_rows) fail("npusim attention: {} keys but the cache holds {} rows", s.keys(), kv_rows);
  AttnOptions o;
  o.faults = f;
  const Launch& l = transient("attention", attention_launch(s, t, device(), o));
  const int64_t n = s.T * s.heads * s.head_dim;
  uint16_t* qb = bf16_scratch(0, q, n);
  uint16_t* ob = bf16_scratch(2, nullptr, n);
  run(l, {{"Q", bf16_in(qb, n)}, {"KV", bf16_in(kv, kv_rows * 2 * s.kv_heads * s.head_dim)}, {"O", DdrTensor::bf16(ob, n)}});
  detail::cast_to_f32(ob, out, n);
}

void NpuOps::attention_decode(const float* q, int64_t pos, int64_t heads, int64_t kv_heads, int64_t head_dim,
                              const uint16_t* kv, int64_t kv_rows, float* out) {
  attention(q, {1, pos, heads, kv_heads, head_dim}, kv, kv_rows, out);
}

void NpuOps::attention_prefill(const float* q, int64_t T, int64_t pos0, int64_t heads, int64_t kv_heads,
                               int64_t head_dim, const uint16_t* kv, int64_t kv_rows, float* out) {
  attention(q, {T, pos0, heads, kv_heads, head_dim}, kv, kv_rows, out);
}

void NpuOps::kv_store(uint16_t* kv, int64_t kv_dim, int64_t row, const float* k, const float* v, int64_t T) {
  for (int64_t t = 0; t < T; ++t) {
    detail::cast_to_bf16(k + t * kv_dim, kv + (row + t) * 2 * kv_dim, kv_dim);
    detail::cast_to_bf16(v + t * kv_dim, kv + (row + t) * 2 * kv_dim + kv_dim, kv_dim);
  }
}

void NpuOps::softmax(const float* x, float* out, int64_t rows, int64_t n) {
  const RowShape s{rows, n};
  const MappingFaults f = faults_for("softmax");
  const Launch& l = cached(fmt::format("softmax:{}x{}:{}", rows, n, f.key()), [&] {
    RowOptions o;
    o.name = "softmax";
    o.faults = f;
    return row_launch(RowOp::Softmax, s, default_row_tiles(RowOp::Softmax, s, device()), device(), o);
  });
  uint16_t* xb = bf16_scratch(0, x, rows * n);
  uint16_t* yb = bf16_scratch(2, nullptr, rows * n);
  run(l, {{"X", bf16_in(xb, rows * n)}, {"Y", DdrTensor::bf16(yb, rows * n)}});
  detail::cast_to_f32(yb, out, rows * n);
}

void NpuOps::silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  const MappingFaults f = faults_for("silu_mul");
  const Launch& l = cached(fmt::format("silu_mul:{}:{}", n, f.key()), [&] {
    EltOptions o;
    o.faults = f;
    return elt_launch(EltOp::SiluMul, n, default_elt_tiles(EltOp::SiluMul, n, device()), device(), o);
  });
  uint16_t* a = bf16_scratch(0, gate, n);
  uint16_t* b = bf16_scratch(1, up, n);
  uint16_t* y = bf16_scratch(2, nullptr, n);
  run(l, {{"A", bf16_in(a, n)}, {"B", bf16_in(b, n)}, {"Y", DdrTensor::bf16(y, n)}});
  detail::cast_to_f32(y, out, n);
}

void NpuOps::add(float* acc, const float* x, int64_t n) {
  const MappingFaults f = faults_for("add");
  const Launch& l = cached(fmt::format("add:{}:{}", n, f.key()), [&] {
    EltOptions o;
    o.faults = f;
    return elt_launch(EltOp::Add, n, default_elt_tiles(EltOp::Add, n, device()), device(), o);
  });
  run(l, {{"A", DdrTensor::f32(acc, n)}, {"B", DdrTensor::f32(const_cast<float*>(x), n)}, {"Y", DdrTensor::f32(acc, n)}});
}

void NpuOps::embedding(const uint16_t* table, int64_t vocab, int64_t hidden, const int32_t* ids, int64_t T,
                       float* out) {
  const MappingFaults f = faults_for("embedding");
  const EmbedTiles t = default_embed_tiles(hidden, T, device());
  const int64_t per = embedding_max_tokens(hidden, t, device());
  uint16_t* ob = bf16_scratch(2, nullptr, T * hidden);
  for (int64_t t0 = 0; t0 < T; t0 += per) {  // several launches when the BDs run out
    const int64_t n = std::min(per, T - t0);
    EmbedOptions o;
    o.faults = f;
    const Launch& l = transient("embedding", embedding_launch({ids + t0, ids + t0 + n}, vocab, hidden,
                                                               default_embed_tiles(hidden, n, device()), device(), o));
    run(l, {{"E", bf16_in(table, vocab * hidden)}, {"O", DdrTensor::bf16(ob + t0 * hidden, n * hidden)}});
  }
  detail::cast_to_f32(ob, out, T * hidden);
}

}  // namespace tessera::npusim
