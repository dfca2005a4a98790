// Debug skill error-shape: what the error of a failing kernel looks like, found by
// experiments on the kernel's own output rather than by matching a known fault. It re-runs
// the op table on a fresh target, and for every output that fails its row it asks, one
// hypothesis at a time, "if the error were only this, would the row pass?": it corrects the
// output by the hypothesis (divides out a fitted gain, undoes a permutation, puts the
// oracle's values back where the error is said to be confined) and re-judges it against the
// row's own limits. "confirmed" means the corrected output passes; so the cause it names
// explains the whole error, whatever bug produced it.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "gates/gates.h"
#include "pipeline/diagnose.h"
#include "pipeline/op_table.h"

namespace tessera {

namespace {

using gates::TensorMetrics;

struct Output {
  const OpResult& r;
  int64_t rows, cols;
  const std::vector<float>& ref;
  const std::vector<float>& got;
  std::string subject() const { return r.gate.subject; }
};

// Whether `candidate` (the output corrected by a hypothesis) passes the row's own gate.
bool passes(const Output& o, const std::vector<float>& candidate, TensorMetrics* m_out = nullptr) {
  const TensorMetrics m = gates::compare(o.ref.data(), candidate.data(), o.rows, o.cols);
  if (m_out) *m_out = m;
  return op_gate(o.r.gate.gate, o.r.gate.subject, o.r.kernel, o.r.expected, m, 0).pass();
}

double nmse_of(const Output& o, const std::vector<float>& v) {
  return gates::compare(o.ref.data(), v.data(), o.rows, o.cols).nmse;
}

// A hypothesis judged by its correction: confirmed when the corrected output passes.
Hypothesis judged(const Output& o, std::string name, std::string cause, const std::vector<float>& corrected,
                  const std::string& detail) {
  TensorMetrics m;
  const bool ok = passes(o, corrected, &m);
  Hypothesis h{std::move(name), std::move(cause), ok ? "confirmed" : "ruled out", ""};
  const gates::Check* limit = o.r.gate.check("nmse");
  h.evidence = fmt::format("{}; corrected this way, NMSE {:.3g} -> {:.3g} (row limit {:.3g}), {}", detail,
                           o.r.measured.nmse, m.nmse, limit ? limit->limit : 0.0,
                           ok ? "the row passes" : "the row still fails");
  return h;
}

// Least-squares a, b of got = a * ref + b over the values in [begin, end) with stride.
std::pair<double, double> fit(const std::vector<float>& ref, const std::vector<float>& got, int64_t begin, int64_t n,
                              int64_t stride) {
  double sr = 0, sg = 0, srr = 0, srg = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double r = ref[size_t(begin + i * stride)], g = got[size_t(begin + i * stride)];
    sr += r, sg += g, srr += r * r, srg += r * g;
  }
  const double mr = sr / double(n), mg = sg / double(n), var = srr / double(n) - mr * mr;
  if (!(var > 0)) return {1, mg - mr};
  const double a = (srg / double(n) - mr * mg) / var;
  return {a, mg - a * mr};
}

// The one-line fit's hypothesis: named a gain or an offset, whichever moves the output more.
Hypothesis judge_with_cause(const Output& o, double a, double b, const std::vector<float>& corrected) {
  const double rms = [&] {
    double ss = 0;
    for (float r : o.ref) ss += double(r) * r;
    return std::sqrt(ss / double(std::max<size_t>(o.ref.size(), 1)));
  }();
  const std::string what = std::fabs(a - 1) * rms >= std::fabs(b)
                               ? fmt::format("gain {:+.3f}%", 100 * (a - 1))
                               : fmt::format("offset {:+.3g} x the output's RMS", rms > 0 ? b / rms : b);
  return judged(o, "one systematic gain or offset over the whole output",
                fmt::format("systematic {} in {}", what, o.subject()), corrected,
                fmt::format("least-squares line got = {:.6f} x ref {:+.3g} (the declared numerics give gain {:.6f}): "
                            "look at constants and scales (a factor, an epsilon, a rounding of a scale, a dequant "
                            "multiplier)",
                            a, b, o.r.expected.gain));
}

void nonfinite(const Output& o, std::vector<Hypothesis>& out) {
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < o.got.size(); ++i)
    if (std::isfinite(o.ref[i]) && !std::isfinite(o.got[i])) {
      if (first < 0) first = int64_t(i);
      ++bad;
    }
  if (bad == 0) return;
  out.push_back({"the kernel writes NaN or Inf where the reference is finite",
                 fmt::format("non-finite output in {}", o.subject()), "confirmed",
                 fmt::format("{} of {} values (first at row {}, column {}); look for an overflow (exp without the max "
                             "subtracted, a division by a zero sum) or an uninitialized buffer",
                             bad, o.got.size(), first / o.cols, first % o.cols)});
}

// One line over the whole output.
void systematic(const Output& o, std::vector<Hypothesis>& out) {
  const int64_t n = o.rows * o.cols;
  const auto [a, b] = fit(o.ref, o.got, 0, n, 1);
  std::vector<float> c(o.got.size());
  for (int64_t i = 0; i < n; ++i) c[size_t(i)] = float((o.got[size_t(i)] - b) / a);
  out.push_back(judge_with_cause(o, a, b, c));
}

// Each row (or each column) corrected by its own fitted line; the fitted gains' range.
std::vector<float> corrected_per_group(const Output& o, bool by_row, double& lo, double& hi) {
  const int64_t groups = by_row ? o.rows : o.cols, n = by_row ? o.cols : o.rows, stride = by_row ? 1 : o.cols;
  std::vector<float> v(o.got.size());
  lo = 1e300, hi = -1e300;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = by_row ? g * o.cols : g;
    const auto [a, b] = fit(o.ref, o.got, begin, n, stride);
    lo = std::min(lo, a), hi = std::max(hi, a);
    for (int64_t i = 0; i < n; ++i) {
      const size_t at = size_t(begin + i * stride);
      v[at] = float((o.got[at] - b) / a);
    }
  }
  return v;
}

// A scale per row (position) or per column (channel): an error that one number cannot fit.
void per_row_or_column_scale(const Output& o, std::vector<Hypothesis>& out) {
  struct Grouping {
    bool by_row;
    bool enough;  // at least 8 values per group, so a line fit means something
    const char* name;
    const char* cause;
    const char* look;
  };
  const Grouping groupings[] = {
      {true, o.cols >= 8, "a scale that differs per position (row)", "per-position scale error",
       "look at what the kernel computes once per row (a norm's mean or epsilon, a softmax sum, a position-dependent "
       "factor)"},
      {false, o.rows >= 8, "a scale that differs per channel (column)", "per-channel scale error",
       "look at per-channel factors (a gain or bias vector read at the wrong offset, a dequantization scale per block)"},
  };
  for (const Grouping& g : groupings) {
    if (!g.enough) continue;
    double lo = 0, hi = 0;
    const std::vector<float> v = corrected_per_group(o, g.by_row, lo, hi);
    out.push_back(judged(o, g.name, fmt::format("{} in {}", g.cause, o.subject()), v,
                         fmt::format("per-{} gains {:.4f} to {:.4f}: {}", g.by_row ? "row" : "column", lo, hi, g.look)));
    if (out.back().verdict == "confirmed") return;
  }
}

// A few elements far off and the rest right: a race, a stray write, an index that hits the
// wrong element once per row.
void isolated(const Output& o, std::vector<Hypothesis>& out) {
  const double big = std::max(8 * o.r.expected.max_abs, gates::threshold("phase1.max_err_floor") * o.r.measured.ref_max);
  std::vector<float> v = o.got;
  int64_t k = 0, worst_row = 0;
  std::vector<int64_t> per_row(size_t(o.rows), 0);
  for (int64_t i = 0; i < o.rows * o.cols; ++i)
    if (std::fabs(double(o.got[size_t(i)]) - o.ref[size_t(i)]) > big) {
      v[size_t(i)] = o.ref[size_t(i)];
      ++k;
      worst_row = std::max(worst_row, ++per_row[size_t(i / o.cols)]);
    }
  if (k == 0 || k > std::max<int64_t>(2 * o.rows, 1) || k * 100 > o.rows * o.cols) return;
  out.push_back(judged(o, "a few isolated elements far off, the rest right",
                       fmt::format("{} isolated wrong elements in {} (at most {} per row)", k, o.subject(), worst_row), v,
                       fmt::format("{} of {} elements are off by more than 8x the expected largest error: look at a "
                                   "stray write or an index that lands on the wrong element",
                                   k, o.rows * o.cols)));
}

// The fewest groups (heads, rows) whose error energies add up to `share` of `total`, in
// index order, and a mask of them; `held` is what they hold.
struct Picked {
  std::vector<int64_t> groups;
  std::vector<bool> is;
  double held = 0;
};
Picked largest_groups(const std::vector<double>& energy, double share, double total) {
  std::vector<std::pair<double, int64_t>> order;
  for (size_t g = 0; g < energy.size(); ++g) order.push_back({energy[g], int64_t(g)});
  std::sort(order.rbegin(), order.rend());
  Picked p;
  p.is.assign(energy.size(), false);
  for (const auto& [e, g] : order) {
    if (p.held >= share * total) break;
    p.held += e;
    p.groups.push_back(g);
    p.is[size_t(g)] = true;
  }
  std::sort(p.groups.begin(), p.groups.end());
  return p;
}

// Where the error is: the smallest set of heads, trailing columns or rows that holds most
// of its energy, then the oracle's values put back there and the row re-judged.
void confined(const Output& o, int64_t head_dim, std::vector<Hypothesis>& out) {
  const double frac_min = gates::threshold("diagnose.confined_fraction_min");
  std::vector<double> col_e(size_t(o.cols), 0), row_e(size_t(o.rows), 0);
  double total = 0;
  for (int64_t r = 0; r < o.rows; ++r)
    for (int64_t j = 0; j < o.cols; ++j) {
      const double d = double(o.got[size_t(r * o.cols + j)]) - o.ref[size_t(r * o.cols + j)];
      col_e[size_t(j)] += d * d, row_e[size_t(r)] += d * d, total += d * d;
    }
  if (!(total > 0)) return;
  // Put the oracle's values back where `in(r, j)` holds, and judge.
  auto repaired = [&](auto in) {
    std::vector<float> v = o.got;
    for (int64_t r = 0; r < o.rows; ++r)
      for (int64_t j = 0; j < o.cols; ++j)
        if (in(r, j)) v[size_t(r * o.cols + j)] = o.ref[size_t(r * o.cols + j)];
    return v;
  };
  // Heads (outputs made of head_dim-wide blocks: q, k, v, attention).
  if (head_dim > 0 && o.cols % head_dim == 0 && o.cols / head_dim > 1) {
    const int64_t heads = o.cols / head_dim;
    std::vector<double> head_e(static_cast<size_t>(heads));
    for (int64_t h = 0; h < heads; ++h)
      head_e[size_t(h)] = std::accumulate(col_e.begin() + h * head_dim, col_e.begin() + (h + 1) * head_dim, 0.0);
    const Picked p = largest_groups(head_e, frac_min, total);
    if (int64_t(p.groups.size()) < heads)
      out.push_back(judged(o, fmt::format("the error is confined to {} of {} heads", p.groups.size(), heads),
                           fmt::format("error confined to heads {} of {}", fmt::join(p.groups, " "), o.subject()),
                           repaired([&](int64_t, int64_t j) { return p.is[size_t(j / head_dim)]; }),
                           fmt::format("heads {} hold {:.0f}% of the error: look at per-head indexing (kv-head "
                                       "mapping, head offsets, a loop over fewer heads)",
                                       fmt::join(p.groups, " "), 100 * p.held / total)));
  }
  // A tail of columns: the first column from which on the rest holds most of the error.
  {
    double acc = 0;
    int64_t from = o.cols;
    while (from > 0 && acc < frac_min * total) acc += col_e[size_t(--from)];
    if (from > 0)
      out.push_back(judged(o, fmt::format("the error is confined to columns {}..{} (the tail)", from, o.cols - 1),
                           fmt::format("error confined to the last {} columns of {}", o.cols - from, o.subject()),
                           repaired([&](int64_t, int64_t j) { return j >= from; }),
                           fmt::format("columns from {} on hold {:.0f}% of the error: look at a loop bound, a "
                                       "remainder not handled, a tile size that does not divide {}",
                                       from, 100 * acc / total, o.cols)));
  }
  // Rows (positions).
  if (o.rows > 1) {
    const Picked p = largest_groups(row_e, frac_min, total);
    if (int64_t(p.groups.size()) * 2 <= o.rows) {
      const std::string list = p.groups.size() > 8
                                   ? fmt::format("{} rows from {} to {}", p.groups.size(), p.groups.front(), p.groups.back())
                                   : fmt::format("rows {}", fmt::join(p.groups, " "));
      out.push_back(judged(o, fmt::format("the error is confined to {} of {} positions (rows)", p.groups.size(), o.rows),
                           fmt::format("error confined to {} of {}", list, o.subject()),
                           repaired([&](int64_t r, int64_t) { return p.is[size_t(r)]; }),
                           fmt::format("{} hold {:.0f}% of the error: look at position-dependent code (masks, "
                                       "cache rows, the first or last tile of a sequence)",
                                       list, 100 * p.held / total)));
    }
  }
}

// Values in the wrong place: columns permuted within the row, rows shifted by one position.
void misplaced(const Output& o, std::vector<Hypothesis>& out) {
  // Each target column's best-correlated reference column (rows >= 4, so correlation means something).
  if (o.rows >= 4 && o.cols <= 4096) {
    std::vector<double> rn(size_t(o.cols), 0), gn(size_t(o.cols), 0);
    for (int64_t r = 0; r < o.rows; ++r)
      for (int64_t j = 0; j < o.cols; ++j) {
        rn[size_t(j)] += double(o.ref[size_t(r * o.cols + j)]) * o.ref[size_t(r * o.cols + j)];
        gn[size_t(j)] += double(o.got[size_t(r * o.cols + j)]) * o.got[size_t(r * o.cols + j)];
      }
    std::vector<int64_t> from(size_t(o.cols));
    int64_t moved = 0;
    for (int64_t j = 0; j < o.cols; ++j) {
      double best = -1;
      for (int64_t k = 0; k < o.cols; ++k) {
        double d = 0;
        for (int64_t r = 0; r < o.rows; ++r) d += double(o.got[size_t(r * o.cols + j)]) * o.ref[size_t(r * o.cols + k)];
        const double c = d / std::sqrt(std::max(gn[size_t(j)] * rn[size_t(k)], 1e-300));
        if (c > best) best = c, from[size_t(j)] = k;
      }
      moved += from[size_t(j)] != j;
    }
    if (moved > 0) {
      std::vector<float> v(o.got.size());  // got with its columns put back where they came from
      for (int64_t r = 0; r < o.rows; ++r)
        for (int64_t j = 0; j < o.cols; ++j) v[size_t(r * o.cols + from[size_t(j)])] = o.got[size_t(r * o.cols + j)];
      int64_t pairs = 0;
      for (int64_t j = 0; j + 1 < o.cols; j += 2) pairs += from[size_t(j)] == j + 1 && from[size_t(j + 1)] == j;
      std::string shape = pairs * 2 == moved ? fmt::format("{} adjacent column pairs swapped", pairs)
                                             : fmt::format("{} of {} columns hold another column's values", moved, o.cols);
      out.push_back(judged(o, "the values are right but in the wrong columns (a layout or index permutation)",
                           fmt::format("columns permuted in {} ({})", o.subject(), shape), v,
                           fmt::format("{}: look at the layout the kernel assumes (interleaved vs half-split pairs, "
                                       "head-major vs position-major, a transposed access)",
                                       shape)));
    }
  }
  if (o.rows >= 2) {
    std::vector<float> v = o.got;  // row t of got taken as the reference's row t - 1
    for (int64_t r = 0; r + 1 < o.rows; ++r)
      std::copy_n(o.got.begin() + (r + 1) * o.cols, o.cols, v.begin() + r * o.cols);
    std::copy_n(o.ref.begin() + (o.rows - 1) * o.cols, o.cols, v.begin() + (o.rows - 1) * o.cols);
    if (nmse_of(o, v) < 0.5 * o.r.measured.nmse)
      out.push_back(judged(o, "every position holds the previous position's values", fmt::format("positions shifted by one in {}", o.subject()), v,
                           "row t matches the reference's row t-1: look at the position passed to the kernel "
                           "(an off-by-one start, a cache row written one late)"));
  }
}

}  // namespace


// The kernel's numbers under numerics other than the declared ones: one rounding point
// moved to another precision at a time. A variant whose emulation the output matches far
// more closely than the exact reference (diagnose.separation_min) names where the kernel
// rounds differently from what the target declares.
void precision_variants(PhaseContext& ctx, StagedRunner& target, const Output& o, std::vector<Hypothesis>& out) {
  using oracle::Numerics;
  using oracle::Precision;
  struct Field {
    const char* name;
    Precision Numerics::*field;
  };
  static const Field fields[] = {{"weights", &Numerics::weights},          {"GEMM inputs", &Numerics::matmul_inputs},
                                 {"GEMM outputs", &Numerics::matmul_outputs}, {"activations", &Numerics::activations},
                                 {"KV cache", &Numerics::kv_cache},        {"norm gains", &Numerics::norm_weights},
                                 {"attention queries", &Numerics::attention_q},
                                 {"softmax probabilities", &Numerics::softmax_probs},
                                 {"RoPE table", &Numerics::rope_table},    {"1/rms", &Numerics::norm_scale}};
  const double sep = gates::threshold("diagnose.separation_min");
  const oracle::Numerics declared = target.numerics(o.r.stage, o.r.tokens, o.r.layer);
  for (const Field& f : fields)
    for (Precision p : {Precision::F32, Precision::BF16, Precision::F16}) {
      if (declared.*(f.field) == p) continue;
      OpHarnessOptions opt;
      opt.gate = "diagnose.kernel";
      opt.keep_outputs = true;
      opt.only_stages = {o.r.stage};
      opt.numerics_variant = [&](const Numerics& n) {
        Numerics v = n;
        v.*(f.field) = p;
        return v;
      };
      for (const OpResult& v : run_op_table(target, ctx.op_inputs(), opt)) {
        if (v.gate.subject != o.subject()) continue;
        // The target's output and the reference at the columns the variant covers.
        std::vector<float> got, ref;
        for (int64_t r = 0; r < o.rows; ++r)
          for (int64_t c : v.emulated_cols) {
            got.push_back(o.got[size_t(r * o.cols + c)]);
            ref.push_back(o.ref[size_t(r * o.cols + c)]);
          }
        const int64_t C = int64_t(v.emulated_cols.size());
        const double to_variant = gates::compare(v.emulated.data(), got.data(), o.rows, C).nmse;
        const double to_ref = gates::compare(ref.data(), got.data(), o.rows, C).nmse;
        if (!(to_variant * sep <= to_ref)) continue;
        out.push_back({fmt::format("the kernel rounds its {} to {} (declared {})", f.name, oracle::precision_name(p),
                                   oracle::precision_name(declared.*(f.field))),
                       fmt::format("{} in {} instead of the declared {} in {}", f.name, oracle::precision_name(p),
                                   oracle::precision_name(declared.*(f.field)), o.subject()),
                       "confirmed",
                       fmt::format("NMSE of the output against that variant's emulation {:.3g}, against the exact "
                                   "reference {:.3g} (at least {}x closer to the variant)",
                                   to_variant, to_ref, sep)});
        return;
      }
    }
}

std::vector<Hypothesis> error_shape(PhaseContext& ctx, const Failure&) {
  std::unique_ptr<StagedRunner> target = ctx.fresh_target();
  OpHarnessOptions opt;
  opt.gate = "diagnose.kernel";
  opt.keep_outputs = true;
  const std::vector<OpResult> results = run_op_table(*target, ctx.op_inputs(), opt);
  std::vector<Hypothesis> out;
  int failing = 0;
  for (const OpResult& r : results) {
    if (r.gate.pass()) continue;
    if (++failing > 3) break;  // the first few failing outputs say enough
    const Output o{r, r.rows, r.cols, r.ref, r.got};
    // Experiments from the most specific explanation to the least; the first that explains
    // the whole error names the cause, and the ones before it stay as evidence.
    const bool has_heads = r.kernel == "attention" || r.kernel == "rope" || r.role.starts_with("q_proj") ||
                           r.role.starts_with("k_proj") || r.role.starts_with("v_proj");
    const std::vector<std::function<void()>> experiments = {
        [&] { nonfinite(o, out); },
        [&] { isolated(o, out); },
        [&] { systematic(o, out); },
        [&] { misplaced(o, out); },
        [&] { per_row_or_column_scale(o, out); },
        [&] { precision_variants(ctx, *target, o, out); },
        [&] { confined(o, has_heads ? ctx.model.spec().head_dim : 0, out); },
    };
    for (const auto& run : experiments) {
      const size_t before = out.size();
      run();
      if (std::any_of(out.begin() + long(before), out.end(), [](const Hypothesis& h) { return h.verdict == "confirmed"; }))
        break;
    }
  }
  if (failing == 0)
    out.push_back({"a kernel row fails on a fresh target", "no failing kernel row", "not applicable",
                   "every op-table row passes on a fresh target: the failure is in how the kernels are wired or in "
                   "state across calls (see the other skills)"});
  return out;
}

}  // namespace tessera
