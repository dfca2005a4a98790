// Internals shared by the cpu kernels' translation units (not part of the kernels' API).
#pragma once
#include <cstdint>
#include <vector>

#include "targets/cpu/kernels.h"

namespace tessera::cpu {

struct Q8Row;  // cpu/quant.h

// The KV cache's storage: per layer, fp16, kv head after kv head, so that a decode job (one
// kv head of one sequence) reads two contiguous regions that the hardware prefetchers stream
// (with the heads interleaved per position, a job read 128 of every 1024 bytes of values and
// waited on its misses: docs/design.md). A head's block holds `capacity` positions: values as rows
// [capacity][head_dim]; keys tiled by kKTile positions, [capacity / kKTile][head_dim][kKTile]
// (element (pos, c) at k_tile_index(pos, c, head_dim)), so a head's keys for a tile of
// positions load as vectors across positions (decode scores without horizontal sums).
// capacity is a multiple of kKTile; positions beyond length are zero.
inline constexpr int64_t kKTile = 16;
// Element (pos, c) of a key block whose rows hold `width` columns.
inline int64_t k_tile_index(int64_t pos, int64_t c, int64_t width) {
  return (pos / kKTile) * kKTile * width + c * kKTile + pos % kKTile;
}
struct KvCache::Storage {
  struct Layer {
    uint16_t* k = nullptr;
    uint16_t* v = nullptr;
    int64_t capacity = 0;  // positions allocated
    int64_t length = 0;    // positions written (highest written + 1)
    // Head h's keys and values (each head's block: capacity x head_dim values).
    uint16_t* k_head(int64_t h, int64_t head_dim) const { return k + h * capacity * head_dim; }
    uint16_t* v_head(int64_t h, int64_t head_dim) const { return v + h * capacity * head_dim; }
  };
  std::vector<Layer> layers;
  ~Storage();
};

namespace detail {

// Which matmul implementation runs: true -> the hand-written AVX-512 BF16 path.
bool use_avx512bf16();
bool cpu_has_avx512bf16();
// AMX (tiles of bf16 products) for the prefill GEMM, on top of the AVX-512 BF16 path: the CPU
// has AMX-TILE and AMX-BF16 and the kernel granted this process the tile state.
bool use_amx();
bool cpu_has_amx();
// AMX-INT8 too (the batched decode GEMV on quantized weights).
bool cpu_has_amx_int8();

// Hand-written AVX-512 BF16 / VNNI matmul (kernels_avx512bf16.cc) of matrices sharing x (all
// of x's K columns, K > 0; one or more): x is rounded (or quantized) once; at T == 1 one
// parallel region covers every matrix's rows.
void matmul_avx512bf16(const float* x, int64_t T, std::span<const MatmulOut> outs, ThreadPool& pool,
                       const GemmBlocking& blocking = {});
// matmul_rows on that path: the matrices' tiles (or bf16 rows) loaded once for all T rows.
void matmul_rows_avx512bf16(const float* x, int64_t T, std::span<const MatmulOut> outs, ThreadPool& pool);

// Highway-dispatched kernels (kernels_hwy.cc); they run on the currently chosen target.
void matmul_hwy(const float* x, int64_t T, const Bf16Matrix& w, const float* bias, float* y, ThreadPool& pool);
// T <= kMaxGemvRows rows, each exactly matmul_hwy(row, 1, ...), the matrix read once for all.
void gemv_rows_bf16_hwy(const float* x, int64_t T, const Bf16Matrix& w, const float* bias, float* y,
                        ThreadPool& pool);
void rmsnorm_hwy(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps);
void rope_hwy(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t pos0, const float* inv_freq);
void silu_mul_hwy(const float* gate, const float* up, float* out, int64_t n);
void add_hwy(float* h, const float* x, int64_t n);
void bf16_rows_to_f32_hwy(const uint16_t* src, float* dst, int64_t n);
// Attention over the fp16 cache for `ng` query heads sharing a kv head: query g at
// q + g * q_stride (head_dim values), keys/values [j0, j1) of the kv head's block
// (KvCache::Storage: k its tiled keys, v its value rows). Writes, per head, the max m[g], the
// sum of exp l[g] and the unnormalized output o[g * hd..].
void attn_chunk_hwy(const float* q, int64_t q_stride, int ng, const uint16_t* k, const uint16_t* v, int64_t hd,
                    int64_t j0, int64_t j1, float scale, float* m, float* l, float* o);

// Prefill attention: K of one kv head -> fp32 transposed [hd][ld]; then R query rows sharing
// that kv head, row r seeing keys [0, limit[r]). Requires hd % f32_lanes_hwy() == 0.
// (V is converted to fp32 rows [n][hd] alongside.)
// k, v: the kv head's block (KvCache::Storage).
void k_transpose_hwy(const uint16_t* k, const uint16_t* v, int64_t hd, int64_t n, int64_t ld, float* kt, float* vf);
void attn_rows_hwy(const float* const* q_rows, float* const* out_rows, const int64_t* limit, int R, const float* kt,
                   int64_t ld, const float* v, int64_t hd, float scale);
int64_t f32_lanes_hwy();
// The portable quantized kernel on x16 tiles (cpu/quant.h) for R <= kMaxGemvRows activation
// rows: y[r][n] = w[n] . x[r] (+ bias[n]) for the weight rows of tile groups [g0, g1) (rows
// past w.rows not written), a[r] = combine_terms_hwy(x[r]). Each row is x16_gemv_rows's
// arithmetic bit for bit, whatever R is; each chunk of a tile is unpacked once for all R rows.
void gemm_x16_hwy(const Q8Row* const* x, const int16_t* const* a, int R, const WeightMatrix& w, const float* bias,
                  float* const* y, int64_t g0, int64_t g1);
// x's terms as one int16 per value (Q8Row::term), what gemm_x16_hwy multiplies: a holds
// x.hi.size() values.
void combine_terms_hwy(const Q8Row& x, int16_t* a);
// Q8Row::quantize's work on `blocks` 32-value blocks of x (its arrays sized by the caller).
void quantize_q8_hwy(const float* x, int64_t blocks, float* d, int32_t* sum_hi, int32_t* sum_lo, int8_t* hi,
                     int8_t* lo);

// Highway target bookkeeping.
int64_t hwy_supported_targets();           // targets compiled in and supported by this CPU
void hwy_restrict_targets(int64_t mask);   // 0: no restriction
int64_t hwy_current_target();
const char* hwy_target_name(int64_t target);

}  // namespace detail
}  // namespace tessera::cpu
