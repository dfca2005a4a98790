// Attention (prefill and decode): flash-style over key tiles, herd columns over kv heads and
// rows over the query heads of a group. See mappings.h.
#include <fmt/format.h>

#include <cmath>

#include "targets/npusim/mappings.h"
#include "util/error.h"

namespace tessera::npusim {

namespace {

int64_t attn_l1(int64_t tq, int64_t qpw, int64_t kt, int64_t hd) {
  return 2 * tq * qpw * hd * 2       // Q
         + 2 * tq * qpw * hd * 2     // O
         + 2 * kt * 2 * hd * 2       // KV
         + tq * qpw * (hd + 2) * 4   // acc, m, l (fp32)
         + kt * 4                    // scores
         + 1024;
}

Herd attn_herd(const AttnShape& s, const Device& d) {
  const int C = int(detail::largest_divisor_at_most(s.kv_heads, d.columns));
  const int R = int(detail::largest_divisor_at_most(s.heads / s.kv_heads, d.compute_rows()));
  return {C, R};
}

}  // namespace

AttnTiles default_attn_tiles(const AttnShape& s, const Device& d) {
  AttnTiles t;
  t.herd = attn_herd(s, d);
  const int64_t qpw = s.heads / s.kv_heads / t.herd.rows;
  const int64_t keys8 = (s.keys() + 7) / 8 * 8;
  for (int64_t tq = detail::largest_divisor_at_most(s.T, 64); tq >= 1; --tq) {
    if (s.T % tq) continue;
    for (int64_t kt : {64, 32, 16, 8}) {
      if (kt > keys8 && kt > 8) continue;
      if (attn_l1(tq, qpw, kt, s.head_dim) <= d.l1_bytes) {
        t.tq = tq;
        t.kt = kt;
        return t;
      }
    }
  }
  t.tq = 1;
  t.kt = 8;
  return t;
}

int64_t attn_kv_rows(const AttnShape& s, const AttnTiles& t) { return (s.keys() + t.kt - 1) / t.kt * t.kt; }

Launch attention_launch(const AttnShape& s, const AttnTiles& tin, const Device& d, const AttnOptions& o) {
  if (s.T <= 0 || s.heads <= 0 || s.kv_heads <= 0 || s.heads % s.kv_heads || s.head_dim <= 0 || s.pos0 < 0)
    fail("attention mapping: bad shape (T {}, heads {}, kv heads {}, head_dim {})", s.T, s.heads, s.kv_heads, s.head_dim);
  AttnTiles t = tin;
  const AttnTiles def = default_attn_tiles(s, d);
  if (t.herd.cols <= 0 || t.herd.rows <= 0) t.herd = def.herd;
  if (t.tq <= 0) t.tq = def.tq;
  if (t.kt <= 0) t.kt = def.kt;
  if (o.faults.l1_overflow) t.kt = attn_kv_rows(s, {0, 256, {}});
  const Herd h = t.herd;
  const int64_t group = s.heads / s.kv_heads;
  if (s.kv_heads % h.cols || group % h.rows || s.T % t.tq)
    fail("attention mapping: a {}x{} herd / tq {} does not divide {} kv heads, groups of {}, {} rows", h.cols, h.rows,
         t.tq, s.kv_heads, group, s.T);
  const int64_t hd = s.head_dim, kpc = s.kv_heads / h.cols, qpw = group / h.rows, tq = t.tq, kt = t.kt;
  const int64_t NQT = s.T / tq, NKT = attn_kv_rows(s, t) / kt, H = s.heads * hd, KVD = s.kv_heads * hd;
  const float scale = o.scale > 0 ? o.scale : float(1.0 / std::sqrt(double(hd)));

  Launch l;
  l.name = o.name;
  l.kernel = fmt::format("attention {} queries at {} x {} keys, {} heads / {} kv heads x {}, tiles tq={} kt={}", s.T,
                         s.pos0, s.keys(), s.heads, s.kv_heads, hd, tq, kt);
  l.herd_cols = h.cols;
  l.herd_rows = h.rows;
  l.loop_order = fmt::format(
      "for {} kv heads per column: for {} query tiles: for {} key tiles: s = q.k * scale (causal), online softmax, "
      "acc += p.v; o = acc / l",
      kpc, NQT, NKT);
  // Causal key tiles actually computed (the rest is streamed and skipped).
  int64_t computed = 0;
  for (int64_t qt = 0; qt < NQT; ++qt) computed += std::min(NKT, (s.pos0 + (qt + 1) * tq - 1) / kt + 1);
  for (int c = 0; c < h.cols; ++c)
    for (int r = 0; r < h.rows; ++r) {
      Worker w = detail::make_worker(fmt::format("attn_{}_{}", c, r), {c, d.first_compute_row + r}, "attention_bf16");
      w.buffers = {{"state", tq * qpw * (hd + 2) * 4 + kt * 4, 1}};
      const int64_t macs = kpc * computed * tq * qpw * kt * hd * 2;
      w.cost = {"attention", "bf16", macs, kpc * computed * tq * qpw * kt * 4, kpc * NQT * NKT};
      w.params = {{"T", s.T},        {"pos0", s.pos0},   {"hd", hd},       {"tq", tq},
                  {"kt", kt},        {"qpw", qpw},       {"kpc", kpc},     {"q_tiles", NQT},
                  {"k_tiles", NKT},  {"scale", scale},   {"q_fifo", fmt::format("{}{}", o.q, c)},
                  {"kv_fifo", fmt::format("{}{}", o.kv, c)}, {"o_fifo", fmt::format("{}{}", o.o, c)}};
      l.workers.push_back(std::move(w));
    }
  // Q / O: column c's object (i, qt) = tq rows x the group's query heads; the memtile lays
  // each worker's qpw heads out contiguously (mem_pattern).
  auto qo_pat = [&](int c) {
    return bd_chain(c * kpc * group * hd, {kpc, s.T, group * hd}, {group * hd, H, 1}, d.max_dims);
  };
  auto qo_fifo = [&](const std::string& name, const std::string& tensor, FifoDir dir, int c) {
    ObjectFifo f = detail::column_fifo(name, tensor, dir, ElemType::BF16, c, h, d, tq * qpw * hd, qo_pat(c));
    f.object_elems = tq * group * hd;
    for (int r = 0; r < h.rows; ++r) {
      f.ends[size_t(r)].offset = 0;
      f.ends[size_t(r)].elems = tq * qpw * hd;
      f.ends[size_t(r)].mem_pattern = AccessPattern{r * qpw * hd, {tq, qpw * hd}, {group * hd, 1}, 1};
    }
    return f;
  };
  for (int c = 0; c < h.cols; ++c) {
    ObjectFifo q = qo_fifo(fmt::format("{}{}", o.q, c), o.q, FifoDir::Fill, c);
    detail::apply_fifo_faults(q, {.stale_buffer = o.faults.stale_buffer, .bd_exhaustion = o.faults.bd_exhaustion}, d);
    l.fifos.push_back(std::move(q));
    // KV: for each kv head, for each query tile: every key tile, kt keys x [k | v].
    ObjectFifo kv;
    kv.name = fmt::format("{}{}", o.kv, c);
    kv.tensor = o.kv;
    kv.shim = {c, d.shim_row};
    kv.memtile = Tile{c, d.mem_row};
    kv.object_elems = kt * 2 * hd;
    kv.depth = 2;
    if (o.faults.transposed_pattern)  // k and v swapped: the kernel takes values for keys
      kv.ddr = bd_chain(c * kpc * hd + KVD, {kpc, NQT, NKT * kt, 2, hd}, {hd, 0, 2 * KVD, -KVD, 1}, d.max_dims);
    else
      kv.ddr = bd_chain(c * kpc * hd, {kpc, NQT, NKT * kt, 2, hd}, {hd, 0, 2 * KVD, KVD, 1}, d.max_dims);
    for (int r = 0; r < h.rows; ++r) kv.ends.push_back({{c, d.first_compute_row + r}, 0, 0, std::nullopt});
    kv.kind = h.rows > 1 ? FifoKind::Broadcast : FifoKind::Forward;
    l.fifos.push_back(std::move(kv));
  }
  for (int c = 0; c < h.cols; ++c) l.fifos.push_back(qo_fifo(fmt::format("{}{}", o.o, c), o.o, FifoDir::Drain, c));
  return l;
}

}  // namespace tessera::npusim
