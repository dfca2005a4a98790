// Row operations (RMSNorm, per-head RMSNorm, softmax, bias add) and element-wise operations
// (SiLU x mul, residual add): the block layout of mappings.h.
#include <fmt/format.h>

#include "targets/npusim/mappings.h"
#include "util/error.h"

namespace tessera::npusim {

const char* row_op_name(RowOp op) {
  switch (op) {
    case RowOp::RmsNorm: return "rmsnorm";
    case RowOp::Softmax: return "softmax";
    case RowOp::BiasAdd: return "bias_add";
  }
  return "?";
}

const char* elt_op_name(EltOp op) { return op == EltOp::SiluMul ? "silu_mul" : "add"; }

namespace {

ElemType row_in_type(RowOp op) { return op == RowOp::BiasAdd ? ElemType::F32 : ElemType::BF16; }
bool row_has_g(RowOp op) { return op != RowOp::Softmax; }

int64_t row_l1(RowOp op, int64_t rt, int64_t n) {
  const int64_t eb = elem_bytes(row_in_type(op));
  return 2 * rt * n * eb * 2 + (row_has_g(op) ? 2 * n * 2 : 0) + 1024;
}

ElemType elt_type(EltOp op) { return op == EltOp::Add ? ElemType::F32 : ElemType::BF16; }
int64_t elt_l1(EltOp op, int64_t tile) { return 2 * tile * elem_bytes(elt_type(op)) * 3 + 1024; }

}  // namespace

RowTiles default_row_tiles(RowOp op, const RowShape& s, const Device& d) {
  RowTiles t;
  t.herd = herd_for(s.rows, d);
  const int64_t rw = s.rows / t.herd.size();
  t.rt = 1;
  for (int64_t rt = rw; rt >= 1; --rt)
    if (rw % rt == 0 && rt * s.n <= 4096 && row_l1(op, rt, s.n) <= d.l1_bytes) {
      t.rt = rt;
      break;
    }
  return t;
}

Launch row_launch(RowOp op, const RowShape& s, const RowTiles& tin, const Device& d, const RowOptions& o) {
  RowTiles t = tin;
  if (t.herd.cols <= 0 || t.herd.rows <= 0) t.herd = herd_for(s.rows, d);
  const Herd h = t.herd;
  const int64_t nw = h.size();
  if (s.rows <= 0 || s.n <= 0 || s.rows % nw) fail("{} mapping: {} rows do not split over {} workers", row_op_name(op), s.rows, nw);
  const int64_t rw = s.rows / nw;
  if (t.rt <= 0) t.rt = default_row_tiles(op, s, d).rt;
  if (o.faults.l1_overflow) t.rt = rw;
  if (rw % t.rt) fail("{} mapping: rt {} does not divide the {} rows per worker", row_op_name(op), t.rt, rw);
  const int64_t rt = t.rt, n = s.n, NB = rw / rt, R = h.rows;
  const ElemType in = row_in_type(op), out = op == RowOp::BiasAdd ? ElemType::F32 : ElemType::BF16;

  Launch l;
  l.name = o.name.empty() ? row_op_name(op) : o.name;
  l.kernel = fmt::format("{} {} rows x {}, tile rt={}", row_op_name(op), s.rows, n, rt);
  l.herd_cols = h.cols;
  l.herd_rows = h.rows;
  l.loop_order = fmt::format("for {} row blocks: y[rt, n] = {}(x[rt, n])", NB, row_op_name(op));
  const std::string kernel = op == RowOp::RmsNorm ? "rmsnorm_bf16" : op == RowOp::Softmax ? "softmax_bf16" : "bias_add_f32";
  for (int c = 0; c < h.cols; ++c)
    for (int r = 0; r < h.rows; ++r) {
      Worker w = detail::make_worker(fmt::format("{}_{}_{}", row_op_name(op), c, r), {c, d.first_compute_row + r}, kernel);
      w.cost = {op == RowOp::Softmax ? "default" : "eltwise", "bf16", 0, rw * n * (op == RowOp::Softmax ? 4 : 3), NB};
      w.params = {{"rt", rt},
                  {"n", n},
                  {"blocks", NB},
                  {"eps", o.eps},
                  {"x_fifo", fmt::format("{}{}", o.x, c)},
                  {"y_fifo", fmt::format("{}{}", o.y, c)},
                  {"g_fifo", row_has_g(op) ? o.g : ""}};
      l.workers.push_back(std::move(w));
    }
  for (int c = 0; c < h.cols; ++c) {
    auto ddr = o.faults.transposed_pattern  // element (row, i) read at i*rows + row
                   ? bd_chain(c * R * rt, {NB, R * rt, n}, {nw * rt, 1, s.rows}, d.max_dims)
                   : bd_chain(c * R * rt * n, {NB, R * rt * n}, {nw * rt * n, 1}, d.max_dims);
    ObjectFifo f = detail::column_fifo(fmt::format("{}{}", o.x, c), o.x, FifoDir::Fill, in, c, h, d, rt * n, std::move(ddr));
    detail::apply_fifo_faults(f, o.faults, d);
    l.fifos.push_back(std::move(f));
  }
  if (row_has_g(op))
    l.fifos.push_back(detail::broadcast_fifo(o.g, o.g, ElemType::BF16, h, d, n, {AccessPattern::contiguous(0, n)}));
  for (int c = 0; c < h.cols; ++c)
    l.fifos.push_back(detail::column_fifo(fmt::format("{}{}", o.y, c), o.y, FifoDir::Drain, out, c, h, d, rt * n,
                                          bd_chain(c * R * rt * n, {NB, R * rt * n}, {nw * rt * n, 1}, d.max_dims)));
  return l;
}

EltTiles default_elt_tiles(EltOp op, int64_t n, const Device& d) {
  EltTiles t;
  // Two split inputs and a join per memtile: 2 x rows + 1 outgoing channels, so at most 2 rows.
  t.herd = herd_for(n, d, 0, 2);
  const int64_t per = n / t.herd.size();
  t.tile = 1;
  for (int64_t v = std::min<int64_t>(per, 4096); v >= 1; --v)
    if (per % v == 0 && elt_l1(op, v) <= d.l1_bytes) {
      t.tile = v;
      break;
    }
  return t;
}

Launch elt_launch(EltOp op, int64_t n, const EltTiles& tin, const Device& d, const EltOptions& o) {
  EltTiles t = tin;
  const EltTiles def = default_elt_tiles(op, n, d);
  if (t.herd.cols <= 0 || t.herd.rows <= 0) t.herd = def.herd;
  const Herd h = t.herd;
  const int64_t nw = h.size();
  if (n <= 0 || n % nw) fail("{} mapping: {} elements do not split over {} workers", elt_op_name(op), n, nw);
  if (t.tile <= 0) t.tile = def.tile;
  if (o.faults.l1_overflow) t.tile = n / nw;
  if ((n / nw) % t.tile) fail("{} mapping: tile {} does not divide the {} elements per worker", elt_op_name(op), t.tile, n / nw);
  const int64_t tile = t.tile, NB = n / nw / tile, R = h.rows;
  const ElemType ty = elt_type(op);

  Launch l;
  l.name = o.name.empty() ? elt_op_name(op) : o.name;
  l.kernel = fmt::format("{} {} elements, tile {}", elt_op_name(op), n, tile);
  l.herd_cols = h.cols;
  l.herd_rows = h.rows;
  l.loop_order = fmt::format("for {} blocks: y[tile] = {}(a[tile], b[tile])", NB, elt_op_name(op));
  for (int c = 0; c < h.cols; ++c)
    for (int r = 0; r < h.rows; ++r) {
      Worker w = detail::make_worker(fmt::format("{}_{}_{}", elt_op_name(op), c, r), {c, d.first_compute_row + r},
                                     op == EltOp::SiluMul ? "silu_mul_bf16" : "add_f32");
      w.cost = {"eltwise", "bf16", 0, n / nw * (op == EltOp::SiluMul ? 6 : 1), NB};
      w.params = {{"tile", tile},
                  {"blocks", NB},
                  {"a_fifo", fmt::format("{}{}", o.a, c)},
                  {"b_fifo", fmt::format("{}{}", o.b, c)},
                  {"y_fifo", fmt::format("{}{}", o.y, c)}};
      l.workers.push_back(std::move(w));
    }
  auto pat = [&](int c) { return bd_chain(c * R * tile, {NB, R * tile}, {nw * tile, 1}, d.max_dims); };
  for (int c = 0; c < h.cols; ++c) {
    ObjectFifo f = detail::column_fifo(fmt::format("{}{}", o.a, c), o.a, FifoDir::Fill, ty, c, h, d, tile, pat(c));
    detail::apply_fifo_faults(f, o.faults, d);
    l.fifos.push_back(std::move(f));
    l.fifos.push_back(detail::column_fifo(fmt::format("{}{}", o.b, c), o.b, FifoDir::Fill, ty, c, h, d, tile, pat(c)));
  }
  for (int c = 0; c < h.cols; ++c)
    l.fifos.push_back(detail::column_fifo(fmt::format("{}{}", o.y, c), o.y, FifoDir::Drain, ty, c, h, d, tile, pat(c)));
  return l;
}

}  // namespace tessera::npusim
