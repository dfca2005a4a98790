// RoPE (half-split pairing, herd over heads) and the embedding row gather.
#include <fmt/format.h>

#include <cmath>

#include "targets/npusim/mappings.h"
#include "util/error.h"

namespace tessera::npusim {

std::vector<float> rope_table(int64_t T, int64_t pos0, const std::vector<float>& inv_freq) {
  const int64_t half = int64_t(inv_freq.size()), hd = 2 * half;
  std::vector<float> cs(size_t(T * hd));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = float(pos0 + t) * inv_freq[size_t(i)];  // fp32 product, as transformers
      cs[size_t(t * hd + i)] = std::cos(angle);
      cs[size_t(t * hd + half + i)] = std::sin(angle);
    }
  return cs;
}

RopeTiles default_rope_tiles(const RopeShape& s, const Device& d) { return {herd_for(s.heads, d)}; }

Launch rope_launch(const RopeShape& s, const RopeTiles& tin, const Device& d, const RopeOptions& o) {
  Herd h = tin.herd;
  if (h.cols <= 0 || h.rows <= 0) h = herd_for(s.heads, d);
  const int64_t nw = h.size();
  if (s.T <= 0 || s.heads <= 0 || s.head_dim <= 0 || s.head_dim % 2 || s.heads % nw)
    fail("rope mapping: {} heads of {} over {} workers do not divide", s.heads, s.head_dim, nw);
  const int64_t hd = s.head_dim, hpw = s.heads / nw, R = h.rows, T = s.T, H = s.heads * hd;

  Launch l;
  l.name = o.name;
  l.kernel = fmt::format("rope {} positions x {} heads x {}, {} heads per worker", T, s.heads, hd, hpw);
  l.herd_cols = h.cols;
  l.herd_rows = h.rows;
  l.loop_order = fmt::format("for {} positions: cs = table[t]; for {} heads: rotate half-split pairs", T, hpw);
  for (int c = 0; c < h.cols; ++c)
    for (int r = 0; r < h.rows; ++r) {
      Worker w = detail::make_worker(fmt::format("rope_{}_{}", c, r), {c, d.first_compute_row + r}, "rope_bf16");
      w.cost = {"eltwise", "bf16", 0, T * hpw * hd * 3, T};
      w.params = {{"T", T},
                  {"hpw", hpw},
                  {"hd", hd},
                  {"x_fifo", fmt::format("{}{}", o.x, c)},
                  {"cs_fifo", o.cs},
                  {"y_fifo", fmt::format("{}{}", o.y, c)}};
      l.workers.push_back(std::move(w));
    }
  auto pat = [&](int c) { return bd_chain(c * R * hpw * hd, {T, R * hpw * hd}, {H, 1}, d.max_dims); };
  for (int c = 0; c < h.cols; ++c) {
    ObjectFifo f = detail::column_fifo(fmt::format("{}{}", o.x, c), o.x, FifoDir::Fill, ElemType::BF16, c, h, d,
                                       hpw * hd, pat(c));
    detail::apply_fifo_faults(f, o.faults, d);
    l.fifos.push_back(std::move(f));
  }
  // The table: one row per position; read transposed under the fault (cos/sin of the wrong
  // frequencies and positions).
  auto cs_pat = o.faults.transposed_pattern ? bd_chain(0, {T, hd}, {1, T}, d.max_dims)
                                            : std::vector<AccessPattern>{AccessPattern::contiguous(0, T * hd)};
  l.fifos.push_back(detail::broadcast_fifo(o.cs, o.cs, ElemType::BF16, h, d, hd, std::move(cs_pat)));
  for (int c = 0; c < h.cols; ++c)
    l.fifos.push_back(detail::column_fifo(fmt::format("{}{}", o.y, c), o.y, FifoDir::Drain, ElemType::BF16, c, h, d,
                                          hpw * hd, pat(c)));
  return l;
}

EmbedTiles default_embed_tiles(int64_t hidden, int64_t T, const Device& d) {
  EmbedTiles t;
  t.cols = int(std::min<int64_t>(d.columns, std::max<int64_t>(T, 1)));
  // Two fifos of depth 2 per worker: at most a quarter of L1 per object.
  t.hc = detail::largest_divisor_at_most(hidden, std::max<int64_t>(1, (d.l1_bytes - 1024) / 4 / 2));
  return t;
}

int64_t embedding_max_tokens(int64_t hidden, const EmbedTiles& t, const Device& d) {
  // Per shim: one BD per token of the gather (more when a row is several objects: still one)
  // plus the drain's BD.
  return int64_t(std::max(1, t.cols)) * std::max(1, d.shim.bds - 1);
}

Launch embedding_launch(const std::vector<int32_t>& ids, int64_t vocab, int64_t hidden, const EmbedTiles& tin,
                        const Device& d, const EmbedOptions& o) {
  EmbedTiles t = tin;
  const int64_t T = int64_t(ids.size());
  const EmbedTiles def = default_embed_tiles(hidden, T, d);
  if (t.cols <= 0) t.cols = def.cols;
  if (t.hc <= 0) t.hc = def.hc;
  if (o.faults.l1_overflow) t.hc = hidden;
  if (T <= 0 || hidden % t.hc || t.cols > d.columns) fail("embedding mapping: bad tiles (hc {} of {}, {} columns)", t.hc, hidden, t.cols);
  for (int32_t id : ids)
    if (id < 0 || id >= vocab) fail("embedding: token id {} is outside the vocabulary ({})", id, vocab);
  const int C = int(std::min<int64_t>(t.cols, T));
  Launch l;
  l.name = o.name;
  l.kernel = fmt::format("embedding {} tokens x {}, chunk {}", T, hidden, t.hc);
  l.herd_cols = C;
  l.herd_rows = 1;
  l.loop_order = "for each token of the column: copy its row (gathered by the DMA, one BD per token)";
  for (int c = 0; c < C; ++c) {
    const int64_t nt = (T - c + C - 1) / C;  // tokens c, c + C, ...
    const Tile tile{c, d.first_compute_row};
    Worker w = detail::make_worker(fmt::format("embed_{}", c), tile, "copy_bf16");
    w.cost = {"eltwise", "bf16", 0, nt * hidden / 32, nt * hidden / t.hc};
    w.params = {{"objects", nt * hidden / t.hc},
                {"in_fifo", fmt::format("{}{}", o.table, c)},
                {"out_fifo", fmt::format("{}{}", o.out, c)}};
    l.workers.push_back(std::move(w));
    ObjectFifo in;
    in.name = fmt::format("{}{}", o.table, c);
    in.tensor = o.table;
    in.shim = {c, d.shim_row};
    in.object_elems = t.hc;
    for (int64_t u = 0; u < nt; ++u) in.ddr.push_back(AccessPattern::contiguous(int64_t(ids[size_t(u * C + c)]) * hidden, hidden));
    in.ends = {{tile, 0, 0, std::nullopt}};
    detail::apply_fifo_faults(in, o.faults, d);
    l.fifos.push_back(std::move(in));
    ObjectFifo out;
    out.name = fmt::format("{}{}", o.out, c);
    out.dir = FifoDir::Drain;
    out.tensor = o.out;
    out.shim = {c, d.shim_row};
    out.object_elems = t.hc;
    out.ddr = bd_chain(c * hidden, {nt, hidden}, {C * hidden, 1}, d.max_dims);
    out.ends = {{tile, 0, 0, std::nullopt}};
    l.fifos.push_back(std::move(out));
  }
  return l;
}

}  // namespace tessera::npusim
