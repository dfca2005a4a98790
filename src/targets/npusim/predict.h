// npusim predictions: the timing model (timing.h) pricing a lowered Program (program.h),
// the same Program the runner executes. price() is the dry mode: nothing is executed, so a
// full-size model's step is predicted in milliseconds; the runner prices each dispatch call
// it runs the same way (its launches as run, the dispatch's buffers), so a functional pass
// and the dry price of its Program agree. Host work is priced at the device profile's host
// speed. `tessera bench --target npusim` and `tessera profile` print these.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/spec.h"
#include "targets/npusim/device.h"
#include "targets/npusim/plans.h"
#include "targets/npusim/program.h"
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

// The dry mode: every dispatch of the Program priced (count times), first calls or steady
// state (resident weights and Once buffers loaded or not).
PassPrediction price(const Program& program, const Device& device, bool first_call = false);
// One call of `dispatch` as it ran: its launches' timings (each timed as run) completed with
// the dispatch's host copies and overhead, plus its host work; added to `p` once.
void add_dispatch_call(PassPrediction& p, const ProgramDispatch& dispatch, std::vector<LaunchTiming> launches,
                       const Device& device, bool first_call);

// Prefill of `tokens` tokens from an empty cache (the head on the last row), or one decode
// step at `context`: price(lower(...)) in steady state.
// `formats`: the weights' element types (a quantized checkpoint's blocks; default bf16).
PassPrediction predict_prefill(const NpuPlan& plan, const ModelSpec& spec, const Device& device, int64_t tokens,
                               const WeightFormats& formats = {});
PassPrediction predict_decode(const NpuPlan& plan, const ModelSpec& spec, const Device& device, int64_t context,
                              const WeightFormats& formats = {});

// The Program's dispatches as the report's timeline and tile maps draw them (steady state):
// {"pass", "tokens", "context", "columns", "rows", "first_compute_row", "dispatches": [{"name",
// "section", "count", "host", "overhead_us", "host_copy_us", "idle_wake_us", "host_ops":
// [{"what", "us"}], "launches": [{"name", "kernel", "fill_us", "body_us", "drain_us",
// "compute_us", "dma_us", "ddr_us", "bound_by", "herd": [cols, rows], "busiest_tile": [c, r],
// "tiles": [[col, row, kernel], ...]}]}]}.
nlohmann::json timeline_json(const Program& program, const Device& device);

}  // namespace tessera::npusim
