#include "targets/npusim/mappings_gemm.h"

#include <fmt/format.h>

#include <vector>

#include "targets/npusim/engine.h"
#include "targets/npusim/numerics.h"
#include "targets/npusim/weight_blocks.h"
#include "util/error.h"

namespace tessera::npusim {

Launch gemm_launch(const GemmShape& s, const GemmTiles& tl, const GemmHerd& h, const Device& d, const GemmOptions& o) {
  const int GM = h.m_on_rows ? h.rows : h.cols, GN = h.m_on_rows ? h.cols : h.rows;
  const int64_t k_l2 = tl.k_l2 > 0 ? tl.k_l2 : tl.k;
  if (h.cols < 1 || h.rows < 1 || h.cols > d.columns || h.rows > d.compute_rows())
    fail("gemm mapping: a {}x{} herd does not fit the {} columns x {} compute rows of {}", h.cols, h.rows, d.columns,
         d.compute_rows(), d.name);
  if (s.M % (GM * tl.m) || s.N % (GN * tl.n) || s.K % k_l2 || k_l2 % tl.k)
    fail("gemm mapping: {}x{}x{} is not a whole number of tiles (M by {}x{}, N by {}x{}, K by k_l2 {} = k_l1 {} x "
         "whole)",
         s.M, s.K, s.N, GM, tl.m, GN, tl.n, k_l2, tl.k);
  const bool quant = is_block(o.b_type);
  const int64_t bv = block_values(o.b_type);
  if (tl.k % bv || k_l2 % bv)
    fail("gemm mapping: k_l1 {} and k_l2 {} must be whole {}-weight {} blocks", tl.k, k_l2, bv, elem_type_name(o.b_type));
  const int64_t MB = s.M / (GM * tl.m), NB = s.N / (GN * tl.n), KB = s.K / tl.k;
  const int64_t m = tl.m, k = tl.k, n = tl.n, K = s.K, N = s.N;
  const int64_t kw = k / bv, Kw = K / bv;  // B's elements per k block and per row (blocks for a block type)

  Launch l;
  l.name = o.name;
  l.kernel = fmt::format("gemm {}x{}x{} ({}{}), tiles m={} k_l2={} k_l1={} n={}", s.M, s.K, s.N,
                         o.b_nk ? "B as [N,K]" : "B as [K,N]", quant ? fmt::format(", {} blocks", elem_type_name(o.b_type)) : "",
                         m, k_l2, k, n);
  l.herd_cols = h.cols;
  l.herd_rows = h.rows;
  l.loop_order = fmt::format("for {} M blocks: for {} N blocks: C = 0; for {} k blocks: C += A . B", MB, NB, KB);
  auto gm_of = [&](int c, int r) { return h.m_on_rows ? r : c; };
  auto gn_of = [&](int c, int r) { return h.m_on_rows ? c : r; };
  for (int c = 0; c < h.cols; ++c)
    for (int r = 0; r < h.rows; ++r) {
      Worker w;
      w.name = fmt::format("mm_{}_{}", c, r);
      w.tile = {c, d.first_compute_row + r};
      w.kernel = quant ? "gemm_blocks" : "gemm_bf16";
      w.cost = {"gemm", "bf16", MB * NB * m * n * K,
                gemm_dequant_ops(o.b_type, MB * NB * n * K, MB * NB * m * n * K, MB * NB * m * K), MB * NB * KB};
      w.params = {{"m", m},
                  {"k", k},
                  {"n", n},
                  {"k_blocks", KB},
                  {"tiles", MB * NB},
                  {"b_nk", o.b_nk},
                  {"a_fifo", fmt::format("{}{}", o.a, gm_of(c, r))},
                  {"b_fifo", fmt::format("{}{}", o.b, gn_of(c, r))},
                  {"c_fifo", fmt::format("{}{}", o.c, c)}};
      l.workers.push_back(std::move(w));
    }
  auto ends_where = [&](auto pred) {
    std::vector<FifoEnd> e;
    for (int c = 0; c < h.cols; ++c)
      for (int r = 0; r < h.rows; ++r)
        if (pred(c, r)) e.push_back({{c, d.first_compute_row + r}, 0, 0, std::nullopt});
    return e;
  };
  for (int g = 0; g < GM; ++g) {
    ObjectFifo f;
    f.name = fmt::format("{}{}", o.a, g);
    f.tensor = o.a;
    f.shim = {g, d.shim_row};
    f.memtile = Tile{g, d.mem_row};
    f.object_elems = m * k;
    f.mem_object_elems = m * k_l2;
    f.depth = o.depth;
    f.ends = ends_where([&](int c, int r) { return gm_of(c, r) == g; });
    f.kind = f.ends.size() > 1 ? FifoKind::Broadcast : FifoKind::Forward;
    // for mb: for nb (A re-read): for kb: m x k block
    f.ddr = bd_chain(g * m * K, {MB, NB, KB, m, k}, {GM * m * K, 0, k, K, 1}, d.max_dims);
    l.fifos.push_back(std::move(f));
  }
  for (int g = 0; g < GN; ++g) {
    ObjectFifo f;
    f.name = fmt::format("{}{}", o.b, g);
    f.type = o.b_type;
    f.tensor = o.b;
    f.shim = {g, d.shim_row};
    f.memtile = Tile{g, d.mem_row};
    f.object_elems = kw * n;
    f.mem_object_elems = k_l2 / bv * n;
    f.depth = o.depth;
    f.ends = ends_where([&](int c, int r) { return gn_of(c, r) == g; });
    f.kind = f.ends.size() > 1 ? FifoKind::Broadcast : FifoKind::Forward;
    if (o.b_nk)  // n x k tiles of B[N, K] (n x k/32 blocks of a block type)
      f.ddr = bd_chain(g * n * Kw, {MB, NB, KB, n, kw}, {0, GN * n * Kw, kw, Kw, 1}, d.max_dims);
    else if (quant)  // blocks are [N, K/32] rows; walked as if [K/32, N] (a wrong pattern: wrong blocks)
      f.ddr = bd_chain(g * n, {MB, NB, KB, n, kw}, {0, GN * n, kw * N, 1, N}, d.max_dims);
    else  // k x n tiles of B[K, N]
      f.ddr = bd_chain(g * n, {MB, NB, KB, k, n}, {0, GN * n, k * N, N, 1}, d.max_dims);
    l.fifos.push_back(std::move(f));
  }
  for (int c = 0; c < h.cols; ++c) {
    ObjectFifo f;
    f.name = fmt::format("{}{}", o.c, c);
    f.dir = FifoDir::Drain;
    f.type = o.c_type;
    f.tensor = o.c;
    f.shim = {c, d.shim_row};
    f.memtile = Tile{c, d.mem_row};
    f.object_elems = h.rows * m * n;  // the column's C tiles, stacked by row
    f.depth = o.depth;
    f.ends = ends_where([&](int cc, int) { return cc == c; });
    for (size_t r = 0; r < f.ends.size(); ++r) {
      f.ends[r].offset = int64_t(r) * m * n;
      f.ends[r].elems = m * n;
    }
    f.kind = f.ends.size() > 1 ? FifoKind::Join : FifoKind::Forward;
    // Stacked object (row r, i, j) -> C[(mb*GM + gm)*m + i, (nb*GN + gn)*n + j].
    if (h.m_on_rows)
      f.ddr = bd_chain(c * n, {MB, NB, h.rows, m, n}, {GM * m * N, GN * n, m * N, N, 1}, d.max_dims);
    else
      f.ddr = bd_chain(c * m * N, {MB, NB, h.rows, m, n}, {GM * m * N, GN * n, n, N, 1}, d.max_dims);
    l.fifos.push_back(std::move(f));
  }
  return l;
}

namespace {

void gemm_bf16_kernel(WorkerContext& ctx) {
  const auto& p = ctx.params();
  const int64_t m = p["m"], k = p["k"], n = p["n"], kb = p["k_blocks"], tiles = p["tiles"];
  const bool b_nk = p["b_nk"];
  const int A = ctx.fifo(p["a_fifo"]), B = ctx.fifo(p["b_fifo"]), C = ctx.fifo(p["c_fifo"]);
  std::vector<float> acc(size_t(m * n));  // the mmul accumulator registers
  for (int64_t t = 0; t < tiles; ++t) {
    ObjectRef c = ctx.acquire(C);
    const bool c_bf16 = c.type == ElemType::BF16;
    if (c_bf16)
      std::fill_n(c.bf16(), m * n, uint16_t(0));
    else
      std::fill_n(c.f32(), m * n, 0.0f);
    for (int64_t q = 0; q < kb; ++q) {
      const uint16_t* a = ctx.acquire(A).bf16();
      const uint16_t* b = ctx.acquire(B).bf16();
      std::fill(acc.begin(), acc.end(), 0.0f);
      if (b_nk) {
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) acc[size_t(i * n + j)] = dot_bf16(a + i * k, b + j * k, k);
      } else {
        mmul_bf16(a, b, acc.data(), m, k, n);
      }
      if (c_bf16) {
        uint16_t* cc = c.bf16();
        for (int64_t i = 0; i < m * n; ++i) cc[i] = tessera::f32_to_bf16(tessera::bf16_to_f32(cc[i]) + acc[size_t(i)]);
      } else {
        float* cc = c.f32();
        for (int64_t i = 0; i < m * n; ++i) cc[i] += acc[size_t(i)];
      }
      ctx.release(A);
      ctx.release(B);
    }
    ctx.release(C);
  }
}

// C (fp32) += A . B with B an n x k/bv tile of GGML blocks (rows of B[N, K], bv = 32 or 256
// weights per element): per element and group (weight_blocks.h), the group's integers (exact
// in bf16) times A on the mmul (exact products, fp32 sums), then each output column scaled by
// its row's group scale (and, for a type with a min, min x the group's sum of A subtracted)
// and added into C.
void gemm_blocks_kernel(WorkerContext& ctx) {
  const auto& p = ctx.params();
  const int64_t m = p["m"], k = p["k"], n = p["n"], kb = p["k_blocks"], tiles = p["tiles"];
  const int A = ctx.fifo(p["a_fifo"]), B = ctx.fifo(p["b_fifo"]), C = ctx.fifo(p["c_fifo"]);
  std::vector<float> a32(size_t(m * kMaxElementValues)), v(size_t(n * kMaxElementValues)),
      scale(size_t(n * kMaxGroups)), mn(size_t(n * kMaxGroups)), acc(static_cast<size_t>(n)), asum(static_cast<size_t>(m));
  for (int64_t t = 0; t < tiles; ++t) {
    float* c = ctx.acquire(C).f32();
    std::fill_n(c, m * n, 0.0f);
    for (int64_t q = 0; q < kb; ++q) {
      const uint16_t* a = ctx.acquire(A).bf16();
      const ObjectRef bo = ctx.acquire(B);
      const uint8_t* b = bo.blocks(bo.type);
      const int64_t bytes = elem_bytes(bo.type), ev = block_values(bo.type), gv = group_values(bo.type),
                    G = ev / gv, sub = k / ev;  // elements per k block
      const bool mins = has_min(bo.type);
      for (int64_t s = 0; s < sub; ++s) {
        for (int64_t j = 0; j < n; ++j) {  // unpack column j's element s
          const BlockTerms bt = unpack_block(bo.type, b + (j * sub + s) * bytes);
          for (int64_t g = 0; g < G; ++g) {
            scale[size_t(j * G + g)] = bt.scale[g];
            mn[size_t(j * G + g)] = bt.min[g];
          }
          for (int64_t l = 0; l < ev; ++l) v[size_t(j * ev + l)] = float(bt.v[l]);
        }
        for (int64_t i = 0; i < m; ++i) bf16_to_f32(a + i * k + s * ev, a32.data() + i * ev, ev);
        for (int64_t g = 0; g < G; ++g) {
          if (mins)
            for (int64_t i = 0; i < m; ++i) {
              const float* ai = a32.data() + i * ev + g * gv;
              float sum = 0;
              for (int64_t l = 0; l < gv; ++l) sum += ai[l];
              asum[size_t(i)] = sum;
            }
          for (int64_t i = 0; i < m; ++i) {
            const float* ai = a32.data() + i * ev + g * gv;
            for (int64_t j = 0; j < n; ++j) {
              const float* vj = v.data() + j * ev + g * gv;
              float sum = 0;
              for (int64_t l = 0; l < gv; ++l) sum += ai[l] * vj[l];
              acc[size_t(j)] = sum;
            }
            float* ci = c + i * n;
            if (mins)
              for (int64_t j = 0; j < n; ++j)
                ci[j] += scale[size_t(j * G + g)] * acc[size_t(j)] - mn[size_t(j * G + g)] * asum[size_t(i)];
            else
              for (int64_t j = 0; j < n; ++j) ci[j] += scale[size_t(j * G + g)] * acc[size_t(j)];
          }
        }
      }
      ctx.release(A);
      ctx.release(B);
    }
    ctx.release(C);
  }
}

}  // namespace

void register_gemm_kernels(Engine& engine) {
  engine.register_kernel("gemm_bf16", gemm_bf16_kernel);
  engine.register_kernel("gemm_blocks", gemm_blocks_kernel);
}

}  // namespace tessera::npusim
