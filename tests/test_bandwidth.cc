// The memory bandwidth probe returns a usable number (no timing assertion: CI machines vary).
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/bandwidth.h"

namespace tessera {
namespace {

TEST(Bandwidth, PositiveFiniteFor64MiB) {
  const double gbs = measure_read_bandwidth_gbs(2, int64_t(64) << 20, 2);
  EXPECT_TRUE(std::isfinite(gbs));
  EXPECT_GT(gbs, 0.0);
}

TEST(Bandwidth, OddSizesAndOneThread) {
  const double gbs = measure_read_bandwidth_gbs(1, (int64_t(8) << 20) + 12345, 1);
  EXPECT_TRUE(std::isfinite(gbs));
  EXPECT_GT(gbs, 0.0);
  evict_caches(int64_t(16) << 20);
}

}  // namespace
}  // namespace tessera
