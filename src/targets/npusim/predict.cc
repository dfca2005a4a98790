#include "targets/npusim/predict.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "targets/npusim/mappings.h"
#include "util/error.h"

namespace tessera::npusim {

namespace {

void account(PassPrediction& p, const PredictedDispatch& e) {
  const double n = double(e.count);
  if (!e.host) {
    p.npu_dispatches += e.count;
    p.launches += e.count * int64_t(e.timing.launches.size());
    p.host_copy_bytes += e.count * e.timing.host_copy_bytes;
    p.breakdown_us["dispatch overhead"] += n * e.timing.overhead_us;
    p.breakdown_us["host copies"] += n * e.timing.host_copy_us;
    for (const LaunchTiming& l : e.timing.launches) {
      p.breakdown_us["fill/drain"] += n * (l.fill_us + l.drain_us);
      p.breakdown_us[l.bound_by] += n * (l.total_us - l.fill_us - l.drain_us);
    }
  }
  p.breakdown_us["host ops"] += n * e.host_us;
  p.ddr_bytes += e.count * e.ddr_bytes;
  p.total_us += n * e.total_us();
  p.dispatches.push_back(e);
}

PredictedDispatch entry(const ProgramDispatch& pd, const Device& d) {
  PredictedDispatch e;
  e.name = pd.name;
  e.count = pd.count;
  e.host = pd.host;
  e.host_us = pd.host_us(d);
  return e;
}

void fill_launch_figures(PredictedDispatch& e, const ProgramDispatch& pd) {
  for (const ProgramStep& st : pd.steps)
    for (const LaunchCall& c : st.launches) e.tiles = std::max(e.tiles, int(c.launch.workers.size()));
  for (const LaunchTiming& lt : e.timing.launches) e.ddr_bytes += lt.ddr_bytes;
}

PassPrediction empty_prediction(const Program& prog) {
  PassPrediction p;
  p.pass = prog.shape.decode ? "decode" : "prefill";
  p.tokens = prog.shape.tokens;
  p.context = prog.shape.context;
  return p;
}

}  // namespace

PassPrediction price(const Program& prog, const Device& d, bool first_call) {
  PassPrediction p = empty_prediction(prog);
  TimingOptions opt;
  opt.first_call = first_call;
  for (const ProgramDispatch& pd : prog.dispatches) {
    PredictedDispatch e = entry(pd, d);
    if (!pd.host) {
      e.timing = time_dispatch(pd.dispatch(), d, opt);
      fill_launch_figures(e, pd);
    }
    account(p, e);
  }
  return p;
}

void add_dispatch_call(PassPrediction& p, const ProgramDispatch& pd, std::vector<LaunchTiming> launches,
                       const Device& d, bool first_call) {
  PredictedDispatch e = entry(pd, d);
  e.count = 1;
  if (!pd.host) {
    e.timing.name = pd.name;
    e.timing.launches = std::move(launches);
    TimingOptions opt;
    opt.first_call = first_call;
    std::vector<HostBuffer> buffers;
    for (const ProgramBuffer& b : pd.buffers) buffers.push_back(b.buffer);
    complete_dispatch_timing(e.timing, buffers, d, opt);
    fill_launch_figures(e, pd);
  }
  account(p, e);
}

PassPrediction predict_prefill(const NpuPlan& plan, const ModelSpec& spec, const Device& device, int64_t tokens,
                               const WeightFormats& formats) {
  if (tokens < 1) fail("npusim predict: prefill needs at least one token");
  return price(lower(plan, spec, device, {false, tokens, 0, 1}, {}, formats), device);
}

PassPrediction predict_decode(const NpuPlan& plan, const ModelSpec& spec, const Device& device, int64_t context,
                              const WeightFormats& formats) {
  if (context < 0) fail("npusim predict: negative context");
  return price(lower(plan, spec, device, {true, 1, context, 1}, {}, formats), device);
}

nlohmann::json PassPrediction::to_json() const {
  nlohmann::json ds = nlohmann::json::array();
  for (const PredictedDispatch& e : dispatches) {
    nlohmann::json j = {{"name", e.name}, {"on", e.host ? "host" : "npu"}, {"count", e.count},
                        {"us_per_call", e.total_us()}, {"us_total", e.total_us() * double(e.count)},
                        {"host_us", e.host_us}, {"tiles", e.tiles}, {"ddr_bytes", e.ddr_bytes}};
    if (!e.host) j["timing"] = e.timing.to_json();
    ds.push_back(j);
  }
  return {{"pass", pass}, {"tokens", tokens}, {"context", context}, {"total_us", total_us},
          {"npu_dispatches", npu_dispatches}, {"launches", launches}, {"ddr_bytes", ddr_bytes},
          {"host_copy_bytes", host_copy_bytes}, {"breakdown_us", breakdown_us}, {"dispatches", ds}};
}

nlohmann::json timeline_json(const Program& prog, const Device& d) {
  nlohmann::json ds = nlohmann::json::array();
  for (const ProgramDispatch& pd : prog.dispatches) {
    nlohmann::json j = {{"name", pd.name}, {"section", pd.section}, {"count", pd.count}, {"host", pd.host}};
    nlohmann::json ops = nlohmann::json::array();
    for (const ProgramStep& st : pd.steps)
      for (const HostWork& w : st.host) ops.push_back({{"what", w.what}, {"us", w.us(d)}});
    j["host_ops"] = ops;
    nlohmann::json ls = nlohmann::json::array();
    if (!pd.host) {
      const DispatchTiming t = time_dispatch(pd.dispatch(), d);
      j["overhead_us"] = t.overhead_us;
      j["host_copy_us"] = t.host_copy_us;
      j["idle_wake_us"] = t.idle_wake_us;
      size_t k = 0;
      for (const ProgramStep& st : pd.steps)
        for (const LaunchCall& c : st.launches) {
          if (k >= t.launches.size()) break;
          const LaunchTiming& lt = t.launches[k++];
          nlohmann::json tiles = nlohmann::json::array();
          for (const Worker& w : c.launch.workers) tiles.push_back({w.tile.col, w.tile.row, w.kernel});
          ls.push_back({{"name", lt.name},
                        {"kernel", c.launch.kernel},
                        {"fill_us", lt.fill_us},
                        {"body_us", lt.total_us - lt.fill_us - lt.drain_us},
                        {"drain_us", lt.drain_us},
                        {"compute_us", lt.compute_us},
                        {"dma_us", lt.dma_us},
                        {"ddr_us", lt.ddr_us},
                        {"bound_by", lt.bound_by},
                        {"herd", {c.launch.herd_cols, c.launch.herd_rows}},
                        {"busiest_tile", {lt.busiest_tile.col, lt.busiest_tile.row}},
                        {"tiles", tiles}});
        }
    }
    j["launches"] = ls;
    ds.push_back(j);
  }
  return {{"pass", prog.shape.decode ? "decode" : "prefill"}, {"tokens", prog.shape.tokens},
          {"context", prog.shape.context}, {"device", d.name}, {"columns", d.columns}, {"rows", d.rows},
          {"shim_row", d.shim_row}, {"mem_row", d.mem_row}, {"first_compute_row", d.first_compute_row},
          {"dispatches", ds}};
}

std::string PassPrediction::describe() const {
  std::string out = fmt::format("{} ({} tokens after {} cached): {:.3f} ms predicted; {} NPU dispatches, {} launches, "
                                "{:.1f} MB through DDR, {:.1f} MB host copies\n",
                                pass, tokens, context, total_us / 1e3, npu_dispatches, launches, ddr_bytes / 1e6,
                                host_copy_bytes / 1e6);
  out += fmt::format("  {:<34} {:>5} {:>6} {:>11} {:>11} {:>9}  {}\n", "dispatch", "on", "x", "us/call", "ms total",
                     "tiles", "bound by / launches");
  for (const PredictedDispatch& e : dispatches) {
    std::string detail;
    if (e.host) {
      detail = "host ops";
    } else {
      detail = e.timing.bound_by + ":";
      for (const LaunchTiming& l : e.timing.launches)
        if (detail.size() < 90) detail += fmt::format(" {} {:.1f}us ({})", l.name, l.total_us, l.bound_by);
      if (e.host_us > 0) detail += fmt::format(" + host {:.1f}us", e.host_us);
    }
    out += fmt::format("  {:<34} {:>5} {:>6} {:>11.1f} {:>11.3f} {:>9}  {}\n", e.name, e.host ? "host" : "npu", e.count,
                       e.total_us(), e.total_us() * double(e.count) / 1e3, e.host ? std::string("-") : std::to_string(e.tiles),
                       detail);
  }
  out += "  where the time goes:";
  for (const auto& [k, v] : breakdown_us)
    if (v > 0) out += fmt::format(" {} {:.1f}%;", k, 100 * v / std::max(total_us, 1e-9));
  return out + "\n";
}

}  // namespace tessera::npusim
