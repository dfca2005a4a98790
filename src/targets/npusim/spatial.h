// npusim spatial program vocabulary, in the hardware's own words (IRON / MLIR-AIE):
// a Launch places a herd of Workers on compute tiles; ObjectFifos move objects between DDR
// (through a shim tile's DMA, driven by an n-D access pattern), memory tiles (forward,
// split, join, broadcast) and the Workers' L1 buffers (rings of `depth` objects); a
// Dispatch is one host call holding one or more Launches plus the host-side runtime
// sequence (which host buffers are synced, copied, zero-copy or kept resident).
//
// These are plain data: mapping generators (mappings_*.h) build them, the checker
// (checker.h) refuses those that do not fit a Device, the engine (engine.h) executes them
// and the timing model (timing.h) prices them.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "targets/npusim/device.h"

namespace tessera::npusim {

// What a fifo moves and a DDR tensor holds. BF16 and F32 are values; the rest are GGML
// blocks, moved as the file holds them (W4A16, W5A16, W6A16, W8A16): one element of such a
// type is one block, so access patterns, objects and tensors count blocks and bytes are
// blocks x elem_bytes. Q4_0 (18 B), Q4_1 (20 B), Q5_0 (22 B), Q5_1 (24 B) and Q8_0 (34 B) are
// blocks of 32 weights; Q4_K (144 B), Q5_K (176 B) and Q6_K (210 B) super-blocks of 256, their
// sub-block scales (and mins) inside the element (weight_blocks.h).
enum class ElemType { BF16, F32, Q4_0, Q8_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K };
int elem_bytes(ElemType t);               // bytes per element (per block for block types)
const char* elem_type_name(ElemType t);  // "bf16", "f32", "q4_0", "q8_0", "q4_1", ..., "q6_k"
bool is_block(ElemType t);                // a GGML block format
int block_values(ElemType t);             // values per element: 32 or 256 for block types, else 1
ElemType elem_type_from_name(const std::string& name);  // throws naming the types

// An n-D access pattern as one buffer descriptor expresses it (IRON TensorAccessPattern):
// elements visited in the order of `sizes` (outermost first) with `strides` (elements) from
// `offset`; `repeat` sends the whole pattern that many times (BD repeat count). The stream
// of visited elements is cut into consecutive objects of the fifo's object size.
struct AccessPattern {
  int64_t offset = 0;
  std::vector<int64_t> sizes;    // outermost first, at most Device::max_dims
  std::vector<int64_t> strides;  // same length as sizes
  int64_t repeat = 1;

  int64_t elements() const;  // product(sizes) * repeat
  // Lowest and highest element index touched (for bounds checks); {offset, offset} if empty.
  std::pair<int64_t, int64_t> extent() const;
  std::string describe() const;  // "off 0 sizes [4,64,32] strides [65536,2048,1] x2"
  nlohmann::json to_json() const;

  static AccessPattern contiguous(int64_t offset, int64_t n);  // one run of n elements
  // A [rows, cols] block of a row-major matrix with `ld` elements per row.
  static AccessPattern block2d(int64_t offset, int64_t rows, int64_t cols, int64_t ld);
};

// The BD chain for an n-D walk of any depth: size-1 dimensions dropped, contiguous ones
// merged, a stride-0 outermost dimension turned into the BD repeat count, and what is
// still deeper than `max_dims` split over its outermost dimensions into one BD each.
std::vector<AccessPattern> bd_chain(int64_t offset, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                                    int max_dims = 4);

// A buffer in a Worker's L1 that is not a fifo end (accumulators, lookup tables, ...).
struct L1Buffer {
  std::string name;
  int64_t bytes = 0;
  int depth = 1;
};

// What one Worker's kernel does over the whole launch, for the timing model:
// `macs` on the matrix unit (Device::macs_per_cycle[dtype]) and `vector_ops` lane
// operations on the vector unit (Device::vector_lanes_bf16 per cycle), both scaled by the
// kernel class's efficiency; `iterations` is the steady-state loop count (objects per
// input fifo), used to price pipeline fill and double-buffer overlap.
struct WorkerCost {
  std::string kernel_class = "default";  // "gemm", "gemv", "attention", "eltwise", ...
  std::string dtype = "bf16";
  int64_t macs = 0;
  int64_t vector_ops = 0;
  int64_t iterations = 1;
};

// A core function placed on a compute tile (IRON Worker). `kernel` names the function the
// engine calls (register it with Engine::register_kernel); `params` are its arguments.
struct Worker {
  std::string name;
  Tile tile;
  std::string kernel;
  std::vector<L1Buffer> buffers;  // local L1 buffers besides the fifo objects
  int64_t stack_bytes = 1024;
  WorkerCost cost;
  nlohmann::json params = nlohmann::json::object();
};

// Direction of a fifo: Fill = DDR -> tiles (runtime sequence fill), Drain = tiles -> DDR.
enum class FifoDir { Fill, Drain };
// How a memory tile connects the DDR side with the compute tiles: forward (one end),
// split (each end gets its slice of each memtile object), join (each end provides its
// slice), broadcast (every end gets the whole object).
enum class FifoKind { Forward, Split, Join, Broadcast };
const char* fifo_dir_name(FifoDir d);
const char* fifo_kind_name(FifoKind k);

// One compute-tile end of a fifo: its slice [offset, offset + elems) of each memtile object
// (split/join; the whole object for forward/broadcast), optionally re-laid out by the
// memtile DMA with `mem_pattern` (element indices relative to the memtile object).
struct FifoEnd {
  Tile tile;
  int64_t offset = 0;
  int64_t elems = 0;
  std::optional<AccessPattern> mem_pattern;
};

struct ObjectFifo {
  std::string name;
  FifoDir dir = FifoDir::Fill;
  FifoKind kind = FifoKind::Forward;
  ElemType type = ElemType::BF16;
  std::string tensor;             // the DDR tensor it fills from / drains to
  Tile shim;                      // the shim tile whose DMA reads/writes DDR
  std::optional<Tile> memtile;    // the memory tile it goes through (none: shim <-> L1 directly)
  int64_t object_elems = 0;       // elements per memtile object (sum of the ends' slices for split/join)
  int depth = 2;                  // objects per compute-tile end (L1 ring)
  int mem_depth = 2;              // objects in the memory tile (L2 ring)
  // Elements per L2 object when the memory tile gathers several L1 objects into one (IRON:
  // a larger object type on the memtile side, e.g. k_l2 = 8 x k_l1 for GEMM); forward and
  // broadcast only; 0 means object_elems. Counts for L2 and for the timing's fill only.
  int64_t mem_object_elems = 0;
  // The shim DMA's transfer over the DDR tensor: a chain of BDs, one pattern each, run in
  // order; the concatenated element stream is cut into objects of object_elems.
  std::vector<AccessPattern> ddr;
  std::vector<FifoEnd> ends;      // consumers (Fill) or producers (Drain)
  // Filled on the first run only: the objects stay in L1 across calls (weights kept
  // resident). Correct only when every end holds all its objects (objects <= depth).
  bool resident = false;
  // The DDR side is a buffer a memory tile holds across a dispatch's launches (an
  // intermediate the lowering placed in L2): the memory tile (`memtile`, else the one of the
  // shim's column) walks it with `ddr`'s patterns; no shim leg, no DDR bytes.
  bool l2_side = false;

  int64_t object_bytes() const { return object_elems * elem_bytes(type); }
  int64_t mem_object_bytes() const { return (mem_object_elems > 0 ? mem_object_elems : object_elems) * elem_bytes(type); }
  int64_t end_elems(const FifoEnd& e) const { return e.elems > 0 ? e.elems : object_elems; }
  // The memory tile that streams an L2-side fifo's buffer.
  Tile l2_tile(int mem_row) const { return memtile ? *memtile : Tile{shim.col, mem_row}; }
  int64_t stream_elements() const;  // all BDs of `ddr` together
  int64_t objects() const;          // stream_elements / object_elems
};

// A fifo between Workers of one launch (IRON: an ObjectFifo whose producer is a core):
// the producer fills `objects` objects of `object_elems` elements one after another into a
// ring of `depth` slots; every consumer sees every object (broadcast), directly or through a
// memory tile's ring of `mem_depth` objects. A producer acquiring a slot waits until every
// consumer released the object that held it; a consumer acquiring object j waits until the
// producer released it. The engine runs the launch's workers concurrently and reports a
// state in which every unfinished worker waits (a deadlock) with the tiles and fifos.
struct LinkFifo {
  std::string name;
  ElemType type = ElemType::BF16;
  Tile producer;
  std::vector<Tile> consumers;
  std::optional<Tile> memtile;
  int64_t object_elems = 0;
  int64_t objects = 0;  // per launch
  int depth = 2;        // slots on each compute tile
  int mem_depth = 2;    // slots in the memory tile
  int64_t object_bytes() const { return object_elems * elem_bytes(type); }
};

// One launch of a herd: the unit the checker checks, the engine runs, the timing prices.
struct Launch {
  std::string name;
  std::string kernel;  // what it computes ("gemm 2048x2048x2048"), for people
  int herd_cols = 0, herd_rows = 0;
  std::vector<Worker> workers;
  std::vector<ObjectFifo> fifos;
  std::vector<LinkFifo> links;  // worker to worker
  std::string loop_order;  // free text: "for n-block: for k: A,B -> C" (describe() only)

  const Worker* worker_at(Tile t) const;
  const ObjectFifo* fifo(const std::string& name) const;
  std::string describe() const;
  nlohmann::json to_json() const;
};

// A host-side buffer of a dispatch (an XRT buffer object).
// Sync: EveryCall = copied host -> device before the call (inputs) and device -> host
// after it (outputs); Once = copied on the first call only, then kept resident (weights);
// ZeroCopy = host memory mapped into the device, never copied; DeviceOnly = an
// intermediate between the dispatch's launches that the host never sees.
enum class Sync { EveryCall, Once, ZeroCopy, DeviceOnly };
const char* sync_name(Sync s);

struct HostBuffer {
  std::string name;
  ElemType type = ElemType::BF16;
  int64_t elems = 0;
  Sync sync = Sync::EveryCall;
  bool to_device = true;     // read by the launches
  bool from_device = false;  // written by the launches
  int64_t bytes() const { return elems * elem_bytes(type); }
};

// One host call (XRT kernel run): the runtime sequence's buffers and its launches, in order.
struct Dispatch {
  std::string name;
  std::vector<HostBuffer> buffers;
  std::vector<Launch> launches;

  const HostBuffer* buffer(const std::string& name) const;
  std::string describe() const;
  nlohmann::json to_json() const;
};

nlohmann::json to_json(const ObjectFifo& f);
nlohmann::json to_json(const Worker& w);

}  // namespace tessera::npusim
