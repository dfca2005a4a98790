// The cpu target's thread pool (targets/cpu/kernels_pool.cc): a lock-free region protocol
// (one state word, chunks claimed with a CAS, workers that spin and then sleep). These tests
// exercise it the ways the kernels and the server do, many short regions back to back, with
// both kinds of chunking, from two threads and two pools at once; tools/tsan.sh runs them
// under ThreadSanitizer, which is what can see a missing happens-before edge.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "targets/cpu/kernels.h"

namespace tessera {
namespace {

using cpu::ThreadPool;

// Every item of [0, n) is handed out exactly once per region, in chunks that cover it, for
// equal chunks (grain 0) and dynamic ones; the caller sees every worker's writes on return.
void check_regions(ThreadPool& pool, int regions) {
  std::vector<int> hits;
  for (int r = 0; r < regions; ++r) {
    const int64_t n = 1 + (r * 37) % 300;
    const int64_t grain = r % 3 == 0 ? 0 : 1 + r % 7;
    hits.assign(size_t(n), 0);
    pool.parallel_for(
        n,
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[size_t(i)] += 1;  // plain writes: disjoint chunks
        },
        grain);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)], 1) << "region " << r << " item " << i;
  }
}

TEST(ThreadPool, EveryItemOnceInManyShortRegions) {
  for (int threads : {1, 2, 3, 5}) {
    SCOPED_TRACE("threads=" + std::to_string(threads));
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    check_regions(pool, 2000);
  }
}

// Regions far apart let the workers fall asleep (they spin about a millisecond first): the
// next region must wake them and still hand out every item once.
TEST(ThreadPool, SleepingWorkersWakeForTheNextRegion) {
  ThreadPool pool(3);
  for (int r = 0; r < 4; ++r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    check_regions(pool, 20);
  }
}

// The server's scheduler and a test's main thread can each own a pool: two pools used from two
// threads at once share nothing.
TEST(ThreadPool, TwoPoolsFromTwoThreadsAtOnce) {
  ThreadPool a(2), b(2);
  std::thread other([&] { check_regions(b, 1500); });
  check_regions(a, 1500);
  other.join();
}

// One pool, two calling threads: regions run one at a time and each still sees its own items.
TEST(ThreadPool, OnePoolFromTwoThreadsRunsRegionsOneAtATime) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  auto caller = [&] {
    for (int r = 0; r < 500; ++r)
      pool.parallel_for(64, [&](int64_t b, int64_t e) { total.fetch_add(e - b, std::memory_order_relaxed); }, 4);
  };
  std::thread other(caller);
  caller();
  other.join();
  EXPECT_EQ(total.load(), 2 * 500 * 64);
}

// An exception in any chunk reaches the caller once; the pool keeps working afterwards.
TEST(ThreadPool, AChunksExceptionReachesTheCallerAndThePoolGoesOn) {
  ThreadPool pool(3);
  for (int r = 0; r < 50; ++r) {
    EXPECT_THROW(pool.parallel_for(
                     100,
                     [&](int64_t b, int64_t e) {
                       if (b <= 77 && 77 < e) throw std::runtime_error("chunk with item 77");
                     },
                     3),
                 std::runtime_error);
    check_regions(pool, 3);
  }
}

}  // namespace
}  // namespace tessera
