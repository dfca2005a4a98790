#include "faults/kernel_faults.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string_view>
#include <vector>

#include "faults/faulty_kernels.h"
#include "model/layer_params.h"
#include "oracle/ops.h"

namespace tessera {

namespace {

// Every fault this file applies; the others (the runtime's, the evaluator's, a target's own)
// are applied elsewhere.
constexpr std::string_view kKernelFaults[] = {
    "rope-interleaved", "rope-scaling-prefill-only", "rope-scaling-missing", "qk-norm-after-rope",
    "qk-norm-whole-projection", "drop-qkv-bias", "qkv-bias-after-rope", "qk-rows-permuted",
    "fused-qkv-swap", "bf16-accumulate", "lm-head-untied", "nondeterministic",
    "stale-kv", "kv-layer-aliased", "gqa-modulo", "gqa-head0",
    "attn-scale-hidden", "attn-scale-no-sqrt", "mask-off-by-one", "softmax-unshifted"};

bool is_q_or_k(const std::string& weight) {
  return weight.find("q_proj") != std::string::npos || weight.find("k_proj") != std::string::npos;
}

class KernelFaults final : public KernelInterceptor {
 public:
  KernelFaults(const Model& model, FaultSet faults, int threads)
      : model_(model), faults_(std::move(faults)), threads_(threads) {
    inv_freq_ = oracle::rope_inv_freq(model.spec());
    ModelSpec unscaled = model.spec();  // for the faults that forget the llama3 scaling
    unscaled.rope_scaling = RopeScaling{};
    unscaled.rope_freq_factors.clear();
    unscaled_freq_ = oracle::rope_inv_freq(unscaled);
  }

  void linears(StagedRunner& r, Stage s, const float* x, int64_t T, std::span<const LinearOut> outs,
               const LinearsKernel& kernel) override {
    if (s == Stage::LmHead && has("lm-head-untied")) {
      // A head that was not tied to the embedding: a freshly initialised matrix instead.
      for (const LinearOut& o : outs) {
        const Weight& w = model_.get(o.weight);
        faulty::matmul_random_weights(x, T, w.rows(), w.cols(), o.y, threads_);
      }
    } else if (has("bf16-accumulate")) {
      for (const LinearOut& o : outs) faulty::matmul_bf16_accumulate(x, T, model_.get(o.weight), o.bias, o.y, threads_);
    } else {
      std::vector<LinearOut> handed(outs.begin(), outs.end());
      if (s == Stage::QkvProj) {
        // drop-qkv-bias: run as if the checkpoint had no bias; qkv-bias-after-rope leaves q's
        // and k's for after the rotation (rope below).
        for (LinearOut& o : handed)
          if (has("drop-qkv-bias") || (has("qkv-bias-after-rope") && is_q_or_k(o.weight))) o.bias = nullptr;
        // fused-qkv-swap: the fused kernel's k and v outputs trade places.
        if (has("fused-qkv-swap") && handed.size() == 3 && r.fuses_linears(s, T)) std::swap(handed[1].y, handed[2].y);
      }
      kernel(x, handed);
    }
    if (s == Stage::QkvProj && has("qk-rows-permuted"))
      for (const LinearOut& o : outs)
        if (is_q_or_k(o.weight)) in_gguf_row_order(o.y, T, model_.get(o.weight).rows(), r.spec().head_dim);
    if (s == Stage::LmHead && has("nondeterministic")) {
      // Output that changes from run to run, too little for any gate on any kernel path (an
      // exact fp32 path's limits are tight): the least likely token's logit moves down by 1
      // to 7 units in the last place, a count that differs per call.
      const int64_t V = model_.get(outs[0].weight).rows();
      float* row = outs[0].y + (T - 1) * V;
      float& least = *std::min_element(row, row + V);
      for (int64_t i = 0, n = ++nondeterministic_calls_ % 7 + 1; i < n; ++i)
        least = std::nextafter(least, -std::numeric_limits<float>::infinity());
    }
  }

  void rope(StagedRunner& r, int64_t l, float* q, float* k, int64_t T, int64_t pos, const RopeKernel& kernel) override {
    const ModelSpec& s = r.spec();
    // The decode step (one token) is where a prefill-only scaling bug shows; a missing
    // scaling shows everywhere far enough out.
    const bool unscaled = has("rope-scaling-missing") || (has("rope-scaling-prefill-only") && T == 1);
    const bool norm_after = s.qk_norm && has("qk-norm-after-rope");
    const bool norm_whole = s.qk_norm && has("qk-norm-whole-projection");
    if (!unscaled && !norm_after && !norm_whole && !has("rope-interleaved")) {
      kernel(q, k);
    } else {
      const LayerParams& L = layer(l);
      if (s.qk_norm && !norm_after) qk_norm(s, L, q, k, T, norm_whole);
      const std::vector<float>& freqs = unscaled ? unscaled_freq_ : inv_freq_;
      if (has("rope-interleaved")) {
        faulty::rope_interleaved(q, T, s.n_heads, s.head_dim, pos, freqs.data());
        faulty::rope_interleaved(k, T, s.n_kv_heads, s.head_dim, pos, freqs.data());
      } else {
        oracle::rope(q, T, s.n_heads, s.head_dim, pos, freqs);
        oracle::rope(k, T, s.n_kv_heads, s.head_dim, pos, freqs);
      }
      if (norm_after) qk_norm(s, L, q, k, T, norm_whole);
    }
    if (has("qkv-bias-after-rope")) {  // the bias the projection left out, after rotating
      const LayerParams& L = layer(l);
      if (L.q_bias.empty()) return;
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t i = 0; i < s.q_dim(); ++i) q[t * s.q_dim() + i] += L.q_bias[size_t(i)];
        for (int64_t i = 0; i < s.kv_dim(); ++i) k[t * s.kv_dim() + i] += L.k_bias[size_t(i)];
      }
    }
  }

  void kv_write(StagedRunner& r, int64_t layer, int64_t rel, const float* k, const float* v, int64_t T,
                const KvWriteKernel& kernel) override {
    const int64_t l = has("kv-layer-aliased") ? 0 : layer;  // every layer's keys and values in layer 0's rows
    if (has("stale-kv") && T == 1 && rel > 0) {
      // The decode step's row filled from a buffer that was never updated: it still holds
      // the previous step's keys and values.
      const int64_t KV = r.spec().kv_dim();
      k_.resize(size_t(KV));
      v_.resize(size_t(KV));
      r.kv_read(l, rel - 1, 1, k_.data(), v_.data());
      return kernel(l, k_.data(), v_.data());
    }
    kernel(l, k, v);
  }

  void attention(StagedRunner& r, int64_t layer, const float* q, int64_t T, int64_t rel, float* out,
                 const AttentionKernel& kernel) override {
    const ModelSpec& s = r.spec();
    const int64_t l = has("kv-layer-aliased") ? 0 : layer;
    using M = faulty::AttentionMistakes;
    M m;
    m.kv_head = has("gqa-modulo") ? M::KvHead::Modulo : has("gqa-head0") ? M::KvHead::Zero : M::KvHead::Group;
    m.mask_excludes_diagonal = has("mask-off-by-one");
    m.softmax_unshifted = has("softmax-unshifted");
    const bool wrong_scale = has("attn-scale-hidden") || has("attn-scale-no-sqrt");
    if (!wrong_scale && m.kv_head == M::KvHead::Group && !m.mask_excludes_diagonal && !m.softmax_unshifted)
      return kernel(l, out);
    const float scale = has("attn-scale-hidden")    ? float(1.0 / std::sqrt(double(s.hidden) / double(s.n_heads)))
                        : has("attn-scale-no-sqrt") ? float(1.0 / double(s.head_dim))
                                                    : float(s.attn_scale());
    const int64_t ctx = rel + T, KV = s.kv_dim();
    k_.resize(size_t(ctx * KV));
    v_.resize(size_t(ctx * KV));
    r.kv_read(l, 0, ctx, k_.data(), v_.data());  // the cache as the target stores it
    faulty::attention_with_mistakes(q, T, rel, k_.data(), v_.data(), s.n_heads, s.n_kv_heads, s.head_dim, scale, out, m);
  }

 private:
  bool has(const char* name) const { return faults_.count(name) > 0; }
  const LayerParams& layer(int64_t l) {
    auto it = layers_.find(l);
    if (it == layers_.end()) it = layers_.emplace(l, load_layer_params(model_, l)).first;
    return it->second;
  }
  // Qwen3's q/k RMSNorm: per head, or (qk-norm-whole-projection) one RMS over each row's
  // whole projection with the per-head weight tiled across it.
  static void qk_norm(const ModelSpec& s, const LayerParams& L, float* q, float* k, int64_t T, bool whole) {
    const int64_t hd = s.head_dim;
    if (!whole) {
      oracle::rmsnorm(q, L.q_norm.data(), q, T * s.n_heads, hd, s.rms_eps);
      oracle::rmsnorm(k, L.k_norm.data(), k, T * s.n_kv_heads, hd, s.rms_eps);
      return;
    }
    auto norm = [&](float* x, const std::vector<float>& w1, int64_t heads) {
      std::vector<float> w(static_cast<size_t>(heads * hd));
      for (int64_t h = 0; h < heads; ++h) std::copy(w1.begin(), w1.end(), w.begin() + h * hd);
      oracle::rmsnorm(x, w.data(), x, T, heads * hd, s.rms_eps);
    };
    norm(q, L.q_norm, s.n_heads);
    norm(k, L.k_norm, s.n_kv_heads);
  }
  // Each head's rows in the GGUF llama order (pairs interleaved), as a loader that forgot
  // to undo that permutation gives them: output (half, i) lands at 2i + half.
  static void in_gguf_row_order(float* y, int64_t T, int64_t N, int64_t hd) {
    std::vector<float> row(static_cast<size_t>(N));
    for (int64_t t = 0; t < T; ++t) {
      float* yt = y + t * N;
      for (int64_t h = 0; h < N / hd; ++h)
        for (int64_t half = 0; half < 2; ++half)
          for (int64_t i = 0; i < hd / 2; ++i) row[size_t(h * hd + 2 * i + half)] = yt[h * hd + half * hd / 2 + i];
      std::copy(row.begin(), row.end(), yt);
    }
  }

  const Model& model_;
  FaultSet faults_;
  int threads_;
  std::vector<float> inv_freq_, unscaled_freq_;
  std::map<int64_t, LayerParams> layers_;
  int64_t nondeterministic_calls_ = 0;
  std::vector<float> k_, v_;  // the cache rows a fault reads
};

}  // namespace

std::shared_ptr<KernelInterceptor> kernel_fault_interceptor(const Model& model, const FaultSet& faults, int threads) {
  FaultSet mine;
  for (const std::string_view f : kKernelFaults)
    if (faults.count(std::string(f))) mine.insert(std::string(f));
  if (mine.empty()) return nullptr;
  return std::make_shared<KernelFaults>(model, std::move(mine), threads);
}

}  // namespace tessera
