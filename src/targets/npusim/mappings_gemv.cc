// GEMV (decode projections and the LM head) and the GEMM defaults for helper-11's GEMM
// mapping. See mappings.h for the layout.
#include <fmt/format.h>

#include <algorithm>

#include "targets/npusim/checker.h"
#include "targets/npusim/mappings.h"
#include "targets/npusim/timing.h"
#include "targets/npusim/weight_blocks.h"
#include "util/error.h"

namespace tessera::npusim {

namespace {

// L1 bytes one GEMV worker needs with blocks of rb rows x kc of weights of type w (W depth dw):
// a block type's scales travel inside its blocks, so they are counted with W.
int64_t gemv_l1(int64_t rb, int64_t kc, int64_t dw, ElemType w = ElemType::BF16) {
  return dw * rb * (kc / block_values(w)) * elem_bytes(w)  // W
         + 2 * kc * 2                                      // X
         + 2 * rb * 4                                      // Y (the fp32 accumulator)
         + 1024;                                           // stack
}

// Whether kc is a K chunk the kernel takes: it divides K, whole blocks of a block type.
bool whole_chunk(int64_t K, int64_t kc, ElemType w) { return kc > 0 && K % kc == 0 && kc % block_values(w) == 0; }

int64_t k_chunks(int64_t K, const Device& d, ElemType w) {
  int64_t kc_n = std::max<int64_t>(1, (K + d.gemv_max_k - 1) / std::max<int64_t>(1, d.gemv_max_k));
  while (kc_n < K && (K % kc_n || !whole_chunk(K, K / kc_n, w))) ++kc_n;
  return kc_n;
}

}  // namespace

GemvTiles default_gemv_tiles(const GemvShape& s, const Device& d, bool resident) {
  GemvTiles t;
  t.herd = herd_for(s.N, d);
  const int64_t rw = s.N / t.herd.size();  // rows per worker
  if (resident) {  // the whole slice in one block; its K chunks are the objects (depth = their count)
    t.rb = rw;
    t.kc = s.K / k_chunks(s.K, d, s.w);
    return t;
  }
  for (int64_t kn = k_chunks(s.K, d, s.w); kn <= s.K; ++kn) {
    if (s.K % kn || !whole_chunk(s.K, s.K / kn, s.w)) continue;
    t.kc = s.K / kn;
    // Largest row block that fits, at most 16 Ki weights per object.
    for (int64_t rb = rw; rb >= 1; --rb) {
      if (rw % rb || rb * t.kc > 16384) continue;
      if (gemv_l1(rb, t.kc, 2, s.w) <= d.l1_bytes) {
        t.rb = rb;
        return t;
      }
    }
  }
  t.rb = 1;
  t.kc = s.K;
  return t;
}

bool gemvs_fit_resident(const std::vector<GemvShape>& shapes, int64_t copies, const Device& d) {
  int64_t weights = 0, largest = 0;
  for (const GemvShape& s : shapes) {
    const GemvTiles t = default_gemv_tiles(s, d, true);
    weights += t.rb * (s.K / block_values(s.w)) * elem_bytes(s.w);  // one worker's slice of W
    largest = std::max(largest, gemv_l1(t.rb, t.kc, s.K / t.kc, s.w));
  }
  return weights * copies + largest <= d.l1_bytes;
}

Launch gemv_launch(const GemvShape& s, const GemvTiles& tin, const Device& d, const GemvOptions& o) {
  GemvTiles t = tin;
  if (t.herd.size() <= 0 || t.herd.cols <= 0) t.herd = herd_for(s.N, d);
  const GemvTiles def = default_gemv_tiles(s, d, o.resident);
  if (t.kc <= 0) t.kc = def.kc;
  const Herd h = t.herd;
  const int64_t nw = h.size();
  if (s.N <= 0 || s.K <= 0) fail("gemv mapping: bad shape {}x{}", s.N, s.K);
  if (h.cols > d.columns || h.rows > d.compute_rows())
    fail("gemv mapping: a {}x{} herd does not fit {} ({} columns x {} compute rows)", h.cols, h.rows, d.name,
         d.columns, d.compute_rows());
  if (s.N % nw) fail("gemv mapping: N {} is not a multiple of the herd's {} workers", s.N, nw);
  const int64_t rw = s.N / nw;
  if (t.rb <= 0) t.rb = o.resident ? rw : def.rb;
  if (o.faults.l1_overflow) t.rb = rw;  // one tile holding the worker's whole slice
  if (rw % t.rb || s.K % t.kc)
    fail("gemv mapping: {}x{} is not a whole number of tiles (rows per worker {} by rb {}, K by kc {})", s.N, s.K, rw,
         t.rb, t.kc);
  const int64_t bv = block_values(s.w);
  if (t.kc % bv)
    fail("gemv mapping: a K chunk of {} is not a whole number of {}-weight {} blocks", t.kc, bv, elem_type_name(s.w));
  const int64_t rb = t.rb, kc = t.kc, KC = s.K / kc, NB = rw / rb, N = s.N, K = s.K, R = h.rows;
  // W's DDR walk counts its elements: weights for bf16, blocks for a block type.
  const int64_t Kw = K / bv, kcw = kc / bv;
  const bool quant = is_block(s.w);
  const bool x_once = KC == 1;

  Launch l;
  l.name = o.name;
  l.kernel = fmt::format("gemv {}x{}{}, tiles rb={} kc={}{}", N, K, quant ? fmt::format(" ({} W)", elem_type_name(s.w)) : "",
                         rb, kc, o.resident ? ", W resident" : "");
  l.herd_cols = h.cols;
  l.herd_rows = h.rows;
  l.loop_order = fmt::format("for {} row blocks: y = 0; for {} k chunks: y[rb] += W[rb, kc] . x[kc]; drain y", NB, KC);
  for (int c = 0; c < h.cols; ++c)
    for (int r = 0; r < h.rows; ++r) {
      Worker w = detail::make_worker(fmt::format("gemv_{}_{}", c, r), {c, d.first_compute_row + r},
                                     quant ? "gemv_blocks" : "gemv_bf16");
      w.cost = {"gemv", "bf16", rw * K, rw * KC + gemv_dequant_ops(s.w, rw * K, x_once ? K : NB * K), NB * KC};
      w.params = {{"rb", rb},         {"kc", kc},         {"k", kc},
                  {"k_chunks", KC},   {"blocks", NB},     {"x_once", x_once},
                  {"w_fifo", fmt::format("{}{}", o.w, c)}, {"x_fifo", o.x}, {"y_fifo", fmt::format("{}{}", o.y, c)}};
      l.workers.push_back(std::move(w));
    }
  // W: column c's object (b, q) = rows [(b*nw + c*R)*rb, +R*rb) x K chunk q, split by rows.
  for (int c = 0; c < h.cols; ++c) {
    ObjectFifo f;
    f.name = fmt::format("{}{}", o.w, c);
    f.kind = R > 1 ? FifoKind::Split : FifoKind::Forward;
    f.type = s.w;
    f.tensor = o.w;
    f.shim = {c, d.shim_row};
    f.memtile = Tile{c, d.mem_row};
    f.object_elems = R * rb * kcw;
    f.depth = o.resident ? int(NB * KC) : 2;
    f.resident = o.resident;
    if (o.faults.transposed_pattern)  // element (n, k) read at k*N + n: W walked as if [K, N]
      f.ddr = bd_chain(c * R * rb, {NB, KC, R * rb, kcw}, {nw * rb, kcw * N, 1, N}, d.max_dims);
    else
      f.ddr = bd_chain(c * R * rb * Kw, {NB, KC, R * rb, kcw}, {nw * rb * Kw, kcw, Kw, 1}, d.max_dims);
    f.ends = detail::column_ends(h, c, d, rb * kcw);
    if (f.kind == FifoKind::Forward) f.ends[0].elems = 0;
    if (o.faults.bd_exhaustion) detail::apply_fifo_faults(f, {.bd_exhaustion = true}, d);
    l.fifos.push_back(std::move(f));
  }
  {  // x: broadcast from column 0, one object per K chunk (re-sent per row block when split)
    ObjectFifo f;
    f.name = o.x;
    f.tensor = o.x;
    f.shim = {0, d.shim_row};
    f.memtile = Tile{0, d.mem_row};
    f.object_elems = kc;
    f.depth = 2;
    f.ddr = x_once ? std::vector<AccessPattern>{AccessPattern::contiguous(0, K)} : bd_chain(0, {NB, K}, {0, 1}, d.max_dims);
    f.ends = detail::all_ends(h, d);
    f.kind = f.ends.size() > 1 ? FifoKind::Broadcast : FifoKind::Forward;
    if (o.faults.stale_buffer) detail::apply_fifo_faults(f, {.stale_buffer = true}, d);
    l.fifos.push_back(std::move(f));
  }
  for (int c = 0; c < h.cols; ++c) {  // y: column c's object b = rows [(b*nw + c*R)*rb, +R*rb)
    ObjectFifo f;
    f.name = fmt::format("{}{}", o.y, c);
    f.dir = FifoDir::Drain;
    f.kind = R > 1 ? FifoKind::Join : FifoKind::Forward;
    f.type = ElemType::F32;
    f.tensor = o.y;
    f.shim = {c, d.shim_row};
    f.memtile = Tile{c, d.mem_row};
    f.object_elems = R * rb;
    f.depth = 2;
    f.ddr = bd_chain(c * R * rb, {NB, R * rb}, {nw * rb, 1}, d.max_dims);
    f.ends = detail::column_ends(h, c, d, rb);
    if (f.kind == FifoKind::Forward) f.ends[0].elems = 0;
    l.fifos.push_back(std::move(f));
  }
  return l;
}

GemvTiles tune_gemv_tiles(const GemvShape& s, const Device& d) {
  GemvTiles best = default_gemv_tiles(s, d);
  best.herd = herd_for(s.N, d);
  double best_us = time_launch(gemv_launch(s, best, d), d).total_us;
  for (int cols = 1; cols <= d.columns; ++cols)
    for (int rows = 1; rows <= d.compute_rows(); ++rows) {
      if (s.N % (cols * rows)) continue;
      const int64_t rw = s.N / (cols * rows);
      // K chunks: whole vectors (bf16 lanes; whole blocks) up to the kernel's limit, or all of K.
      for (int64_t kc = d.vector_lanes_bf16; kc <= std::min(s.K, d.gemv_max_k); kc += d.vector_lanes_bf16) {
        if (!whole_chunk(s.K, kc, s.w)) continue;
        for (int64_t rb = 1; rb <= rw; ++rb) {
          if (rw % rb || gemv_l1(rb, kc, 2, s.w) > d.l1_bytes) continue;
          const GemvTiles t{rb, kc, Herd{cols, rows}};
          const Launch l = gemv_launch(s, t, d);
          if (!check(l, d).empty()) continue;
          const double us = time_launch(l, d).total_us;
          if (us < best_us) {
            best_us = us;
            best = t;
          }
        }
      }
    }
  return best;
}

GemmPlan default_gemm_plan(int64_t M, int64_t K, int64_t N, const Device& d, ElemType c_type, ElemType b_type) {
  const int64_t bv = block_values(b_type), bb = elem_bytes(b_type);
  const int64_t cb = elem_bytes(c_type);
  const int64_t cand[] = {64, 32, 16, 8};
  // k: whole elements of B; a K-quant's k tile is one 256-weight super-block.
  const std::vector<int64_t> k_cand = bv > 64 ? std::vector<int64_t>{bv} : std::vector<int64_t>{64, 32, 16, 8};
  GemmPlan best;
  int64_t best_score = -1;
  for (int gn = d.columns; gn >= 1; --gn) {
    for (int64_t n : cand) {
      if (N % (gn * n)) continue;
      for (int64_t k : k_cand) {
        if (K % k || k % bv) continue;
        for (int gm = d.compute_rows(); gm >= 1; --gm) {
          for (int64_t m : cand) {
            const int64_t l1 = 2 * m * k * 2 + 2 * (k / bv) * n * bb + 2 * m * n * cb + 1024;
            if (l1 > d.l1_bytes) continue;
            const int64_t Mp = (M + gm * m - 1) / (gm * m) * (gm * m);
            // Prefer: little padding, many workers, big tiles; for a block type, among tiles as
            // big, more rows (each B tile is unpacked once per use, for its m rows: a K-quant's
            // k = 256 leaves room for m = 32 x n = 32 or m = 16 x n = 64, and the first unpacks half
            // as often).
            const int64_t score = (1 << 30) / Mp * 1000 + int64_t(gn) * gm * 64 + m * n / 16 + k + (is_block(b_type) ? m : 0);
            if (score > best_score) {
              best_score = score;
              best.shape = {Mp, K, N};
              best.tiles = {m, k, n, k};
              best.herd = {gn, gm, true};
            }
          }
        }
      }
    }
  }
  if (best_score < 0)
    fail("gemm mapping: no tiles fit {}x{}x{} ({} B) on {}", M, K, N, elem_type_name(b_type), d.name);
  // Larger L2 K blocks where K allows (fewer, longer DMA transfers), as the measured mapping.
  for (int64_t kl2 : {256, 128, 64})
    if (kl2 > best.tiles.k && K % kl2 == 0 && kl2 % best.tiles.k == 0) {
      best.tiles.k_l2 = kl2;
      break;
    }
  return best;
}

}  // namespace tessera::npusim
