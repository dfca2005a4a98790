// npusim calibration: the timing model's free parameters fitted on part of the kernel-level
// measurements of ../shared/reference/xdna2.md (never end-to-end timings), and checked on the
// rest. Each point is priced on the mapping it names (tessera's own mapping generators: the
// GEMM generator with the measured tiles, the deployed attention, GEMV and element-wise
// mappings); the fit minimises the squared log error over the fit points by coordinate
// descent; the held-out points are predicted with those parameters, and every point is
// predicted once more with parameters fitted on all the others (leave-one-out). A figure
// measured as a range is fitted at its geometric middle and is exact anywhere inside it.
// `tessera device calibrate` prints this; bench/npusim_calibration.md is its output.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "targets/npusim/device.h"
#include "targets/npusim/spatial.h"

namespace tessera::npusim {

struct CalibrationPoint {
  std::string name;
  std::string source;    // where the measurement comes from (as xdna2.md cites it)
  std::string modelled;  // the mapping it is priced on and what the unit counts
  std::string unit;      // "us", "GB/s", "TFLOP/s"
  double low = 0, high = 0;  // the measurement (low == high) or its range
  bool held_out = false;     // predicted, never fitted
  // An upper mark (the figure of another, unstated mapping): only a prediction above it is
  // an error.
  bool upper_mark = false;
  // The model's figure in `unit` for a device, and what bounds it ("compute", "dma", ...).
  std::function<std::pair<double, std::string>(const Device&)> model;

  double predicted = 0;      // with the parameters fitted on the fit points
  double loo_predicted = 0;  // with the parameters fitted on every other point
  std::string bound_by;
  std::string measured_text() const;  // "2822", "26-40", "<= 9.8"
  // Relative error of a prediction: 0 inside the measured range (or under an upper mark),
  // else against the nearer end.
  double error_of(double value) const;
  double error() const { return error_of(predicted); }
  double loo_error() const { return error_of(loo_predicted); }
};

struct CalibrationParameter {
  std::string key;     // the profile figure it sets ("timing.efficiency.gemm")
  double profile = 0;  // the profile's value
  double fitted = 0;   // fitted on the fit points
  double lo = 0, hi = 0;  // the search range
};

struct Calibration {
  std::vector<CalibrationParameter> parameters;
  std::vector<CalibrationPoint> points;
  // Measurements of xdna2.md that are not points, each with why.
  std::vector<std::string> not_points;
  int fit_points() const;
  double max_error(bool held_out) const;  // over the fit or the held-out points
  double max_loo_error() const;
};

// Fits `device`'s free timing parameters on the fit points and predicts every point.
Calibration calibrate(const Device& device);
// `device` with one of the free parameters set (keys as CalibrationParameter::key).
Device with_parameter(Device device, const std::string& key, double value);
// Markdown report: parameters (profile vs fitted), every point with its fit, held-out and
// leave-one-out error and its source, and the verdict against `tolerance` (0.25 = +-25%).
std::string calibration_markdown(const Device& device, const Calibration& calibration, double tolerance = 0.25);

}  // namespace tessera::npusim
