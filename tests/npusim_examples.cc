#include "npusim_examples.h"

#include <fmt/format.h>

#include <tuple>
#include <vector>

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

Launch example_pipeline_launch(int64_t n, int64_t chunk, int depth, int hold, const Device& d) {
  if (chunk < 1 || n % chunk != 0 || hold < 1 || (n / chunk) % hold != 0)
    fail("pipeline mapping: {} elements do not split into groups of {} {}-element objects", n, hold, chunk);
  Launch l;
  l.name = "pipeline";
  l.kernel = fmt::format("2x + 1 over {} bf16 in two stages", n);
  l.herd_cols = 1;
  l.herd_rows = 2;
  const Tile p{0, d.first_compute_row}, c{0, d.first_compute_row + 1};
  Worker a;
  a.name = "double";
  a.tile = p;
  a.kernel = "example_double_to_link";
  a.cost = {"eltwise", "bf16", 0, n, n / chunk};
  Worker b = a;
  b.name = "add_one";
  b.tile = c;
  b.kernel = "example_link_add_one";
  b.params = {{"hold", hold}};
  l.workers = {a, b};
  ObjectFifo x;
  x.name = "X";
  x.tensor = "X";
  x.shim = {0, d.shim_row};
  x.memtile = Tile{0, d.mem_row};
  x.object_elems = chunk;
  x.ddr = {AccessPattern::contiguous(0, n)};
  x.ends = {{p, 0, 0, std::nullopt}};
  ObjectFifo z = x;
  z.name = "Z";
  z.tensor = "Z";
  z.dir = FifoDir::Drain;
  z.ends = {{c, 0, 0, std::nullopt}};
  l.fifos = {x, z};
  LinkFifo link;
  link.name = "L";
  link.producer = p;
  link.consumers = {c};
  link.object_elems = chunk;
  link.objects = n / chunk;
  link.depth = depth;
  l.links = {link};
  return l;
}

Launch example_ring_launch(int64_t objects, bool consume_first, const Device& d) {
  Launch l;
  l.name = "ring";
  l.kernel = "two workers trading objects";
  l.herd_cols = 1;
  l.herd_rows = 2;
  const Tile ta{0, d.first_compute_row}, tb{0, d.first_compute_row + 1};
  for (const auto& [name, tile, in, out, first] :
       {std::tuple{"A", ta, "BA", "AB", !consume_first}, std::tuple{"B", tb, "AB", "BA", false}}) {
    Worker w;
    w.name = name;
    w.tile = tile;
    w.kernel = "example_trade";
    w.params = {{"in", in}, {"out", out}, {"produce_first", first}};
    l.workers.push_back(w);
  }
  for (const auto& [name, from, to] : {std::tuple{"AB", ta, tb}, std::tuple{"BA", tb, ta}}) {
    LinkFifo f;
    f.name = name;
    f.producer = from;
    f.consumers = {to};
    f.object_elems = 16;
    f.objects = objects;
    f.depth = 1;
    l.links.push_back(f);
  }
  return l;
}

void register_example_kernels(Engine& engine) {
  engine.register_kernel("example_double_to_link", [](WorkerContext& ctx) {
    const int X = ctx.fifo("X"), L = ctx.fifo("L");
    for (int64_t o = 0; o < ctx.objects(L); ++o) {
      const ObjectRef x = ctx.acquire(X), y = ctx.acquire(L);
      for (int64_t i = 0; i < y.elems; ++i) y.bf16()[i] = f32_to_bf16(2.0f * bf16_to_f32(x.bf16()[i]));
      ctx.release(X);
      ctx.release(L);
    }
  });
  engine.register_kernel("example_link_add_one", [](WorkerContext& ctx) {
    const int L = ctx.fifo("L"), Z = ctx.fifo("Z");
    const int64_t hold = ctx.params()["hold"];
    for (int64_t o = 0; o < ctx.objects(L); o += hold) {
      std::vector<ObjectRef> in;
      for (int64_t k = 0; k < hold; ++k) in.push_back(ctx.acquire(L));  // a window of `hold` objects
      for (const ObjectRef& y : in) {
        const ObjectRef z = ctx.acquire(Z);
        for (int64_t i = 0; i < z.elems; ++i) z.bf16()[i] = f32_to_bf16(bf16_to_f32(y.bf16()[i]) + 1.0f);
        ctx.release(Z);
      }
      for (int64_t k = 0; k < hold; ++k) ctx.release(L);
    }
  });
  engine.register_kernel("example_trade", [](WorkerContext& ctx) {
    const int in = ctx.fifo(ctx.params()["in"]), out = ctx.fifo(ctx.params()["out"]);
    const bool produce_first = ctx.params()["produce_first"];
    for (int64_t o = 0; o < ctx.objects(out); ++o) {
      auto produce = [&] {
        const ObjectRef y = ctx.acquire(out);
        for (int64_t i = 0; i < y.elems; ++i) y.bf16()[i] = f32_to_bf16(float(o));
        ctx.release(out);
      };
      if (produce_first) produce();
      ctx.acquire(in);
      ctx.release(in);
      if (!produce_first) produce();
    }
  });
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
