#include "runtime/bandwidth.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "util/error.h"
#include "util/parallel.h"

namespace tessera {

namespace {

// 32-byte integer vectors: the compiler emits wide loads (AVX2 where built for it, else
// pairs of SSE loads) and cannot drop them, since the sums are used.
typedef uint64_t u64x4 __attribute__((vector_size(32)));
constexpr size_t kAlign = size_t(2) << 20;  // 2 MiB: lets the kernel back it with huge pages
constexpr size_t kVecsPerStep = 4;          // 128 bytes per loop iteration

struct Buffer {
  void* p = nullptr;
  size_t n = 0;
  explicit Buffer(size_t bytes) : n((bytes + kAlign - 1) / kAlign * kAlign) {
    p = std::aligned_alloc(kAlign, n);
    if (!p) fail("cannot allocate {} MiB to measure memory bandwidth", n >> 20);
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE);
#endif
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

uint64_t sum_slice(const u64x4* v, size_t count) {
  u64x4 a = {0, 0, 0, 0}, b = a, c = a, d = a;
  size_t i = 0;
  for (; i + kVecsPerStep <= count; i += kVecsPerStep) {
    a += v[i];
    b += v[i + 1];
    c += v[i + 2];
    d += v[i + 3];
  }
  for (; i < count; ++i) a += v[i];
  const u64x4 s = a + b + c + d;
  return s[0] + s[1] + s[2] + s[3];
}

std::atomic<uint64_t> g_sink{0};

}  // namespace

double measure_read_bandwidth_gbs(int threads, int64_t bytes, int repeats) {
  if (threads <= 0) threads = default_threads();
  if (repeats < 1) repeats = 1;
  if (bytes < int64_t(threads) * 4096) bytes = int64_t(threads) * 4096;
  Buffer buf{size_t(bytes)};
  const size_t n_vecs = buf.n / sizeof(u64x4);
  auto* vecs = static_cast<u64x4*>(buf.p);
  auto slice = [&](int t) {
    const size_t per = (n_vecs / size_t(threads)) / kVecsPerStep * kVecsPerStep;
    const size_t begin = per * size_t(t);
    const size_t end = t == threads - 1 ? n_vecs : begin + per;
    return std::pair<size_t, size_t>(begin, end);
  };

  // Every thread touches, then reads, its own slice; the clock runs between barriers.
  std::barrier sync(threads);
  std::vector<double> seconds(size_t(repeats), 0.0);
  auto work = [&](int t) {
    const auto [begin, end] = slice(t);
    std::memset(static_cast<void*>(vecs + begin), 0x5a, (end - begin) * sizeof(u64x4));
    uint64_t acc = 0;
    for (int r = 0; r < repeats; ++r) {
      sync.arrive_and_wait();
      const auto t0 = std::chrono::steady_clock::now();
      acc += sum_slice(vecs + begin, end - begin);
      sync.arrive_and_wait();
      if (t == 0) seconds[size_t(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    g_sink.fetch_add(acc, std::memory_order_relaxed);
  };
  std::vector<std::thread> pool;
  pool.reserve(size_t(threads - 1));
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& th : pool) th.join();

  const double best = *std::min_element(seconds.begin(), seconds.end());
  return double(n_vecs * sizeof(u64x4)) / std::max(best, 1e-9) / 1e9;
}

void evict_caches(int64_t bytes) {
  if (bytes <= 0) return;
  Buffer buf{size_t(bytes)};
  std::memset(buf.p, 0xa5, buf.n);
  g_sink.fetch_add(sum_slice(static_cast<const u64x4*>(buf.p), buf.n / sizeof(u64x4)),
                   std::memory_order_relaxed);
}

}  // namespace tessera
