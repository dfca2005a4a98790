// npusim timing model: deterministic, overlap and residency behave, and the calibration
// points are within +-25% of the kernel-level measurements they were fitted on.
#include <gtest/gtest.h>

#include <cmath>

#include "targets/npusim/calibration.h"
#include "targets/npusim/examples_internal.h"
#include "targets/npusim/mappings_gemm.h"
#include "targets/npusim/timing.h"
#include "test_support.h"

namespace tessera::npusim {
namespace {

using testing_support::xdna2;

TEST(NpusimTiming, DeterministicAndComputeBoundGemm) {
  const Launch l = gemm_launch({2048, 2048, 2048}, {64, 32, 64, 256}, {8, 4, true}, xdna2());
  const LaunchTiming a = time_launch(l, xdna2()), b = time_launch(l, xdna2());
  EXPECT_EQ(a.to_json().dump(), b.to_json().dump());
  EXPECT_EQ(a.bound_by, "compute");
  EXPECT_EQ(a.macs, int64_t(2048) * 2048 * 2048);
  EXPECT_GT(a.total_us, a.compute_us);
  EXPECT_NEAR(a.total_us, a.fill_us + a.compute_us + a.drain_us, 1e-6);
}

TEST(NpusimTiming, SingleBufferingSerializesAndResidencySavesTransfers) {
  const int64_t n = 2048 * 2048;
  const LaunchTiming two = time_launch(example_add_launch(n, 8, 1024, xdna2(), false, 2), xdna2());
  const LaunchTiming one = time_launch(example_add_launch(n, 8, 1024, xdna2(), false, 1), xdna2());
  EXPECT_TRUE(two.overlapped);
  EXPECT_FALSE(one.overlapped);
  EXPECT_GT(one.total_us, two.total_us);
  EXPECT_EQ(two.bound_by, "ddr");
  // A resident X moves on the first call only.
  const Launch res = example_add_launch(n, 8, 1024, xdna2(), true, 2);
  EXPECT_EQ(time_launch(res, xdna2(), {.first_call = true}).ddr_bytes, 3 * n * 2);
  EXPECT_EQ(time_launch(res, xdna2()).ddr_bytes, 2 * n * 2);
}

TEST(NpusimTiming, DispatchAddsOverheadHostCopiesAndIdleWake) {
  const int64_t n = 1 << 20;
  Dispatch d;
  d.name = "add";
  d.buffers = {{"X", ElemType::BF16, n, Sync::EveryCall, true, false},
               {"Y", ElemType::BF16, n, Sync::Once, true, false},
               {"Z", ElemType::BF16, n, Sync::ZeroCopy, false, true}};
  d.launches = {example_add_launch(n, 8, 1024, xdna2())};
  const DispatchTiming steady = time_dispatch(d, xdna2());
  EXPECT_DOUBLE_EQ(steady.overhead_us, xdna2().dispatch_us);
  EXPECT_EQ(steady.host_copy_bytes, n * 2);  // X only: Y resident, Z zero-copy
  EXPECT_NEAR(steady.total_us, steady.launches_us + steady.overhead_us + steady.host_copy_us, 1e-9);
  const DispatchTiming first = time_dispatch(d, xdna2(), {.first_call = true, .after_idle = true});
  EXPECT_EQ(first.host_copy_bytes, 2 * n * 2);
  EXPECT_DOUBLE_EQ(first.idle_wake_us, 150e3);
  EXPECT_EQ(first.bound_by, "idle-wake");
}

TEST(NpusimTiming, CalibrationPointsWithin25Percent) {
  const auto pts = calibrate(xdna2());
  ASSERT_GE(pts.size(), 8u);
  for (const auto& p : pts) EXPECT_LE(std::fabs(p.error()), 0.25) << p.name << ": " << p.predicted << " " << p.unit;
  // The model is not a constant: a GEMM with 4x the MACs takes several times longer.
  EXPECT_GT(pts[1].predicted, 3 * pts[0].predicted);
  // And the report says so.
  const std::string md = calibration_markdown(xdna2(), pts);
  EXPECT_NE(md.find("all of"), std::string::npos) << md;
}

}  // namespace
}  // namespace tessera::npusim
