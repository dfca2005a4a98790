// The cpu target's persistent thread pool. A parallel region publishes one 64-bit word
// (generation | chunk count | next chunk); workers spinning on it claim chunks with a CAS,
// so a region costs a cache-line round trip or two rather than a thread start or a futex.
// Workers that have been idle for a while sleep on a condition variable.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "targets/cpu/kernels.h"
#include "util/parallel.h"

namespace tessera::cpu {

namespace {

thread_local bool t_inside_pool = false;

inline void cpu_relax() { _mm_pause(); }

// state word layout: [generation:32][chunks:16][next:16]
constexpr uint64_t kMaxChunks = 0xFFFF;
inline uint32_t gen_of(uint64_t s) { return uint32_t(s >> 32); }
inline uint64_t chunks_of(uint64_t s) { return (s >> 16) & 0xFFFF; }
inline uint64_t next_of(uint64_t s) { return s & 0xFFFF; }

// How long an idle worker spins before it sleeps.
constexpr auto kSpin = std::chrono::microseconds(1000);

}  // namespace

struct ThreadPool::Impl {
  int threads = 1;
  std::vector<std::thread> workers;

  alignas(64) std::atomic<uint64_t> state{0};
  alignas(64) std::atomic<int64_t> done{0};
  alignas(64) std::atomic<int> sleepers{0};
  std::atomic<bool> stop{false};

  // The current job; stable while any of its chunks is claimed and not yet done.
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0, chunks = 0, grain = 0;  // grain 0: chunk c is [n*c/chunks, n*(c+1)/chunks)
  bool guided = false;                    // chunk c is [bounds[c], bounds[c + 1])
  std::vector<int64_t> bounds;

  std::mutex sleep_mutex;
  std::condition_variable sleep_cv;
  std::mutex error_mutex;
  std::exception_ptr error;
  std::mutex call_mutex;  // one region at a time

  // Claims and runs chunks of generation `gen` until none is left.
  void run_chunks(uint32_t gen) {
    uint64_t s = state.load(std::memory_order_acquire);
    for (;;) {
      if (gen_of(s) != gen || next_of(s) >= chunks_of(s)) return;
      if (!state.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      const int64_t c = int64_t(next_of(s));
      int64_t b, e;
      if (guided) {
        b = bounds[size_t(c)];
        e = bounds[size_t(c) + 1];
      } else if (grain > 0) {
        b = c * grain;
        e = std::min(n, b + grain);
      } else {
        b = n * c / chunks;
        e = n * (c + 1) / chunks;
      }
      try {
        (*fn)(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      done.fetch_add(1, std::memory_order_acq_rel);
      s = state.load(std::memory_order_acquire);
    }
  }

  void worker_loop() {
    t_inside_pool = true;
    uint32_t seen = gen_of(state.load(std::memory_order_acquire));
    for (;;) {
      // Spin for a while on the state word, then sleep.
      uint64_t s = state.load(std::memory_order_acquire);
      if (gen_of(s) == seen && !stop.load(std::memory_order_relaxed)) {
        auto start = std::chrono::steady_clock::now();
        int iter = 0;
        for (;;) {
          cpu_relax();
          s = state.load(std::memory_order_acquire);
          if (gen_of(s) != seen || stop.load(std::memory_order_relaxed)) break;
          if (++iter == 256) {
            iter = 0;
            if (std::chrono::steady_clock::now() - start > kSpin) {
              std::unique_lock<std::mutex> lock(sleep_mutex);
              sleepers.fetch_add(1, std::memory_order_seq_cst);
              sleep_cv.wait(lock, [&] {
                return gen_of(state.load(std::memory_order_seq_cst)) != seen || stop.load(std::memory_order_seq_cst);
              });
              sleepers.fetch_sub(1, std::memory_order_relaxed);
              start = std::chrono::steady_clock::now();
            }
          }
        }
      }
      if (stop.load(std::memory_order_acquire)) return;
      seen = gen_of(s);
      run_chunks(seen);
    }
  }

  void wake_sleepers() {
    if (sleepers.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard<std::mutex> lock(sleep_mutex); }
      sleep_cv.notify_all();
    }
  }
};

ThreadPool::ThreadPool(int threads) : impl_(std::make_unique<Impl>()) {
  if (threads <= 0) threads = default_threads();
  impl_->threads = threads;
  impl_->workers.reserve(size_t(threads - 1));
  for (int i = 1; i < threads; ++i) impl_->workers.emplace_back([p = impl_.get()] { p->worker_loop(); });
}

ThreadPool::~ThreadPool() {
  impl_->stop.store(true, std::memory_order_seq_cst);
  // Bump the generation so spinning workers look at `stop`.
  impl_->state.fetch_add(uint64_t(1) << 32, std::memory_order_seq_cst);
  {
    std::lock_guard<std::mutex> lock(impl_->sleep_mutex);
  }
  impl_->sleep_cv.notify_all();
  for (auto& t : impl_->workers) t.join();
}

int ThreadPool::size() const { return impl_->threads; }

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn) {
  parallel_for(n, fn, 0);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  Impl& p = *impl_;
  if (p.threads == 1 || n == 1 || t_inside_pool || (grain > 0 && grain >= n)) {
    fn(0, n);  // serial (also nested regions: run inline)
    return;
  }
  std::lock_guard<std::mutex> call_lock(p.call_mutex);
  int64_t chunks;
  if (grain > 0) {
    grain = std::max(grain, (n + int64_t(kMaxChunks) - 1) / int64_t(kMaxChunks));
    chunks = (n + grain - 1) / grain;
  } else {
    chunks = std::min<int64_t>(n, p.threads);
  }
  p.guided = false;
  run(n, fn, chunks, grain);
}

void ThreadPool::parallel_for_guided(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn,
                                     int64_t min_grain) {
  if (n <= 0) return;
  Impl& p = *impl_;
  min_grain = std::max<int64_t>(min_grain, 1);
  if (p.threads == 1 || n == 1 || t_inside_pool || min_grain >= n) {
    fn(0, n);  // serial (also nested regions: run inline)
    return;
  }
  std::lock_guard<std::mutex> call_lock(p.call_mutex);
  // Each chunk 1 / (2 threads) of what is left, rounded up to whole grains: with two threads
  // the first is a quarter of the region and each next one 3/4 of the one before, down to
  // min_grain. At most n / min_grain chunks, which the state word's count must hold.
  min_grain = std::max(min_grain, (n + int64_t(kMaxChunks) / 2 - 1) / (int64_t(kMaxChunks) / 2));
  p.bounds.clear();
  for (int64_t b = 0; b < n;) {
    p.bounds.push_back(b);
    const int64_t share = (n - b + 2 * p.threads - 1) / (2 * p.threads);
    b = std::min(n, b + (share + min_grain - 1) / min_grain * min_grain);
  }
  p.bounds.push_back(n);
  p.guided = true;
  run(n, fn, int64_t(p.bounds.size()) - 1, 0);
}

void ThreadPool::run(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn, int64_t chunks,
                     int64_t grain) {
  Impl& p = *impl_;
  p.fn = &fn;
  p.n = n;
  p.chunks = chunks;
  p.grain = grain;
  p.done.store(0, std::memory_order_relaxed);
  const uint64_t old = p.state.load(std::memory_order_relaxed);
  const uint32_t gen = gen_of(old) + 1;
  p.state.store((uint64_t(gen) << 32) | (uint64_t(chunks) << 16), std::memory_order_seq_cst);
  p.wake_sleepers();

  t_inside_pool = true;
  p.run_chunks(gen);
  t_inside_pool = false;
  while (p.done.load(std::memory_order_acquire) < chunks) cpu_relax();

  if (p.error) {
    std::exception_ptr e;
    std::swap(e, p.error);
    std::rethrow_exception(e);
  }
}

}  // namespace tessera::cpu
