#include "targets/cpu/weight_store.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <set>

#include "model/weights.h"
#include "targets/cpu/quant.h"
#include "util/error.h"
#include "util/mapped_file.h"

namespace tessera {

CpuWeightStore::CpuWeightStore(Bf16WeightStore::ParallelFor parallel_for)
    : parallel_for_(parallel_for), bf16_(std::move(parallel_for)) {}

CpuWeightStore::~CpuWeightStore() {
  for (const Arena& a : arenas_) ::munmap(a.p, a.size);
}

namespace {
constexpr size_t kHuge = size_t(2) << 20, kArena = size_t(64) << 20;

// Whether load() re-lays w as x16 tiles (else bf16, in Bf16WeightStore).
bool tiled(const Weight& w) {
  return cpu::x16_supported(w.info.dtype) && w.cols() % dtype_block_values(w.info.dtype) == 0;
}
int64_t tile_alloc_bytes(const Weight& w) {
  return (cpu::x16_bytes(w.info.dtype, w.rows(), w.cols()) + 63) / 64 * 64;
}
}  // namespace

// An anonymous mapping of `bytes` (rounded up to 4 KiB) starting on a 2 MiB boundary:
// mapped 2 MiB larger, the ends cut off, so that the mapping is exactly the arena. Its whole
// 2 MiB pages are advised huge; the partial last one is advised not, so that it is resident
// only as far as it is used (a huge page is resident whole, even under THP "always").
void CpuWeightStore::open_arena(size_t bytes) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t size = (bytes + page - 1) / page * page;
  void* m = ::mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  auto* raw = static_cast<uint8_t*>(m);
  auto* p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + kHuge - 1) / kHuge * kHuge);
  if (p > raw) ::munmap(raw, size_t(p - raw));
  if (const size_t tail = size_t(raw + size + kHuge - (p + size)); tail > 0) ::munmap(p + size, tail);
  const size_t whole = size / kHuge * kHuge;
  if (whole > 0) ::madvise(p, whole, MADV_HUGEPAGE);  // a hint: without it, 4 KiB pages
  if (size > whole) ::madvise(p + whole, size - whole, MADV_NOHUGEPAGE);
  arenas_.push_back({p, size});
  arena_next_ = p;
  arena_left_ = size;
}

void CpuWeightStore::reserve(const std::vector<const Weight*>& ws) {
  if (!arenas_.empty()) fail("CpuWeightStore::reserve: tiles were already loaded");
  std::set<std::string> seen;  // a tied embedding is listed twice
  int64_t bytes = 0;
  for (const Weight* w : ws)
    if (tiled(*w) && seen.insert(w->name).second) bytes += tile_alloc_bytes(*w);
  if (bytes > 0) open_arena(size_t(bytes));
}

// Tiles live in arenas on 2 MiB pages where the kernel gives them (transparent huge pages on
// request): a decode step streams every tile once, a 4 KiB page holding only 14 Q4_0 tiles
// (measured: full-size 1B Q4_0 decode +16%). One arena for many matrices, because a huge
// page is resident whole: a 2 MiB-aligned buffer per matrix left about 1 MiB of each
// matrix's last page unused but resident (130 MB for the 1B's 113). The runner reserve()s
// one arena for all its tiles; without that, arenas of 64 MiB or more, each one's last
// partly used huge page resident whole (2 MiB of the 135M model's 126 MB peak).
uint8_t* CpuWeightStore::allocate(int64_t bytes) {
  const size_t need = (size_t(bytes) + 63) / 64 * 64;
  if (arena_left_ < need) open_arena(std::max(kArena, (need + kHuge - 1) / kHuge * kHuge));
  uint8_t* out = arena_next_;
  arena_next_ += need;
  arena_left_ -= need;
  return out;
}

const cpu::WeightMatrix& CpuWeightStore::load(const Weight& w) {
  if (auto it = matrices_.find(w.name); it != matrices_.end()) return it->second;
  const DType t = w.info.dtype;
  const int64_t rows = w.rows(), cols = w.cols();
  if (!tiled(w)) {
    const int64_t mapped = bf16_.mapped_bytes();
    const cpu::WeightMatrix m(bf16_.load(w));
    format_[w.name] = bf16_.mapped_bytes() > mapped ? "bf16 mapped" : fmt::format("bf16 converted from {}", dtype_name(t));
    return matrices_[w.name] = m;
  }
  const int64_t bytes = cpu::x16_bytes(t, rows, cols);
  uint8_t* out = allocate(bytes);
  const uint64_t row_bytes = dtype_bytes(t, cols);
  const int64_t groups = (rows + cpu::kTileRows - 1) / cpu::kTileRows, blocks = cols / dtype_block_values(t);
  const int64_t tile = cpu::x16_tile_bytes(t);
  // Each group of 16 rows is independent: pack them in parallel, a batch at a time, and give
  // each batch's file pages back as soon as they are copied (read again only if another
  // reader, the oracle, asks for them), so the file's copy and the tiles of one large matrix
  // (a tied embedding) are not in memory together.
  auto pack = [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const uint8_t* src[cpu::kTileRows];
      for (int64_t i = 0; i < cpu::kTileRows; ++i) {
        const int64_t r = g * cpu::kTileRows + i;
        src[i] = r < rows ? w.info.data + uint64_t(w.source_row(r)) * row_bytes : nullptr;
      }
      for (int64_t b = 0; b < blocks; ++b) cpu::x16_pack_tile(t, src, b, out + (g * blocks + b) * tile);
    }
  };
  // About 1 MiB of tiles per batch; a permuted q/k matrix (rows read from anywhere in their
  // head) gives its pages back at the end instead.
  const int64_t batch = std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(1, tile * blocks));
  for (int64_t g0 = 0; g0 < groups; g0 += batch) {
    const int64_t g1 = std::min(groups, g0 + batch);
    if (parallel_for_) parallel_for_(g1 - g0, [&](int64_t a, int64_t b) { pack(g0 + a, g0 + b); });
    else pack(g0, g1);
    if (w.info.file && w.unpermute_head_dim == 0) {
      const int64_t r0 = g0 * cpu::kTileRows, r1 = std::min(rows, g1 * cpu::kTileRows);
      w.info.file->release(w.info.data + uint64_t(r0) * row_bytes, uint64_t(r1 - r0) * row_bytes);
    }
  }
  if (w.info.file) w.info.file->release(w.info.data, w.info.nbytes);
  tiled_bytes_ += bytes;
  format_[w.name] = fmt::format("{} x16 tiles", dtype_name(t));
  return matrices_[w.name] = cpu::WeightMatrix(t, out, rows, cols);
}

int64_t CpuWeightStore::arena_bytes() const {
  int64_t n = 0;
  for (const Arena& a : arenas_) n += int64_t(a.size);
  return n;
}

std::map<std::string, int64_t> CpuWeightStore::formats() const {
  std::map<std::string, int64_t> out;
  for (const auto& [name, f] : format_) ++out[f];
  return out;
}

const cpu::WeightMatrix& CpuWeightStore::get(const std::string& name) const {
  auto it = matrices_.find(name);
  if (it == matrices_.end()) fail("no cpu weight matrix '{}' was loaded", name);
  return it->second;
}

}  // namespace tessera
