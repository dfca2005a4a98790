// npusim device profile: the hardware figures of a spatial NPU (array geometry, tile
// memories, DMA channels, buffer descriptors, locks, stream bandwidth, clock, MACs per
// cycle, DDR bandwidth, host dispatch costs) and the timing model's few fitted parameters.
// Profiles are JSON (devices/*.json, embedded in the binary at build time); every figure
// carries its unit, its source and whether it is uncertain, so that nothing built on an
// unconfirmed figure is ever presented as a measurement.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tessera::npusim {

// A tile position in the array, IRON/MLIR-AIE style: (column, row), row 0 at the shim.
struct Tile {
  int col = 0;
  int row = 0;
  auto operator<=>(const Tile&) const = default;
};
std::string to_string(Tile t);  // "(2,3)"

enum class TileKind { Shim, Mem, Compute, Outside };
const char* tile_kind_name(TileKind k);  // "shim", "memory", "compute", "outside"

// Resources a tile of one kind owns. DMA channels: MM2S reads the tile's memory onto a
// stream (out of the tile), S2MM writes a stream into it (into the tile).
struct TileResources {
  int dma_mm2s = 0;
  int dma_s2mm = 0;
  int bds = 0;    // buffer descriptors
  int locks = 0;
};

// One figure as the profile states it.
struct Figure {
  std::string key;     // "memory.l1_bytes"
  double value = 0;
  std::string unit;    // "B", "B/cycle", "us", ...
  std::string source;  // where it comes from
  bool uncertain = false;
};

struct Device {
  std::string name;
  std::string description;

  // Array geometry: rows [first_compute_row, rows) are compute tiles.
  int columns = 0, rows = 0, shim_row = 0, mem_row = 1, first_compute_row = 2;
  // Memories (bytes).
  int64_t l1_bytes = 0, l1_banks = 0, program_bytes = 0, l2_bytes = 0, l2_banks = 0;
  TileResources shim, mem, compute;
  int bd_repeat_max = 255;  // a BD repeats its transfer at most this many times
  int max_dims = 4;         // access-pattern dimensions one BD can express
  double stream_bytes_per_cycle = 4;
  int cascade_bits = 512;
  double clock_hz = 1e9;
  std::map<std::string, double> macs_per_cycle;  // per dtype: "bf16" -> 256
  int vector_lanes_bf16 = 32;
  int64_t gemv_max_k = 0;
  double ddr_bytes_per_s = 0;         // reachable by the NPU through all shims together
  double system_ddr_bytes_per_s = 0;  // the platform's
  double dispatch_us = 0;             // host cost of one dispatch (one XRT kernel call)
  double host_copy_bytes_per_s = 0;   // host-side buffer sync/copy rate
  // Ops a plan leaves on the host CPU (softmax, decode attention, LM head) are priced at
  // max(flops / host_flops_per_s, bytes read / host_read_bytes_per_s).
  double host_flops_per_s = 0, host_read_bytes_per_s = 0;
  double idle_after_s = 0, idle_wake_ms = 0;
  // Timing model parameters (see timing.h): achieved fraction of the tile's peak per kernel
  // class ("gemm", "gemv", "attention", "eltwise", ... and "default"), and the fraction of
  // the stream bandwidth a DMA channel achieves.
  std::map<std::string, double> efficiency;
  double dma_efficiency = 1;
  // Fixed cost of one object through one DMA channel (a buffer descriptor started, its
  // locks acquired and released): what makes tiny objects slow, so that a tile search has
  // an optimum that is not the smallest tile.
  double dma_object_cycles = 0;

  std::vector<Figure> figures;  // every figure in profile order (for `tessera device show`)

  TileKind kind(Tile t) const;
  bool contains(Tile t) const { return kind(t) != TileKind::Outside; }
  const TileResources& resources(TileKind k) const;  // throws for Outside
  int compute_rows() const { return rows - first_compute_row; }
  int64_t compute_tiles() const { return int64_t(columns) * compute_rows(); }
  double macs_per_cycle_for(const std::string& dtype) const;  // throws naming the dtype
  double efficiency_for(const std::string& kernel_class) const;  // falls back to "default"
  const Figure* figure(const std::string& key) const;            // nullptr when absent
  nlohmann::json to_json() const;  // the profile as loaded (same schema as devices/*.json)
};

// A built-in profile by name ("xdna2") or a JSON file by path (anything containing '/' or
// ending in ".json"). Throws tessera::Error naming the profile and the missing or bad field.
Device load_device(const std::string& name_or_path);
// Parses a profile; `origin` names it in errors.
Device parse_device(const nlohmann::json& j, const std::string& origin);
// Names of the profiles built into the binary (from devices/*.json at build time).
std::vector<std::string> builtin_devices();
// The embedded JSON text of a built-in profile (throws if unknown).
const std::string& builtin_device_json(const std::string& name);

}  // namespace tessera::npusim
