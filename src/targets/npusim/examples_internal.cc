#include "targets/npusim/examples_internal.h"

#include <fmt/format.h>

#include "targets/npusim/engine.h"
#include "targets/npusim/numerics.h"
#include "util/error.h"
#include "util/half.h"

namespace tessera::npusim {

Launch example_add_launch(int64_t n, int columns, int64_t chunk, const Device& d, bool resident_x, int depth) {
  if (columns < 1 || columns > d.columns || n % (int64_t(columns) * chunk) != 0)
    fail("eltwise mapping: {} elements do not split into {} columns of {}-element objects", n, columns, chunk);
  const int64_t seg = n / columns;
  Launch l;
  l.name = "eltwise_add";
  l.kernel = fmt::format("add {} bf16", n);
  l.herd_cols = columns;
  l.herd_rows = 1;
  l.loop_order = fmt::format("for {} objects: z = x + y", seg / chunk);
  for (int c = 0; c < columns; ++c) {
    const Tile t{c, d.first_compute_row};
    Worker w;
    w.name = fmt::format("add_{}", c);
    w.tile = t;
    w.kernel = "example_add_bf16";
    w.cost = {"eltwise", "bf16", 0, seg, seg / chunk};
    w.params = {{"x", fmt::format("X{}", c)}, {"y", fmt::format("Y{}", c)}, {"z", fmt::format("Z{}", c)}};
    l.workers.push_back(std::move(w));
    for (const char* name : {"X", "Y", "Z"}) {
      ObjectFifo f;
      f.name = fmt::format("{}{}", name, c);
      f.dir = name[0] == 'Z' ? FifoDir::Drain : FifoDir::Fill;
      f.tensor = name;
      f.shim = {c, d.shim_row};
      f.memtile = Tile{c, d.mem_row};
      f.object_elems = chunk;
      f.depth = depth;
      f.ddr = {AccessPattern::contiguous(c * seg, seg)};
      f.ends = {{t, 0, 0, std::nullopt}};
      f.resident = resident_x && name[0] == 'X';
      l.fifos.push_back(std::move(f));
    }
  }
  return l;
}

Launch example_gemv_launch(int64_t N, int64_t K, int columns, int64_t r, const Device& d) {
  if (columns < 1 || columns > d.columns || N % (int64_t(columns) * r) != 0)
    fail("gemv mapping: {} rows do not split into {} columns of {}-row objects", N, columns, r);
  const int64_t rows = N / columns;
  Launch l;
  l.name = "gemv";
  l.kernel = fmt::format("gemv {}x{} bf16", N, K);
  l.herd_cols = columns;
  l.herd_rows = 1;
  l.loop_order = fmt::format("hold x; for {} objects: y[r] = W[r, :] . x", rows / r);
  ObjectFifo x;
  x.name = "x";
  x.tensor = "x";
  x.shim = {0, d.shim_row};
  x.memtile = Tile{0, d.mem_row};
  x.object_elems = K;
  x.depth = 1;
  x.mem_depth = 1;
  x.ddr = {AccessPattern::contiguous(0, K)};
  x.kind = columns > 1 ? FifoKind::Broadcast : FifoKind::Forward;
  for (int c = 0; c < columns; ++c) {
    const Tile t{c, d.first_compute_row};
    Worker w;
    w.name = fmt::format("gemv_{}", c);
    w.tile = t;
    w.kernel = "example_gemv_bf16";
    w.cost = {"gemv", "bf16", 0, rows * K, rows / r};
    w.params = {{"k", K}, {"w", fmt::format("W{}", c)}, {"y", fmt::format("y{}", c)}};
    l.workers.push_back(std::move(w));
    x.ends.push_back({t, 0, 0, std::nullopt});
    ObjectFifo wf;
    wf.name = fmt::format("W{}", c);
    wf.tensor = "W";
    wf.shim = {c, d.shim_row};
    wf.memtile = Tile{c, d.mem_row};
    wf.object_elems = r * K;
    wf.ddr = {AccessPattern::contiguous(c * rows * K, rows * K)};
    wf.ends = {{t, 0, 0, std::nullopt}};
    l.fifos.push_back(std::move(wf));
    ObjectFifo y;
    y.name = fmt::format("y{}", c);
    y.dir = FifoDir::Drain;
    y.tensor = "y";
    y.shim = {c, d.shim_row};
    y.memtile = Tile{c, d.mem_row};
    y.object_elems = r;
    y.ddr = {AccessPattern::contiguous(c * rows, rows)};
    y.ends = {{t, 0, 0, std::nullopt}};
    l.fifos.push_back(std::move(y));
  }
  l.fifos.push_back(std::move(x));
  return l;
}

void register_example_kernels(Engine& engine) {
  engine.register_kernel("example_gemv_bf16", [](WorkerContext& ctx) {
    const auto& p = ctx.params();
    const int64_t K = p["k"];
    const int X = ctx.fifo("x"), W = ctx.fifo(p["w"]), Y = ctx.fifo(p["y"]);
    const uint16_t* x = ctx.acquire(X).bf16();
    for (int64_t o = 0; o < ctx.objects(Y); ++o) {
      const ObjectRef w = ctx.acquire(W), y = ctx.acquire(Y);
      for (int64_t i = 0; i < y.elems; ++i) y.bf16()[i] = f32_to_bf16(dot_bf16(w.bf16() + i * K, x, K));
      ctx.release(W);
      ctx.release(Y);
    }
    ctx.release(X);
  });
  engine.register_kernel("example_add_bf16", [](WorkerContext& ctx) {
    const auto& p = ctx.params();
    const int X = ctx.fifo(p["x"]), Y = ctx.fifo(p["y"]), Z = ctx.fifo(p["z"]);
    for (int64_t o = 0; o < ctx.objects(Z); ++o) {
      const ObjectRef x = ctx.acquire(X), y = ctx.acquire(Y), z = ctx.acquire(Z);
      for (int64_t i = 0; i < z.elems; ++i)
        z.bf16()[i] = f32_to_bf16(bf16_to_f32(x.bf16()[i]) + bf16_to_f32(y.bf16()[i]));
      ctx.release(X);
      ctx.release(Y);
      ctx.release(Z);
    }
  });
}

}  // namespace tessera::npusim
