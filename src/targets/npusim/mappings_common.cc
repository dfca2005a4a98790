// Shared pieces of the kernel-set mapping generators (mappings.h): herd choice, workers,
// fifo ends, and the generic mapping faults.
#include <fmt/format.h>

#include <cstring>

#include "util/half.h"

#include "targets/npusim/engine.h"
#include "targets/npusim/mappings.h"
#include "util/error.h"

namespace tessera::npusim {

std::string MappingFaults::key() const {
  std::string k;
  if (transposed_pattern) k += 'T';
  if (stale_buffer) k += 'S';
  if (l1_overflow) k += 'O';
  if (bd_exhaustion) k += 'B';
  if (dma_oversubscribed) k += 'D';
  return k;
}

Herd herd_for(int64_t blocks, const Device& d, int max_cols, int max_rows) {
  const int C = max_cols > 0 ? std::min(max_cols, d.columns) : d.columns;
  const int R = max_rows > 0 ? std::min(max_rows, d.compute_rows()) : d.compute_rows();
  Herd best{1, 1};
  for (int c = C; c >= 1; --c)
    for (int r = R; r >= 1; --r)
      if (blocks > 0 && blocks % (c * r) == 0 && c * r > best.size()) best = {c, r};
  return best;
}

void register_kernel_set(Engine& engine) {
  register_gemm_kernels(engine);
  detail::register_linear_kernels(engine);
  detail::register_row_kernels(engine);
  detail::register_attention_kernels(engine);
}

namespace detail {

int64_t largest_divisor_at_most(int64_t n, int64_t cap) {
  for (int64_t v = std::min(n, cap); v >= 1; --v)
    if (n % v == 0) return v;
  return 1;
}

void cast_to_bf16(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = tessera::f32_to_bf16(in[i]);
}

void cast_to_f32(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(in[i]) << 16;
    std::memcpy(&out[i], &u, 4);
  }
}

Worker make_worker(const std::string& name, Tile tile, const std::string& kernel) {
  Worker w;
  w.name = name;
  w.tile = tile;
  w.kernel = kernel;
  return w;
}

std::vector<FifoEnd> column_ends(const Herd& h, int c, const Device& d, int64_t slice) {
  std::vector<FifoEnd> e;
  for (int r = 0; r < h.rows; ++r) e.push_back({{c, d.first_compute_row + r}, r * slice, slice, std::nullopt});
  return e;
}

std::vector<FifoEnd> all_ends(const Herd& h, const Device& d) {
  std::vector<FifoEnd> e;
  for (int c = 0; c < h.cols; ++c)
    for (int r = 0; r < h.rows; ++r) e.push_back({{c, d.first_compute_row + r}, 0, 0, std::nullopt});
  return e;
}

ObjectFifo column_fifo(const std::string& name, const std::string& tensor, FifoDir dir, ElemType type, int c,
                       const Herd& h, const Device& d, int64_t slice, std::vector<AccessPattern> ddr) {
  ObjectFifo f;
  f.name = name;
  f.dir = dir;
  f.type = type;
  f.tensor = tensor;
  f.shim = {c, d.shim_row};
  f.memtile = Tile{c, d.mem_row};
  f.object_elems = h.rows * slice;
  f.depth = 2;
  f.ddr = std::move(ddr);
  f.ends = column_ends(h, c, d, slice);
  if (h.rows > 1) {
    f.kind = dir == FifoDir::Fill ? FifoKind::Split : FifoKind::Join;
  } else {
    f.kind = FifoKind::Forward;
    f.ends[0].elems = 0;
  }
  return f;
}

ObjectFifo broadcast_fifo(const std::string& name, const std::string& tensor, ElemType type, const Herd& h,
                          const Device& d, int64_t object_elems, std::vector<AccessPattern> ddr) {
  ObjectFifo f;
  f.name = name;
  f.type = type;
  f.tensor = tensor;
  f.shim = {0, d.shim_row};
  f.memtile = Tile{0, d.mem_row};
  f.object_elems = object_elems;
  f.depth = 2;
  f.ddr = std::move(ddr);
  f.ends = all_ends(h, d);
  f.kind = f.ends.size() > 1 ? FifoKind::Broadcast : FifoKind::Forward;
  return f;
}

namespace {

int64_t bd_count(const std::vector<AccessPattern>& ps, const Device& d) {
  int64_t n = 0;
  for (const auto& p : ps) n += std::max<int64_t>(1, (p.repeat + d.bd_repeat_max - 1) / d.bd_repeat_max);
  return n;
}

// Cuts a transfer into more BDs, in stream order: repeats unrolled, then the outermost
// dimension of each BD, then 1-D runs halved, until there are `want` BDs (or nothing is left
// to cut).
std::vector<AccessPattern> explode(std::vector<AccessPattern> ps, int64_t want, const Device& d) {
  while (bd_count(ps, d) < want) {
    std::vector<AccessPattern> next;
    bool cut = false;
    for (const auto& p : ps) {
      if (p.repeat > 1) {
        for (int64_t r = 0; r < p.repeat; ++r) next.push_back({p.offset, p.sizes, p.strides, 1});
        cut = true;
      } else if (p.sizes.size() > 1) {
        for (int64_t i = 0; i < p.sizes[0]; ++i)
          next.push_back({p.offset + i * p.strides[0], {p.sizes.begin() + 1, p.sizes.end()},
                          {p.strides.begin() + 1, p.strides.end()}, 1});
        cut = true;
      } else if (!p.sizes.empty() && p.sizes[0] > 1) {
        const int64_t a = p.sizes[0] / 2;
        next.push_back({p.offset, {a}, p.strides, 1});
        next.push_back({p.offset + a * p.strides[0], {p.sizes[0] - a}, p.strides, 1});
        cut = true;
      } else {
        next.push_back(p);
      }
    }
    ps = std::move(next);
    if (!cut) break;
  }
  return ps;
}

}  // namespace

void oversubscribe_dma(Launch& l, const std::string& tensor) {
  for (const ObjectFifo& f : l.fifos)
    if (f.tensor == tensor && f.dir == FifoDir::Fill) {
      ObjectFifo twin = f;
      twin.name += "_again";
      l.fifos.push_back(std::move(twin));
      return;
    }
}

void apply_fifo_faults(ObjectFifo& f, const MappingFaults& faults, const Device& d) {
  if (faults.stale_buffer) f.resident = true;
  if (faults.bd_exhaustion) f.ddr = explode(f.ddr, int64_t(d.shim.bds) + 1, d);
}

}  // namespace detail
}  // namespace tessera::npusim
