// npusim timing model: deterministic, overlap and residency behave, and the calibration
// holds: parameters fitted on part of the kernel-level measurements predict the rest.
#include <gtest/gtest.h>

#include <cmath>

#include "targets/npusim/calibration.h"
#include "npusim_examples.h"
#include "targets/npusim/mappings_gemm.h"
#include "targets/npusim/timing.h"
#include "test_support.h"
#include "util/error.h"

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

// The timing model's free parameters, fitted on the 2025 kernel-level measurements of
// xdna2.md, predict the held-out 2026 ones, and every point is predicted by a fit on all the
// others (leave-one-out), within 25%; the profile holds the fitted values.
TEST(NpusimCalibration, HeldOutAndLeaveOneOutWithin25Percent) {
  const Calibration c = calibrate(xdna2());
  const int held_out = int(c.points.size()) - c.fit_points();
  EXPECT_GE(held_out, 5);
  EXPECT_LT(int(c.parameters.size()) * 3 / 2, c.fit_points());  // clearly fewer parameters than fit points
  for (const CalibrationPoint& p : c.points) {
    EXPECT_LE(std::fabs(p.error()), 0.25) << p.name << ": predicted " << p.predicted << " " << p.unit
                                           << ", measured " << p.measured_text();
    if (!p.upper_mark) {
      EXPECT_LE(std::fabs(p.loo_error()), 0.25) << p.name << ": leave-one-out " << p.loo_predicted;
    }
    EXPECT_FALSE(p.source.empty()) << p.name;
  }
  for (const CalibrationParameter& p : c.parameters)
    EXPECT_NEAR(p.fitted / p.profile, 1.0, 0.01) << p.key << ": the profile says " << p.profile << ", the fit " << p.fitted;
  // The model is not a constant: a GEMM with 4x the MACs takes several times longer.
  EXPECT_GT(c.points[1].predicted, 3 * c.points[0].predicted);
  const std::string md = calibration_markdown(xdna2(), c);
  EXPECT_NE(md.find("all of"), std::string::npos) << md;
  EXPECT_NE(md.find("leave-one-out"), std::string::npos);
}

// A point's error: none inside a measured range or under an upper mark, else against the
// nearer end; and a parameter set far off is seen as such by the points.
TEST(NpusimCalibration, ErrorsAgainstRangesAndUpperMarks) {
  CalibrationPoint range;
  range.low = 26;
  range.high = 40;
  EXPECT_EQ(range.error_of(30), 0);
  EXPECT_NEAR(range.error_of(52), 0.3, 1e-12);
  EXPECT_NEAR(range.error_of(13), -0.5, 1e-12);
  CalibrationPoint mark;
  mark.high = 9.8;
  mark.upper_mark = true;
  EXPECT_EQ(mark.error_of(1), 0);
  EXPECT_GT(mark.error_of(14.7), 0.25);
  // Twice the GEMM efficiency the fit found: the measured GEMM points fail.
  const Calibration c = calibrate(xdna2());
  const Device off = with_parameter(xdna2(), "timing.efficiency.gemm", 2 * c.parameters[0].fitted);
  std::vector<std::string> failing;
  for (const CalibrationPoint& p : c.points)
    if (std::fabs(p.error_of(p.model(off).first)) > 0.25) failing.push_back(p.name);
  EXPECT_GE(failing.size(), 3u) << ::testing::PrintToString(failing);
  EXPECT_THROW(with_parameter(xdna2(), "array.columns", 4), Error);
}

}  // namespace
}  // namespace tessera::npusim
