#include "report/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace tessera::report {

namespace {

// The length of the well-formed UTF-8 sequence at text[i] (1-4), or 0 when it is not one
// (a stray continuation byte, a truncated or overlong sequence, a surrogate, past U+10FFFF).
size_t utf8_length(std::string_view text, size_t i) {
  const unsigned char c = static_cast<unsigned char>(text[i]);
  if (c < 0x80) return 1;
  size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
  if (n == 0 || c > 0xF4 || i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return 0;
  const unsigned char d = static_cast<unsigned char>(text[i + 1]);
  if ((c == 0xE0 && d < 0xA0) || (c == 0xED && d >= 0xA0) || (c == 0xF0 && d < 0x90) || (c == 0xF4 && d >= 0x90)) return 0;
  return n;
}

}  // namespace

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c >= 0x80) {  // a multi-byte character as it is, or U+FFFD for bytes that are not UTF-8
      const size_t n = utf8_length(text, i);
      if (n == 0) {
        out += "\xEF\xBF\xBD";
      } else {
        out.append(text.substr(i, n));
        i += n - 1;
      }
      continue;
    }
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') break;  // not allowed in XML 1.0
        out += ch;
    }
  }
  return out;
}

std::string short_number(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "NaN" : (v > 0 ? "inf" : "-inf");
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e5 || a < 1e-3) return fmt::format("{:.2g}", v);
  if (a >= 1000) return fmt::format("{:.0f}", v);
  return fmt::format("{:.3g}", v);
}

namespace {

// A coordinate as written in the SVG.
std::string px(double v) { return fmt::format("{:.1f}", v); }

std::string text(double x, double y, std::string_view s, std::string_view cls = "", std::string_view anchor = "start") {
  return fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"{}\"{}>{}</text>", px(x), px(y), anchor,
                     cls.empty() ? "" : fmt::format(" class=\"{}\"", cls), escape(s));
}

std::string title_of(std::string_view s) { return s.empty() ? "" : fmt::format("<title>{}</title>", escape(s)); }

std::string open_svg(std::string_view kind, double w, double h, std::string_view title) {
  return fmt::format(
      "<svg class=\"chart {}\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{}\">"
      "<title>{}</title>",
      kind, px(w), px(h), px(w), px(h), escape(title), escape(title));
}

// An axis mapping [lo, hi] onto [a, b] (pixels), linear or log10.
struct Axis {
  double lo = 0, hi = 1, a = 0, b = 1;
  bool log = false;
  double operator()(double v) const {
    double t = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
    t = std::clamp(t, -0.05, 1.05);
    return a + t * (b - a);
  }
  // Tick values: decades on a log axis, 1/2/5 steps on a linear one.
  std::vector<double> ticks(int want = 5) const {
    std::vector<double> out;
    if (log) {
      const int e0 = int(std::floor(std::log10(lo) + 1e-9)), e1 = int(std::ceil(std::log10(hi) - 1e-9));
      const int step = std::max(1, (e1 - e0 + 5) / 6);
      for (int e = e0; e <= e1; e += step) out.push_back(std::pow(10.0, e));
      return out;
    }
    const double span = hi - lo;
    if (!(span > 0)) return {lo};
    const double raw = span / want, mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (const double m : {1.0, 2.0, 5.0, 10.0})
      if (mag * m >= raw) {
        step = mag * m;
        break;
      }
    for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
      out.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
    return out;
  }
};

// [lo, hi] widened so that a flat range still has height.
void widen(double& lo, double& hi) {
  if (!(hi > lo)) {
    const double d = std::max(std::fabs(lo) * 0.01, 1e-9);
    lo -= d;
    hi += d;
  }
}

}  // namespace

std::string render(const BarChart& c) {
  const double label_w = 300, plot_w = 380, row_h = 18, top = 40, bottom = 10;
  const double w = label_w + plot_w + 80, h = top + row_h * double(std::max<size_t>(c.bars.size(), 1)) + bottom;
  Axis ax;
  ax.log = c.log;
  ax.a = label_w;
  ax.b = label_w + plot_w;
  double lo = c.log ? HUGE_VAL : 0, hi = c.log ? 0 : 0;
  const auto see = [&](double v) {
    if (!std::isfinite(v)) return;
    if (c.log) {
      v = std::max(v, c.floor);
      lo = std::min(lo, v);
    }
    hi = std::max(hi, v);
  };
  for (const Bar& b : c.bars) {
    see(b.value);
    if (b.limit) see(*b.limit);
  }
  if (c.log) {
    if (!(lo < HUGE_VAL)) lo = c.floor, hi = 1;
    lo = std::pow(10.0, std::floor(std::log10(lo)));
    hi = std::pow(10.0, std::ceil(std::log10(std::max(hi, lo * 10))));
  } else {
    hi = hi > 0 ? hi * 1.1 : 1;
  }
  ax.lo = lo;
  ax.hi = hi;
  std::string s = open_svg("bars", w, h, c.title);
  s += text(4, 14, c.title, "ctitle");
  // The value axis along the top, with grid lines.
  for (const double t : ax.ticks()) {
    const double x = ax(t);
    s += fmt::format("<line class=\"grid\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>", px(x), px(top - 4), px(x), px(h - bottom));
    s += text(x, top - 8, short_number(t), "tick", "middle");
  }
  s += text(label_w + plot_w + 4, top - 8, c.value_label + (c.log ? " (log)" : ""), "axis");
  for (size_t i = 0; i < c.bars.size(); ++i) {
    const Bar& b = c.bars[i];
    const double y = top + row_h * double(i);
    const double v = std::isfinite(b.value) ? (c.log ? std::max(b.value, c.floor) : b.value) : hi;
    const double x1 = ax(v);
    const std::string hover = b.title.empty() ? fmt::format("{}: {}", b.label, short_number(b.value)) : b.title;
    std::string lab = b.label.size() > 48 ? b.label.substr(0, 46) + ".." : b.label;
    s += fmt::format("<g class=\"row{}\">{}", b.fail ? " fail" : "", title_of(hover));
    s += text(label_w - 6, y + row_h * 0.7, lab, b.fail ? "label fail" : "label", "end");
    s += fmt::format("<rect class=\"bar {}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>", b.fail ? "fail" : "ok",
                     px(label_w), px(y + 3), px(std::max(1.0, x1 - label_w)), px(row_h - 6));
    if (b.limit && std::isfinite(*b.limit)) {
      const double xl = ax(c.log ? std::max(*b.limit, c.floor) : *b.limit);
      s += fmt::format("<line class=\"limit\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>", px(xl), px(y + 1), px(xl),
                       px(y + row_h - 1));
    }
    s += text(label_w + plot_w + 4, y + row_h * 0.7, b.fail ? "FAIL " + short_number(b.value) : short_number(b.value),
              b.fail ? "fail" : "value");
    s += "</g>";
  }
  if (c.bars.empty()) s += text(label_w, top + 12, "(no rows)", "note");
  s += "</svg>";
  return s;
}

std::string render(const LineChart& c) {
  const double left = 70, right = 170, top = 30, bottom = 40, plot_w = 480, plot_h = 220;
  const double w = left + plot_w + right, h = top + plot_h + bottom;
  double xlo = HUGE_VAL, xhi = -HUGE_VAL, ylo = HUGE_VAL, yhi = -HUGE_VAL;
  for (const Series& se : c.series)
    for (const Point& p : se.points) {
      if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
      xlo = std::min(xlo, p.x), xhi = std::max(xhi, p.x);
      ylo = std::min(ylo, p.lo.value_or(p.y)), yhi = std::max(yhi, p.hi.value_or(p.y));
      ylo = std::min(ylo, p.y), yhi = std::max(yhi, p.y);
    }
  if (!(xlo <= xhi)) xlo = 0, xhi = 1, ylo = c.log_y ? c.floor : 0, yhi = 1;
  if (c.limit) ylo = std::min(ylo, *c.limit), yhi = std::max(yhi, *c.limit);
  if (c.y_min) ylo = *c.y_min;
  if (c.y_max) yhi = *c.y_max;
  widen(xlo, xhi);
  // On a log axis a value is drawn at the floor at least, the range in whole decades.
  const auto yv = [&](double v) { return c.log_y ? std::max(v, c.floor) : v; };
  if (c.log_y) {
    ylo = std::pow(10.0, std::floor(std::log10(yv(ylo))));
    yhi = std::pow(10.0, std::ceil(std::log10(std::max(yv(yhi), ylo * 10))));
  } else {
    widen(ylo, yhi);
    const double pad = (yhi - ylo) * 0.05;
    if (!c.y_min) ylo -= pad;
    if (!c.y_max) yhi += pad;
  }
  Axis ax{xlo, xhi, left, left + plot_w};
  Axis ay{ylo, yhi, top + plot_h, top, c.log_y};
  std::string s = open_svg("lines", w, h, c.title);
  s += text(4, 16, c.title, "ctitle");
  s += fmt::format("<rect class=\"frame\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>", px(left), px(top), px(plot_w),
                   px(plot_h));
  for (const double t : ay.ticks()) {
    const double y = ay(t);
    s += fmt::format("<line class=\"grid\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>", px(left), px(y), px(left + plot_w), px(y));
    s += text(left - 4, y + 4, short_number(t), "tick", "end");
  }
  std::vector<double> xt = ax.ticks(8);
  if (c.integer_x) {
    xt.erase(std::remove_if(xt.begin(), xt.end(), [](double v) { return v != std::floor(v); }), xt.end());
    if (xt.empty()) xt.push_back(std::round(xlo));
  }
  for (const double t : xt) s += text(ax(t), top + plot_h + 14, short_number(t), "tick", "middle");
  s += text(left + plot_w / 2, h - 6, c.x_label, "axis", "middle");
  s += fmt::format("<text class=\"axis\" transform=\"translate(14,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
                   px(top + plot_h / 2), escape(c.y_label + (c.log_y ? " (log)" : "")));
  if (c.limit) {
    const double y = ay(yv(*c.limit));
    s += fmt::format("<g>{}<line class=\"limit\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/></g>",
                     title_of(fmt::format("{} {}", c.limit_label, short_number(*c.limit))), px(left), px(y),
                     px(left + plot_w), px(y));
    s += text(left + plot_w - 4, y - 4, fmt::format("{} {}", c.limit_label, short_number(*c.limit)), "limitlabel", "end");
  }
  for (size_t k = 0; k < c.series.size(); ++k) {
    const Series& se = c.series[k];
    const std::string cls = fmt::format("s{}{}", k % 8, se.dashed ? " dashed" : "");
    s += fmt::format("<g class=\"series {}\">{}", cls, title_of(se.name));
    std::string pts;
    for (const Point& p : se.points)
      if (std::isfinite(p.x) && std::isfinite(p.y)) pts += fmt::format("{},{} ", px(ax(p.x)), px(ay(yv(p.y))));
    if (!pts.empty()) pts.pop_back();
    if (se.line && !pts.empty()) s += fmt::format("<polyline class=\"line\" points=\"{}\"/>", pts);
    for (const Point& p : se.points) {
      if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
      const double x = ax(p.x), y = ay(yv(p.y));
      s += "<g>";
      s += title_of(p.title.empty() ? fmt::format("{}: {} = {}", se.name, short_number(p.x), short_number(p.y)) : p.title);
      if (p.lo && p.hi)
        s += fmt::format("<line class=\"err\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>", px(x), px(ay(yv(*p.lo))), px(x),
                         px(ay(yv(*p.hi))));
      s += fmt::format("<circle class=\"pt{}\" cx=\"{}\" cy=\"{}\" r=\"{}\"/>", p.mark.empty() ? "" : " " + p.mark, px(x),
                       px(y), p.mark.empty() ? "2.5" : "4.5");
      s += "</g>";
    }
    s += "</g>";
    // The legend, right of the plot.
    const double ly = top + 14 * double(k);
    if (ly < top + plot_h) {
      s += fmt::format("<line class=\"line {}\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>", cls, px(left + plot_w + 8),
                       px(ly + 18), px(left + plot_w + 22), px(ly + 18));
      const std::string name = se.name.size() > 22 ? se.name.substr(0, 20) + ".." : se.name;
      s += text(left + plot_w + 26, ly + 22, name, "legend");
    }
  }
  s += "</svg>";
  return s;
}

std::string render(const Gantt& c) {
  std::vector<std::string> lanes;
  double t1 = 0;
  for (const Span& sp : c.spans) {
    if (std::find(lanes.begin(), lanes.end(), sp.lane) == lanes.end()) lanes.push_back(sp.lane);
    if (std::isfinite(sp.end)) t1 = std::max(t1, sp.end);
  }
  const double label_w = 190, plot_w = 560, lane_h = 20, top = 30, bottom = 30;
  const double w = label_w + plot_w + 20, h = top + lane_h * double(std::max<size_t>(lanes.size(), 1)) + bottom;
  Axis ax{0, t1 > 0 ? t1 : 1, label_w, label_w + plot_w};
  std::string s = open_svg("gantt", w, h, c.title);
  s += text(4, 16, c.title, "ctitle");
  for (const double t : ax.ticks(8)) {
    const double x = ax(t);
    s += fmt::format("<line class=\"grid\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>", px(x), px(top), px(x), px(h - bottom));
    s += text(x, h - bottom + 14, short_number(t), "tick", "middle");
  }
  s += text(label_w + plot_w, h - 4, c.unit, "axis", "end");
  for (size_t i = 0; i < lanes.size(); ++i) {
    const std::string lab = lanes[i].size() > 30 ? lanes[i].substr(0, 28) + ".." : lanes[i];
    s += text(label_w - 6, top + lane_h * double(i) + lane_h * 0.7, lab, "label", "end");
  }
  for (const Span& sp : c.spans) {
    const size_t lane = size_t(std::find(lanes.begin(), lanes.end(), sp.lane) - lanes.begin());
    const double x0 = ax(sp.start), x1 = ax(std::max(sp.end, sp.start));
    const double y = top + lane_h * double(lane);
    s += fmt::format("<g>{}<rect class=\"span {}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>",
                     title_of(sp.title.empty() ? fmt::format("{}: {}-{} {}", sp.label, short_number(sp.start),
                                                             short_number(sp.end), c.unit)
                                               : sp.title),
                     escape(sp.kind), px(x0), px(y + 3), px(std::max(1.0, x1 - x0)), px(lane_h - 6));
    if (x1 - x0 > 7.0 * double(sp.label.size()) && !sp.label.empty())
      s += text(x0 + 3, y + lane_h * 0.68, sp.label, "inside");
    s += "</g>";
  }
  if (c.spans.empty()) s += text(label_w, top + 12, "(nothing to draw)", "note");
  s += "</svg>";
  return s;
}

std::string render(const TileMap& c) {
  const double cell = 26, left = 70, top = c.subtitle.empty() ? 26 : 40, bottom = 20;
  const int cols = std::max(c.columns, 1), rows = std::max(c.rows, 1);
  const double w = left + cell * cols + 10, h = top + cell * rows + bottom;
  std::string s = open_svg("tiles", w, h, c.title + (c.subtitle.empty() ? "" : ": " + c.subtitle));
  s += text(4, 16, c.title, "ctitle");
  if (!c.subtitle.empty()) s += text(4, 30, c.subtitle.size() > 44 ? c.subtitle.substr(0, 42) + ".." : c.subtitle, "note");
  std::map<std::pair<int, int>, const Cell*> at;
  for (const Cell& ce : c.cells) at[{ce.col, ce.row}] = &ce;
  for (int r = 0; r < rows; ++r) {
    const double y = top + cell * double(rows - 1 - r);
    if (size_t(r) < c.row_names.size()) s += text(left - 4, y + cell * 0.65, c.row_names[size_t(r)], "label", "end");
    for (int col = 0; col < cols; ++col) {
      const double x = left + cell * col;
      const auto it = at.find({col, r});
      const Cell* ce = it == at.end() ? nullptr : it->second;
      s += fmt::format("<g>{}<rect class=\"tile{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>",
                       title_of(ce ? (ce->title.empty() ? fmt::format("({},{})", col, r) : ce->title)
                                   : fmt::format("({},{}) idle", col, r)),
                       ce && !ce->kind.empty() ? " " + ce->kind : "", px(x + 1), px(y + 1), px(cell - 2), px(cell - 2));
      if (ce && !ce->label.empty()) s += text(x + cell / 2, y + cell * 0.65, ce->label.substr(0, 3), "cell", "middle");
      s += "</g>";
    }
  }
  for (int col = 0; col < cols; ++col) s += text(left + cell * (col + 0.5), h - 6, std::to_string(col), "tick", "middle");
  s += "</svg>";
  return s;
}

std::string svg_css() {
  return R"(svg.chart{font:11px sans-serif;background:#fff;border:1px solid #ddd;margin:4px 0;display:block}
svg.chart .ctitle{font-weight:bold;font-size:12px}
svg.chart .tick,svg.chart .axis,svg.chart .legend,svg.chart .note,svg.chart .value{fill:#444}
svg.chart .grid{stroke:#eee}
svg.chart .frame{fill:none;stroke:#bbb}
svg.chart .bar.ok{fill:#4a7fc1}
svg.chart .bar.fail,svg.chart .span.fail{fill:#d03a2f}
svg.chart text.fail,svg.chart .label.fail{fill:#d03a2f;font-weight:bold}
svg.chart .limit{stroke:#222;stroke-width:2;stroke-dasharray:4 2}
svg.chart .limitlabel{fill:#222}
svg.chart .line{fill:none;stroke-width:1.5}svg.chart .dashed .line,svg.chart .line.dashed{stroke-dasharray:5 3}
svg.chart .err{stroke:#555;stroke-width:1.5}
svg.chart .pt{fill:#fff;stroke:#333}
svg.chart .pt.cliff,svg.chart .pt.fail,svg.chart .pt.reverted{fill:#d03a2f;stroke:#d03a2f}
svg.chart .pt.kept{fill:#2e8b57;stroke:#2e8b57}svg.chart .pt.cliff{stroke:#000;stroke-width:2}
svg.chart .s0{stroke:#1f77b4}svg.chart .s1{stroke:#ff7f0e}svg.chart .s2{stroke:#2ca02c}svg.chart .s3{stroke:#9467bd}
svg.chart .s4{stroke:#8c564b}svg.chart .s5{stroke:#e377c2}svg.chart .s6{stroke:#7f7f7f}svg.chart .s7{stroke:#17becf}
svg.chart .span.launch{fill:#4a7fc1}svg.chart .span.dma{fill:#f0a030}svg.chart .span.host{fill:#8c564b}
svg.chart .span.overhead{fill:#999}svg.chart .span.copy{fill:#e377c2}
svg.chart .inside{fill:#fff;font-size:10px}
svg.chart .tile{fill:#f4f4f4;stroke:#ccc}svg.chart .tile.used{fill:#7fa7d9}svg.chart .tile.busiest{fill:#1f4e8c}
svg.chart .tile.mem{fill:#e8dcc0}svg.chart .tile.shim{fill:#d8d8d8}
svg.chart .cell{font-size:9px;fill:#111}
svg.chart g:hover>rect,svg.chart g:hover>circle{opacity:.75}
)";
}

}  // namespace tessera::report
