// The cpu kernels' entry points: ISA selection, the KV cache and attention's work split.
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <vector>

#include "targets/cpu/kernels_internal.h"
#include "targets/cpu/quant.h"
#include "util/half.h"
#include "util/error.h"

namespace tessera::cpu {

namespace detail {
namespace {
enum class Mode { Auto, Amx, Bf16, Hwy };
std::atomic<Mode> g_mode{Mode::Auto};
}  // namespace

bool use_avx512bf16() {
  const Mode m = g_mode.load(std::memory_order_relaxed);
  return m == Mode::Amx || m == Mode::Bf16 || (m == Mode::Auto && cpu_has_avx512bf16());
}
bool use_amx() {
  const Mode m = g_mode.load(std::memory_order_relaxed);
  return m == Mode::Amx || (m == Mode::Auto && cpu_has_amx());
}
}  // namespace detail

using namespace detail;

namespace {

std::vector<int64_t> hwy_targets_best_first() {
  std::vector<int64_t> out;
  const int64_t all = hwy_supported_targets();
  for (int bit = 0; bit < 63; ++bit)
    if (all & (int64_t(1) << bit)) out.push_back(int64_t(1) << bit);  // lower bit = better
  return out;
}

}  // namespace

std::string isa() {
  if (use_amx()) return "amx";
  if (use_avx512bf16()) return "avx512bf16";
  return hwy_target_name(hwy_current_target());
}

std::vector<std::string> available_isas() {
  std::vector<std::string> out;
  if (cpu_has_amx()) out.push_back("amx");
  if (cpu_has_avx512bf16()) out.push_back("avx512bf16");
  for (int64_t t : hwy_targets_best_first()) out.push_back(hwy_target_name(t));
  return out;
}

bool matmul_rounds_activations_to_bf16() { return use_avx512bf16(); }
bool gemm_has_cache_blocking() { return use_avx512bf16(); }

std::string isa_from_environment() {
  const char* env = std::getenv("TESSERA_ISA");
  return env && *env ? std::string(env) : std::string("auto");
}

void set_isa(const std::string& name) {
  const std::vector<int64_t> targets = hwy_targets_best_first();
  if (name == "auto") {
    hwy_restrict_targets(0);
    g_mode = Mode::Auto;
  } else if (name == "amx") {
    if (!cpu_has_amx()) fail("ISA amx is not supported by this CPU (or the kernel refused its tile state)");
    hwy_restrict_targets(0);
    g_mode = Mode::Amx;
  } else if (name == "avx512bf16") {
    if (!cpu_has_avx512bf16()) fail("ISA avx512bf16 is not supported by this CPU");
    hwy_restrict_targets(0);
    g_mode = Mode::Bf16;
  } else if (name == "hwy") {
    hwy_restrict_targets(0);
    g_mode = Mode::Hwy;
  } else if (name == "scalar") {
    if (targets.empty()) fail("no Highway target available");
    hwy_restrict_targets(targets.back());
    g_mode = Mode::Hwy;
  } else {
    for (int64_t t : targets)
      if (name == hwy_target_name(t)) {
        hwy_restrict_targets(t);
        g_mode = Mode::Hwy;
        return;
      }
    std::string known = "auto, hwy, scalar";
    for (const auto& s : available_isas()) known += ", " + s;
    fail("unknown or unsupported ISA '{}' (this CPU has: {})", name, known);
  }
}

// ---------------------------------------------------------------- matmul
Bf16Matrix WeightMatrix::bf16() const {
  if (quantized()) fail("cpu kernels: a {} matrix read as bf16", dtype_name(dtype));
  return Bf16Matrix{static_cast<const uint16_t*>(data), rows, cols};
}

int64_t WeightMatrix::bytes() const { return quantized() ? x16_bytes(dtype, rows, cols) : rows * cols * 2; }

namespace {

void check_quantized(const WeightMatrix& w) {
  if (!x16_supported(w.dtype)) fail("cpu kernels: no kernel reads {} weights", dtype_name(w.dtype));
  if (w.cols % dtype_block_values(w.dtype) != 0)
    fail("cpu kernels: a {} matrix of {} columns (a multiple of {} expected)", dtype_name(w.dtype), w.cols,
         dtype_block_values(w.dtype));
}

// Activation rows as the portable quantized kernel reads them: quantized per block (Q8Row)
// and their two terms combined into one int16 per value; kept per calling thread, so that a
// decode step's hundreds of calls allocate nothing.
struct PortableRows {
  std::vector<Q8Row> q;
  std::vector<int16_t> terms;  // [T][K]
  std::vector<const Q8Row*> q_rows;
  std::vector<const int16_t*> term_rows;
  void prepare(const float* x, int64_t T, int64_t K, ThreadPool& pool) {
    if (q.size() < size_t(T)) q.resize(size_t(T));
    if (terms.size() < size_t(T * K)) terms.resize(size_t(T * K));
    q_rows.resize(size_t(T));
    term_rows.resize(size_t(T));
    for (int64_t t = 0; t < T; ++t) {
      q_rows[size_t(t)] = &q[size_t(t)];
      term_rows[size_t(t)] = terms.data() + t * K;
    }
    pool.parallel_for(T, [this, x, K](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        q[size_t(t)].quantize(x + t * K, K);
        combine_terms_hwy(q[size_t(t)], terms.data() + t * K);
      }
    });
  }
};

// One quantized matrix on the portable path (no AVX-512 BF16): every row exactly as the
// one-row GEMV computes it (x16_gemv_rows's arithmetic, Highway's current target), whatever T
// is, so a row's numbers never depend on the rows beside it; each tile group's chunks are
// unpacked once for up to kMaxGemvRows rows. Work items are (rows tile, tile group), handed
// out largest first (a noisy core finishes late by a small chunk, not half the matrix).
void matmul_quantized_portable(const PortableRows& x, int64_t T, const WeightMatrix& w, const float* bias, float* y,
                               ThreadPool& pool) {
  const int64_t N = w.rows, groups = (N + kTileRows - 1) / kTileRows;
  const int64_t row_tiles = (T + kMaxGemvRows - 1) / kMaxGemvRows;
  pool.parallel_for_guided(
      row_tiles * groups,
      [&](int64_t b, int64_t e) {
        float* ys[kMaxGemvRows];
        while (b < e) {
          const int64_t tile = b / groups, g0 = b % groups, g1 = std::min(groups, g0 + (e - b));
          const int64_t t0 = tile * kMaxGemvRows, rows = std::min(kMaxGemvRows, T - t0);
          for (int64_t r = 0; r < rows; ++r) ys[r] = y + (t0 + r) * N;
          gemm_x16_hwy(x.q_rows.data() + t0, x.term_rows.data() + t0, int(rows), w, bias, ys, g0, g1);
          b += g1 - g0;
        }
      },
      1);
}

// matmul_shared_input off the AVX-512 BF16 path: x prepared once for all the quantized
// matrices; bf16 ones on Highway's GEMM.
void matmul_portable(const float* x, int64_t T, std::span<const MatmulOut> outs, ThreadPool& pool) {
  thread_local PortableRows rows_of_this_thread;
  PortableRows* rows = nullptr;  // the caller's (a thread_local named in the workers is theirs)
  for (const MatmulOut& o : outs) {
    if (o.w->quantized()) {
      if (!rows) (rows = &rows_of_this_thread)->prepare(x, T, o.w->cols, pool);
      matmul_quantized_portable(*rows, T, *o.w, o.bias, o.y, pool);
    } else {
      matmul_hwy(x, T, o.w->bf16(), o.bias, o.y, pool);
    }
  }
}

}  // namespace

void matmul(const float* x, int64_t T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool,
            const GemmBlocking& blocking) {
  if (!blocking.valid())
    fail("matmul: cache blocking kc {} (a positive multiple of 32) and tc {} (positive)", blocking.kc, blocking.tc);
  if (w.quantized()) check_quantized(w);
  if (T <= 0 || w.rows <= 0) return;
  if (w.cols <= 0) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < w.rows; ++n) y[t * w.rows + n] = bias ? bias[n] : 0.0f;
    return;
  }
  if (use_avx512bf16()) {
    const MatmulOut out{&w, bias, y};
    matmul_avx512bf16(x, T, std::span<const MatmulOut>(&out, 1), pool, blocking);
  } else {
    const MatmulOut out{&w, bias, y};
    matmul_portable(x, T, std::span<const MatmulOut>(&out, 1), pool);
  }
}

void matmul_shared_input(const float* x, int64_t T, std::span<const MatmulOut> outs, ThreadPool& pool,
                         const GemmBlocking& blocking) {
  const int64_t K = outs.empty() ? 0 : outs[0].w->cols;
  for (const MatmulOut& o : outs) {
    if (o.w->cols != K) fail("matmul_shared_input: matrices of {} and {} columns share one input", K, o.w->cols);
    if (o.w->quantized()) check_quantized(*o.w);
  }
  if (T <= 0 || K <= 0) {
    for (const MatmulOut& o : outs) matmul(x, T, *o.w, o.bias, o.y, pool, blocking);
    return;
  }
  if (!use_avx512bf16()) return matmul_portable(x, T, outs, pool);
  matmul_avx512bf16(x, T, outs, pool, blocking);
}

void matmul_rows(const float* x, int64_t T, std::span<const MatmulOut> outs, ThreadPool& pool) {
  if (T < 1 || T > kMaxGemvRows) fail("matmul_rows: {} rows (1 to {} allowed)", T, kMaxGemvRows);
  const int64_t K = outs.empty() ? 0 : outs[0].w->cols;
  for (const MatmulOut& o : outs) {
    if (o.w->cols != K) fail("matmul_rows: matrices of {} and {} columns share one input", K, o.w->cols);
    if (o.w->quantized()) check_quantized(*o.w);
  }
  if (K > 0 && use_avx512bf16()) return matmul_rows_avx512bf16(x, T, outs, pool);
  if (K <= 0) return matmul_shared_input(x, T, outs, pool);
  // The portable path: every matrix read once for all T rows, each row the one-row GEMV's
  // numbers (quantized ones as for prefill).
  std::vector<MatmulOut> quantized;
  for (const MatmulOut& o : outs) {
    if (o.w->quantized()) quantized.push_back(o);
    else gemv_rows_bf16_hwy(x, T, o.w->bf16(), o.bias, o.y, pool);
  }
  if (!quantized.empty()) matmul_portable(x, T, quantized, pool);
}

// ---------------------------------------------------------------- element-wise kernels
void rmsnorm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps) {
  rmsnorm_hwy(x, w, out, rows, n, eps);
}

void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t pos0, const float* inv_freq) {
  rope_hwy(x, T, n_heads, head_dim, pos0, inv_freq);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n, ThreadPool& pool) {
  // 1024-value pieces (multiples of the vector width, so every value takes the path it takes
  // unsplit): a row of 8192 takes ~7 us on one core, a parallel region ~1 us.
  constexpr int64_t kPiece = 1024;
  if (n < 2 * kPiece || pool.size() == 1) return silu_mul_hwy(gate, up, out, n);
  pool.parallel_for((n + kPiece - 1) / kPiece, [&](int64_t b, int64_t e) {
    const int64_t i0 = b * kPiece, i1 = std::min(n, e * kPiece);
    silu_mul_hwy(gate + i0, up + i0, out + i0, i1 - i0);
  });
}

void add(float* h, const float* x, int64_t n) { add_hwy(h, x, n); }

void embedding(const WeightMatrix& table, const int32_t* ids, int64_t T, float* out) {
  if (table.quantized()) check_quantized(table);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = ids[t];
    if (id < 0 || id >= table.rows) fail("token id {} is outside the embedding table ({} rows)", id, table.rows);
    if (table.quantized())
      x16_rows_f32(table.dtype, table.tiles(), table.cols, id, id + 1, 0, table.cols, out + t * table.cols, table.cols);
    else
      bf16_rows_to_f32_hwy(table.bf16().data + id * table.cols, out + t * table.cols, table.cols);
  }
}

// ---------------------------------------------------------------- KV cache (fp16)
namespace {

uint16_t f32_to_f16_scalar(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t ax = x & 0x7FFFFFFF;
  if (ax >= 0x7F800000) return uint16_t(sign | (ax > 0x7F800000 ? 0x7E00 : 0x7C00));  // nan / inf
  if (ax >= 0x477FF000) return uint16_t(sign | 0x7BFF);                             // clamp to 65504
  if (ax < 0x38800000) {  // f16 subnormal or zero: h = m * 2^(e - 126) rounded to nearest even
    const int e = int(ax >> 23);
    const int s = 126 - e;
    if (e == 0 || s > 24) return uint16_t(sign);
    const uint32_t m = (ax & 0x7FFFFF) | 0x800000;
    const uint32_t q = m >> s, rem = m & ((1u << s) - 1), halfv = 1u << (s - 1);
    return uint16_t(sign | (q + ((rem > halfv || (rem == halfv && (q & 1))) ? 1 : 0)));
  }
  uint32_t h = ((ax - 0x38000000) >> 13);
  const uint32_t rem = ax & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return uint16_t(sign | h);
}

__attribute__((target("avx2,f16c"))) void f32_to_f16_f16c(const float* src, uint16_t* dst, int64_t n) {
  const __m256 lim = _mm256_set1_ps(65504.0f), nlim = _mm256_set1_ps(-65504.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(src + i), nlim), lim);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) dst[i] = f32_to_f16_scalar(src[i]);
}

void f32_to_f16(const float* src, uint16_t* dst, int64_t n) {
  static const bool f16c = [] {
    __builtin_cpu_init();
    // F16C from CPUID (leaf 1, ECX bit 29): clang before 15 has no "f16c" for __builtin_cpu_supports.
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
  }();
  if (f16c)
    f32_to_f16_f16c(src, dst, n);
  else
    for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_f16_scalar(src[i]);
}


uint16_t* alloc_u16(int64_t n) {
  void* p = std::aligned_alloc(64, size_t((n * 2 + 63) / 64 * 64));
  if (!p) throw std::bad_alloc();
  return static_cast<uint16_t*>(p);
}

}  // namespace

KvCache::Storage::~Storage() {
  for (auto& l : layers) {
    std::free(l.k);
    std::free(l.v);
  }
}

KvCache::KvCache(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim)
    : n_layers_(n_layers),
      n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      storage_(std::make_unique<Storage>()) {
  if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0)
    fail("KvCache needs layers, kv heads and head_dim > 0 (got {}, {}, {})", n_layers, n_kv_heads, head_dim);
  storage_->layers.resize(size_t(n_layers));
}

KvCache::~KvCache() = default;

int64_t KvCache::bytes_per_position() const { return n_layers_ * kv_dim() * 2 * int64_t(sizeof(uint16_t)); }

void KvCache::write(int64_t layer, int64_t pos, const float* k, const float* v, int64_t T) {
  if (layer < 0 || layer >= n_layers_) fail("KvCache layer {} out of range ({} layers)", layer, n_layers_);
  if (pos < 0 || T < 0) fail("KvCache write at negative position");
  Storage::Layer& L = storage_->layers[size_t(layer)];
  const int64_t need = pos + T;
  const int64_t hd = head_dim_, heads = n_kv_heads_, kv_dim = this->kv_dim();
  if (need > L.capacity) {
    const int64_t cap = (std::max({need, L.capacity * 2, int64_t(64)}) + kKTile - 1) / kKTile * kKTile;
    uint16_t* nk = alloc_u16(cap * kv_dim);
    uint16_t* nv = alloc_u16(cap * kv_dim);
    std::memset(nk, 0, size_t(cap * kv_dim) * 2);  // positions beyond length stay zero
    std::memset(nv, 0, size_t(cap * kv_dim) * 2);
    for (int64_t h = 0; h < heads && L.capacity > 0; ++h) {  // each head's block moves to its new place
      std::memcpy(nk + h * cap * hd, L.k_head(h, hd), size_t(L.capacity * hd) * 2);  // whole tiles; same layout
      std::memcpy(nv + h * cap * hd, L.v_head(h, hd), size_t(L.length * hd) * 2);
    }
    std::free(L.k);
    std::free(L.v);
    L.k = nk;
    L.v = nv;
    L.capacity = cap;
  }
  // A gap (pos > length) is already zero: storage beyond length is never written.
  // A position's key is one 2-byte column of its tile in each of hd rows 32 bytes apart (32
  // cache lines a head), its value a row of 2 lines: lines a decode step last read before
  // the layers' weights streamed through the caches. Asked for all at once, ahead of the
  // stores, their misses overlap instead of each store waiting on its own.
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t t = 0; t < T && t < kKTile; ++t) {
      const int64_t p = pos + t;
      const char* kd = reinterpret_cast<const char*>(L.k_head(h, hd) + k_tile_index(p, 0, hd));
      if (t == 0 || p % kKTile == 0)  // a tile's lines once
        for (int64_t b = 0; b < hd * kKTile * 2; b += 64) __builtin_prefetch(kd + b, 1, 3);
      const char* vd = reinterpret_cast<const char*>(L.v_head(h, hd) + p * hd);
      for (int64_t b = 0; b < hd * 2; b += 64) __builtin_prefetch(vd + b, 1, 3);
    }
  thread_local std::vector<uint16_t> kh;
  if (kh.size() < size_t(T * kv_dim)) kh.resize(size_t(T * kv_dim));
  f32_to_f16(k, kh.data(), T * kv_dim);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = pos + t;
      const uint16_t* ks = kh.data() + t * kv_dim + h * hd;
      uint16_t* dst = L.k_head(h, hd) + k_tile_index(p, 0, hd);
      for (int64_t c = 0; c < hd; ++c) dst[c * kKTile] = ks[c];
      f32_to_f16(v + t * kv_dim + h * hd, L.v_head(h, hd) + p * hd, hd);  // values: rows, in place
    }
  L.length = std::max(L.length, need);
}

void KvCache::read_k(int64_t layer, int64_t pos, float* out) const {
  if (layer < 0 || layer >= n_layers_) fail("KvCache layer {} out of range ({} layers)", layer, n_layers_);
  const Storage::Layer& L = storage_->layers[size_t(layer)];
  if (pos < 0 || pos >= L.length) fail("KvCache position {} not written (layer {} holds {})", pos, layer, L.length);
  for (int64_t i = 0; i < kv_dim(); ++i)
    out[i] = f16_to_f32(L.k_head(i / head_dim_, head_dim_)[k_tile_index(pos, i % head_dim_, head_dim_)]);
}

void KvCache::read_v(int64_t layer, int64_t pos, float* out) const {
  if (layer < 0 || layer >= n_layers_) fail("KvCache layer {} out of range ({} layers)", layer, n_layers_);
  const Storage::Layer& L = storage_->layers[size_t(layer)];
  if (pos < 0 || pos >= L.length) fail("KvCache position {} not written (layer {} holds {})", pos, layer, L.length);
  for (int64_t i = 0; i < kv_dim(); ++i)
    out[i] = f16_to_f32(L.v_head(i / head_dim_, head_dim_)[pos * head_dim_ + i % head_dim_]);
}

// ---------------------------------------------------------------- attention
namespace {
// Decode attention splits each (query row, kv head)'s keys into `count` chunks of `length`
// (whole key tiles) when there are too few such jobs to keep the threads busy.
struct KeyChunks {
  int64_t count, length;
};
KeyChunks key_chunks(int64_t rows_jobs, int64_t ctx, const ThreadPool& pool) {
  const int64_t want = 4 * int64_t(pool.size());
  int64_t C = 1;
  if (rows_jobs < want) C = std::clamp<int64_t>((want + rows_jobs - 1) / rows_jobs, 1, std::max<int64_t>(1, ctx / 128));
  return {C, ((ctx + C - 1) / C + kKTile - 1) / kKTile * kKTile};
}

// One head's output from its C chunks' partial softmaxes (p: C entries of part_stride: max,
// sum of exp, unnormalized output).
void merge_key_chunks(const float* p, int64_t C, int64_t part_stride, int64_t hd, float* o) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < C; ++c) mx = std::max(mx, p[c * part_stride]);
  std::fill(o, o + hd, 0.0f);
  float lsum = 0;
  for (int64_t c = 0; c < C; ++c) {
    const float* pc = p + c * part_stride;
    if (pc[1] <= 0) continue;
    const float f = std::exp(pc[0] - mx);
    lsum += pc[1] * f;
    for (int64_t d = 0; d < hd; ++d) o[d] += pc[2 + d] * f;
  }
  const float inv = lsum > 0 ? 1.0f / lsum : 0.0f;
  for (int64_t d = 0; d < hd; ++d) o[d] *= inv;
}

// `layer` of a cache that holds n_kv_heads heads of head_dim (else an Error naming both).
const KvCache::Storage::Layer& cache_layer(const KvCache& cache, int64_t layer, int64_t n_kv_heads, int64_t head_dim) {
  if (n_kv_heads != cache.n_kv_heads() || head_dim != cache.head_dim())
    fail("attention: {} kv heads of {} but the cache holds {} of {}", n_kv_heads, head_dim, cache.n_kv_heads(),
         cache.head_dim());
  if (layer < 0 || layer >= cache.n_layers()) fail("attention: layer {} out of range", layer);
  return cache.storage().layers[size_t(layer)];
}

// One decode job: kv head kvh's query heads of one query row (q: the row, n_heads x hd) over
// key chunk c of C (keys [0, n_keys) in chunks of clen). C == 1: the normalized output goes to
// out (the row); else the chunk's partial (max, sum of exp, unnormalized output) goes to
// part (the row's parts: head h's chunk c at (h * C + c) * (hd + 2)) for merge_key_chunks.
void attend_key_chunk(const float* q, float* out, float* part, const KvCache::Storage::Layer& L,
                      int64_t kvh, int64_t c, int64_t C, int64_t clen, int64_t n_keys, int64_t group, int64_t hd,
                      float scale) {
  thread_local std::vector<float> ml, ob;
  if (ml.size() < size_t(2 * group)) ml.resize(size_t(2 * group));
  if (ob.size() < size_t(group * hd)) ob.resize(size_t(group * hd));
  const int64_t j0 = std::min(n_keys, c * clen), j1 = std::min(n_keys, (c + 1) * clen);
  float* m = ml.data();
  float* l = m + group;
  attn_chunk_hwy(q + kvh * group * hd, hd, int(group), L.k_head(kvh, hd), L.v_head(kvh, hd), hd, j0, j1, scale, m, l,
                 ob.data());
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kvh * group + g;
    if (C == 1) {
      float* o = out + h * hd;
      const float inv = l[g] > 0 ? 1.0f / l[g] : 0.0f;
      for (int64_t d = 0; d < hd; ++d) o[d] = ob[size_t(g * hd + d)] * inv;
    } else {
      float* p = part + (h * C + c) * (hd + 2);
      p[0] = m[g];
      p[1] = l[g];
      std::memcpy(p + 2, ob.data() + g * hd, size_t(hd) * 4);
    }
  }
}
}  // namespace

void attention(const float* q, int64_t T, int64_t pos0, const KvCache& cache, int64_t layer, int64_t n_heads,
               int64_t n_kv_heads, int64_t head_dim, float scale, float* out, ThreadPool& pool) {
  if (T <= 0) return;
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
    fail("attention: {} heads are not a multiple of {} kv heads", n_heads, n_kv_heads);
  const KvCache::Storage::Layer& L = cache_layer(cache, layer, n_kv_heads, head_dim);
  const int64_t ctx = pos0 + T;
  if (pos0 < 0 || ctx > L.length) fail("attention: positions up to {} needed, the cache holds {}", ctx, L.length);

  const int64_t group = n_heads / n_kv_heads, hd = head_dim;
  const int64_t q_row = n_heads * hd;

  if (T >= 8 && hd <= 1024 && hd % f32_lanes_hwy() == 0) {
    // Prefill: keys of each kv head converted once to fp32 [hd][ctx] (transposed), then
    // jobs of TB query rows x the group's heads (the rows share every key and value load).
    // ld: padded so the transposed rows are not a power of two apart (cache set aliasing).
    const int64_t ld = (ctx + 31) / 32 * 32 + 16;
    thread_local std::vector<float> kt_buf, vf_buf;
    if (kt_buf.size() < size_t(n_kv_heads * hd * ld)) kt_buf.resize(size_t(n_kv_heads * hd * ld));
    if (vf_buf.size() < size_t(n_kv_heads * hd * ctx)) vf_buf.resize(size_t(n_kv_heads * hd * ctx));
    float* kt = kt_buf.data();
    float* vf = vf_buf.data();
    pool.parallel_for(n_kv_heads, [&](int64_t b, int64_t e) {
      for (int64_t h = b; h < e; ++h)
        k_transpose_hwy(L.k_head(h, hd), L.v_head(h, hd), hd, ctx, ld, kt + h * hd * ld, vf + h * hd * ctx);
    });
    const int64_t TB = std::max<int64_t>(1, 32 / group);
    const int64_t tblocks = (T + TB - 1) / TB;
    pool.parallel_for(n_kv_heads * tblocks, [&](int64_t b, int64_t e) {
      std::vector<const float*> qr(size_t(TB * group));
      std::vector<float*> orows(size_t(TB * group));
      std::vector<int64_t> lim(size_t(TB * group));
      for (int64_t job = b; job < e; ++job) {
        // kv head major (its keys and values stay in L2), latest rows (most keys) first
        const int64_t kvh = job / tblocks;
        const int64_t tb = tblocks - 1 - job % tblocks;
        const int64_t t0 = tb * TB, t1 = std::min(T, t0 + TB);
        int R = 0;
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t g = 0; g < group; ++g, ++R) {
            const int64_t h = kvh * group + g;
            qr[size_t(R)] = q + t * q_row + h * hd;
            orows[size_t(R)] = out + t * q_row + h * hd;
            lim[size_t(R)] = pos0 + t + 1;
          }
        attn_rows_hwy(qr.data(), orows.data(), lim.data(), R, kt + kvh * hd * ld, ld, vf + kvh * hd * ctx, hd, scale);
      }
    }, 1);
    return;
  }

  // Split the keys into C chunks when there are too few (query row, kv head) jobs to keep
  // the threads busy (decode); the chunks' partial softmaxes are merged afterwards.
  const int64_t rows_jobs = T * n_kv_heads;
  const KeyChunks kc = key_chunks(rows_jobs, ctx, pool);
  const int64_t C = kc.count, clen = kc.length;
  const int64_t jobs = rows_jobs * C;

  thread_local std::vector<float> part_buf;
  const int64_t part_stride = hd + 2;
  if (C > 1 && part_buf.size() < size_t(T * n_heads * C * part_stride))
    part_buf.resize(size_t(T * n_heads * C * part_stride));
  float* part = part_buf.data();

  auto job_fn = [&](int64_t b, int64_t e) {
    for (int64_t job = b; job < e; ++job) {
      // Heaviest query rows (latest positions) first.
      const int64_t t = T - 1 - job / (n_kv_heads * C);
      const int64_t r = job % (n_kv_heads * C);
      attend_key_chunk(q + t * q_row, out + t * q_row, part + t * n_heads * C * part_stride, L, r / C, r % C, C,
                       clen, pos0 + t + 1, group, hd, scale);
    }
  };
  pool.parallel_for(jobs, job_fn, jobs >= 4 * pool.size() ? 1 : 0);

  if (C > 1)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < n_heads; ++h)
        merge_key_chunks(part + (t * n_heads + h) * C * part_stride, C, part_stride, hd, out + t * q_row + h * hd);
}

void attention_rows(std::span<const AttentionRow> rows, int64_t layer, int64_t n_heads, int64_t n_kv_heads,
                    int64_t head_dim, float scale, ThreadPool& pool) {
  if (rows.empty()) return;
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
    fail("attention: {} heads are not a multiple of {} kv heads", n_heads, n_kv_heads);
  const int64_t group = n_heads / n_kv_heads, hd = head_dim, part_stride = hd + 2;
  // Per row: its cache layer and its key chunks, as attention() of that row alone (T = 1).
  struct Row {
    const KvCache::Storage::Layer* L;
    int64_t n_keys, C, clen, first_job, part;
  };
  std::vector<Row> rs(rows.size());
  int64_t jobs = 0, parts = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const AttentionRow& a = rows[i];
    const KvCache::Storage::Layer& L = cache_layer(*a.cache, layer, n_kv_heads, hd);
    if (a.pos < 0 || a.pos + 1 > L.length)
      fail("attention: positions up to {} needed, the cache holds {}", a.pos + 1, L.length);
    const KeyChunks kc = key_chunks(n_kv_heads, a.pos + 1, pool);
    rs[i] = {&L, a.pos + 1, kc.count, kc.length, jobs, parts};
    jobs += n_kv_heads * kc.count;
    if (kc.count > 1) parts += n_heads * kc.count * part_stride;
  }
  thread_local std::vector<float> part_buf;
  if (part_buf.size() < size_t(parts)) part_buf.resize(size_t(parts));
  float* part = part_buf.data();
  pool.parallel_for(jobs, [&](int64_t b, int64_t e) {
    size_t i = 0;  // the row of job b; jobs are numbered row after row
    for (int64_t job = b; job < e; ++job) {
      while (i + 1 < rs.size() && job >= rs[i + 1].first_job) ++i;
      const Row& R = rs[i];
      const int64_t r = job - R.first_job;
      attend_key_chunk(rows[i].q, rows[i].out, part + R.part, *R.L, r / R.C, r % R.C, R.C, R.clen, R.n_keys,
                       group, hd, scale);
    }
  }, jobs >= 4 * pool.size() ? 1 : 0);
  for (size_t i = 0; i < rows.size(); ++i)
    if (rs[i].C > 1)
      for (int64_t h = 0; h < n_heads; ++h)
        merge_key_chunks(part + rs[i].part + h * rs[i].C * part_stride, rs[i].C, part_stride, hd,
                         rows[i].out + h * hd);
}

}  // namespace tessera::cpu
