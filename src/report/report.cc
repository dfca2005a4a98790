#include "report/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pipeline/deployment.h"
#include "report/svg.h"
#include "util/error.h"
#include "util/json_fields.h"
#include "util/sha256.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace tessera::report {

namespace {

// The directory's files as the page reads them: a missing file is absent, an unreadable one
// is noted on the page.
struct Dir {
  fs::path dir;
  std::vector<std::string> problems;

  std::optional<json> load(const std::string& name) {
    const fs::path f = dir / name;
    if (!fs::exists(f)) return std::nullopt;
    try {
      return read_json_file(f);
    } catch (const std::exception& e) {
      problems.push_back(fmt::format("{}: {}", name, e.what()));
      return std::nullopt;
    }
  }
  std::optional<std::string> text(const std::string& name) const {
    std::ifstream in(dir / name, std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
};

std::string str(const json& j, const char* key, const std::string& def = "") {
  if (!j.is_object()) return def;
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  return it->is_string() ? it->get<std::string>() : it->dump();
}

double num(const json& j, const char* key, double def = std::nan("")) {
  if (!j.is_object()) return def;
  const auto it = j.find(key);
  if (it == j.end()) return def;
  if (it->is_number()) return it->get<double>();
  if (it->is_string()) {  // gates::json_number writes NaN and infinities as strings
    const std::string s = it->get<std::string>();
    if (s == "NaN" || s == "nan") return std::nan("");
    if (s == "Infinity" || s == "inf") return HUGE_VAL;
    if (s == "-Infinity" || s == "-inf") return -HUGE_VAL;
  }
  return def;
}

double as_num(const json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "Infinity" || s == "inf") return HUGE_VAL;
    if (s == "-Infinity" || s == "-inf") return -HUGE_VAL;
  }
  return std::nan("");
}

std::string e(std::string_view s) { return escape(s); }

// Element i of a JSON array as an int (0 when absent; an integer only: a float's cast is undefined).
int at(const json& a, size_t i) { return a.is_array() && i < a.size() ? json_int(a[i], "report: a timeline index") : 0; }

Point point(double x, double y, std::string title = "") {
  Point p;
  p.x = x;
  p.y = y;
  p.title = std::move(title);
  return p;
}

std::string status_class(const std::string& s) {
  if (s == "passed" || s == "PASS" || s == "pass") return "ok";
  if (s == "unverified" || s == "PASS-with-warnings" || s == "warn" || s == "stale") return "warn";
  if (s == "failed" || s == "FAIL" || s == "fail") return "bad";
  return "idle";
}

std::string badge(const std::string& s) { return fmt::format("<span class=\"badge {}\">{}</span>", status_class(s), e(s)); }

std::string ms_text(double s) { return std::isfinite(s) ? fmt::format("{:.3f} ms", s * 1e3) : "-"; }

// A section that did not run: says so, with the phase's status.
std::string not_run(const json& state, int phase, const std::string& what) {
  const std::string st = str(state["phases"].value(std::to_string(phase), json::object()), "status", "pending");
  return fmt::format("<p class=\"note\">Phase {} did not run (status: {}): {}.</p>\n", phase, e(st), e(what));
}

std::string phase_status(const json& state, int phase) {
  return str(state["phases"].value(std::to_string(phase), json::object()), "status", "pending");
}

// The figures a deployment holds, each labelled measured or predicted.
struct Fig {
  std::string name, value, kind, note;
};

std::vector<Fig> figures(const std::optional<json>& report, const std::optional<json>& phase6) {
  std::vector<Fig> figs;
  if (report && report->contains("figures")) {
    const json& f = (*report)["figures"];
    if (f.contains("phase6_target_timing")) {
      // On a modelled target this is the simulator's own wall time on the host, not the device's.
      const json& t = f["phase6_target_timing"];
      const std::string note = f.contains("predicted") ? "the simulator's wall time on this host, not the modelled device's; " + str(t, "note")
                                                        : str(t, "note");
      figs.push_back({"prefill (phase 6)", fmt::format("{:.1f} tok/s", num(t, "prefill_tokens_per_s")), "measured", note});
      figs.push_back({"decode (phase 6)", fmt::format("{:.1f} tok/s", num(t, "decode_tokens_per_s")), "measured", note});
    }
    if (f.contains("predicted")) {
      const json& p = f["predicted"];
      figs.push_back({fmt::format("prefill {} tokens on {}", str(p, "prefill_tokens"), str(p, "device")),
                      fmt::format("{:.3f} ms ({:.0f} tok/s)", num(p, "prefill_ms"), num(p, "prefill_tokens_per_s")), "predicted",
                      str(p, "note")});
      figs.push_back({fmt::format("decode at context {} on {}", str(p, "decode_context"), str(p, "device")),
                      fmt::format("{:.3f} ms/token ({:.1f} tok/s)", num(p, "decode_ms_per_token"), num(p, "decode_tokens_per_s")),
                      "predicted", str(p, "note")});
    }
  }
  if (report && report->contains("optimization"))
    for (const auto& [k, o] : (*report)["optimization"].items()) {
      const bool pred = o.value("predicted", false);
      figs.push_back({fmt::format("phase {} {}: start -> final", k, str(o, "pass")),
                      fmt::format("{} -> {}", ms_text(num(o, "start_s")), ms_text(num(o, "final_s"))),
                      pred ? "predicted" : "measured", str(o, "figure")});
    }
  if (phase6 && (*phase6)["details"].contains("roofs")) {
    const json& r = (*phase6)["details"]["roofs"];
    figs.push_back({"read bandwidth", fmt::format("{:.1f} GB/s", num(r, "read_bandwidth_gbs")), "measured", str(r, "note")});
    figs.push_back({"decode roof (bandwidth / weight bytes per token)", fmt::format("{:.1f} tok/s", num(r, "decode_roof_tokens_per_s")),
                    "measured", fmt::format("{:.1f} MB per token", num(r, "weight_bytes_per_token") / 1e6)});
    if (num(r, "gemm_gflops", 0) > 0) {
      figs.push_back({"compute roof (the GEMM kernel's rate)", fmt::format("{:.1f} GFLOP/s", num(r, "gemm_gflops")), "measured",
                      "bf16 [256 x 2048] x [2048 x 2048]^T, best of 3"});
      figs.push_back({"prefill roof (GEMM rate / flops per token)", fmt::format("{:.0f} tok/s", num(r, "prefill_roof_tokens_per_s")),
                      "measured", fmt::format("{:.3g} flops per token", num(r, "flops_per_token"))});
    }
  }
  return figs;
}

// ---- header ----

std::string header(const json& state, const std::optional<json>& plan, const std::optional<json>& report,
                   const std::optional<json>& evaluation, const std::optional<json>& phase6) {
  const json& id = state["identity"];
  std::string h;
  const std::string model = str(id, "model_path", "?");
  const std::string target = str(id, "target", "?");
  h += fmt::format("<h1>{} on {}</h1>\n", e(fs::path(model).filename().string()), e(target));
  if (const std::string altered = altered_on_purpose(id); !altered.empty())
    h += fmt::format("<p class=\"bad\"><strong>This deployment was {}.</strong></p>\n", e(altered));
  h += "<table class=\"kv\">\n";
  h += fmt::format("<tr><th>model</th><td><code>{}</code></td></tr>\n", e(model));
  h += fmt::format("<tr><th>target</th><td>{}</td></tr>\n", e(target));
  if (plan)
    h += fmt::format("<tr><th>plan</th><td><code>{}</code> {}</td></tr>\n", e(str(*plan, "name", "?")),
                     e(str(*plan, "description")));
  else
    h += "<tr><th>plan</th><td>no plan.json (phase 1 did not finish)</td></tr>\n";
  if (id.contains("faults") && !id["faults"].empty())
    h += fmt::format("<tr><th>injected faults</th><td class=\"bad\">{}</td></tr>\n", e(id["faults"].dump()));
  if (id.contains("perturbations") && !id["perturbations"].empty())
    h += fmt::format("<tr><th>perturbations</th><td class=\"bad\">{}</td></tr>\n", e(id["perturbations"].dump()));
  std::string ref = "unverified (no independent reference)";
  if (report && report->contains("reference")) {
    const json& r = (*report)["reference"];
    ref = str(r, "status", "unverified");
    if (ref == "verified") ref += fmt::format(" against transformers {} ({})", str(r, "transformers_version", "?"), str(r, "dir"));
  } else if (phase_status(state, 0) == "unverified") {
    ref = "unverified (phase 0 found no independent reference)";
  } else if (phase_status(state, 0) == "passed") {
    ref = "verified";
  }
  h += fmt::format("<tr><th>reference</th><td>{}</td></tr>\n", e(ref));
  h += fmt::format("<tr><th>created</th><td>{}</td></tr>\n", e(str(state, "created")));
  h += "</table>\n";

  // Every phase's verdict, and the audit's.
  h += "<h2 id=\"phases\">Phases</h2>\n<table>\n<tr><th>phase</th><th>name</th><th>status</th><th>gates</th>"
       "<th>wall time</th><th>summary</th></tr>\n";
  for (int p = 0; p <= 7; ++p) {
    const json rec = state["phases"].value(std::to_string(p), json::object());
    std::string status = str(rec, "status", "pending");
    std::string summary = str(rec, "summary");
    std::string gates;
    if (report && report->contains("phases") && (*report)["phases"].contains(std::to_string(p))) {
      const json& r = (*report)["phases"][std::to_string(p)];
      if (r.contains("gates_total")) gates = fmt::format("{}/{}", str(r, "gates_passed"), str(r, "gates_total"));
    }
    if (p == 7 && evaluation) {
      status = str(*evaluation, "verdict", status);
      summary = "tessera audit";
    }
    const double wall = num(rec, "wall_s");
    h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n", p,
                     e(str(rec, "name", p == 7 ? "evaluate" : "")), badge(status), e(gates),
                     std::isfinite(wall) ? fmt::format("{:.2f} s", wall) : "", e(summary));
  }
  h += "</table>\n";

  // The figures, each labelled measured or predicted.
  const std::vector<Fig> figs = figures(report, phase6);
  h += "<h2 id=\"figures\">Figures</h2>\n";
  if (figs.empty()) {
    h += "<p class=\"note\">No figures yet: phases 4-6 did not run.</p>\n";
  } else {
    h += "<table>\n<tr><th>figure</th><th>value</th><th>kind</th><th>how</th></tr>\n";
    for (const Fig& f : figs)
      h += fmt::format("<tr><td>{}</td><td>{}</td><td><span class=\"kind {}\">{}</span></td><td>{}</td></tr>\n", e(f.name),
                       e(f.value), f.kind, f.kind, e(f.note));
    h += "</table>\n";
  }
  return h;
}

// ---- phase 1 ----

std::string phase1_section(const json& state, const std::optional<json>& p1) {
  std::string h = "<h2 id=\"phase1\">Phase 1: kernels</h2>\n";
  if (!p1 || !(*p1)["details"].contains("kernels"))
    return h + not_run(state, 1, "no kernel was checked against its oracle twin");
  const json& ks = (*p1)["details"]["kernels"];
  const json gates = p1->value("gates", json::array());
  BarChart c;
  c.title = "Each kernel's NMSE against its limit (tick), log axis";
  c.value_label = "NMSE";
  c.log = true;
  c.floor = 1e-16;
  int failed = 0;
  for (size_t i = 0; i < ks.size(); ++i) {
    const json& k = ks[i];
    Bar b;
    b.label = i < gates.size() ? str(gates[i], "subject") : fmt::format("{} {}", str(k, "op"), str(k, "shape"));
    b.value = num(k["values"], "nmse", 0);
    if (k["limits"].contains("nmse")) b.limit = num(k["limits"], "nmse");
    b.fail = !k.value("pass", true);
    failed += b.fail;
    std::string checks;
    if (i < gates.size())
      for (const json& ch : gates[i].value("checks", json::array()))
        checks += fmt::format("\n{} {} {} {} {}", str(ch, "metric"), short_number(num(ch, "value")), str(ch, "op"),
                              short_number(num(ch, "limit")), ch.value("pass", true) ? "" : "FAIL");
    b.title = fmt::format("{}: NMSE {} (limit {}){}{}", b.label, short_number(b.value),
                          b.limit ? short_number(*b.limit) : "-", b.fail ? " FAIL" : "", checks);
    c.bars.push_back(std::move(b));
  }
  h += fmt::format("<p>{} kernel cases, {} failed ({}). Every metric of each row is in its hover text and in "
                   "<code>kernel_registry.md</code>.</p>\n",
                   ks.size(), failed, e(str(*p1, "summary")));
  h += "<div class=\"chart\" data-chart=\"phase1-kernels\">" + render(c) + "</div>\n";
  return h;
}

// ---- phase 2 ----

std::string phase2_section(const json& state, const std::optional<json>& p2) {
  std::string h = "<h2 id=\"phase2\">Phase 2: one block</h2>\n";
  if (!p2) return h + not_run(state, 2, "no block was compared with the oracle");
  h += "<table>\n<tr><th>scenario</th><th>cosine</th><th>min row cosine</th><th>NMSE</th></tr>\n";
  for (const json& s : (*p2)["details"].value("scenarios", json::array()))
    h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n", e(str(s, "scenario")),
                     fmt::format("{:.6f}", num(s["metrics"], "cosine")), fmt::format("{:.6f}", num(s["metrics"], "min_row_cosine")),
                     e(short_number(num(s["metrics"], "nmse"))));
  h += "</table>\n";
  return h;
}

// ---- phase 3 ----

std::string phase3_section(const json& state, const std::optional<json>& p3) {
  std::string h = "<h2 id=\"phase3\">Phase 3: the whole model</h2>\n";
  if (!p3 || !(*p3)["details"].contains("prompts")) return h + not_run(state, 3, "no prompt was compared layer by layer");
  const json& prompts = (*p3)["details"]["prompts"];
  double limit = std::nan(""), cliff_max = std::nan("");
  for (const json& p : prompts)
    for (const json& ch : p["gate"].value("checks", json::array())) {
      if (str(ch, "metric") == "min_layer_cosine") limit = num(ch, "limit");
      if (str(ch, "metric") == "cliff") cliff_max = num(ch, "limit");
    }
  LineChart c;
  c.title = "Per-layer cosine to the oracle, every prompt (cliffs and values under the limit marked)";
  c.x_label = "layer";
  c.y_label = "cosine";
  if (std::isfinite(limit)) c.limit = limit, c.limit_label = "limit";
  c.y_max = 1.0;
  LineChart pos;
  pos.title = "Per-position minimum cosine over the layers, every prompt";
  pos.x_label = "position";
  pos.y_label = "min cosine";
  if (std::isfinite(limit)) pos.limit = limit, pos.limit_label = "layer limit";
  pos.y_max = 1.0;
  // The same on a log axis of 1 - cosine, where layers near 1 are told apart.
  LineChart err;
  err.title = "Per-layer 1 - cosine, every prompt, log axis (the error's growth through the layers)";
  err.x_label = "layer";
  err.y_label = "1 - cosine";
  err.log_y = true;
  err.floor = 1e-9;
  if (std::isfinite(limit)) err.limit = 1 - limit, err.limit_label = "limit";
  bool have_pos = false;
  int cliffs = 0;
  for (const json& p : prompts) {
    Series se;
    se.name = str(p, "text");
    const json cos = p.value("layer_cosines", json::array());
    for (size_t l = 0; l < cos.size(); ++l) {
      Point pt;
      pt.x = double(l);
      pt.y = as_num(cos[l]);
      const double prev = l > 0 ? as_num(cos[l - 1]) : pt.y;
      const double drop = prev - pt.y;
      // A cliff (a drop past cliff_max from the layer before) is marked as such even under the
      // limit: it says where the error came in.
      const bool under = std::isfinite(limit) && !(pt.y >= limit);
      const bool cliff = std::isfinite(cliff_max) && l > 0 && !(drop <= cliff_max);
      if (cliff) pt.mark = "cliff", ++cliffs;
      else if (under) pt.mark = "fail";
      pt.title = fmt::format("\"{}\" layer {}: cosine {:.6f}{}{}", se.name, l, pt.y,
                             cliff ? fmt::format(" (cliff: a {} drop from layer {})", short_number(drop), l - 1) : "",
                             under ? " (under the limit)" : "");
      if (!std::isfinite(pt.y)) pt.y = 0, pt.mark = "fail";
      se.points.push_back(pt);
    }
    Series es = se;
    for (Point& pt : es.points) pt.y = 1 - pt.y;
    err.series.push_back(std::move(es));
    c.series.push_back(std::move(se));
    if (p.contains("position_min_cosines")) {
      have_pos = true;
      Series ps;
      ps.name = str(p, "text");
      const json& pm = p["position_min_cosines"];
      for (size_t t = 0; t < pm.size(); ++t) {
        Point pt = point(double(t), as_num(pm[t]));
        if (!std::isfinite(pt.y)) pt.y = 0, pt.mark = "fail";
        else if (std::isfinite(limit) && pt.y < limit) pt.mark = "fail";
        pt.title = fmt::format("\"{}\" position {}: min cosine {:.6f}", ps.name, t, as_num(pm[t]));
        ps.points.push_back(pt);
      }
      pos.series.push_back(std::move(ps));
    }
  }
  h += fmt::format("<p>{} prompts; layer cosine limit {}, cliff limit {} (a drop between adjacent layers); {} cliff(s) marked.</p>\n",
                   prompts.size(), short_number(limit), short_number(cliff_max), cliffs);
  h += "<div class=\"chart\" data-chart=\"phase3-layers\">" + render(c) + "</div>\n";  h += "<div class=\"chart\" data-chart=\"phase3-layers-error\">" + render(err) + "</div>\n";
  if (have_pos) h += "<div class=\"chart\" data-chart=\"phase3-positions\">" + render(pos) + "</div>\n";
  else h += "<p class=\"note\">Per-position minima were not recorded by this deployment's phase 3 (an older tessera).</p>\n";
  h += "<table>\n<tr><th>prompt</th><th>verdict</th><th>checks</th></tr>\n";
  for (const json& p : prompts) {
    std::string checks;
    for (const json& ch : p["gate"].value("checks", json::array()))
      checks += fmt::format("{} {} {} {}{}; ", str(ch, "metric"), short_number(num(ch, "value")), str(ch, "op"),
                            short_number(num(ch, "limit")), ch.value("pass", true) ? "" : " FAIL");
    const bool pass = p["gate"].value("pass", true);
    h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>\n", e(str(p["gate"], "subject")), badge(pass ? "pass" : "fail"),
                     e(checks));
  }
  h += "</table>\n";
  return h;
}

// ---- phases 4-5 ----

std::string optimization_section(const json& state, const std::optional<json>& p4, const std::optional<json>& p5) {
  std::string h = "<h2 id=\"phase45\">Phases 4-5: the optimization trajectory</h2>\n";
  int n = 0;
  for (const auto& [phase, rec] : {std::pair{4, &p4}, std::pair{5, &p5}}) {
    if (!*rec || !(**rec)["details"].contains("steps")) {
      h += not_run(state, phase, phase == 4 ? "no prefill rewrite was tried" : "no decode rewrite was tried");
      continue;
    }
    ++n;
    const json& d = (**rec)["details"];
    const bool pred = d.value("predicted", false);
    LineChart c;
    c.title = fmt::format("Phase {} ({}): the plan's time after each step ({}), every candidate tried", phase, str(d, "pass"),
                          pred ? "predicted" : "measured");
    c.x_label = "step";
    c.y_label = "ms";
    Series plan, cand;
    plan.name = "plan (after the step)";
    cand.name = "candidate (kept / reverted)";
    cand.line = false;
    double cur = num(d, "start_s");
    plan.points.push_back(point(0, cur * 1e3, fmt::format("start: plan {} {}", str(d, "start_plan"), ms_text(cur))));
    const json& steps = d["steps"];
    for (size_t i = 0; i < steps.size(); ++i) {
      const json& s = steps[i];
      const double x = double(i + 1);
      const std::string result = str(s, "result");
      const bool kept = result.rfind("kept", 0) == 0;
      const double after = num(s, "after_s"), before = num(s, "before_s");
      if (std::isfinite(after)) {
        Point p = point(x, after * 1e3);
        p.mark = kept ? "kept" : "reverted";
        if (s.contains("ratio_min") && std::isfinite(before)) {
          p.lo = before * num(s, "ratio_min") * 1e3;
          p.hi = before * num(s, "ratio_max") * 1e3;
        }
        p.title = fmt::format("step {} {}: {} -> {}; {}", i + 1, str(s, "skill"), ms_text(before), ms_text(after), result);
        cand.points.push_back(p);
        if (kept) cur = after;
      }
      plan.points.push_back(point(x, cur * 1e3, fmt::format("after step {} ({}): {}", i + 1, str(s, "skill"), ms_text(cur))));
    }
    c.series = {plan, cand};
    h += fmt::format("<p>Phase {}: {} ({}). {}</p>\n", phase, e(str(d, "figure")), pred ? "predicted" : "measured",
                     pred ? "" : "Error bars: the spread of the per-round after/before ratios, times the before figure.");
    h += fmt::format("<div class=\"chart\" data-chart=\"phase{}-trajectory\">", phase) + render(c) + "</div>\n";
    h += "<table>\n<tr><th>step</th><th>skill</th><th>rewrite</th><th>before</th><th>after</th><th>gate</th><th>result</th></tr>\n";
    for (size_t i = 0; i < steps.size(); ++i) {
      const json& s = steps[i];
      const std::string result = str(s, "result");
      h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td></tr>\n",
                       i + 1, e(str(s, "skill")), e(str(s, "what")), ms_text(num(s, "before_s")), ms_text(num(s, "after_s")),
                       e(str(s, "gate", "-")), result.rfind("kept", 0) == 0 ? "ok" : "", e(result));
    }
    h += "</table>\n";
  }
  return h;
}

// ---- the target ----

std::string timeline_chart(const json& tl, bool prefill_layer, std::string& tiles_html, std::set<std::string>& tiles_seen) {
  Gantt g;
  const std::string pass = str(tl, "pass");
  g.title = prefill_layer ? fmt::format("One prefill layer ({} tokens): launches, DMA and host work per dispatch (predicted)",
                                        str(tl, "tokens"))
                          : fmt::format("One decode step (context {}): every dispatch, a layer's once (predicted)", str(tl, "context"));
  double t = 0;
  const int cols = int(num(tl, "columns", 0)), rows = int(num(tl, "rows", 0));
  const int shim = int(num(tl, "shim_row", 0)), mem = int(num(tl, "mem_row", 1));
  for (const json& d : tl.value("dispatches", json::array())) {
    if (prefill_layer && str(d, "section") != "layer") continue;
    const std::string dn = str(d, "name");
    const int64_t count = json_integer_or(d, "count", "report: a dispatch's 'count'", 1);
    const std::string xn = count > 1 ? fmt::format(" (x{} per pass)", count) : "";
    if (!d.value("host", false)) {
      const double copy = num(d, "host_copy_us", 0), over = num(d, "overhead_us", 0);
      if (copy > 0) {
        g.spans.push_back({"host", t, t + copy, "copy", "copies", fmt::format("{}{}: host copies {:.2f} us", dn, xn, copy)});
        t += copy;
      }
      g.spans.push_back({"host", t, t + over, "overhead", "dispatch", fmt::format("{}{}: dispatch overhead {:.2f} us", dn, xn, over)});
      t += over;
      for (const json& l : d.value("launches", json::array())) {
        const std::string ln = str(l, "name");
        const double fill = num(l, "fill_us", 0), body = num(l, "body_us", 0), drain = num(l, "drain_us", 0);
        const std::string how = fmt::format("{} in {}{}: fill {:.2f} + body {:.2f} + drain {:.2f} us; compute {:.2f}, dma {:.2f}, "
                                            "ddr {:.2f} us; bound by {}; {}",
                                            ln, dn, xn, fill, body, drain, num(l, "compute_us", 0), num(l, "dma_us", 0),
                                            num(l, "ddr_us", 0), str(l, "bound_by"), str(l, "kernel"));
        g.spans.push_back({"DMA (shim, memory tiles)", t, t + fill, "dma", "fill", how});
        g.spans.push_back({"array (launch bodies)", t + fill, t + fill + body, "launch", ln, how});
        g.spans.push_back({"DMA (shim, memory tiles)", t + fill + body, t + fill + body + drain, "dma", "drain", how});
        t += fill + body + drain;
        // The launch's tile map, once per launch name and pass.
        if (tiles_seen.insert(pass + "/" + ln).second && cols > 0 && rows > 0) {
          TileMap m;
          m.title = fmt::format("{} {}: herd {}x{}", pass, ln, at(l["herd"], 0), at(l["herd"], 1));
          m.subtitle = str(l, "kernel");
          m.columns = cols;
          m.rows = rows;
          for (int r = 0; r < rows; ++r)
            m.row_names.push_back(r == shim ? "shim" : r == mem ? "memory" : fmt::format("compute {}", r));
          for (int c = 0; c < cols; ++c) {
            m.cells.push_back({c, shim, "shim", "", fmt::format("({},{}) shim", c, shim)});
            m.cells.push_back({c, mem, "mem", "", fmt::format("({},{}) memory tile", c, mem)});
          }
          const json bt = l.value("busiest_tile", json::array());
          for (const json& tile : l.value("tiles", json::array())) {
            const int c = at(tile, 0), r = at(tile, 1);
            const std::string k = tile.size() > 2 && tile[2].is_string() ? tile[2].get<std::string>() : "";
            const bool busiest = bt.size() == 2 && bt[0] == c && bt[1] == r;
            m.cells.push_back({c, r, busiest ? "busiest" : "used", k.substr(0, 3),
                               fmt::format("({},{}) {}{}", c, r, k, busiest ? " (busiest: sets the compute time)" : "")});
          }
          tiles_html += "<div class=\"tilemap\" data-chart=\"tile-map\">" + render(m) + "</div>\n";
        }
      }
    }
    for (const json& op : d.value("host_ops", json::array())) {
      const double us = num(op, "us", 0);
      g.spans.push_back({"host", t, t + us, "host", str(op, "what"), fmt::format("{}{}: host op {} {:.2f} us", dn, xn, str(op, "what"), us)});
      t += us;
    }
  }
  return render(g);
}

std::string target_section(const json& state, const std::optional<json>& p6, const std::optional<json>& report) {
  const std::string target = str(state["identity"], "target");
  std::string h = fmt::format("<h2 id=\"target\">The target: {}</h2>\n", e(target));
  if (!p6) return h + not_run(state, 6, "the frozen plan's figures were not taken");
  const json& d = (*p6)["details"];
  if (d.contains("target_timeline")) {
    const json& tl = d["target_timeline"];
    std::string tiles_prefill, tiles_decode;
    std::set<std::string> seen;
    h += "<p>The lowered program of the final plan as the timing model prices it (steady state; each dispatch's parts laid "
         "end to end: host copies, dispatch overhead, then each launch's fill, body and drain, then the host's ops). Hover "
         "a bar for its figures.</p>\n";
    if (tl.contains("prefill"))
      h += "<div class=\"chart\" data-chart=\"npusim-prefill-timeline\">" + timeline_chart(tl["prefill"], true, tiles_prefill, seen) +
           "</div>\n";
    if (tl.contains("decode"))
      h += "<div class=\"chart\" data-chart=\"npusim-decode-timeline\">" + timeline_chart(tl["decode"], false, tiles_decode, seen) +
           "</div>\n";
    h += "<h3>Tile map of each launch</h3>\n<p>Compute tiles a launch's workers use (dark: the busiest, which sets its "
         "compute time); the shim and memory rows below.</p>\n<div class=\"tiles\">\n" +
         tiles_prefill + tiles_decode + "</div>\n";
  } else if (d.contains("roofs")) {
    const json& r = d["roofs"];
    const json t = d.value("target_timing", json::object());
    BarChart dec;
    dec.title = "Decode tokens/s (phase 6, measured) against the bandwidth roof (tick)";
    dec.value_label = "tokens/s";
    Bar b;
    b.label = "decode";
    b.value = num(t, "decode_tokens_per_s", 0);
    b.limit = num(r, "decode_roof_tokens_per_s", 0);
    b.title = fmt::format("decode {:.1f} tok/s measured; roof {:.1f} tok/s = {:.1f} GB/s / {:.1f} MB per token ({:.0f}% of the roof)",
                          b.value, *b.limit, num(r, "read_bandwidth_gbs"), num(r, "weight_bytes_per_token") / 1e6,
                          *b.limit > 0 ? 100 * b.value / *b.limit : 0);
    dec.bars.push_back(b);
    h += "<div class=\"chart\" data-chart=\"cpu-decode-roof\">" + render(dec) + "</div>\n";
    BarChart pre;
    const double gemm = num(r, "gemm_gflops", 0);
    pre.title = gemm > 0 ? "Prefill GFLOP/s (phase 6, measured) against the compute roof (tick: the target's own GEMM rate)"
                         : "Prefill GFLOP/s achieved (phase 6, measured); the compute roof is not recorded";
    pre.value_label = "GFLOP/s";
    Bar pb;
    pb.label = "prefill";
    pb.value = num(r, "prefill_achieved_gflops", 0);
    if (gemm > 0) pb.limit = gemm;
    pb.title = fmt::format("prefill {:.1f} tok/s x {:.3g} flops per token = {:.2f} GFLOP/s{}", num(t, "prefill_tokens_per_s"),
                           num(r, "flops_per_token"), pb.value,
                           gemm > 0 ? fmt::format("; roof {:.1f} GFLOP/s ({:.0f}% of it; {:.0f} tok/s)", gemm, 100 * pb.value / gemm,
                                                  num(r, "prefill_roof_tokens_per_s", 0))
                                    : "");
    pre.bars.push_back(pb);
    h += "<div class=\"chart\" data-chart=\"cpu-prefill-compute\">" + render(pre) + "</div>\n";
    h += fmt::format("<p class=\"note\">{}. Phase 6 times its few prompts (short ones and one of 320 positions); <code>tessera bench</code> measures "
                     "throughput properly.</p>\n",
                     e(str(r, "note")));
  } else {
    h += "<p class=\"note\">Phase 6 of this deployment recorded neither a timeline nor roofs (an older tessera).</p>\n";
  }
  return h;
}

// ---- issues, diagnoses, audit ----

std::string issues_section(Dir& dir) {
  std::string h = "<h2 id=\"issues\">Issues and diagnoses</h2>\n";
  const std::optional<json> diag = dir.load("diagnosis.json");
  if (diag && diag->contains("diagnoses")) {
    for (const json& d : (*diag)["diagnoses"]) {
      h += fmt::format("<h3>Debug skill <code>{}</code></h3>\n<p>Symptom: {}. Where to look: {}.</p>\n", e(str(d, "skill")),
                       e(str(d, "symptom")), e(str(d, "where")));
      h += "<table>\n<tr><th>hypothesis</th><th>cause</th><th>verdict</th><th>experiment and evidence</th></tr>\n";
      for (const json& hy : d.value("hypotheses", json::array())) {
        const std::string v = str(hy, "verdict");
        h += fmt::format("<tr><td>{}</td><td><code>{}</code></td><td class=\"{}\">{}</td><td>{}</td></tr>\n", e(str(hy, "name")),
                         e(str(hy, "cause")), v == "confirmed" ? "bad" : "", e(v), e(str(hy, "evidence")));
      }
      h += "</table>\n";
    }
  }
  const std::optional<std::string> issues = dir.text("issues.md");
  if (issues) {
    const bool none = issues->find("\n## ") == std::string::npos;
    h += none ? "<p>No issue was recorded (<code>issues.md</code> is empty).</p>\n"
              : "<details open=\"open\"><summary><code>issues.md</code></summary><pre>" + e(*issues) + "</pre></details>\n";
  } else {
    h += "<p class=\"note\">No issues.md.</p>\n";
  }
  return h;
}

std::string audit_section(const std::optional<json>& ev) {
  std::string h = "<h2 id=\"audit\">Phase 7: the audit</h2>\n";
  if (!ev) return h + "<p class=\"note\">The audit has not run: <code>tessera audit DIR</code> re-checks the deployment and "
                      "refreshes this page.</p>\n";
  h += fmt::format("<p>Verdict: {}</p>\n<table>\n<tr><th>check</th><th>verdict</th><th>finding</th></tr>\n",
                   badge(str(*ev, "verdict")));
  for (const json& f : ev->value("findings", json::array()))
    h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>\n", e(str(f, "check")), badge(str(f, "verdict")), e(str(f, "detail")));
  h += "</table>\n";
  return h;
}

std::string page_css() {
  return R"(body{font:14px/1.4 sans-serif;margin:1.5em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:2px 6px;vertical-align:top;text-align:left}
th{background:#f4f4f4}table.kv th{width:9em}
.badge{padding:0 6px;border-radius:3px;color:#fff;background:#999}.badge.ok{background:#2e8b57}
.badge.warn{background:#c98a00}.badge.bad{background:#d03a2f}
td.bad,.bad{color:#d03a2f;font-weight:bold}td.ok{color:#2e8b57}
.kind{padding:0 4px;border-radius:3px}.kind.measured{background:#dfeedd}.kind.predicted{background:#e7e2f5}
.note{color:#666;font-style:italic}pre{background:#f8f8f8;padding:.5em;overflow:auto;white-space:pre-wrap}
.tiles{display:flex;flex-wrap:wrap;gap:6px}nav a{margin-right:1em}
)";
}

}  // namespace

std::string deployment_report_html(const fs::path& dir_path) {
  Dir dir{dir_path, {}};
  const std::optional<json> state = dir.load("state.json");
  if (!state || !state->contains("identity") || !state->contains("phases"))
    fail("{} is not a deployment directory (no readable state.json)", dir_path.string());
  const std::optional<json> plan = dir.load("plan.json");
  const std::optional<json> report = dir.load("report.json");
  std::optional<json> evaluation = dir.load("evaluation.json");
  // An audit of an earlier state of the deployment (a deploy ran after it) is stale.
  bool audit_stale = false;
  if (evaluation && evaluation->contains("state_json_sha256"))
    audit_stale = (*evaluation)["state_json_sha256"] != sha256_file_hex((dir_path / "state.json").string());
  if (audit_stale) (*evaluation)["verdict"] = "stale";
  const std::optional<json> p1 = dir.load("phase1.json"), p2 = dir.load("phase2.json"), p3 = dir.load("phase3.json"),
                            p4 = dir.load("phase4.json"), p5 = dir.load("phase5.json"), p6 = dir.load("phase6.json");
  const std::string model = fs::path(str((*state)["identity"], "model_path", "?")).filename().string();
  std::string body;
  body += "<nav><a href=\"#phases\">phases</a><a href=\"#figures\">figures</a><a href=\"#phase1\">kernels</a>"
          "<a href=\"#phase3\">model</a><a href=\"#phase45\">optimization</a><a href=\"#target\">target</a>"
          "<a href=\"#issues\">issues</a><a href=\"#audit\">audit</a></nav>\n";
  body += header(*state, plan, report, evaluation, p6);
  body += phase1_section(*state, p1);
  body += phase2_section(*state, p2);
  body += phase3_section(*state, p3);
  body += optimization_section(*state, p4, p5);
  body += target_section(*state, p6, report);
  body += issues_section(dir);
  body += audit_section(evaluation);
  if (audit_stale)
    body += "<p class=\"bad\">This audit checked an earlier state of the deployment: a deploy ran after it. Run "
            "<code>tessera audit DIR</code> again.</p>\n";
  if (!dir.problems.empty()) {
    body += "<h2>Files that could not be read</h2>\n<ul>\n";
    for (const std::string& p : dir.problems) body += "<li>" + e(p) + "</li>\n";
    body += "</ul>\n";
  }
  // The page names no path of its own: a copy of the directory makes the same page.
  body += fmt::format("<p class=\"note\">Written by <code>tessera report</code> {} from the deployment directory alone.</p>\n",
                      TESSERA_VERSION);
  return html_page(fmt::format("tessera report: {} on {}", model, str((*state)["identity"], "target")), body);
}

std::string html_page(const std::string& title, const std::string& body) {
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>{}</title>\n"
      "<style>\n{}{}</style>\n</head>\n<body>\n{}</body>\n</html>\n",
      e(title), page_css(), svg_css(), body);
}

namespace {

// One deployment as the comparison reads it.
struct Loaded {
  std::string label;
  json state;
  std::optional<json> plan, report, p1, p3, p6, evaluation;
};

Loaded load_deployment(const fs::path& path, const std::string& label) {
  Dir dir{path, {}};
  Loaded l;
  l.label = label;
  const std::optional<json> state = dir.load("state.json");
  if (!state || !state->contains("identity") || !state->contains("phases"))
    fail("{} is not a deployment directory (no readable state.json)", path.string());
  l.state = *state;
  l.plan = dir.load("plan.json");
  l.report = dir.load("report.json");
  l.p1 = dir.load("phase1.json");
  l.p3 = dir.load("phase3.json");
  l.p6 = dir.load("phase6.json");
  l.evaluation = dir.load("evaluation.json");
  return l;
}

std::string model_name(const json& state) { return fs::path(str(state["identity"], "model_path", "?")).filename().string(); }

}  // namespace

std::string comparison_report_html(const fs::path& a_path, const fs::path& b_path) {
  const Loaded a = load_deployment(a_path, "A"), b = load_deployment(b_path, "B");
  std::string h = fmt::format("<h1>{} on {} (A) and {} on {} (B)</h1>\n", e(model_name(a.state)),
                              e(str(a.state["identity"], "target")), e(model_name(b.state)), e(str(b.state["identity"], "target")));
  h += "<h2 id=\"identity\">The two deployments</h2>\n<table>\n<tr><th></th><th>A</th><th>B</th></tr>\n";
  const auto row = [&](const std::string& name, const std::string& va, const std::string& vb) {
    h += fmt::format("<tr><th>{}</th><td>{}</td><td>{}</td></tr>\n", e(name), va, vb);
  };
  row("model", "<code>" + e(str(a.state["identity"], "model_path")) + "</code>", "<code>" + e(str(b.state["identity"], "model_path")) + "</code>");
  row("target", e(str(a.state["identity"], "target")), e(str(b.state["identity"], "target")));
  row("plan", e(a.plan ? str(*a.plan, "name") : "-"), e(b.plan ? str(*b.plan, "name") : "-"));
  const auto ref = [](const Loaded& l) {
    return l.report && l.report->contains("reference") ? str((*l.report)["reference"], "status", "unverified") : phase_status(l.state, 0);
  };
  row("reference", e(ref(a)), e(ref(b)));
  for (int p = 0; p <= 6; ++p)
    row(fmt::format("phase {} {}", p, str(a.state["phases"].value(std::to_string(p), json::object()), "name")),
        badge(phase_status(a.state, p)), badge(phase_status(b.state, p)));
  row("phase 7 (audit)", a.evaluation ? badge(str(*a.evaluation, "verdict")) : badge("not-run"),
      b.evaluation ? badge(str(*b.evaluation, "verdict")) : badge("not-run"));
  h += "</table>\n";

  // The figures side by side, matched by name.
  h += "<h2 id=\"figures\">Figures</h2>\n<table>\n<tr><th>figure</th><th>A</th><th>B</th></tr>\n";
  const std::vector<Fig> fa = figures(a.report, a.p6), fb = figures(b.report, b.p6);
  std::vector<std::string> names;
  for (const auto* fs_ : {&fa, &fb})
    for (const Fig& f : *fs_)
      if (std::find(names.begin(), names.end(), f.name) == names.end()) names.push_back(f.name);
  const auto cell = [](const std::vector<Fig>& v, const std::string& n) {
    for (const Fig& f : v)
      if (f.name == n) return fmt::format("{} <span class=\"kind {}\">{}</span>", escape(f.value), f.kind, f.kind);
    return std::string("-");
  };
  for (const std::string& n : names) h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>\n", e(n), cell(fa, n), cell(fb, n));
  h += "</table>\n";

  // Phase 3's per-layer cosines overlaid: A solid, B dashed, one colour per prompt.
  h += "<h2 id=\"phase3\">Phase 3: per-layer cosine, A solid and B dashed</h2>\n";
  LineChart c;
  c.title = "Per-layer cosine to the oracle, every prompt of A (solid) and B (dashed)";
  c.x_label = "layer";
  c.y_label = "cosine";
  c.y_max = 1.0;
  bool any = false;
  for (const Loaded* l : {&a, &b}) {
    if (!l->p3 || !(*l->p3)["details"].contains("prompts")) {
      h += fmt::format("<p class=\"note\">{}: phase 3 did not run (status: {}).</p>\n", l->label, e(phase_status(l->state, 3)));
      continue;
    }
    for (const json& p : (*l->p3)["details"]["prompts"]) {
      for (const json& ch : p["gate"].value("checks", json::array()))
        if (str(ch, "metric") == "min_layer_cosine" && !c.limit) c.limit = num(ch, "limit"), c.limit_label = "limit";
      Series se;
      se.name = l->label + ": " + str(p, "text");
      se.dashed = l == &b;
      const json cos = p.value("layer_cosines", json::array());
      for (size_t i = 0; i < cos.size(); ++i) {
        Point pt = point(double(i), as_num(cos[i]), fmt::format("{} layer {}: {:.6f}", se.name, i, as_num(cos[i])));
        if (!std::isfinite(pt.y)) pt.y = 0, pt.mark = "fail";
        se.points.push_back(pt);
      }
      c.series.push_back(std::move(se));
      any = true;
    }
  }
  if (any) h += "<div class=\"chart\" data-chart=\"compare-phase3-layers\">" + render(c) + "</div>\n";
  h += "<p class=\"note\">Written by <code>tessera report A B</code> " TESSERA_VERSION " from the two deployment directories alone.</p>\n";
  return html_page(fmt::format("tessera report: {} vs {}", model_name(a.state), model_name(b.state)), h);
}

std::string campaign_results_html(const json& results) {
  const json rows = results.value("rows", json::array());
  std::string h = "<h1>Campaign results</h1>\n";
  h += fmt::format("<p>{} deployments; eta_scale = (parameters x tokens/s) / (those of the reference, {}, on the same target): "
                   "how far a model's throughput sits from what its size alone predicts. npusim figures are predicted, "
                   "cpu figures measured.</p>\n",
                   rows.size(), e(str(results, "reference", "?")));
  h += "<table>\n<tr><th>model</th><th>target</th><th>parameters</th><th>phases</th><th>gates</th><th>prefill tok/s</th>"
       "<th>decode tok/s</th><th>figures</th><th>dispatches/layer</th><th>deploy wall time</th><th>eta prefill</th>"
       "<th>eta decode</th><th>failure</th></tr>\n";
  BarChart eta, wall;
  eta.title = "eta_scale per model and target, prefill and decode (tick: the reference, 1)";
  eta.value_label = "eta_scale";
  wall.title = "Deploy wall time per model and target";
  wall.value_label = "s";
  for (const json& r : rows) {
    const std::string who = fmt::format("{} ({})", str(r, "model"), str(r, "target"));
    const bool ok = r.value("deployed", false);
    h += fmt::format("<tr><td>{}</td><td>{}</td><td>{:.1f}M</td><td>{}/{}</td><td>{}/{}</td><td>{:.1f}</td><td>{:.1f}</td><td>"
                     "<span class=\"kind {}\">{}</span></td><td>{}</td><td>{:.1f} s</td><td>{:.3f}</td><td>{:.3f}</td><td class=\"{}\">{}</td></tr>\n",
                     e(str(r, "model")), e(str(r, "target")), num(r, "parameters", 0) / 1e6, str(r, "phases_passed"),
                     str(r, "phases_total"), str(r, "gates_passed"), str(r, "gates_total"), num(r, "prefill_tokens_per_s", 0),
                     num(r, "decode_tokens_per_s", 0), e(str(r, "figures")), e(str(r, "figures")), e(str(r, "dispatches_per_layer")),
                     num(r, "deploy_wall_s", 0), num(r, "eta_scale_prefill", 0), num(r, "eta_scale_decode", 0), ok ? "" : "bad",
                     e(str(r, "failure")));
    for (const char* pass : {"prefill", "decode"}) {
      if (!(num(r, fmt::format("eta_scale_{}", pass).c_str(), 0) > 0)) continue;  // 0: no reference on this target
      Bar b;
      b.label = who + " " + pass;
      b.value = num(r, fmt::format("eta_scale_{}", pass).c_str(), 0);
      b.limit = 1.0;
      b.fail = !ok;
      b.title = fmt::format("{} {}: eta_scale {:.3f} ({} figures){}", who, pass, b.value, str(r, "figures"),
                            b.value == 0 ? " (no reference on this target)" : "");
      eta.bars.push_back(b);
    }
    Bar w;
    w.label = who;
    w.value = num(r, "deploy_wall_s", 0);
    w.fail = !ok;
    w.title = fmt::format("{}: deployed in {:.1f} s{}", who, w.value, ok ? "" : " (failed: " + str(r, "failure") + ")");
    wall.bars.push_back(w);
  }
  h += "</table>\n";
  if (eta.bars.empty())
    h += fmt::format("<p class=\"note\">No eta_scale to draw: the reference ({}) is not in this campaign on any target "
                     "it ran, or did not deploy.</p>\n",
                     e(str(results, "reference", "?")));
  else
    h += "<div class=\"chart\" data-chart=\"campaign-eta\">" + render(eta) + "</div>\n";
  h += "<div class=\"chart\" data-chart=\"campaign-wall\">" + render(wall) + "</div>\n";
  h += "<p class=\"note\">Written by <code>tessera campaign</code> " TESSERA_VERSION " from results.json; each deployment's own "
       "page is its report.html.</p>\n";
  return html_page("tessera campaign results", h);
}

fs::path write_deployment_report(const fs::path& dir, const fs::path& out) {
  const fs::path path = out.empty() ? dir / "report.html" : out;
  write_file_atomic(path, deployment_report_html(dir));
  return path;
}

}  // namespace tessera::report
