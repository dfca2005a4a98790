// npusim timing model: an analytical model of a Launch and a Dispatch on a Device.
//
// Per launch:
//   compute  = busiest worker: macs / (MACs per cycle x efficiency[class]) +
//              vector_ops / (vector lanes x efficiency[class]) cycles
//   dma      = busiest DMA channel: bytes / (stream bytes per cycle x dma_efficiency) +
//              objects x dma_object_cycles (a descriptor and lock handshake per object)
//              (shim, memory-tile and compute-tile channels, per fifo leg; a broadcast leg
//              is one multicast stream)
//   ddr      = bytes through all shims together / reachable DDR bandwidth
//   body     = max(compute, dma, ddr) when every fifo is double-buffered (depth >= 2),
//              compute + max(dma, ddr) when some fifo has depth 1 (no overlap)
//   fill     = first object of the slowest fill fifo through its hops (shim -> memtile -> L1),
//              each hop paying the per-object cost too
//   drain    = last object of the slowest drain fifo back to DDR
//   total    = fill + body + drain
// Per dispatch: its launches + the host dispatch overhead + host copies (buffer syncs at
// the host copy rate, unless zero-copy or device-only; resident (Once) buffers only on the
// first call) + the idle-wake penalty when the NPU was idle. Resident fifos move no data
// after the first call.
// The parameters (efficiency per kernel class, dma_efficiency, DDR bandwidth) are fitted on
// kernel-level measurements only: bench/npusim_calibration.md, `tessera device calibrate`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "targets/npusim/device.h"
#include "targets/npusim/spatial.h"

namespace tessera::npusim {

struct TimingOptions {
  bool first_call = false;  // resident fifos and Once buffers are loaded on this call
  bool after_idle = false;  // the NPU was idle longer than Device::idle_after_s
};

struct LaunchTiming {
  std::string name;
  double compute_us = 0, dma_us = 0, ddr_us = 0, fill_us = 0, drain_us = 0, total_us = 0;
  bool overlapped = true;     // double-buffered: compute and transfers overlap
  std::string bound_by;       // "compute", "dma", "ddr"
  Tile busiest_tile;          // the worker that sets `compute_us`
  std::string busiest_channel;  // "(0,1) mm2s: fifo A" sets `dma_us`
  int64_t macs = 0, ddr_bytes = 0;
  nlohmann::json to_json() const;
};

struct DispatchTiming {
  std::string name;
  std::vector<LaunchTiming> launches;
  double launches_us = 0, overhead_us = 0, host_copy_us = 0, idle_wake_us = 0, total_us = 0;
  int64_t host_copy_bytes = 0;
  std::string bound_by;  // "launches", "overhead", "host-copy", "idle-wake": the largest part
  nlohmann::json to_json() const;
};

LaunchTiming time_launch(const Launch& launch, const Device& device, const TimingOptions& opt = {});
DispatchTiming time_dispatch(const Dispatch& dispatch, const Device& device, const TimingOptions& opt = {});
// The dispatch's parts around launches already timed (t.launches): host copies of
// `buffers`, the dispatch overhead, the idle wake, the total and what bounds it.
void complete_dispatch_timing(DispatchTiming& t, const std::vector<HostBuffer>& buffers, const Device& device,
                              const TimingOptions& opt = {});
// A readable profile: one line per launch and the dispatch's parts.
std::string describe(const DispatchTiming& t);

}  // namespace tessera::npusim
