// npusim calibration: the timing model against the kernel-level measurements of
// ../shared/reference/xdna2.md (never end-to-end timings). Each point is a launch shape
// (the GEMM mapping generator for the GEMMs, the example element-wise and GEMV mappings,
// and a flash-attention launch shape modelled directly here: FLOPs, bytes and tiles only,
// until the attention mapping exists) priced by time_launch and compared with the
// measurement. `tessera device calibrate` prints this; bench/npusim_calibration.md is its output.
#pragma once
#include <string>
#include <vector>

#include "targets/npusim/device.h"
#include "targets/npusim/spatial.h"

namespace tessera::npusim {

struct CalibrationPoint {
  std::string name;
  std::string shape;     // how the point is modelled
  std::string unit;      // "us" or "GB/s"
  double measured = 0;   // from xdna2.md (for a range: its midpoint)
  std::string measured_text;  // "2822", "26-40"
  double predicted = 0;
  std::string bound_by;
  double error() const { return predicted / measured - 1; }
};

// Every calibration point on `device` (its fitted parameters are the device's).
std::vector<CalibrationPoint> calibrate(const Device& device);
// The flash-attention launch shape used for the calibration point (timing only: no kernel).
Launch flash_attention_shape(const Device& device, int64_t tokens = 2048, int64_t q_heads = 32, int64_t kv_heads = 8,
                             int64_t head_dim = 64, int64_t lqp = 256, int64_t lkp = 64);
// Markdown report: parameters, table, verdict against `tolerance` (0.25 = +-25%).
std::string calibration_markdown(const Device& device, const std::vector<CalibrationPoint>& points,
                                 double tolerance = 0.25);

}  // namespace tessera::npusim
