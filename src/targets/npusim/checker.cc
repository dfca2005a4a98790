#include "targets/npusim/checker.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

namespace tessera::npusim {

namespace {

std::string bytes_term(const std::string& name, int64_t depth, int64_t bytes) {
  return depth == 1 ? fmt::format("{} {}", name, bytes) : fmt::format("{} {}x{}", name, depth, bytes);
}

// BDs one DDR-side pattern needs: the BD repeat counter holds at most bd_repeat_max.
int64_t pattern_bds(const AccessPattern& p, const Device& d) {
  return std::max<int64_t>(1, (p.repeat + d.bd_repeat_max - 1) / d.bd_repeat_max);
}

}  // namespace

std::vector<TileUsage> tile_usage(const Launch& l, const Device& d) {
  std::map<Tile, TileUsage> u;
  auto at = [&](Tile t) -> TileUsage& {
    auto& x = u[t];
    x.tile = t;
    x.kind = d.kind(t);
    return x;
  };
  auto add_mem = [](TileUsage& x, int64_t bytes, const std::string& term) {
    x.memory_bytes += bytes;
    x.memory_terms += (x.memory_terms.empty() ? "" : " + ") + term;
  };
  for (const auto& f : l.fifos) {
    const bool fill = f.dir == FifoDir::Fill;
    const int legs = (f.kind == FifoKind::Split || f.kind == FifoKind::Join) ? int(f.ends.size()) : 1;
    if (f.l2_side) {
      // The memory tile walks the buffer it holds: its BDs carry the DDR-side patterns, one
      // channel per leg towards the compute tiles; no shim leg, no ring (the buffer is the
      // dispatch's, counted by the lowering's L2 arena).
      auto& m = at(f.l2_tile(d.mem_row));
      for (const auto& p : f.ddr) m.bds += int(pattern_bds(p, d));
      (fill ? m.mm2s : m.s2mm) += legs;
      m.locks += 2 * legs;
    } else {
      auto& shim = at(f.shim);
      (fill ? shim.mm2s : shim.s2mm) += 1;
      for (const auto& p : f.ddr) shim.bds += int(pattern_bds(p, d));
    }
    if (f.memtile && !f.l2_side) {
      auto& m = at(*f.memtile);
      add_mem(m, f.mem_depth * f.mem_object_bytes(), bytes_term(f.name, f.mem_depth, f.mem_object_bytes()));
      // One channel (and its BD ring and lock pair) towards the shim, one per leg towards
      // the compute tiles; a broadcast is one multicast leg.
      (fill ? m.s2mm : m.mm2s) += 1;
      (fill ? m.mm2s : m.s2mm) += legs;
      m.bds += f.mem_depth * (1 + legs);
      m.locks += 2 * (1 + legs);
    }
    for (const auto& e : f.ends) {
      auto& t = at(e.tile);
      const int64_t bytes = f.end_elems(e) * elem_bytes(f.type);
      add_mem(t, f.depth * bytes, bytes_term(f.name, f.depth, bytes));
      (fill ? t.s2mm : t.mm2s) += 1;
      t.bds += f.depth;
      t.locks += 2;
    }
  }
  for (const auto& f : l.links) {
    // A ring on the producer and on every consumer; one outgoing channel on the producer, one
    // incoming per consumer; through a memory tile one channel in and one multicast leg out.
    for (size_t k = 0; k <= f.consumers.size(); ++k) {
      auto& t = at(k == 0 ? f.producer : f.consumers[k - 1]);
      add_mem(t, f.depth * f.object_bytes(), bytes_term(f.name, f.depth, f.object_bytes()));
      (k == 0 ? t.mm2s : t.s2mm) += 1;
      t.bds += f.depth;
      t.locks += 2;
    }
    if (f.memtile) {
      auto& m = at(*f.memtile);
      add_mem(m, f.mem_depth * f.object_bytes(), bytes_term(f.name, f.mem_depth, f.object_bytes()));
      m.s2mm += 1;
      m.mm2s += 1;
      m.bds += 2 * f.mem_depth;
      m.locks += 4;
    }
  }
  for (const auto& w : l.workers) {
    auto& t = at(w.tile);
    for (const auto& b : w.buffers) add_mem(t, b.depth * b.bytes, bytes_term(b.name, b.depth, b.bytes));
    add_mem(t, w.stack_bytes, fmt::format("stack {}", w.stack_bytes));
  }
  std::vector<TileUsage> out;
  for (auto& [_, x] : u) out.push_back(x);
  return out;
}

std::vector<Refusal> check(const Launch& l, const Device& d) {
  std::vector<Refusal> r;
  auto refuse = [&](std::string code, Tile t, int64_t needed, int64_t available, std::string text) {
    r.push_back({std::move(code), t, needed, available, fmt::format("tile {}: {}", to_string(t), text)});
  };

  // Placement.
  std::map<Tile, int> workers_on;
  for (const auto& w : l.workers) {
    const TileKind k = d.kind(w.tile);
    if (k == TileKind::Outside)
      refuse("placement", w.tile, 0, 0,
             fmt::format("worker {} is outside the {}x{} array", w.name, d.columns, d.rows));
    else if (k != TileKind::Compute)
      refuse("placement", w.tile, 0, 0,
             fmt::format("worker {} is on a {} tile (compute tiles are rows {}-{})", w.name, tile_kind_name(k),
                         d.first_compute_row, d.rows - 1));
    if (++workers_on[w.tile] == 2)
      refuse("placement", w.tile, 2, 1, fmt::format("more than one worker ({} and another)", w.name));
    if (w.cost.kernel_class == "gemv") {
      const int64_t k_len = w.params.is_object() ? w.params.value("k", int64_t(0)) : 0;
      if (k_len > d.gemv_max_k)
        refuse("vector-length", w.tile, k_len, d.gemv_max_k,
               fmt::format("GEMV K {} exceeds the {} the bf16 vector kernel handles ({} lanes); split K", k_len,
                           d.gemv_max_k, d.vector_lanes_bf16));
    }
  }
  for (const auto& f : l.fifos) {
    if (d.kind(f.shim) != TileKind::Shim)
      refuse("placement", f.shim, 0, 0,
             fmt::format("fifo {}: its DDR side must be a shim tile (row {}), is {}", f.name, d.shim_row,
                         tile_kind_name(d.kind(f.shim))));
    if (f.memtile && d.kind(*f.memtile) != TileKind::Mem)
      refuse("placement", *f.memtile, 0, 0,
             fmt::format("fifo {}: its memory tile must be on row {}, is {}", f.name, d.mem_row,
                         tile_kind_name(d.kind(*f.memtile))));
    if (!f.memtile && (f.kind == FifoKind::Split || f.kind == FifoKind::Join))
      refuse("placement", f.shim, 0, 0, fmt::format("fifo {}: a {} needs a memory tile", f.name, fifo_kind_name(f.kind)));
    const bool fill = f.dir == FifoDir::Fill;
    if ((fill && f.kind == FifoKind::Join) || (!fill && (f.kind == FifoKind::Split || f.kind == FifoKind::Broadcast)))
      refuse("fifo-shape", f.shim, 0, 0,
             fmt::format("fifo {}: a {} fifo cannot {}", f.name, fifo_dir_name(f.dir), fifo_kind_name(f.kind)));
    if (f.ends.empty()) refuse("fifo-shape", f.shim, 0, 0, fmt::format("fifo {} has no compute-tile end", f.name));
    if (f.kind == FifoKind::Forward && f.ends.size() > 1)
      refuse("fifo-shape", f.shim, int64_t(f.ends.size()), 1,
             fmt::format("fifo {}: a forward fifo has one end, has {}", f.name, f.ends.size()));
    if (f.object_elems <= 0) {
      refuse("fifo-shape", f.shim, 0, 0, fmt::format("fifo {}: object size must be > 0", f.name));
      continue;
    }
    if (f.mem_object_elems > 0 &&
        (f.mem_object_elems % f.object_elems != 0 || f.kind == FifoKind::Split || f.kind == FifoKind::Join))
      refuse("fifo-shape", f.memtile.value_or(f.shim), f.mem_object_elems, f.object_elems,
             fmt::format("fifo {}: an L2 object ({} elements) must be a whole number of L1 objects ({}) on a forward "
                         "or broadcast fifo",
                         f.name, f.mem_object_elems, f.object_elems));
    if (f.depth < 1 || f.mem_depth < 1)
      refuse("fifo-shape", f.shim, 0, 1, fmt::format("fifo {}: depth must be >= 1", f.name));
    for (const auto& p : f.ddr) {
      if (p.sizes.size() != p.strides.size())
        refuse("fifo-shape", f.shim, int64_t(p.sizes.size()), int64_t(p.strides.size()),
               fmt::format("fifo {}: pattern has {} sizes but {} strides", f.name, p.sizes.size(), p.strides.size()));
      if (int(p.sizes.size()) > d.max_dims)
        refuse("bd-dims", f.shim, int64_t(p.sizes.size()), d.max_dims,
               fmt::format("fifo {}: access pattern has {} dimensions, a BD expresses {}", f.name, p.sizes.size(),
                           d.max_dims));
      if (p.repeat < 1)
        refuse("bd-repeat", f.shim, p.repeat, d.bd_repeat_max, fmt::format("fifo {}: repeat must be >= 1", f.name));
    }
    if (f.stream_elements() % f.object_elems != 0)
      refuse("fifo-shape", f.shim, f.stream_elements(), f.object_elems,
             fmt::format("fifo {}: the DDR transfer ({} elements) is not a whole number of {}-element objects", f.name,
                         f.stream_elements(), f.object_elems));
    for (const auto& e : f.ends) {
      if (!l.worker_at(e.tile))
        refuse("placement", e.tile, 0, 0, fmt::format("fifo {}: no worker on its end tile", f.name));
      const int64_t n = f.end_elems(e);
      if (e.offset < 0 || e.offset + n > f.object_elems)
        refuse("fifo-shape", e.tile, e.offset + n, f.object_elems,
               fmt::format("fifo {}: end slice [{}, {}) lies outside the {}-element object", f.name, e.offset,
                           e.offset + n, f.object_elems));
      if (e.mem_pattern) {
        const auto [lo, hi] = e.mem_pattern->extent();
        if (e.mem_pattern->elements() != n || lo < 0 || hi >= f.object_elems)
          refuse("fifo-shape", e.tile, e.mem_pattern->elements(), n,
                 fmt::format("fifo {}: memtile pattern ({}) must visit {} elements inside the object", f.name,
                             e.mem_pattern->describe(), n));
        if (int(e.mem_pattern->sizes.size()) > d.max_dims)
          refuse("bd-dims", f.memtile.value_or(e.tile), int64_t(e.mem_pattern->sizes.size()), d.max_dims,
                 fmt::format("fifo {}: memtile pattern has {} dimensions, a BD expresses {}", f.name,
                             e.mem_pattern->sizes.size(), d.max_dims));
      }
    }
  }

  for (const auto& f : l.links) {
    if (!l.worker_at(f.producer))
      refuse("placement", f.producer, 0, 0, fmt::format("link fifo {}: no worker on its producer tile", f.name));
    if (f.consumers.empty()) refuse("fifo-shape", f.producer, 0, 1, fmt::format("link fifo {} has no consumer", f.name));
    for (const Tile& c : f.consumers)
      if (!l.worker_at(c)) refuse("placement", c, 0, 0, fmt::format("link fifo {}: no worker on its consumer tile", f.name));
    if (f.memtile && d.kind(*f.memtile) != TileKind::Mem)
      refuse("placement", *f.memtile, 0, 0,
             fmt::format("link fifo {}: its memory tile must be on row {}", f.name, d.mem_row));
    if (f.depth < 1 || f.mem_depth < 1)
      refuse("fifo-shape", f.producer, std::min(f.depth, f.mem_depth), 1,
             fmt::format("link fifo {}: depth must be >= 1 (a ring of {} cannot hold an object)", f.name,
                         std::min(f.depth, f.mem_depth)));
    if (f.object_elems <= 0 || f.objects < 0)
      refuse("fifo-shape", f.producer, 0, 0, fmt::format("link fifo {}: object size and count must be positive", f.name));
  }

  // Resources per tile.
  for (const auto& u : tile_usage(l, d)) {
    if (u.kind == TileKind::Outside) continue;
    const TileResources& res = d.resources(u.kind);
    if (u.kind == TileKind::Compute && u.memory_bytes > d.l1_bytes)
      refuse("l1-overflow", u.tile, u.memory_bytes, d.l1_bytes,
             fmt::format("L1 needs {} B ({}), has {} B", u.memory_bytes, u.memory_terms, d.l1_bytes));
    if (u.kind == TileKind::Mem && u.memory_bytes > d.l2_bytes)
      refuse("l2-overflow", u.tile, u.memory_bytes, d.l2_bytes,
             fmt::format("L2 needs {} B ({}), has {} B", u.memory_bytes, u.memory_terms, d.l2_bytes));
    if (u.mm2s > res.dma_mm2s)
      refuse("dma-channels", u.tile, u.mm2s, res.dma_mm2s,
             fmt::format("needs {} MM2S (outgoing) DMA channels, a {} tile has {}", u.mm2s, tile_kind_name(u.kind),
                         res.dma_mm2s));
    if (u.s2mm > res.dma_s2mm)
      refuse("dma-channels", u.tile, u.s2mm, res.dma_s2mm,
             fmt::format("needs {} S2MM (incoming) DMA channels, a {} tile has {}", u.s2mm, tile_kind_name(u.kind),
                         res.dma_s2mm));
    if (u.bds > res.bds)
      refuse("bd-exhaustion", u.tile, u.bds, res.bds,
             fmt::format("needs {} buffer descriptors, a {} tile has {}", u.bds, tile_kind_name(u.kind), res.bds));
    if (u.locks > res.locks)
      refuse("lock-exhaustion", u.tile, u.locks, res.locks,
             fmt::format("needs {} locks, a {} tile has {}", u.locks, tile_kind_name(u.kind), res.locks));
  }
  return r;
}

std::vector<Refusal> check(const Dispatch& dispatch, const Device& d) {
  std::vector<Refusal> r;
  for (const auto& l : dispatch.launches) {
    auto lr = check(l, d);
    for (auto& x : lr) x.text = fmt::format("launch {}: {}", l.name, x.text);
    r.insert(r.end(), lr.begin(), lr.end());
    for (const auto& f : l.fifos) {
      const HostBuffer* b = dispatch.buffer(f.tensor);
      if (!b) {
        r.push_back({"fifo-shape", f.shim, 0, 0,
                     fmt::format("launch {}: tile {}: fifo {} uses tensor '{}' that the dispatch does not declare",
                                 l.name, to_string(f.shim), f.name, f.tensor)});
        continue;
      }
      for (const auto& p : f.ddr) {
        const auto [lo, hi] = p.extent();
        if (lo < 0 || hi >= b->elems)
          r.push_back({"fifo-shape", f.shim, hi + 1, b->elems,
                       fmt::format("launch {}: tile {}: fifo {} pattern ({}) reaches elements [{}, {}] of '{}' "
                                   "({} elements)",
                                   l.name, to_string(f.shim), f.name, p.describe(), lo, hi, f.tensor, b->elems)});
      }
    }
  }
  return r;
}

std::string describe(const std::vector<Refusal>& refusals) {
  std::string s;
  for (const auto& x : refusals) s += fmt::format("{}: {}\n", x.code, x.text);
  return s;
}

nlohmann::json to_json(const Refusal& x) {
  return {{"code", x.code},
          {"tile", {x.tile.col, x.tile.row}},
          {"needed", x.needed},
          {"available", x.available},
          {"text", x.text}};
}

nlohmann::json to_json(const std::vector<Refusal>& refusals) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& x : refusals) j.push_back(to_json(x));
  return j;
}

}  // namespace tessera::npusim
