// Test support: the npusim kernel set (mappings.h) as one launch per call on host buffers,
// for the per-kernel tests (test_npusim_kernels.cc). The product runs lowered Programs
// (targets/npusim/program.h, executor.h), not these calls. Each call finds (or generates and
// caches, per shape) its Launch, binds the DDR tensors, runs it on the Engine (workers on
// threads), and records the launch's predicted time (time_launch).
//
// Host side: activations arrive and leave as fp32 (the runner keeps fp32 hidden states
// between ops); a call casts its inputs to bf16 where the kernel reads bf16 (that cast is the
// buffer sync) and widens bf16 outputs back to fp32. Weights are bf16 and read in place
// (zero-copy DDR). Output types per op: GEMV/GEMM/LM head fp32 (the fp32 accumulator),
// residual add fp32, RMSNorm/RoPE/attention/softmax/SiLU x mul/embedding bf16 (widened).
// Bias (Qwen2 QKV) is a second launch (bias add over the fp32 output) in the same call.
// The KV cache is the caller's: one bf16 tensor per layer, rows [K (kv_dim) | V (kv_dim)]
// per position (kv_store writes it), with rows to spare up to a whole key tile.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "targets/npusim/device.h"
#include "targets/npusim/engine.h"
#include "targets/npusim/mappings.h"
#include "targets/npusim/spatial.h"
#include "targets/npusim/timing.h"

namespace tessera::npusim {

class NpuOps {
 public:
  explicit NpuOps(const Device& device, int threads = 0);
  const Device& device() const { return engine_.device(); }
  Engine& engine() { return engine_; }

  // Faults for the launches generated from now on: `op` is an op name ("gemv", "gemm",
  // "rmsnorm", "rope", "attention", "softmax", "silu_mul", "add", "embedding") or "*".
  void set_faults(const std::string& op, const MappingFaults& f);
  void clear_faults();
  // GEMV tiles by weight shape (N, K) for streamed (non-resident) weights: a plan's tuned
  // tiles; other shapes use the defaults.
  void set_gemv_tiles(std::map<std::pair<int64_t, int64_t>, GemvTiles> tiles) { gemv_tiles_ = std::move(tiles); }

  // y[N] = W[N, K] x[K] (+ bias[N]). W bf16 row-major. `weight` names the weight (required
  // when resident: the launch keeps W in L1 across calls, only if gemv_fits_resident).
  void gemv(const uint16_t* w, int64_t N, int64_t K, const float* x, const float* bias, float* y,
            const std::string& weight = "", bool resident = false);
  // y[T, N] = x[T, K] W^T (+ bias): helper-11's GEMM mapping, M padded to whole tiles.
  void gemm(const uint16_t* w, int64_t N, int64_t K, const float* x, int64_t T, const float* bias, float* y,
            const std::string& weight = "");
  // T == 1: gemv, else gemm.
  void linear(const uint16_t* w, int64_t N, int64_t K, const float* x, int64_t T, const float* bias, float* y,
              const std::string& weight = "", bool resident = false);
  // logits[vocab] = E[vocab, hidden] x: the GEMV over all 8 columns.
  void lm_head(const uint16_t* w, int64_t vocab, int64_t hidden, const float* x, float* logits);
  // out[r] = rmsnorm(x[r]) * gamma over `rows` rows of n (per-head: rows = T * heads, n = head_dim).
  void rmsnorm(const float* x, const float* gamma, float* out, int64_t rows, int64_t n, double eps);
  // In place on x [T, heads * head_dim] at positions pos0.. (half-split pairs).
  void rope(float* x, int64_t T, int64_t heads, int64_t head_dim, int64_t pos0, const std::vector<float>& inv_freq);
  // Causal GQA attention of q [T, heads * hd] at positions s.pos0.. over the cache `kv`
  // (kv_rows rows of [K | V], rows [0, pos0 + T) written) -> out [T, heads * hd].
  void attention(const float* q, const AttnShape& s, const uint16_t* kv, int64_t kv_rows, float* out);
  void attention_decode(const float* q, int64_t pos, int64_t heads, int64_t kv_heads, int64_t head_dim,
                        const uint16_t* kv, int64_t kv_rows, float* out);
  void attention_prefill(const float* q, int64_t T, int64_t pos0, int64_t heads, int64_t kv_heads, int64_t head_dim,
                         const uint16_t* kv, int64_t kv_rows, float* out);
  // Writes k, v [T, kv_dim] (fp32) into cache rows [row, row + T) as bf16.
  static void kv_store(uint16_t* kv, int64_t kv_dim, int64_t row, const float* k, const float* v, int64_t T);
  // Rows of cache a layer needs for `positions` positions (whole key tiles of the default tiling).
  static int64_t kv_rows_for(int64_t positions) { return (positions + 63) / 64 * 64; }
  void softmax(const float* x, float* out, int64_t rows, int64_t n);
  void silu_mul(const float* gate, const float* up, float* out, int64_t n);  // in place on gate allowed
  void add(float* acc, const float* x, int64_t n);                          // acc += x
  void embedding(const uint16_t* table, int64_t vocab, int64_t hidden, const int32_t* ids, int64_t T, float* out);

  // Predicted time of every launch run so far, in order.
  const std::vector<LaunchTiming>& timings() const { return timings_; }
  void clear_timings() { timings_.clear(); }
  // The launches by cache key, which is also the launch's name ("gemv:<weight>:NxK:...",
  // "rmsnorm:1x576:..."), and the latest one of each per-call op ("attention", "embedding"):
  // for plans, checker reports and `tessera profile`.
  const std::map<std::string, Launch>& launches() const { return cache_; }
  const Launch* last_launch() const { return last_; }

 private:
  MappingFaults faults_for(const std::string& op) const;
  template <typename Gen>
  const Launch& cached(const std::string& key, Gen&& gen);
  const Launch& transient(const std::string& op, Launch l);
  void run(const Launch& l, const Bindings& b);
  void bias_add(float* y, int64_t T, int64_t N, const float* bias);
  uint16_t* bf16_scratch(int slot, const float* src, int64_t n);

  Engine engine_;
  std::map<std::string, MappingFaults> faults_;
  std::map<std::pair<int64_t, int64_t>, GemvTiles> gemv_tiles_;
  std::map<std::string, Launch> cache_;
  std::set<std::string> seen_;
  std::vector<LaunchTiming> timings_;
  const Launch* last_ = nullptr;
  std::vector<std::vector<uint16_t>> scratch_{4};
  std::vector<std::vector<float>> fscratch_{2};
};

}  // namespace tessera::npusim
