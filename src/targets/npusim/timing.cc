#include "targets/npusim/timing.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

namespace tessera::npusim {

namespace {

struct Channel {
  Tile tile;
  bool mm2s = true;
  std::string fifo;
  bool operator<(const Channel& o) const {
    return std::tie(tile, mm2s, fifo) < std::tie(o.tile, o.mm2s, o.fifo);
  }
};

}  // namespace

LaunchTiming time_launch(const Launch& l, const Device& d, const TimingOptions& opt) {
  LaunchTiming t;
  t.name = l.name;
  const double hz = d.clock_hz;
  const double chan_bytes_per_s = d.stream_bytes_per_cycle * d.dma_efficiency * hz;

  double compute_s = 0;
  for (const auto& w : l.workers) {
    const double eff = d.efficiency_for(w.cost.kernel_class);
    double cycles = 0;
    if (w.cost.macs > 0) cycles += double(w.cost.macs) / (d.macs_per_cycle_for(w.cost.dtype) * eff);
    if (w.cost.vector_ops > 0) cycles += double(w.cost.vector_ops) / (d.vector_lanes_bf16 * eff);
    t.macs += w.cost.macs;
    if (cycles / hz > compute_s) {
      compute_s = cycles / hz;
      t.busiest_tile = w.tile;
    }
  }

  // Seconds per DMA channel (every leg of every fifo is its own channel): its bytes at the
  // channel rate plus the fixed cost of each object it moves.
  const double object_s = d.dma_object_cycles / hz;
  std::map<Channel, double> chan;
  double fill_s = 0, drain_s = 0;
  bool overlapped = true;
  for (const auto& f : l.fifos) {
    if (f.resident && f.dir == FifoDir::Fill && !opt.first_call) continue;  // already in L1
    const bool fill = f.dir == FifoDir::Fill;
    const int es = elem_bytes(f.type);
    const double stream_bytes = double(f.stream_elements()) * es;
    const int64_t objects = f.objects();
    const double stream_s = stream_bytes / chan_bytes_per_s + double(objects) * object_s;
    if (f.l2_side) {
      // From (to) the buffer a memory tile holds: no DDR bytes, no shim leg; without a
      // staging memtile, the column's memory tile streams it to the ends.
      if (!f.memtile) chan[{f.l2_tile(d.mem_row), fill, f.name}] += stream_s;
    } else {
      t.ddr_bytes += int64_t(stream_bytes);
      chan[{f.shim, fill, f.name}] += stream_s;
      if (f.memtile) chan[{*f.memtile, !fill, f.name}] += stream_s;
    }
    double slowest_end = 0;
    for (size_t k = 0; k < f.ends.size(); ++k) {
      const auto& e = f.ends[k];
      const double end_s = double(objects) * (double(f.end_elems(e)) * es / chan_bytes_per_s + object_s);
      // Memtile legs: a split/join leg per end; broadcast/forward one (multicast) leg.
      if (f.memtile) {
        const bool per_end = f.kind == FifoKind::Split || f.kind == FifoKind::Join;
        if (per_end || k == 0) chan[{*f.memtile, fill, f.name + (per_end ? "#" + std::to_string(k) : "")}] += end_s;
      }
      chan[{e.tile, !fill, f.name}] += end_s;
      slowest_end = std::max(slowest_end, double(f.end_elems(e)) * es);
    }
    if (f.depth < 2) overlapped = false;
    // One object through each hop before the pipeline runs (fill) or after it stops (drain).
    const double hop_s = (f.memtile && !f.l2_side ? double(f.mem_object_bytes()) / chan_bytes_per_s + object_s : 0.0) +
                         slowest_end / chan_bytes_per_s + object_s;
    (fill ? fill_s : drain_s) = std::max(fill ? fill_s : drain_s, hop_s);
  }
  for (const auto& f : l.links) {
    // Tile to tile: the producer's outgoing leg and each consumer's incoming one (through a
    // memory tile, its two legs as well); no DDR traffic.
    const double leg_s = double(f.objects) * (double(f.object_bytes()) / chan_bytes_per_s + object_s);
    chan[{f.producer, true, f.name}] += leg_s;
    for (const Tile& c : f.consumers) chan[{c, false, f.name}] += leg_s;
    if (f.memtile) chan[{*f.memtile, false, f.name}] += leg_s, chan[{*f.memtile, true, f.name}] += leg_s;
    if (f.depth < 2) overlapped = false;
  }
  double dma_s = 0;
  for (const auto& [c, s] : chan) {
    if (s > dma_s) {
      dma_s = s;
      t.busiest_channel = fmt::format("{} {}: fifo {}", to_string(c.tile), c.mm2s ? "mm2s" : "s2mm", c.fifo);
    }
  }
  const double ddr_s = double(t.ddr_bytes) / d.ddr_bytes_per_s;

  t.compute_us = compute_s * 1e6;
  t.dma_us = dma_s * 1e6;
  t.ddr_us = ddr_s * 1e6;
  t.fill_us = fill_s * 1e6;
  t.drain_us = drain_s * 1e6;
  t.overlapped = overlapped;
  const double transfer_s = std::max(dma_s, ddr_s);
  const double body_s = overlapped ? std::max(compute_s, transfer_s) : compute_s + transfer_s;
  t.total_us = (fill_s + body_s + drain_s) * 1e6;
  t.bound_by = compute_s >= transfer_s ? "compute" : (dma_s >= ddr_s ? "dma" : "ddr");
  return t;
}

DispatchTiming time_dispatch(const Dispatch& dsp, const Device& d, const TimingOptions& opt) {
  DispatchTiming t;
  t.name = dsp.name;
  for (const auto& l : dsp.launches) t.launches.push_back(time_launch(l, d, opt));
  complete_dispatch_timing(t, dsp.buffers, d, opt);
  return t;
}

void complete_dispatch_timing(DispatchTiming& t, const std::vector<HostBuffer>& buffers, const Device& d,
                              const TimingOptions& opt) {
  t.launches_us = 0;
  for (const LaunchTiming& l : t.launches) t.launches_us += l.total_us;
  t.host_copy_bytes = 0;
  for (const auto& b : buffers) {
    if (b.sync == Sync::ZeroCopy || b.sync == Sync::DeviceOnly) continue;
    if (b.to_device && (b.sync == Sync::EveryCall || opt.first_call)) t.host_copy_bytes += b.bytes();
    if (b.from_device) t.host_copy_bytes += b.bytes();
  }
  t.host_copy_us = double(t.host_copy_bytes) / d.host_copy_bytes_per_s * 1e6;
  t.overhead_us = d.dispatch_us;
  t.idle_wake_us = opt.after_idle ? d.idle_wake_ms * 1e3 : 0;
  t.total_us = t.launches_us + t.overhead_us + t.host_copy_us + t.idle_wake_us;
  const std::pair<double, const char*> parts[] = {{t.launches_us, "launches"},
                                                  {t.overhead_us, "overhead"},
                                                  {t.host_copy_us, "host-copy"},
                                                  {t.idle_wake_us, "idle-wake"}};
  t.bound_by = std::max_element(std::begin(parts), std::end(parts))->second;
}

nlohmann::json LaunchTiming::to_json() const {
  return {{"name", name},
          {"compute_us", compute_us},
          {"dma_us", dma_us},
          {"ddr_us", ddr_us},
          {"fill_us", fill_us},
          {"drain_us", drain_us},
          {"total_us", total_us},
          {"overlapped", overlapped},
          {"bound_by", bound_by},
          {"busiest_tile", {busiest_tile.col, busiest_tile.row}},
          {"busiest_channel", busiest_channel},
          {"macs", macs},
          {"ddr_bytes", ddr_bytes}};
}

nlohmann::json DispatchTiming::to_json() const {
  nlohmann::json j = {{"name", name},
                      {"launches_us", launches_us},
                      {"overhead_us", overhead_us},
                      {"host_copy_us", host_copy_us},
                      {"host_copy_bytes", host_copy_bytes},
                      {"idle_wake_us", idle_wake_us},
                      {"total_us", total_us},
                      {"bound_by", bound_by}};
  j["launches"] = nlohmann::json::array();
  for (const auto& l : launches) j["launches"].push_back(l.to_json());
  return j;
}

std::string describe(const DispatchTiming& t) {
  std::string s = fmt::format("dispatch {}: {:.1f} us (launches {:.1f}, overhead {:.1f}, host copies {:.1f} for {} B{}), "
                              "bound by {}\n",
                              t.name, t.total_us, t.launches_us, t.overhead_us, t.host_copy_us, t.host_copy_bytes,
                              t.idle_wake_us > 0 ? fmt::format(", idle wake {:.0f}", t.idle_wake_us) : "", t.bound_by);
  for (const auto& l : t.launches)
    s += fmt::format("  launch {}: {:.1f} us = fill {:.1f} + {} (compute {:.1f} on {}, dma {:.1f} on {}, ddr {:.1f}) + "
                     "drain {:.1f}; bound by {}\n",
                     l.name, l.total_us, l.fill_us, l.overlapped ? "max" : "sum", l.compute_us,
                     to_string(l.busiest_tile), l.dma_us, l.busiest_channel, l.ddr_us, l.drain_us, l.bound_by);
  return s;
}

}  // namespace tessera::npusim
