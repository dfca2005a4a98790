#include "targets/npusim/spatial.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "util/error.h"

namespace tessera::npusim {

int elem_bytes(ElemType t) {
  switch (t) {
    case ElemType::BF16: return 2;
    case ElemType::F32: return 4;
    case ElemType::Q4_0: return 2 + 16;            // f16 d, 32 4-bit values
    case ElemType::Q8_0: return 2 + 32;            // f16 d, 32 int8 values
    case ElemType::Q4_1: return 2 + 2 + 16;        // f16 d, f16 m, 32 4-bit values
    case ElemType::Q5_0: return 2 + 4 + 16;        // f16 d, 32 fifth bits, 32 4-bit values
    case ElemType::Q5_1: return 2 + 2 + 4 + 16;    // f16 d, f16 m, fifth bits, 4-bit values
    case ElemType::Q4_K: return 2 + 2 + 12 + 128;  // f16 d, dmin, 8 6-bit scales and mins, 256 nibbles
    case ElemType::Q5_K: return 2 + 2 + 12 + 32 + 128;  // as Q4_K, with 256 fifth bits
    case ElemType::Q6_K: return 128 + 64 + 16 + 2;      // ql, qh, 16 int8 scales, f16 d
  }
  return 0;
}
namespace {
constexpr ElemType kAllTypes[] = {ElemType::BF16, ElemType::F32,  ElemType::Q4_0, ElemType::Q8_0, ElemType::Q4_1,
                                  ElemType::Q5_0, ElemType::Q5_1, ElemType::Q4_K, ElemType::Q5_K, ElemType::Q6_K};
}  // namespace
const char* elem_type_name(ElemType t) {
  switch (t) {
    case ElemType::BF16: return "bf16";
    case ElemType::F32: return "f32";
    case ElemType::Q4_0: return "q4_0";
    case ElemType::Q8_0: return "q8_0";
    case ElemType::Q4_1: return "q4_1";
    case ElemType::Q5_0: return "q5_0";
    case ElemType::Q5_1: return "q5_1";
    case ElemType::Q4_K: return "q4_k";
    case ElemType::Q5_K: return "q5_k";
    case ElemType::Q6_K: return "q6_k";
  }
  return "?";
}
bool is_block(ElemType t) { return t != ElemType::BF16 && t != ElemType::F32; }
int block_values(ElemType t) {
  if (!is_block(t)) return 1;
  return t == ElemType::Q4_K || t == ElemType::Q5_K || t == ElemType::Q6_K ? 256 : 32;
}
ElemType elem_type_from_name(const std::string& name) {
  std::string names;
  for (ElemType t : kAllTypes) {
    if (name == elem_type_name(t)) return t;
    names += (names.empty() ? "" : ", ") + std::string(elem_type_name(t));
  }
  fail("npusim: no element type '{}' ({})", name, names);
}

const char* fifo_dir_name(FifoDir d) { return d == FifoDir::Fill ? "fill" : "drain"; }
const char* fifo_kind_name(FifoKind k) {
  switch (k) {
    case FifoKind::Forward: return "forward";
    case FifoKind::Split: return "split";
    case FifoKind::Join: return "join";
    case FifoKind::Broadcast: return "broadcast";
  }
  return "?";
}
const char* sync_name(Sync s) {
  switch (s) {
    case Sync::EveryCall: return "every-call";
    case Sync::Once: return "once (resident)";
    case Sync::ZeroCopy: return "zero-copy";
    case Sync::DeviceOnly: return "device-only";
  }
  return "?";
}

int64_t AccessPattern::elements() const {
  int64_t n = sizes.empty() ? 0 : 1;
  for (int64_t s : sizes) n *= s;
  return n * repeat;
}

std::pair<int64_t, int64_t> AccessPattern::extent() const {
  int64_t lo = offset, hi = offset;
  for (size_t d = 0; d < std::min(sizes.size(), strides.size()); ++d) {  // mismatches: the checker's
    if (sizes[d] <= 0) return {offset, offset};
    const int64_t span = (sizes[d] - 1) * strides[d];
    (span < 0 ? lo : hi) += span;
  }
  return {lo, hi};
}

std::string AccessPattern::describe() const {
  std::string s = fmt::format("off {} sizes [{}] strides [{}]", offset, fmt::join(sizes, ","), fmt::join(strides, ","));
  if (repeat != 1) s += fmt::format(" x{}", repeat);
  return s;
}

nlohmann::json AccessPattern::to_json() const {
  return {{"offset", offset}, {"sizes", sizes}, {"strides", strides}, {"repeat", repeat}};
}

AccessPattern AccessPattern::contiguous(int64_t offset, int64_t n) { return {offset, {n}, {1}, 1}; }

AccessPattern AccessPattern::block2d(int64_t offset, int64_t rows, int64_t cols, int64_t ld) {
  return {offset, {rows, cols}, {ld, 1}, 1};
}

std::vector<AccessPattern> bd_chain(int64_t offset, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                                    int max_dims) {
  if (sizes.size() != strides.size()) fail("bd_chain: {} sizes but {} strides", sizes.size(), strides.size());
  std::vector<int64_t> sz, st;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    if (!sz.empty() && st.back() == sizes[d] * strides[d]) {
      sz.back() *= sizes[d];
      st.back() = strides[d];
    } else {
      sz.push_back(sizes[d]);
      st.push_back(strides[d]);
    }
  }
  if (sz.empty()) return {AccessPattern{offset, {1}, {1}, 1}};
  int64_t repeat = 1;
  if (sz.size() > 1 && st.front() == 0) {
    repeat = sz.front();
    sz.erase(sz.begin());
    st.erase(st.begin());
  }
  if (int(sz.size()) <= max_dims) return {AccessPattern{offset, sz, st, repeat}};
  // Too deep: one BD per index of the outer dimensions (repeat applies to the whole chain,
  // so it is unrolled too).
  std::vector<AccessPattern> out;
  const size_t outer = sz.size() - size_t(max_dims);
  std::vector<int64_t> idx(outer, 0);
  for (int64_t r = 0; r < repeat; ++r) {
    std::fill(idx.begin(), idx.end(), 0);
    while (true) {
      int64_t off = offset;
      for (size_t d = 0; d < outer; ++d) off += idx[d] * st[d];
      out.push_back(AccessPattern{off, {sz.begin() + outer, sz.end()}, {st.begin() + outer, st.end()}, 1});
      size_t d = outer;
      while (d > 0 && ++idx[d - 1] == sz[d - 1]) idx[--d] = 0;
      if (d == 0) break;
    }
  }
  return out;
}

int64_t ObjectFifo::stream_elements() const {
  int64_t n = 0;
  for (const auto& p : ddr) n += p.elements();
  return n;
}

int64_t ObjectFifo::objects() const { return object_elems > 0 ? stream_elements() / object_elems : 0; }

const Worker* Launch::worker_at(Tile t) const {
  for (const auto& w : workers)
    if (w.tile == t) return &w;
  return nullptr;
}

const ObjectFifo* Launch::fifo(const std::string& n) const {
  for (const auto& f : fifos)
    if (f.name == n) return &f;
  return nullptr;
}

const HostBuffer* Dispatch::buffer(const std::string& n) const {
  for (const auto& b : buffers)
    if (b.name == n) return &b;
  return nullptr;
}

nlohmann::json to_json(const Worker& w) {
  nlohmann::json bufs = nlohmann::json::array();
  for (const auto& b : w.buffers) bufs.push_back({{"name", b.name}, {"bytes", b.bytes}, {"depth", b.depth}});
  return {{"name", w.name},
          {"tile", {w.tile.col, w.tile.row}},
          {"kernel", w.kernel},
          {"buffers", bufs},
          {"stack_bytes", w.stack_bytes},
          {"cost",
           {{"kernel_class", w.cost.kernel_class},
            {"dtype", w.cost.dtype},
            {"macs", w.cost.macs},
            {"vector_ops", w.cost.vector_ops},
            {"iterations", w.cost.iterations}}},
          {"params", w.params}};
}

nlohmann::json to_json(const ObjectFifo& f) {
  nlohmann::json j = {{"name", f.name},
                      {"dir", fifo_dir_name(f.dir)},
                      {"kind", fifo_kind_name(f.kind)},
                      {"type", elem_type_name(f.type)},
                      {"tensor", f.tensor},
                      {"shim", {f.shim.col, f.shim.row}},
                      {"object_elems", f.object_elems},
                      {"depth", f.depth},
                      {"mem_depth", f.mem_depth},
                      {"mem_object_elems", f.mem_object_elems > 0 ? f.mem_object_elems : f.object_elems},
                      {"resident", f.resident}};
  if (f.memtile) j["memtile"] = {f.memtile->col, f.memtile->row};
  j["ddr"] = nlohmann::json::array();
  for (const auto& p : f.ddr) j["ddr"].push_back(p.to_json());
  j["ends"] = nlohmann::json::array();
  for (const auto& e : f.ends) {
    nlohmann::json je = {{"tile", {e.tile.col, e.tile.row}}, {"offset", e.offset}, {"elems", f.end_elems(e)}};
    if (e.mem_pattern) je["mem_pattern"] = e.mem_pattern->to_json();
    j["ends"].push_back(je);
  }
  return j;
}

nlohmann::json Launch::to_json() const {
  nlohmann::json j = {{"name", name}, {"kernel", kernel}, {"herd", {herd_cols, herd_rows}}, {"loop_order", loop_order}};
  j["workers"] = nlohmann::json::array();
  for (const auto& w : workers) j["workers"].push_back(npusim::to_json(w));
  j["fifos"] = nlohmann::json::array();
  for (const auto& f : fifos) j["fifos"].push_back(npusim::to_json(f));
  if (!links.empty()) {
    j["links"] = nlohmann::json::array();
    for (const auto& f : links) {
      nlohmann::json c = nlohmann::json::array();
      for (const Tile& t : f.consumers) c.push_back({t.col, t.row});
      nlohmann::json jl = {{"name", f.name},       {"type", elem_type_name(f.type)}, {"producer", {f.producer.col, f.producer.row}},
                           {"consumers", c},       {"object_elems", f.object_elems}, {"objects", f.objects},
                           {"depth", f.depth},     {"mem_depth", f.mem_depth}};
      if (f.memtile) jl["memtile"] = {f.memtile->col, f.memtile->row};
      j["links"].push_back(jl);
    }
  }
  return j;
}

nlohmann::json Dispatch::to_json() const {
  nlohmann::json j = {{"name", name}};
  j["buffers"] = nlohmann::json::array();
  for (const auto& b : buffers)
    j["buffers"].push_back({{"name", b.name},
                            {"type", elem_type_name(b.type)},
                            {"elems", b.elems},
                            {"sync", sync_name(b.sync)},
                            {"to_device", b.to_device},
                            {"from_device", b.from_device}});
  j["launches"] = nlohmann::json::array();
  for (const auto& l : launches) j["launches"].push_back(l.to_json());
  return j;
}

std::string Launch::describe() const {
  std::string s = fmt::format("launch {}: {} on a {}x{} herd ({} workers)\n", name, kernel, herd_cols, herd_rows,
                              workers.size());
  if (!loop_order.empty()) s += fmt::format("  loop order: {}\n", loop_order);
  for (const auto& w : workers) {
    s += fmt::format("  worker {} on {}: kernel {}, stack {} B", w.name, to_string(w.tile), w.kernel, w.stack_bytes);
    for (const auto& b : w.buffers) s += fmt::format(", {} {}x{} B", b.name, b.depth, b.bytes);
    s += "\n";
  }
  for (const auto& f : fifos) {
    s += fmt::format("  fifo {} ({} {}, {}): {} {} via shim {}{}, object {} x {} ({} B), depth {} (L2 {}), {} "
                     "objects{}\n",
                     f.name, fifo_dir_name(f.dir), fifo_kind_name(f.kind), elem_type_name(f.type),
                     f.dir == FifoDir::Fill ? "from" : "to", f.tensor, to_string(f.shim),
                     f.memtile ? " and memtile " + to_string(*f.memtile) : std::string(), f.object_elems,
                     elem_type_name(f.type), f.object_bytes(), f.depth, f.mem_depth, f.objects(),
                     f.resident ? ", resident" : "");
    for (const auto& p : f.ddr) s += fmt::format("    ddr BD: {}\n", p.describe());
    for (const auto& e : f.ends) {
      s += fmt::format("    end {}: elems [{}, {})", to_string(e.tile), e.offset, e.offset + f.end_elems(e));
      if (e.mem_pattern) s += " memtile pattern " + e.mem_pattern->describe();
      s += "\n";
    }
  }
  return s;
}

std::string Dispatch::describe() const {
  std::string s = fmt::format("dispatch {}: {} launch(es)\n", name, launches.size());
  for (const auto& b : buffers)
    s += fmt::format("  buffer {} {} x {} ({} B), sync {}{}{}\n", b.name, b.elems, elem_type_name(b.type), b.bytes(),
                     sync_name(b.sync), b.to_device ? ", in" : "", b.from_device ? ", out" : "");
  for (const auto& l : launches) s += l.describe();
  return s;
}

}  // namespace tessera::npusim
