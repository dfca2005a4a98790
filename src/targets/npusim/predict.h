// npusim predictions for a whole model under a plan: each dispatch of a prefill or decode
// pass built from the kernel set's mapping generators at the model's shapes (the same
// default tiles the runner executes), with the host buffers the plan's residency implies,
// priced by the timing model (timing.h); host-placed ops priced at the device profile's
// host speed. Nothing is executed, so a full-size model's step is predicted in
// milliseconds. `tessera bench --target npusim` and `tessera profile` print these.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/spec.h"
#include "targets/npusim/device.h"
#include "targets/npusim/plans.h"
#include "targets/npusim/timing.h"

namespace tessera::npusim {

struct PredictedDispatch {
  std::string name;            // "layer.norm+qkv+rope", "head.lm_head", ...
  bool host = false;           // host work between calls (no dispatch)
  int64_t count = 1;           // times per pass (n_layers for a layer's dispatch)
  DispatchTiming timing;       // one call (NPU dispatches)
  double host_us = 0;          // host-placed work of this entry, one call
  int tiles = 0;               // compute tiles its largest launch uses
  int64_t ddr_bytes = 0;       // moved by its launches, one call
  double total_us() const { return timing.total_us + host_us; }
};

struct PassPrediction {
  std::string pass;   // "prefill" or "decode"
  int64_t tokens = 0;  // tokens this step runs
  int64_t context = 0;  // positions already cached before it
  std::vector<PredictedDispatch> dispatches;
  double total_us = 0;
  int64_t npu_dispatches = 0, launches = 0, ddr_bytes = 0, host_copy_bytes = 0;
  // Where the time goes, summed over the pass: "compute", "dma", "ddr" (launch bodies by
  // what bounds them), "fill/drain", "dispatch overhead", "host copies", "host ops".
  std::map<std::string, double> breakdown_us;
  nlohmann::json to_json() const;
  std::string describe() const;  // the profile table
};

// Prefill of `tokens` tokens from an empty cache, or one decode step at `context`.
PassPrediction predict_prefill(const NpuPlan& plan, const ModelSpec& spec, const Device& device, int64_t tokens);
PassPrediction predict_decode(const NpuPlan& plan, const ModelSpec& spec, const Device& device, int64_t context);

}  // namespace tessera::npusim
