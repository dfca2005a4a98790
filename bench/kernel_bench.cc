// Micro-benchmarks of the cpu kernels: memory read bandwidth, GEMV bandwidth, GEMM
// throughput, attention and the pool's overhead, per ISA path and thread count.
// Usage: tessera_kernel_bench [--quick]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "targets/cpu/kernels.h"
#include "targets/cpu/quant.h"

using namespace tessera::cpu;
using Clock = std::chrono::steady_clock;

namespace {

bool g_quick = false;
std::string g_only;      // "", "gemv", "qgemv", "bgemv", "gemm", "qgemm", "attn", "pool", "bw"
int g_threads = 0;       // 0: 1 and 2
std::string g_path;      // "": every path
int64_t g_bgemv_n = 2048, g_bgemv_k = 2048;  // bgemv's matrix (--shape NxK)
bool g_in_cache = false;  // bgemv: one copy of the matrix, read again and again (the compute alone)
bool want(const char* what) { return g_only.empty() || g_only == what; }

// Best time of repeated runs of fn, in seconds (runs for at least `min_s` in total).
double best_time(const std::function<void()>& fn, double min_s = 0.3, int min_reps = 3) {
  fn();  // warm up
  double best = 1e30, total = 0;
  for (int rep = 0; rep < min_reps || total < min_s; ++rep) {
    const auto t0 = Clock::now();
    fn();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, dt);
    total += dt;
    if (rep > 2000) break;
  }
  return best;
}

__attribute__((target("avx512f"))) uint64_t read_sum(const uint8_t* p, size_t bytes) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 256 <= bytes; i += 256) {
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 192));
  }
  a0 = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  alignas(64) uint64_t out[8];
  _mm512_store_si512(out, a0);
  return out[0] ^ out[3] ^ out[7];
}

// Multi-threaded read loop over a 1 GiB buffer, timed per 128 MiB slice (rotating through the
// buffer, so every slice comes from DRAM); best slice, to see past other processes' noise.
double read_bandwidth(ThreadPool& pool) {
  const size_t bytes = size_t(1) << 30, slice = size_t(128) << 20;
  auto* buf = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
  std::memset(buf, 1, bytes);
  volatile uint64_t sink = 0;
  const int64_t chunks = 32;
  size_t off = 0;
  const double t = best_time([&] {
    const uint8_t* base = buf + off;
    off = (off + slice) % bytes;
    pool.parallel_for(chunks, [&](int64_t b, int64_t e) {
      uint64_t s = 0;
      for (int64_t c = b; c < e; ++c) s ^= read_sum(base + size_t(c) * (slice / chunks), slice / chunks);
      sink = sink ^ s;
    });
  }, g_quick ? 0.5 : 1.5, 16);
  std::free(buf);
  return double(slice) / t / 1e9;
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

// Enough copies of an [N, K] bf16 matrix to span > 256 MiB, so GEMV reads come from DRAM
// as they do in a real decode step (the whole model does not fit the caches).
struct Weights {
  std::vector<std::vector<uint16_t>> copies;
  int64_t N, K;
  Weights(int64_t n, int64_t k, size_t min_total = size_t(256) << 20) : N(n), K(k) {
    const size_t one = size_t(N * K) * 2;
    const size_t count = std::max<size_t>(1, (min_total + one - 1) / one);
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 0.05f);
    std::vector<uint16_t> base(size_t(N * K));
    for (auto& v : base) v = to_bf16(d(rng));
    copies.assign(count, base);
  }
};

struct Shape {
  const char* model;
  const char* name;
  int64_t N, K;
};

const Shape kShapes[] = {
    {"135M", "q_proj", 576, 576},       {"135M", "gate/up", 1536, 576},   {"135M", "down", 576, 1536},
    {"135M", "lm_head", 49152, 576},    {"1B", "q_proj", 2048, 2048},     {"1B", "gate/up", 8192, 2048},
    {"1B", "down", 2048, 8192},         {"1B", "lm_head", 128256, 2048},
};

void bench_gemv(ThreadPool& pool, double bw) {
  for (const Shape& s : kShapes) {
    Weights w(s.N, s.K);
    std::vector<float> x(size_t(s.K), 0.5f), y(size_t(s.N));
    size_t i = 0;
    const size_t per_call = size_t(s.N * s.K) * 2;
    // >= 128 MiB a timing (like the read loop's slices), best of many to see past other
    // processes' noise.
    const int calls = int(std::max<size_t>(1, (size_t(128) << 20) / per_call));
    const double t = best_time([&] {
      for (int c = 0; c < calls; ++c) {
        matmul(x.data(), 1, Bf16Matrix{w.copies[i].data(), s.N, s.K}, nullptr, y.data(), pool);
        i = (i + 1) % w.copies.size();
      }
    }, g_quick ? 0.3 : 1.0, g_quick ? 6 : 16);
    const double gbs = double(per_call) * calls / t / 1e9;
    std::printf("  gemv %-5s %-8s [%6ld x %5ld]  %8.1f us  %6.1f GB/s  %5.1f%% of read bw\n", s.model, s.name,
                long(s.N), long(s.K), t / calls * 1e6, gbs, 100.0 * gbs / bw);
  }
}

// The decode GEMV on x16 tiles (cpu/quant.h), per block type: out of cache (copies rotated
// through 256 MiB, as the model streams its weights) against the read bandwidth, and in L2
// (one 1024-row matrix again and again), which shows the kernel's own instruction throughput.
void bench_qgemv(ThreadPool& pool, double bw) {
  using tessera::DType;
  constexpr int64_t N = 2048, K = 2048, kL2Rows = 1024;
  std::printf("  qgemv [%ld x %ld], random blocks (scales 1.0)\n", long(N), long(K));
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const size_t per_call = size_t(x16_bytes(t, N, K));
    const size_t copies = std::max<size_t>(2, (size_t(256) << 20) / per_call);
    std::vector<uint8_t> tiles(per_call * copies);
    std::mt19937 rng(3);
    for (auto& b : tiles) b = uint8_t(rng());
    const int64_t tile = x16_tile_bytes(t);
    for (size_t at = 0; at + 64 <= tiles.size(); at += size_t(tile))  // f16 1.0 scales (and mins)
      for (int e = 0; e < 32; ++e) reinterpret_cast<uint16_t*>(tiles.data() + at)[e] = 0x3C00;
    std::vector<float> x(static_cast<size_t>(K)), y(static_cast<size_t>(N));
    for (auto& v : x) v = std::normal_distribution<float>()(rng);
    size_t i = 0;
    const int calls = int(std::max<size_t>(1, (size_t(128) << 20) / per_call));
    const double t_mem = best_time([&] {
      for (int c = 0; c < calls; ++c) {
        matmul(x.data(), 1, WeightMatrix(t, tiles.data() + i * per_call, N, K), nullptr, y.data(), pool);
        i = (i + 1) % copies;
      }
    }, g_quick ? 0.3 : 1.0, g_quick ? 6 : 16);
    const size_t l2_bytes = size_t(x16_bytes(t, kL2Rows, K));
    const int l2_calls = 200;
    const double t_l2 = best_time([&] {
      for (int c = 0; c < l2_calls; ++c)
        matmul(x.data(), 1, WeightMatrix(t, tiles.data(), kL2Rows, K), nullptr, y.data(), pool);
    }, g_quick ? 0.2 : 0.5, 4);
    Q8Row xq;
    const double t_q = best_time([&] { for (int c = 0; c < 100; ++c) xq.quantize(x.data(), K); }, 0.1, 3) / 100;
    const double gbs = double(per_call) * calls / t_mem / 1e9;
    std::printf("  qgemv %-5s  %8.1f us  %6.1f GB/s  %5.1f%% of read bw;  in L2: %6.1f GB/s;  x quantized in %.2f us\n",
                tessera::dtype_name(t), t_mem / calls * 1e6, gbs, 100.0 * gbs / bw,
                double(l2_bytes) * l2_calls / t_l2 / 1e9, t_q * 1e6);
  }
}

// The batched decode GEMV (matmul_rows: T sequences' rows against one matrix, the
// weights read once for all of them), out of cache, per type and T: the time per call and
// the rows it serves per second against T = 1's. What a batched decode step can gain over
// one stream is bounded by this ratio. --in-cache reads one copy again and again (2048 x
// 2048 Q4_0 is 1.2 MB per thread, within L2): the kernel's compute alone, which is what
// limits the ratio once it exceeds the out-of-cache time of one row.
void bench_batched_gemv(ThreadPool& pool) {
  using tessera::DType;
  const int64_t N = g_bgemv_n, K = g_bgemv_k;
  std::printf("  batched gemv [%ld x %ld], %s: us per call (rows/s vs T = 1)\n", long(N), long(K),
              g_in_cache ? "in cache" : "out of cache");
  for (DType t : {DType::BF16, DType::Q4_0, DType::Q8_0, DType::Q4_K}) {
    const bool bf16 = t == DType::BF16;
    const size_t per_call = bf16 ? size_t(N * K * 2) : size_t(x16_bytes(t, N, K));
    const size_t copies = g_in_cache ? 1 : std::max<size_t>(2, (size_t(256) << 20) / per_call);
    std::vector<uint8_t> data(per_call * copies);
    std::mt19937 rng(3);
    if (bf16) {
      auto* v = reinterpret_cast<uint16_t*>(data.data());
      for (size_t e = 0; e < data.size() / 2; ++e) v[e] = uint16_t(0x3F80 | (rng() & 0x7F));  // bf16 in [1, 2)
    } else {
      for (auto& b : data) b = uint8_t(rng());
      const int64_t tile = x16_tile_bytes(t);
      for (size_t at = 0; at + 64 <= data.size(); at += size_t(tile))
        for (int e = 0; e < 32; ++e) reinterpret_cast<uint16_t*>(data.data() + at)[e] = 0x3C00;
    }
    std::vector<WeightMatrix> ws;
    for (size_t c = 0; c < copies; ++c)
      ws.push_back(bf16 ? WeightMatrix(Bf16Matrix{reinterpret_cast<const uint16_t*>(data.data() + c * per_call), N, K})
                        : WeightMatrix(t, data.data() + c * per_call, N, K));
    std::vector<float> x(size_t(16 * K)), y(size_t(16 * N));
    for (auto& v : x) v = std::normal_distribution<float>()(rng);
    std::printf("  %-5s", tessera::dtype_name(t));
    double one = 0;
    size_t i = 0;
    for (int64_t T : {1, 2, 4, 8, 16}) {
      const int calls = int(std::max<size_t>(1, (size_t(64) << 20) / per_call));
      const double s = best_time([&] {
        for (int c = 0; c < calls; ++c) {
          const MatmulOut out[] = {{&ws[i], nullptr, y.data()}};
          matmul_rows(x.data(), T, out, pool);
          i = (i + 1) % copies;
        }
      }, g_quick ? 0.2 : 0.6, g_quick ? 4 : 8) / calls;
      if (T == 1) one = s;
      std::printf("  T=%-2ld %7.1f us (%4.2fx)", long(T), s * 1e6, one / s * double(T));
    }
    std::printf("\n");
  }
}

void bench_gemm(ThreadPool& pool) {
  for (int64_t T : {128, 512}) {
    for (const Shape& s : kShapes) {
      if (std::string(s.name) == "lm_head") continue;  // prefill runs lm_head on the last token only
      Weights w(s.N, s.K, 0);
      std::mt19937 rng(2);
      std::normal_distribution<float> d;
      std::vector<float> x(size_t(T * s.K)), y(size_t(T * s.N));
      for (auto& v : x) v = d(rng);
      const double t = best_time([&] {
        matmul(x.data(), T, Bf16Matrix{w.copies[0].data(), s.N, s.K}, nullptr, y.data(), pool);
      }, g_quick ? 0.1 : 0.3, 2);
      std::printf("  gemm T=%-3ld %-5s %-8s [%6ld x %5ld]  %9.1f us  %7.1f GFLOP/s\n", long(T), s.model, s.name,
                  long(s.N), long(s.K), t * 1e6, 2.0 * double(T * s.N * s.K) / t / 1e9);
    }
  }
}

// The prefill GEMM on quantized weights (matmul, T rows) for the 1B model's shapes: GFLOP/s
// against the bf16 GEMM on the same shape (the weights in L3 or memory, as in a prefill).
void bench_quantized_gemm(ThreadPool& pool) {
  using tessera::DType;
  for (int64_t T : {16, 64, 128, 512}) {
    if (g_quick && T > 64) continue;
    for (const Shape& s : kShapes) {
      if (std::string(s.model) != "1B" || std::string(s.name) == "lm_head") continue;
      std::printf("  qgemm T=%-3ld %-8s [%5ld x %5ld]", long(T), s.name, long(s.N), long(s.K));
      std::mt19937 rng(5);
      std::vector<float> x(size_t(T * s.K)), y(size_t(T * s.N));
      for (auto& v : x) v = std::normal_distribution<float>()(rng);
      for (DType t : {DType::BF16, DType::Q4_0, DType::Q4_K, DType::Q8_0}) {
        const bool bf16 = t == DType::BF16;
        std::vector<uint8_t> data(bf16 ? size_t(s.N * s.K * 2) : size_t(x16_bytes(t, s.N, s.K)));
        if (bf16) {
          auto* v = reinterpret_cast<uint16_t*>(data.data());
          for (size_t e = 0; e < data.size() / 2; ++e) v[e] = uint16_t(0x3F80 | (rng() & 0x7F));
        } else {
          for (auto& b : data) b = uint8_t(rng());
          for (size_t at = 0; at + 64 <= data.size(); at += size_t(x16_tile_bytes(t)))
            for (int e = 0; e < 32; ++e) reinterpret_cast<uint16_t*>(data.data() + at)[e] = 0x3C00;
        }
        const WeightMatrix w = bf16 ? WeightMatrix(Bf16Matrix{reinterpret_cast<const uint16_t*>(data.data()), s.N, s.K})
                                    : WeightMatrix(t, data.data(), s.N, s.K);
        const double sec = best_time([&] { matmul(x.data(), T, w, nullptr, y.data(), pool); }, g_quick ? 0.1 : 0.3, 2);
        std::printf("  %s %6.0f", tessera::dtype_name(t), 2.0 * double(T * s.N * s.K) / sec / 1e9);
      }
      std::printf("  GFLOP/s\n");
    }
  }
}

void bench_attention(ThreadPool& pool) {
  struct A {
    const char* model;
    int64_t nh, nkv;
  };
  const A models[] = {{"135M", 9, 3}, {"1B", 32, 8}};
  const int64_t hd = 64;
  for (const A& m : models) {
    for (int64_t ctx : {128, 512, 2048}) {
      const int64_t kv_dim = m.nkv * hd;
      KvCache cache(1, m.nkv, hd);
      std::mt19937 rng(3);
      std::normal_distribution<float> d;
      std::vector<float> kv(size_t(ctx * kv_dim));
      for (auto& v : kv) v = d(rng);
      cache.write(0, 0, kv.data(), kv.data(), ctx);
      std::vector<float> q(size_t(ctx * m.nh * hd)), out(q.size());
      for (auto& v : q) v = d(rng);
      const float scale = 0.125f;
      const double td = best_time([&] {
        attention(q.data(), 1, ctx - 1, cache, 0, m.nh, m.nkv, hd, scale, out.data(), pool);
      }, g_quick ? 0.05 : 0.2);
      std::printf("  attn %-5s decode  ctx=%-5ld %9.1f us/layer\n", m.model, long(ctx), td * 1e6);
      if (ctx > 512) continue;
      const double tp = best_time([&] {
        attention(q.data(), ctx, 0, cache, 0, m.nh, m.nkv, hd, scale, out.data(), pool);
      }, g_quick ? 0.05 : 0.2);
      const double flops = 4.0 * double(m.nh) * hd * double(ctx) * double(ctx + 1) / 2;
      std::printf("  attn %-5s prefill T=%-5ld %9.1f us/layer  %6.1f GFLOP/s\n", m.model, long(ctx), tp * 1e6,
                  flops / tp / 1e9);
    }
  }
}

// Decode attention as the model meets it: the sequences' caches (1B: 8 kv heads of 64)
// evicted from the CPU caches before each call (a decode step streams the weights between two
// layers' attention). 1 row (one stream) and 8 rows (a batched step) at contexts 128 and 2048.
// Median of the calls, with their range.
void bench_attention_rows_cold(ThreadPool& pool) {
  const int64_t nh = 32, nkv = 8, hd = 64, kv_dim = nkv * hd;
  std::vector<uint8_t> evict(size_t(256) << 20, 1);
  uint64_t sink = 0;
  for (int64_t rows : {1, 8})
    for (int64_t ctx : {128, 2048}) {
      std::mt19937 rng(5);
      std::normal_distribution<float> d;
      std::vector<std::unique_ptr<KvCache>> caches;
      std::vector<float> kv(size_t(ctx * kv_dim)), q(size_t(rows * nh * hd)), out(q.size());
      for (auto& v : q) v = d(rng);
      std::vector<AttentionRow> ar;
      for (int64_t r = 0; r < rows; ++r) {
        caches.push_back(std::make_unique<KvCache>(1, nkv, hd));
        for (auto& v : kv) v = d(rng);
        caches.back()->write(0, 0, kv.data(), kv.data(), ctx);
        ar.push_back({q.data() + r * nh * hd, caches.back().get(), ctx - 1, out.data() + r * nh * hd});
      }
      std::vector<double> us;
      for (int rep = 0; rep < (g_quick ? 11 : 31); ++rep) {
        for (size_t i = 0; i < evict.size(); i += 64) sink += evict[i]++;
        const auto t0 = Clock::now();
        if (rows == 1)
          attention(q.data(), 1, ctx - 1, *caches[0], 0, nh, nkv, hd, 0.125f, out.data(), pool);
        else
          attention_rows(ar, 0, nh, nkv, hd, 0.125f, pool);
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
      std::sort(us.begin(), us.end());
      std::printf("  attn 1B   decode of %ld row%s, ctx=%-5ld from DRAM: %8.1f us/layer (median; range %.1f-%.1f)\n",
                  long(rows), rows > 1 ? "s" : " ", long(ctx), us[us.size() / 2], us.front(), us.back());
    }
  if (sink == 42) std::printf(" \n");
}

void bench_pool(ThreadPool& pool) {
  const int reps = 200000;
  for (int64_t n : {int64_t(pool.size()), int64_t(64)}) {
    const double t = best_time([&] {
      for (int r = 0; r < reps; ++r) pool.parallel_for(n, [](int64_t, int64_t) {});
    }, 0.1, 2);
    std::printf("  pool empty parallel_for(n=%ld): %.2f us\n", long(n), t / reps * 1e6);
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") g_quick = true;
    else if (a == "--only" && i + 1 < argc) g_only = argv[++i];
    else if (a == "--threads" && i + 1 < argc) g_threads = std::atoi(argv[++i]);
    else if (a == "--path" && i + 1 < argc) g_path = argv[++i];
    else if (a == "--in-cache") g_in_cache = true;
    else if (a == "--shape" && i + 1 < argc && std::sscanf(argv[i + 1], "%ldx%ld", &g_bgemv_n, &g_bgemv_k) == 2) ++i;
    else {
      std::fprintf(stderr, "usage: tessera_kernel_bench [--quick] [--only gemv|qgemv|bgemv|gemm|qgemm|attn|pool|bw] [--threads N] [--path P] [--shape NxK (bgemv; default 2048x2048)] [--in-cache (bgemv)]\n");
      return 2;
    }
  }
  std::printf("tessera kernel bench; ISAs available: ");
  for (const auto& s : available_isas()) std::printf("%s ", s.c_str());
  std::printf("\n");
  std::vector<std::string> paths;
  for (const auto& s : available_isas())  // amx: what `auto` runs where the CPU has it
    if (s == "amx" || s == "avx512bf16") paths.push_back(s);
  paths.push_back("hwy");
  if (!g_path.empty()) paths = {g_path};
  std::vector<int> thread_counts = {1, 2};
  if (g_threads > 0) thread_counts = {g_threads};
  for (int threads : thread_counts) {
    ThreadPool pool(threads);
    std::printf("\n=== %d thread%s ===\n", threads, threads > 1 ? "s" : "");
    double bw = 0;
    if (want("bw") || want("gemv") || want("qgemv")) {
      bw = read_bandwidth(pool);
      std::printf("  read bandwidth (1 GiB): %.1f GB/s\n", bw);
    }
    if (want("pool")) bench_pool(pool);
    for (const auto& path : paths) {
      set_isa(path);
      std::printf(" -- path %s (isa %s)\n", path.c_str(), isa().c_str());
      if (want("gemv")) bench_gemv(pool, bw);
      if (want("qgemv")) bench_qgemv(pool, bw);
      if (want("bgemv")) bench_batched_gemv(pool);
      if (want("gemm")) bench_gemm(pool);
      if (want("qgemm")) bench_quantized_gemm(pool);
      if (want("attn")) {
        bench_attention(pool);
        bench_attention_rows_cold(pool);
      }
    }
    set_isa("auto");
  }
  return 0;
}
