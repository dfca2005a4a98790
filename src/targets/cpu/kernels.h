// The cpu target's kernels: BF16 or block-quantized weights, FP32 activations and accumulation, vectorized
// with run-time dispatch (AVX-512 BF16 where the CPU has it, Highway's best target
// otherwise: AVX-512, AVX2, ... down to scalar) and multi-threaded on a persistent pool.
// Every kernel has its reference twin in oracle/ops.h.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/tensor.h"
#include "targets/bf16_weights.h"

namespace tessera::cpu {

// The instruction set the kernels dispatch to on this machine, e.g. "amx" (the AVX-512 BF16
// path with AMX tiles for T >= 16), "avx512bf16", "AVX3", "AVX2", "SCALAR" (Highway's target
// names for the non-bf16 paths).
std::string isa();
// Restricts dispatch for tests and comparisons: "auto" (default), "amx", "avx512bf16", "hwy"
// (Highway's best target, no hand-written bf16 path), "scalar". Throws on an unknown name
// or on an ISA this CPU lacks.
void set_isa(const std::string& name);
// Every name set_isa accepts on this CPU besides "auto": "amx" and "avx512bf16" where the CPU
// has them, then Highway's targets compiled in and supported, best first ("AVX3", "AVX2",
// "SSE4", "SCALAR"); "hwy" and "scalar" are aliases for the first and last Highway target.
std::vector<std::string> available_isas();
// The path the TESSERA_ISA environment variable names, "auto" when it is unset or empty: the
// CLI and the test binary apply it at start (set_isa), so every kernel, deploy and test runs
// on a forced path the same way; tests that force a path of their own restore this one.
std::string isa_from_environment();
// What the bf16-weight matmul does with its activations on the current path (the path's
// declared numerics, CpuRunner::numerics): rounded to bf16 for the AVX-512 BF16 dot products
// and the AMX tiles; kept in fp32 on the portable (Highway) path, which widens the weights.
bool matmul_rounds_activations_to_bf16();
// Whether the current path's GEMM has cache blocking a plan can tune (GemmBlocking: the
// AVX-512 BF16 and AMX paths; the portable one has none).
bool gemm_has_cache_blocking();

// A persistent pool: workers spin briefly then sleep, so a decode step's hundreds of small
// parallel regions do not pay a thread start each.
class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // total threads, the caller included; <= 0: default_threads()
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  int size() const;
  // Calls fn(begin, end) on disjoint chunks covering [0, n); returns when all are done.
  // Exceptions thrown by fn are rethrown on the caller.
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);
  // As above, but hands out chunks of `grain` items dynamically (for uneven work, e.g. causal
  // attention); grain <= 0 means one equal contiguous chunk per thread.
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn, int64_t grain);
  // As above, dynamically, each chunk a share of the items left (a multiple of min_grain, at
  // least min_grain): large chunks first (few chunk starts), small ones last, so the threads
  // finish within a small chunk of each other instead of a large one.
  void parallel_for_guided(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn, int64_t min_grain);

 private:
  // Publishes a region of `chunks` chunks (as the Impl's mode says), runs chunks on this
  // thread too, and returns when all are done; the caller holds the call lock.
  void run(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn, int64_t chunks, int64_t grain);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A row-major BF16 matrix [rows, cols] (a Linear weight is [out_features, in_features]).
using Bf16Matrix = ::tessera::Bf16Matrix;  // targets/bf16_weights.h

// A weight matrix [rows, cols] as the kernels read it: BF16 rows, or a GGML block format
// (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) re-laid as tiles of 16 rows (targets/cpu/quant.h).
struct WeightMatrix {
  DType dtype = DType::BF16;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  WeightMatrix() = default;
  WeightMatrix(const Bf16Matrix& m) : data(m.data), rows(m.rows), cols(m.cols) {}  // NOLINT: a bf16 view
  WeightMatrix(DType t, const void* d, int64_t r, int64_t c) : dtype(t), data(d), rows(r), cols(c) {}
  bool quantized() const { return dtype != DType::BF16; }
  Bf16Matrix bf16() const;  // throws unless BF16
  const uint8_t* tiles() const { return static_cast<const uint8_t*>(data); }
  int64_t bytes() const;  // what one pass over the matrix reads
};

// The prefill GEMM's cache blocking (the AVX-512 BF16 packed path; others ignore it): K per
// packed weight panel (kept in L1, a multiple of 32) and token rows per block (activations
// and the scratch tile kept in L2). A plan's tile-tune chooses them per machine.
struct GemmBlocking {
  int64_t kc = 256;
  int64_t tc = 512;
  bool valid() const { return kc >= 32 && kc % 32 == 0 && tc >= 1; }
};

// y[T, N] = x[T, K] . W[N, K]^T (+ bias[N]); T == 1 is the decode GEMV. Quantized weights:
// the GEMV quantizes x per 32-value block to two int8 terms (cpu/quant.h Q8Row) and multiplies the
// blocks as they are (VNNI, or exact fp32 dequantization off the AVX-512 path); T > 1
// dequantizes each block of weight rows once into bf16 and runs the bf16 GEMM on it.
void matmul(const float* x, int64_t T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool,
            const GemmBlocking& blocking = {});

// One output of matmuls that share their input: y[T, w.rows] = x . w^T (+ bias).
struct MatmulOut {
  const WeightMatrix* w;
  const float* bias;  // may be null
  float* y;
};
// Several matmuls of one x (q|k|v, gate|up; every w has x's K columns). The activations are
// rounded once, and a decode GEMV spreads all the matrices' rows over one parallel region, so
// the step pays one barrier per group instead of one per matrix (on the AVX-512 BF16 path;
// elsewhere, one matmul after another).
void matmul_shared_input(const float* x, int64_t T, std::span<const MatmulOut> outs, ThreadPool& pool,
                         const GemmBlocking& blocking = {});

// The decode GEMV of T independent rows at once (a batched decode step: one row per
// sequence). Row t of every output is exactly what matmul_shared_input(x + t * K, 1, ...)
// computes, bit for bit (the one-row GEMV's numerics, not the GEMM's), while each matrix
// comes from memory once for all the rows (on the AVX-512 path; elsewhere one row after
// another). 1 <= T <= kMaxGemvRows.
inline constexpr int64_t kMaxGemvRows = 64;
void matmul_rows(const float* x, int64_t T, std::span<const MatmulOut> outs, ThreadPool& pool);

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w for `rows` rows of n (in place allowed).
void rmsnorm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps);

// Half-split RoPE in place on T rows of n_heads heads; row t at position pos0 + t.
// inv_freq holds head_dim / 2 frequencies with any scaling already applied.
void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t pos0, const float* inv_freq);

// out = silu(gate) * up (in place on gate allowed), split across the pool's threads (each
// value computed alone, so the split changes no bit).
void silu_mul(const float* gate, const float* up, float* out, int64_t n, ThreadPool& pool);

// h += x.
void add(float* h, const float* x, int64_t n);

// out[t] = table[ids[t]] upcast to fp32 (quantized tables: dequantized exactly).
void embedding(const WeightMatrix& table, const int32_t* ids, int64_t T, float* out);

// Keys and values of every layer, grown on demand (never allocated for the model's whole
// context up front). The storage type is the cache's business; rows go in and out as fp32.
class KvCache {
 public:
  KvCache(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim);
  ~KvCache();
  // Stores T rows of keys and values for positions [pos, pos + T) of `layer`.
  void write(int64_t layer, int64_t pos, const float* k, const float* v, int64_t T);
  // Reads one position's key or value row (kv_dim values) as fp32 (slow paths, tests).
  void read_k(int64_t layer, int64_t pos, float* out) const;
  void read_v(int64_t layer, int64_t pos, float* out) const;
  int64_t kv_dim() const { return n_kv_heads_ * head_dim_; }
  int64_t n_kv_heads() const { return n_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t n_layers() const { return n_layers_; }
  int64_t bytes_per_position() const;  // all layers, keys and values

  struct Storage;
  const Storage& storage() const { return *storage_; }

 private:
  int64_t n_layers_, n_kv_heads_, head_dim_;
  std::unique_ptr<Storage> storage_;
};

// Causal attention with GQA (query head h reads kv head h / (n_heads / n_kv_heads)) over
// `cache` positions [0, pos0 + T): q is [T, n_heads * head_dim] at positions pos0..;
// out is [T, n_heads * head_dim]. Softmax in fp32 with the max subtracted.
void attention(const float* q, int64_t T, int64_t pos0, const KvCache& cache, int64_t layer, int64_t n_heads,
               int64_t n_kv_heads, int64_t head_dim, float scale, float* out, ThreadPool& pool);

// Decode attention of one query row from each of several sequences (a batched decode step):
// row i's q at position pos over its own cache, out [n_heads * head_dim]. One parallel
// region for all rows; each row's output is attention()'s for that row alone, bit for bit.
struct AttentionRow {
  const float* q;
  const KvCache* cache;
  int64_t pos;
  float* out;
};
void attention_rows(std::span<const AttentionRow> rows, int64_t layer, int64_t n_heads, int64_t n_kv_heads,
                    int64_t head_dim, float scale, ThreadPool& pool);

}  // namespace tessera::cpu
