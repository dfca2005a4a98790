// The deployment report (report/report.h, `tessera report`): the page `deploy` writes for a
// tiny deploy on each target and for a failed deploy is well-formed (a strict checker below:
// every tag closed and balanced, attributes quoted, entities valid), references nothing
// outside itself, and holds every chart of the phases that ran, each a non-empty <svg>; a
// phase that did not run is said so. `audit` refreshes the page with its checks.
#include <gtest/gtest.h>

#include <cctype>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "report/report.h"
#include "report/svg.h"
#include "test_support.h"

namespace tessera {
namespace {

using namespace testing_support;
namespace fs = std::filesystem;

const char* kPreset = "SmolLM2-360M";

// ---- a strict checker for the XML-compatible HTML the report writes ----

struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;
  int parent = -1;
  std::vector<int> children;
  std::string text;  // the element's own character data (not its children's)
};

struct Doc {
  std::vector<Element> elements;  // [0] the root
  std::string error;              // empty: well-formed
};

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ':' || c == '.'; }

// Character data: '&' only as an entity (&name; or &#N; or &#xH;), no '<'.
bool valid_text(const std::string& t, std::string& why) {
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '<') return why = "'<' in character data", false;
    if (t[i] != '&') continue;
    const size_t semi = t.find(';', i);
    if (semi == std::string::npos || semi - i > 10) return why = "bare '&': " + t.substr(i, 20), false;
    const std::string ent = t.substr(i + 1, semi - i - 1);
    static const std::set<std::string> named = {"amp", "lt", "gt", "quot", "apos"};
    const bool numeric = ent.size() > 1 && ent[0] == '#' &&
                         std::all_of(ent.begin() + 1, ent.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == 'x'; });
    if (!numeric && !named.count(ent)) return why = "unknown entity &" + ent + ";", false;
  }
  return true;
}

Doc parse(const std::string& s) {
  Doc d;
  std::vector<int> stack;
  size_t i = 0;
  auto fail = [&](const std::string& why) {
    d.error = why + " at byte " + std::to_string(i) + ": " + s.substr(i, 60);
    return d;
  };
  const std::string doctype = "<!DOCTYPE html>";
  if (s.compare(0, doctype.size(), doctype) != 0) return fail("no <!DOCTYPE html> first");
  i = doctype.size();
  while (i < s.size()) {
    const size_t lt = s.find('<', i);
    const std::string text = s.substr(i, (lt == std::string::npos ? s.size() : lt) - i);
    std::string why;
    if (!valid_text(text, why)) return fail(why);
    if (!stack.empty()) d.elements[size_t(stack.back())].text += text;
    else if (text.find_first_not_of(" \t\r\n") != std::string::npos) return fail("text outside the root");
    if (lt == std::string::npos) break;
    i = lt;
    if (s.compare(i, 4, "<!--") == 0) {
      const size_t end = s.find("-->", i);
      if (end == std::string::npos) return fail("unclosed comment");
      i = end + 3;
      continue;
    }
    if (s.compare(i, 2, "</") == 0) {
      size_t j = i + 2;
      while (j < s.size() && name_char(s[j])) ++j;
      const std::string name = s.substr(i + 2, j - i - 2);
      if (j >= s.size() || s[j] != '>') return fail("bad end tag");
      if (stack.empty() || d.elements[size_t(stack.back())].name != name)
        return fail("end tag </" + name + "> does not close <" + (stack.empty() ? "" : d.elements[size_t(stack.back())].name) + ">");
      stack.pop_back();
      i = j + 1;
      continue;
    }
    // A start tag.
    size_t j = i + 1;
    while (j < s.size() && name_char(s[j])) ++j;
    Element el;
    el.name = s.substr(i + 1, j - i - 1);
    if (el.name.empty()) return fail("'<' not starting a tag");
    bool self_closing = false;
    for (;;) {
      while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j]))) ++j;
      if (j >= s.size()) return fail("unclosed start tag");
      if (s[j] == '>') {
        ++j;
        break;
      }
      if (s.compare(j, 2, "/>") == 0) {
        self_closing = true;
        j += 2;
        break;
      }
      size_t k = j;
      while (k < s.size() && name_char(s[k])) ++k;
      const std::string an = s.substr(j, k - j);
      if (an.empty() || k >= s.size() || s[k] != '=' || k + 1 >= s.size() || s[k + 1] != '"')
        return fail("attribute not written name=\"value\"");
      const size_t close = s.find('"', k + 2);
      if (close == std::string::npos) return fail("unclosed attribute value");
      const std::string value = s.substr(k + 2, close - k - 2);
      if (!valid_text(value, why)) return fail("attribute " + an + ": " + why);
      if (!el.attrs.emplace(an, value).second) return fail("attribute " + an + " twice");
      j = close + 1;
    }
    el.parent = stack.empty() ? -1 : stack.back();
    if (stack.empty() && !d.elements.empty()) return fail("a second root element");
    const int idx = int(d.elements.size());
    if (el.parent >= 0) d.elements[size_t(el.parent)].children.push_back(idx);
    d.elements.push_back(std::move(el));
    i = j;
    const std::string& name = d.elements.back().name;
    if (!self_closing && (name == "style" || name == "script")) {  // raw text up to its end tag
      const std::string end = "</" + name + ">";
      const size_t e = s.find(end, i);
      if (e == std::string::npos) return fail("unclosed <" + name + ">");
      const std::string raw = s.substr(i, e - i);
      if (raw.find('<') != std::string::npos || raw.find('&') != std::string::npos) return fail("'<' or '&' in <" + name + ">");
      d.elements.back().text = raw;
      i = e + end.size();
      continue;
    }
    if (!self_closing) stack.push_back(idx);
  }
  if (!stack.empty()) return i = s.size(), fail("unclosed <" + d.elements[size_t(stack.back())].name + ">");
  if (d.elements.empty() || d.elements[0].name != "html") return fail("the root is not <html>");
  return d;
}

// Every descendant of element `i` (itself included) named `name`.
void find_all(const Doc& d, int i, const std::string& name, std::vector<int>& out) {
  if (d.elements[size_t(i)].name == name) out.push_back(i);
  for (int c : d.elements[size_t(i)].children) find_all(d, c, name, out);
}

bool has_class(const Element& e, const std::string& cls) {
  const auto it = e.attrs.find("class");
  if (it == e.attrs.end()) return false;
  std::string word;
  for (std::istringstream in(it->second); in >> word;)
    if (word == cls) return true;
  return false;
}

// The page's checks: well-formed, nothing outside the file, and each chart in `charts` (the
// data-chart names) present with a non-empty <svg>. Returns the parsed page.
Doc check_page(const std::string& html, const std::vector<std::string>& charts) {
  Doc d = parse(html);
  EXPECT_EQ(d.error, "");
  if (!d.error.empty()) return d;
  // Nothing fetched: no URL scheme anywhere, no link or source but a fragment of this page.
  for (const char* bad : {"http://", "https://", "file:", "url(", "@import", "<script", "<iframe", "<img", "<link"})
    EXPECT_EQ(html.find(bad), std::string::npos) << bad;
  for (const Element& e : d.elements)
    for (const char* attr : {"src", "href", "xlink:href", "action", "data", "poster"}) {
      if (auto it = e.attrs.find(attr); it != e.attrs.end()) {
        EXPECT_TRUE(!it->second.empty() && it->second[0] == '#') << "<" << e.name << " " << attr << "=\"" << it->second << "\">";
      }
    }
  std::map<std::string, int> found;
  for (size_t i = 0; i < d.elements.size(); ++i) {
    const Element& e = d.elements[i];
    const auto it = e.attrs.find("data-chart");
    if (it == e.attrs.end()) continue;
    ++found[it->second];
    std::vector<int> svgs;
    find_all(d, int(i), "svg", svgs);
    EXPECT_EQ(svgs.size(), 1u) << it->second;
    if (svgs.size() != 1) continue;
    const Element& svg = d.elements[size_t(svgs[0])];
    EXPECT_GT(std::stod(svg.attrs.at("width")), 0) << it->second;
    EXPECT_GT(std::stod(svg.attrs.at("height")), 0) << it->second;
    size_t marks = 0;
    for (const char* shape : {"rect", "line", "circle", "polyline"}) {
      std::vector<int> v;
      find_all(d, svgs[0], shape, v);
      marks += v.size();
    }
    EXPECT_GT(marks, 3u) << it->second << ": an empty chart";
  }
  for (const std::string& c : charts) EXPECT_GT(found[c], 0) << "chart " << c << " missing";
  return d;
}

int count_class(const Doc& d, const std::string& name, const std::string& cls) {
  int n = 0;
  for (const Element& e : d.elements) n += e.name == name && has_class(e, cls);
  return n;
}

// One CLI deploy per target (and fault), made once per test process.
const fs::path& deployed(const std::string& target, const std::string& inject = "") {
  static ScratchDir root("report");
  static std::map<std::string, fs::path> made;
  const std::string key = target + (inject.empty() ? "" : "+" + inject);
  if (auto it = made.find(key); it != made.end()) return it->second;
  const fs::path dir = root.path() / key;
  const CliResult r = run_tessera(fmt::format("deploy {} --target {} --out {} --quiet --threads 2{}", tiny_model(kPreset), target,
                                              dir.string(), inject.empty() ? "" : " --inject " + inject));
  EXPECT_EQ(r.exit_code, inject.empty() ? 0 : 3) << r.out << r.err;
  EXPECT_NE(r.out.find("report.html"), std::string::npos) << r.out;
  return made[key] = dir;
}

// ---- the charts alone ----

TEST(ReportSvg, EscapesTextAndAttributes) {
  EXPECT_EQ(report::escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  EXPECT_EQ(report::escape(std::string("x\x01y\tz", 5)), "xy\tz");  // a control character is not XML
  EXPECT_EQ(report::escape("caf\xC3\xA9 \xE2\x86\x92"), "caf\xC3\xA9 \xE2\x86\x92");  // UTF-8 as it is
  EXPECT_EQ(report::escape("a\xE2\x86"), "a\xEF\xBF\xBD\xEF\xBF\xBD");  // a truncated character: U+FFFD per byte
  std::string five;
  for (int i = 0; i < 5; ++i) five += "\xEF\xBF\xBD";
  EXPECT_EQ(report::escape("\xC0\xAF\xED\xA0\x80"), five);  // an overlong form, a surrogate
  report::BarChart c;
  c.title = "<script>alert(1)</script> & \"quotes\"";
  c.log = true;
  c.bars.push_back({"k<1>", 1e-9, 1e-10, true, "hover & <more>"});
  c.bars.push_back({"zero", 0.0, 1e-10, false, ""});
  const std::string svg = report::render(c);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  const Doc d = parse("<!DOCTYPE html><html>" + svg + "</html>");
  EXPECT_EQ(d.error, "") << svg;
  EXPECT_EQ(count_class(d, "rect", "fail"), 1);
}

TEST(ReportSvg, EveryChartKindIsWellFormedEvenEmpty) {
  report::LineChart l;
  l.title = "lines";
  l.limit = 0.95;
  l.series.push_back({"a", {}, true});
  report::Point p;
  p.x = 1;
  p.y = 0.9;
  p.mark = "cliff";
  p.lo = 0.8;
  p.hi = 1.0;
  l.series[0].points = {report::Point{}, p};
  report::Gantt g;
  g.spans.push_back({"host", 0, 2, "host", "op", ""});
  g.spans.push_back({"array", 2, 9, "launch", "gemm", ""});
  report::TileMap t;
  t.columns = 4;
  t.rows = 3;
  t.cells.push_back({1, 2, "busiest", "gem", "(1,2)"});
  for (const std::string& svg : {report::render(l), report::render(g), report::render(t), report::render(report::LineChart{}),
                                 report::render(report::Gantt{}), report::render(report::BarChart{})}) {
    const Doc d = parse("<!DOCTYPE html><html>" + svg + "</html>");
    EXPECT_EQ(d.error, "") << svg;
  }
  const Doc d = parse("<!DOCTYPE html><html>" + report::render(l) + "</html>");
  EXPECT_EQ(count_class(d, "circle", "cliff"), 1);
  EXPECT_EQ(count_class(d, "line", "limit"), 1);
}

TEST(ReportChecker, RefusesWhatIsNotWellFormed) {
  EXPECT_NE(parse("<!DOCTYPE html><html><p></html>").error, "");
  EXPECT_NE(parse("<!DOCTYPE html><html><p>a & b</p></html>").error, "");
  EXPECT_NE(parse("<!DOCTYPE html><html><p class=x></p></html>").error, "");
  EXPECT_NE(parse("<!DOCTYPE html><html></html><html></html>").error, "");
  EXPECT_EQ(parse("<!DOCTYPE html><html><p class=\"x\">a &amp; b<br/></p></html>").error, "");
}

// ---- pages of real deployments ----

TEST(Report, TinyCpuDeployPageHasEveryChart) {
  const fs::path& dir = deployed("cpu");
  const std::string html = slurp(dir / "report.html");
  const Doc d = check_page(html, {"phase1-kernels", "phase3-layers", "phase3-layers-error", "phase3-positions", "phase4-trajectory", "phase5-trajectory",
                                  "cpu-decode-roof", "cpu-prefill-compute"});
  EXPECT_EQ(count_class(d, "rect", "fail"), 0);
  EXPECT_NE(html.find("measured"), std::string::npos);
  EXPECT_NE(html.find("The audit has not run"), std::string::npos);
  EXPECT_EQ(html.find("npusim-prefill-timeline"), std::string::npos);
  // Both roofs drawn: decode against the read bandwidth, prefill against the GEMM kernel's rate.
  for (const char* chart : {"cpu-decode-roof", "cpu-prefill-compute"}) {
    const size_t at = html.find(std::string("data-chart=\"") + chart);
    ASSERT_NE(at, std::string::npos) << chart;
    EXPECT_LT(html.find("class=\"limit\"", at), html.find("</svg>", at)) << chart << ": no roof drawn";
  }
}

TEST(Report, TinyNpusimDeployPageHasTheTimelineAndTileMaps) {
  const fs::path& dir = deployed("npusim");
  const std::string html = slurp(dir / "report.html");
  const Doc d = check_page(html, {"phase1-kernels", "phase3-layers", "phase3-layers-error", "phase3-positions", "phase4-trajectory", "phase5-trajectory",
                                  "npusim-prefill-timeline", "npusim-decode-timeline", "tile-map"});
  EXPECT_GT(count_class(d, "rect", "launch"), 0);
  EXPECT_GT(count_class(d, "rect", "dma"), 0);
  EXPECT_GT(count_class(d, "rect", "busiest"), 0);
  EXPECT_NE(html.find("predicted"), std::string::npos);
  EXPECT_EQ(html.find("cpu-decode-roof"), std::string::npos);
}

TEST(Report, FailedDeployPageMarksTheFailingKernelsAndSaysWhatDidNotRun) {
  const fs::path& dir = deployed("cpu", "rope-interleaved");
  const std::string html = slurp(dir / "report.html");
  const Doc d = check_page(html, {"phase1-kernels"});
  EXPECT_GE(count_class(d, "rect", "fail"), 1);
  for (const char* chart : {"phase3-layers", "phase4-trajectory", "cpu-decode-roof"})
    EXPECT_EQ(html.find(chart), std::string::npos) << chart;
  for (const char* said : {"Phase 3 did not run", "Phase 4 did not run", "Phase 6 did not run", "rope-variant", "confirmed"})
    EXPECT_NE(html.find(said), std::string::npos) << said;
}

TEST(Report, PhaseThreeFailurePageMarksTheCliff) {
  // Layer 1's residual stream made wrong from outside the target: phases 0-2 pass (they look
  // at layer 0), phase 3 fails with a cliff at layer 1.
  ScratchDir out("report_cliff");
  const CliResult r = run_tessera(fmt::format("deploy {} --target cpu --out {} --quiet --threads 2 --perturb "
                                              "mlp_residual:noise:0.5:layer=1",
                                              tiny_model(kPreset), out.str("dep")));
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  const std::string html = slurp(out.path() / "dep" / "report.html");
  const Doc d = check_page(html, {"phase1-kernels", "phase3-layers", "phase3-layers-error", "phase3-positions"});
  EXPECT_GT(count_class(d, "circle", "cliff"), 0);
  EXPECT_NE(html.find("cliff: a "), std::string::npos);
  EXPECT_NE(html.find("Phase 4 did not run"), std::string::npos);
}

TEST(Report, CommandWritesWhereAskedAndAuditRefreshesThePage) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "the Release run's (a deploy and an audit; the page code runs under sanitizers in the other Report tests)";
#endif
  const fs::path& dep = deployed("cpu");
  ScratchDir out("report_cmd");
  fs::copy(dep, out.path() / "dep", fs::copy_options::recursive);
  const fs::path dir = out.path() / "dep";
  const CliResult r = run_tessera(fmt::format("report {} --out {}", dir.string(), out.str("page.html")));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(slurp(out.path() / "page.html"), slurp(dir / "report.html"));
  const CliResult a = run_tessera(fmt::format("audit {} --no-remeasure --quiet --threads 2", dir.string()));
  EXPECT_EQ(a.exit_code, 0) << a.out << a.err;
  const std::string html = slurp(dir / "report.html");
  check_page(html, {"phase1-kernels"});
  EXPECT_EQ(html.find("The audit has not run"), std::string::npos);
  EXPECT_NE(html.find("Phase 7: the audit"), std::string::npos);
  EXPECT_NE(html.find(">PASS<"), std::string::npos);
  // A deploy after the audit (here: phase 6 again) makes the audit on the page stale.
  const CliResult again = run_tessera(fmt::format("deploy {} --out {} --from-phase 6 --quiet --threads 2", tiny_model(kPreset),
                                                  dir.string()));
  EXPECT_EQ(again.exit_code, 0) << again.out << again.err;
  const std::string after = slurp(dir / "report.html");
  check_page(after, {"phase1-kernels"});
  EXPECT_NE(after.find("checked an earlier state of the deployment"), std::string::npos);
  EXPECT_EQ(after.find(">PASS<"), std::string::npos);
  const CliResult bad = run_tessera(fmt::format("report {}", out.str()));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("not a deployment directory"), std::string::npos) << bad.err;
}

TEST(Report, TwoDeploymentsComparedSideBySide) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "the Release run's (two whole deploys; the page code runs under sanitizers in the other Report tests)";
#endif
  const fs::path& cpu = deployed("cpu");
  const fs::path& npu = deployed("npusim");
  ScratchDir out("report_compare");
  const CliResult r = run_tessera(fmt::format("report {} {} --out {}", cpu.string(), npu.string(), out.str("compare.html")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string html = slurp(out.path() / "compare.html");
  const Doc d = check_page(html, {"compare-phase3-layers"});
  EXPECT_GT(count_class(d, "g", "dashed"), 0);  // B's series overlaid, dashed
  for (const char* said : {"(A)", "(B)", "predicted", "measured", "decode (phase 6)"})
    EXPECT_NE(html.find(said), std::string::npos) << said;
  // A failed deployment compares too: its phase 3 did not run.
  const std::string failed = report::comparison_report_html(cpu, deployed("cpu", "rope-interleaved"));
  check_page(failed, {"compare-phase3-layers"});
  EXPECT_NE(failed.find("B: phase 3 did not run"), std::string::npos);
}

TEST(ReportCampaign, ResultsPageHasTheTableAndBothCharts) {
  const nlohmann::json results = {
      {"format", "tessera-campaign/1"},
      {"reference", "Llama-3.2-1B"},
      {"rows",
       {{{"model", "Llama-3.2-1B"}, {"target", "npusim"}, {"parameters", 1235814400}, {"phases_passed", 7},
         {"phases_total", 7}, {"gates_passed", 135}, {"gates_total", 135}, {"deployed", true}, {"failure", ""},
         {"prefill_tokens_per_s", 2100.5}, {"decode_tokens_per_s", 21.3}, {"figures", "predicted"},
         {"dispatches_per_layer", "1/1"}, {"deploy_wall_s", 300.2}, {"eta_scale_prefill", 1.0}, {"eta_scale_decode", 1.0}},
        {{"model", "Qwen3-0.6B <&>"}, {"target", "cpu"}, {"parameters", 596049920}, {"phases_passed", 1},
         {"phases_total", 7}, {"gates_passed", 20}, {"gates_total", 32}, {"deployed", false},
         {"failure", "phase 1: 4 kernels failed <rope>"}, {"prefill_tokens_per_s", 0}, {"decode_tokens_per_s", 0},
         {"figures", "measured"}, {"dispatches_per_layer", "-"}, {"deploy_wall_s", 12.5}, {"eta_scale_prefill", 0},
         {"eta_scale_decode", 0}}}}};
  const std::string html = report::campaign_results_html(results);
  const Doc d = check_page(html, {"campaign-eta", "campaign-wall"});
  EXPECT_EQ(count_class(d, "rect", "fail"), 1);  // the failed row's wall-time bar (it has no eta_scale)
  EXPECT_NE(html.find("Qwen3-0.6B &lt;&amp;&gt;"), std::string::npos);
}

}  // namespace
}  // namespace tessera
