// Charts as inline SVG for the deployment report (report.h): typed descriptions in, one
// self-contained <svg> element out (no scripts, no external references, every text escaped).
// Each chart's hover text is an SVG <title> (shown by any browser without JavaScript); the
// classes (class="bar fail", "pt cliff", ...) are styled by the page's inline CSS
// (svg_css()), so a chart reads the same in a page and in a test that parses it.
//
//   BarChart  one bar per item against its own limit (a tick across the bar), linear or log axis
//   LineChart series of points (marked points, error bars) and a horizontal limit line
//   Gantt     spans on lanes along a time axis (launches, DMA, host work)
//   TileMap   a grid of cells (the array's tiles), some labelled
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::report {

// Text and attribute values for HTML and SVG: & < > " ' escaped; bytes that are not valid
// in XML 1.0 (control characters other than tab, newline, carriage return) dropped; bytes
// that are not well-formed UTF-8 (a token's partial character) replaced by U+FFFD.
std::string escape(std::string_view text);

// A number as a chart writes it: 3 significant digits, 1.2e-05 for the small and large.
std::string short_number(double v);

struct Bar {
  std::string label;
  double value = 0;
  std::optional<double> limit;  // drawn as a tick across the bar's slot
  bool fail = false;            // class "fail" (red) instead of "ok"
  std::string title;            // hover text (the label and value when empty)
};

struct BarChart {
  std::string title;
  std::string value_label;  // the axis: "NMSE", "tokens/s"
  bool log = false;         // log axis; values <= floor drawn at the floor
  double floor = 1e-12;     // log axis: smallest value drawn
  std::vector<Bar> bars;
};

struct Point {
  double x = 0, y = 0;
  std::optional<double> lo, hi;  // an error bar from lo to hi
  std::string mark;              // "" plain; otherwise a class: "cliff", "fail", "kept", "reverted"
  std::string title;             // hover text
};

struct Series {
  std::string name;
  std::vector<Point> points;
  bool line = true;  // joined by a line; false: points alone
  bool dashed = false;  // the line dashed (a second deployment overlaid)
};

struct LineChart {
  std::string title;
  std::string x_label, y_label;
  std::vector<Series> series;
  std::optional<double> limit;  // a horizontal line
  std::string limit_label;
  bool integer_x = true;                // ticks at whole numbers
  std::optional<double> y_min, y_max;   // axis range (default: the data and the limit)
  bool log_y = false;                   // log y axis; values <= floor drawn at the floor
  double floor = 1e-12;
};

struct Span {
  std::string lane;   // the row it is drawn on
  double start = 0, end = 0;
  std::string kind;   // class: "launch", "dma", "host", "overhead", "copy"
  std::string label;  // drawn inside when it fits
  std::string title;  // hover text
};

struct Gantt {
  std::string title;
  std::string unit = "us";
  std::vector<Span> spans;  // lanes in order of first appearance
};

struct Cell {
  int col = 0, row = 0;
  std::string kind;   // class: "used", "busiest", "mem", "shim"
  std::string label;  // short text in the cell
  std::string title;  // hover text
};

struct TileMap {
  std::string title;
  std::string subtitle;  // a second line (cut to fit; whole in the hover text)
  int columns = 0, rows = 0;  // row 0 drawn at the bottom (the shim row of an NPU array)
  std::vector<std::string> row_names;  // per row, bottom first (may be shorter)
  std::vector<Cell> cells;
};

std::string render(const BarChart& c);
std::string render(const LineChart& c);
std::string render(const Gantt& c);
std::string render(const TileMap& c);

// The style every chart's classes need.
std::string svg_css();

}  // namespace tessera::report
