// npusim checker: refuses a Launch that does not fit a Device, as the hardware (or its
// compiler) would: L1 or L2 overflow, too many DMA channels, buffer descriptors or locks on
// a tile, a worker outside the array or on the wrong row kind, a vector length the kernel
// cannot handle, a fifo whose shape does not add up. Refusals are structured (code, tile,
// numbers) so that debug skills can act on them, and carry a readable line for people.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "targets/npusim/device.h"
#include "targets/npusim/spatial.h"

namespace tessera::npusim {

struct Refusal {
  // "l1-overflow", "l2-overflow", "dma-channels", "bd-exhaustion", "bd-repeat", "bd-dims",
  // "lock-exhaustion", "placement", "vector-length", "fifo-shape"
  std::string code;
  Tile tile;
  int64_t needed = 0;
  int64_t available = 0;
  // "tile (2,3): L1 needs 70144 B (A 2x16384 + B 2x16384 + C 4096 + stack 1024), has 65536 B"
  std::string text;
};

// Every refusal of `launch` on `device` (empty: it fits).
std::vector<Refusal> check(const Launch& launch, const Device& device);
// All launches of a dispatch, plus its buffers (every fifo tensor must be a buffer).
std::vector<Refusal> check(const Dispatch& dispatch, const Device& device);

// What each tile of a launch uses, as the checker counts it (also for reports).
struct TileUsage {
  Tile tile;
  TileKind kind = TileKind::Outside;
  int64_t memory_bytes = 0;  // L1 (compute) or L2 (memory tile)
  std::string memory_terms;  // "A 2x16384 + B 2x16384 + C 4096 + stack 1024"
  int mm2s = 0, s2mm = 0, bds = 0, locks = 0;
};
std::vector<TileUsage> tile_usage(const Launch& launch, const Device& device);

std::string describe(const std::vector<Refusal>& refusals);  // one line each
nlohmann::json to_json(const Refusal& r);
nlohmann::json to_json(const std::vector<Refusal>& refusals);

}  // namespace tessera::npusim
