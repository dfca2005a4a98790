// The cpu target's thread pool (targets/cpu/kernels_pool.cc): a lock-free region protocol
// (one state word, chunks claimed with a CAS, workers that spin and then sleep). These tests
// exercise it the ways the kernels and the server do, many short regions back to back, with
// both kinds of chunking, from two threads and two pools at once; tools/tsan.sh runs them
// under ThreadSanitizer, which is what can see a missing happens-before edge.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "targets/cpu/kernels.h"

namespace tessera {
namespace {

using cpu::ThreadPool;

// Every item of [0, n) is handed out exactly once per region, in chunks that cover it, for
// equal chunks (grain 0), dynamic ones and guided ones; the caller sees every worker's writes
// on return.
void check_regions(ThreadPool& pool, int regions) {
  std::vector<int> hits;
  for (int r = 0; r < regions; ++r) {
    const int64_t n = 1 + (r * 37) % 300;
    const int64_t grain = r % 4 == 0 ? 0 : 1 + r % 7;
    hits.assign(size_t(n), 0);
    auto fn = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)] += 1;  // plain writes: disjoint chunks
    };
    if (r % 4 == 3) pool.parallel_for_guided(n, fn, grain);
    else pool.parallel_for(n, fn, grain);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)], 1) << "region " << r << " item " << i;
  }
}

// Guided chunks: whole grains (but the last), none larger than the one before it, the first a
// 1 / (2 threads) share of the region, the last ones the grain: the threads end a grain apart.
TEST(ThreadPool, GuidedChunksShrinkToTheGrain) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    for (const int64_t grain : {1, 2, 4}) {
      for (const int64_t n : {int64_t(5), int64_t(128), int64_t(1024), int64_t(8016)}) {
        SCOPED_TRACE(fmt::format("threads {} grain {} n {}", threads, grain, n));
        std::mutex m;
        std::vector<std::pair<int64_t, int64_t>> chunks;
        pool.parallel_for_guided(n, [&](int64_t b, int64_t e) {
          std::lock_guard<std::mutex> l(m);
          chunks.emplace_back(b, e);
        }, grain);
        std::sort(chunks.begin(), chunks.end());
        ASSERT_FALSE(chunks.empty());
        EXPECT_EQ(chunks.front().first, 0);
        EXPECT_EQ(chunks.back().second, n);
        const int64_t share = (n + 2 * threads - 1) / (2 * threads);
        EXPECT_EQ(chunks.front().second, std::min(n, (share + grain - 1) / grain * grain));
        for (size_t i = 0; i < chunks.size(); ++i) {
          const int64_t size = chunks[i].second - chunks[i].first;
          if (i + 1 < chunks.size()) {
            EXPECT_EQ(chunks[i].second, chunks[i + 1].first);
            EXPECT_EQ(size % grain, 0) << "chunk " << i;
            EXPECT_GE(size, chunks[i + 1].second - chunks[i + 1].first) << "chunk " << i;
          }
        }
        if (n >= 1024) {
          EXPECT_LE(chunks.back().second - chunks.back().first, grain);
        }
      }
    }
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
