// npusim device profiles: the built-in xdna2 profile and the validation of user profiles.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "targets/npusim/device.h"
#include "util/error.h"

namespace tessera::npusim {
namespace {

TEST(NpusimDevice, Xdna2ProfileLoadsWithTheReferenceFigures) {
  const Device d = load_device("xdna2");
  EXPECT_EQ(d.name, "xdna2");
  EXPECT_EQ(d.columns, 8);
  EXPECT_EQ(d.rows, 6);
  EXPECT_EQ(d.compute_tiles(), 32);
  EXPECT_EQ(d.l1_bytes, 65536);
  EXPECT_EQ(d.l1_banks, 4);
  EXPECT_EQ(d.l2_bytes, 512 * 1024);
  EXPECT_EQ(d.mem.dma_mm2s, 6);
  EXPECT_EQ(d.compute.dma_s2mm, 2);
  EXPECT_EQ(d.mem.bds, 48);
  EXPECT_EQ(d.shim.bds, 16);
  EXPECT_EQ(d.mem.locks, 64);
  EXPECT_EQ(d.bd_repeat_max, 255);
  EXPECT_EQ(d.macs_per_cycle_for("bf16"), 256);
  EXPECT_EQ(d.vector_lanes_bf16, 32);
  EXPECT_EQ(d.gemv_max_k, 8160);
  EXPECT_GE(d.dispatch_us, 43);  // fitted on the measured 43-52 us
  EXPECT_LE(d.dispatch_us, 52);
  EXPECT_EQ(d.kind({0, 0}), TileKind::Shim);
  EXPECT_EQ(d.kind({3, 1}), TileKind::Mem);
  EXPECT_EQ(d.kind({7, 5}), TileKind::Compute);
  EXPECT_EQ(d.kind({8, 2}), TileKind::Outside);
  EXPECT_EQ(d.kind({0, 6}), TileKind::Outside);
  // Every figure names its source; the ones xdna2.md calls uncertain say so.
  for (const auto& f : d.figures) EXPECT_FALSE(f.source.empty()) << f.key;
  for (const char* key : {"clock.hz", "stream.bytes_per_cycle", "ddr.npu_bytes_per_s"}) {
    ASSERT_NE(d.figure(key), nullptr) << key;
    EXPECT_TRUE(d.figure(key)->uncertain) << key;
  }
  EXPECT_FALSE(d.figure("memory.l1_bytes")->uncertain);
  EXPECT_THROW(d.macs_per_cycle_for("fp8"), Error);
  EXPECT_EQ(d.efficiency_for("no-such-class"), d.efficiency.at("default"));
}

TEST(NpusimDevice, UserProfileRoundTripsAndMissingFieldIsNamed) {
  const Device d = load_device("xdna2");
  const auto dir = std::filesystem::path(::testing::TempDir()) / "npusim_device_test";
  std::filesystem::create_directories(dir);
  const auto good = (dir / "mine.json").string();
  nlohmann::json j = d.to_json();
  j["name"] = "mine";
  j["figures"]["array.columns"]["value"] = 4;
  std::ofstream(good) << j.dump();
  const Device mine = load_device(good);
  EXPECT_EQ(mine.name, "mine");
  EXPECT_EQ(mine.columns, 4);
  EXPECT_EQ(mine.l1_bytes, d.l1_bytes);

  j["figures"].erase("memory.l1_bytes");
  const auto bad = (dir / "bad.json").string();
  std::ofstream(bad) << j.dump();
  try {
    load_device(bad);
    FAIL() << "a profile without memory.l1_bytes loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory.l1_bytes"), std::string::npos) << e.what();
  }
  j = d.to_json();
  j["figures"]["clock.hz"].erase("source");
  std::ofstream(bad) << j.dump();
  try {
    load_device(bad);
    FAIL() << "a figure without a source loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("clock.hz"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("source"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(NpusimDevice, UnknownBuiltinNamesTheKnownOnes) {
  try {
    load_device("xdna9");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("xdna2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_device("/no/such/profile.json"), Error);
}

}  // namespace
}  // namespace tessera::npusim
