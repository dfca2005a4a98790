// npusim checker: it refuses mappings that do not fit, with the numbers, and accepts those that do.
#include <gtest/gtest.h>

#include "targets/npusim/mappings.h"
#include "targets/npusim/checker.h"
#include "npusim_examples.h"
#include "targets/npusim/mappings_gemm.h"
#include "test_support.h"

namespace tessera::npusim {
namespace {

using testing_support::xdna2;

bool has(const std::vector<Refusal>& r, const std::string& code) {
  for (const auto& x : r)
    if (x.code == code) return true;
  return false;
}

// One worker on (2,3) with three fifos A, B (fill) and C (drain) of the given sizes.
Launch one_tile(int64_t a_elems, int64_t b_elems, int64_t c_elems, int64_t stack = 1024) {
  const Device& d = xdna2();
  Launch l;
  l.name = "one";
  l.herd_cols = l.herd_rows = 1;
  Worker w;
  w.name = "w";
  w.tile = {2, 3};
  w.kernel = "k";
  w.stack_bytes = stack;
  l.workers.push_back(w);
  auto fifo = [&](const char* name, int64_t elems, int depth, FifoDir dir) {
    ObjectFifo f;
    f.name = name;
    f.dir = dir;
    f.tensor = name;
    f.shim = {2, d.shim_row};
    f.memtile = Tile{2, d.mem_row};
    f.object_elems = elems;
    f.depth = depth;
    f.ddr = {AccessPattern::contiguous(0, elems * 4)};
    f.ends = {{{2, 3}, 0, 0, std::nullopt}};
    return f;
  };
  l.fifos.push_back(fifo("A", a_elems, 2, FifoDir::Fill));
  l.fifos.push_back(fifo("B", b_elems, 2, FifoDir::Fill));
  l.fifos.push_back(fifo("C", c_elems, 1, FifoDir::Drain));
  return l;
}

TEST(NpusimChecker, RefusesL1OverflowWithTheNumbers) {
  // 2 x 16384 + 2 x 16384 + 4096 + 1024 = 70656 B > 65536 B.
  const auto r = check(one_tile(8192, 8192, 2048), xdna2());
  ASSERT_EQ(r.size(), 1u) << describe(r);
  EXPECT_EQ(r[0].code, "l1-overflow");
  EXPECT_EQ(r[0].tile, (Tile{2, 3}));
  EXPECT_EQ(r[0].needed, 70656);
  EXPECT_EQ(r[0].available, 65536);
  EXPECT_EQ(r[0].text, "tile (2,3): L1 needs 70656 B (A 2x16384 + B 2x16384 + C 4096 + stack 1024), has 65536 B");
  // The same mapping with smaller objects fits.
  EXPECT_TRUE(check(one_tile(4096, 4096, 2048), xdna2()).empty());
}

TEST(NpusimChecker, RefusesBdExhaustionAndRepeatsBeyondTheCounter) {
  Launch l = one_tile(1024, 1024, 1024);
  // 20 chained BDs on the shim for A (a tile-by-tile walk without multi-dim patterns).
  l.fifos[0].ddr.clear();
  for (int i = 0; i < 20; ++i) l.fifos[0].ddr.push_back(AccessPattern::contiguous(i * 1024, 1024));
  auto r = check(l, xdna2());
  ASSERT_TRUE(has(r, "bd-exhaustion")) << describe(r);
  for (const auto& x : r)
    if (x.code == "bd-exhaustion") {
      EXPECT_EQ(x.tile, (Tile{2, 0}));
      EXPECT_EQ(x.needed, 20 + 1 + 1);
      EXPECT_EQ(x.available, 16);
    }
  // One BD repeated 1000 times needs ceil(1000 / 255) = 4 BDs: fits, and counts.
  l = one_tile(1024, 1024, 1024);
  l.fifos[0].ddr = {AccessPattern{0, {1024}, {1}, 1000}};
  const auto usage = tile_usage(l, xdna2());
  for (const auto& u : usage)
    if (u.tile == Tile{2, 0}) {
      EXPECT_EQ(u.bds, 4 + 1 + 1);
    }
  EXPECT_TRUE(check(l, xdna2()).empty()) << describe(check(l, xdna2()));
  // Five dimensions do not fit one BD.
  l.fifos[0].ddr = {AccessPattern{0, {2, 2, 2, 2, 64}, {1, 1, 1, 1, 1}, 1}};
  r = check(l, xdna2());
  EXPECT_TRUE(has(r, "bd-dims")) << describe(r);
}

TEST(NpusimChecker, RefusesPlacementOutsideTheArrayAndOnTheWrongRow) {
  Launch l = one_tile(1024, 1024, 1024);
  l.workers[0].tile = {8, 3};
  for (auto& f : l.fifos) f.ends[0].tile = {8, 3};
  auto r = check(l, xdna2());
  ASSERT_TRUE(has(r, "placement")) << describe(r);
  EXPECT_NE(describe(r).find("outside the 8x6 array"), std::string::npos) << describe(r);

  l = one_tile(1024, 1024, 1024);
  l.workers[0].tile = {2, 1};  // a memory tile
  for (auto& f : l.fifos) f.ends[0].tile = {2, 1};
  r = check(l, xdna2());
  ASSERT_TRUE(has(r, "placement")) << describe(r);
  EXPECT_NE(describe(r).find("memory tile"), std::string::npos) << describe(r);

  l = one_tile(1024, 1024, 1024);
  l.fifos[0].shim = {2, 2};  // DDR through a compute tile
  EXPECT_TRUE(has(check(l, xdna2()), "placement"));
}

TEST(NpusimChecker, RefusesGemvKBeyondTheVectorLimit) {
  Launch ok = example_gemv_launch(256, 8160, 8, 1, xdna2());
  EXPECT_TRUE(check(ok, xdna2()).empty()) << describe(check(ok, xdna2()));
  Launch big = example_gemv_launch(256, 8192, 8, 1, xdna2());
  const auto r = check(big, xdna2());
  ASSERT_TRUE(has(r, "vector-length")) << describe(r);
  for (const auto& x : r)
    if (x.code == "vector-length") {
      EXPECT_EQ(x.needed, 8192);
      EXPECT_EQ(x.available, 8160);
    }
}

TEST(NpusimChecker, RefusesDmaChannelAndLockExhaustion) {
  Launch l = one_tile(1024, 1024, 1024);
  auto extra = l.fifos[0];
  extra.name = "D";
  l.fifos.push_back(extra);  // a third incoming stream into one compute tile (and shim)
  const auto r = check(l, xdna2());
  ASSERT_TRUE(has(r, "dma-channels")) << describe(r);
  bool compute_tile = false;
  for (const auto& x : r)
    if (x.code == "dma-channels" && x.tile == Tile{2, 3}) {
      compute_tile = true;
      EXPECT_EQ(x.needed, 3);
      EXPECT_EQ(x.available, 2);
    }
  EXPECT_TRUE(compute_tile) << describe(r);
}

TEST(NpusimChecker, RefusesL2Overflow) {
  Launch l = one_tile(1024, 1024, 1024);
  l.fifos[0].mem_object_elems = 1024 * 160;  // 320 KiB x 2 in one memory tile
  const auto r = check(l, xdna2());
  ASSERT_TRUE(has(r, "l2-overflow")) << describe(r);
}

TEST(NpusimChecker, AcceptsTheCalibrationMappings) {
  const Device& d = xdna2();
  for (const Launch& l : {gemm_launch({2048, 2048, 2048}, {64, 32, 64, 256}, {8, 4, true}, d),
                          gemm_launch({2048, 8192, 2048}, {64, 32, 64, 256}, {8, 4, true}, d),
                          gemm_launch({2048, 2048, 512}, {64, 32, 128, 64}, {8, 4, false}, d),
                          gemm_launch({256, 512, 256}, {32, 32, 32, 0}, {4, 2, true}, d, {.b_nk = true}),
                          attention_launch({2048, 0, 32, 8, 64}, {}, d), example_add_launch(2048 * 2048, 8, 1024, d),
                          example_gemv_launch(2048, 2048, 8, 4, d)})
    EXPECT_TRUE(check(l, d).empty()) << l.name << ":\n" << describe(check(l, d));
  // Tiles too large for L1: n = 256 needs 2 x 32 KiB of B alone plus C.
  const auto r = check(gemm_launch({2048, 2048, 2048}, {64, 32, 256, 256}, {8, 4, true}, d), d);
  EXPECT_TRUE(has(r, "l1-overflow")) << describe(r);
}

}  // namespace
}  // namespace tessera::npusim
