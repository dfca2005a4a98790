// `tessera device`: the npusim device profiles (list, show) and the timing model's
// calibration against the profile's kernel-level measurements (calibrate).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "targets/npusim/calibration.h"
#include "targets/npusim/device.h"

namespace tessera::cli {

namespace {

struct DeviceArgs {
  std::string name = "xdna2";
  bool json = false;
  bool markdown = false;
};

void run_list() {
  for (const auto& n : npusim::builtin_devices()) {
    const npusim::Device d = npusim::load_device(n);
    fmt::print("{:<10} {}\n", n, d.description);
  }
}

void run_show(const DeviceArgs& a) {
  const npusim::Device d = npusim::load_device(a.name);
  if (a.json) {
    fmt::print("{}\n", d.to_json().dump(2));
    return;
  }
  fmt::print("device {}: {}\n", d.name, d.description);
  fmt::print("{} columns x {} rows: row {} shim, row {} memory, rows {}-{} compute ({} compute tiles)\n\n", d.columns,
             d.rows, d.shim_row, d.mem_row, d.first_compute_row, d.rows - 1, d.compute_tiles());
  size_t w = 0;
  for (const auto& f : d.figures) w = std::max(w, f.key.size());
  fmt::print("{:<{}}  {:>12}  {:<10} {}\n", "figure", w, "value", "unit", "source");
  bool any_uncertain = false;
  for (const auto& f : d.figures) {
    any_uncertain = any_uncertain || f.uncertain;
    fmt::print("{:<{}}  {:>12g}  {:<10} {}{}\n", f.key, w, f.value, f.unit, f.uncertain ? "[uncertain] " : "",
               f.source);
  }
  if (any_uncertain)
    fmt::print("\n[uncertain]: no primary source confirms the figure; predictions built on it are not measurements.\n");
}

void run_calibrate(const DeviceArgs& a) {
  const npusim::Device d = npusim::load_device(a.name);
  const npusim::Calibration c = npusim::calibrate(d);
  if (a.markdown) {
    fmt::print("{}", npusim::calibration_markdown(d, c));
    return;
  }
  auto set = [](const npusim::CalibrationPoint& p) { return p.upper_mark ? "upper mark" : p.held_out ? "held out" : "fit"; };
  if (a.json) {
    nlohmann::json j = {{"device", d.name}, {"parameters", nlohmann::json::array()}, {"points", nlohmann::json::array()}};
    for (const auto& p : c.parameters)
      j["parameters"].push_back({{"key", p.key}, {"profile", p.profile}, {"fitted", p.fitted}});
    for (const auto& p : c.points)
      j["points"].push_back({{"point", p.name},           {"set", set(p)},
                             {"unit", p.unit},            {"measured", p.measured_text()},
                             {"predicted", p.predicted},  {"error", p.error()},
                             {"leave_one_out", p.loo_predicted}, {"leave_one_out_error", p.loo_error()},
                             {"bound_by", p.bound_by},    {"priced_on", p.modelled},
                             {"source", p.source}});
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("{} free parameters fitted on {} points (profile -> fitted):\n", c.parameters.size(), c.fit_points());
  for (const auto& p : c.parameters) fmt::print("  {:<28} {:>10.4g} -> {:<10.4g}\n", p.key, p.profile, p.fitted);
  fmt::print("\n{:<56} {:<10} {:>7} {:>9} {:>9} {:>8} {:>14}  {}\n", "point", "set", "unit", "measured", "predicted",
             "error", "leave-one-out", "bound by");
  for (const auto& p : c.points)
    fmt::print("{:<56} {:<10} {:>7} {:>9} {:>9.3g} {:>+7.1f}% {:>14}  {}\n", p.name, set(p), p.unit, p.measured_text(),
               p.predicted, p.error() * 100, p.upper_mark ? "-" : fmt::format("{:+.1f}%", p.loo_error() * 100), p.bound_by);
  fmt::print("\nlargest error: fit {:.1f}%, held out {:.1f}%, leave-one-out {:.1f}% (sources: --markdown)\n",
             c.max_error(false) * 100, c.max_error(true) * 100, c.max_loo_error() * 100);
}

}  // namespace

void add_device_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("device", "npusim device profiles: list, show, calibrate");
  cmd->require_subcommand(1);
  CLI::App* list = cmd->add_subcommand("list", "List the built-in device profiles");
  list->callback([] { run_list(); });

  auto show_args = std::make_shared<DeviceArgs>();
  CLI::App* show = cmd->add_subcommand("show", "Print a device profile: every figure with its unit and source");
  show->add_option("device", show_args->name, "Built-in profile name or path to a .json profile (default: xdna2)");
  show->add_flag("--json", show_args->json, "Print the profile as JSON");
  show->callback([show_args] { run_show(*show_args); });

  auto cal_args = std::make_shared<DeviceArgs>();
  CLI::App* cal = cmd->add_subcommand(
      "calibrate",
      "Fit the timing model's free parameters on part of the kernel-level measurements and print fit, held-out and "
      "leave-one-out errors with their sources");
  cal->add_option("device", cal_args->name, "Built-in profile name or path to a .json profile (default: xdna2)");
  cal->add_flag("--json", cal_args->json, "Print JSON");
  cal->add_flag("--markdown", cal_args->markdown, "Print the Markdown report (bench/npusim_calibration.md)");
  cal->callback([cal_args] { run_calibrate(*cal_args); });
}

}  // namespace tessera::cli
