// npusim functional execution engine: runs a Launch tile by tile on the host with exactly
// the data movement it describes. The shim DMA walks the DDR-side access patterns, memory
// tiles forward / split / join / broadcast objects (optionally re-laid out by their own
// pattern), each compute-tile end of a fifo is a ring of `depth` object slots in L1, and the
// Worker's kernel (a C++ function registered by name) sees nothing but its L1: it acquires
// and releases objects like IRON's ObjectFifo acquire/release. So a wrong access pattern or
// a slot the DMA did not rewrite gives wrong numbers, as on the device.
//
// Data moves on demand: acquiring the j-th object of a fill fifo makes the DMA produce
// exactly that object (element range [j*P, (j+1)*P) of the fifo's DDR stream, P = object
// size, this end's slice of it); releasing the j-th object of a drain fifo writes it back.
// Workers of a launch that only talk to DDR run in parallel on threads. A launch with
// worker-to-worker fifos (spatial.h: LinkFifo) runs each worker on its own thread, as each
// core runs on its own: a producer waits for a free slot of its ring, a consumer for the
// object it acquires, and a state in which every unfinished worker waits with none able to go
// on is reported as a deadlock naming each worker's tile and what it waits for; holding more
// objects than a fifo's depth is reported at once. L1 slots and local buffers persist across
// calls per launch (state key), and host buffers of a Dispatch live in device memory between
// calls unless zero-copy. Not modelled yet: cascade, memory-tile contents across launches
// (memory tiles pass objects through).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "targets/npusim/device.h"
#include "targets/npusim/spatial.h"

namespace tessera::npusim {

// Host memory a fifo's `tensor` name is bound to (a DDR buffer as the device sees it).
struct DdrTensor {
  ElemType type = ElemType::BF16;
  void* data = nullptr;
  int64_t elems = 0;

  static DdrTensor bf16(uint16_t* p, int64_t n) { return {ElemType::BF16, p, n}; }
  static DdrTensor f32(float* p, int64_t n) { return {ElemType::F32, p, n}; }
  // `n` GGML blocks of type t (weights: read-only on the device).
  static DdrTensor blocks(ElemType t, const uint8_t* p, int64_t n) { return {t, const_cast<uint8_t*>(p), n}; }
};
using Bindings = std::map<std::string, DdrTensor>;

// One object slot in a worker's L1.
struct ObjectRef {
  uint8_t* data = nullptr;
  int64_t elems = 0;
  ElemType type = ElemType::BF16;

  uint16_t* bf16() const;  // throws unless type is BF16
  float* f32() const;      // throws unless type is F32
  const uint8_t* blocks(ElemType t) const;  // the object's blocks; throws unless it holds type t
  int64_t bytes() const { return elems * elem_bytes(type); }
};

class WorkerContext;
// A Worker's core function: runs once per launch on its tile, loops over its objects.
using KernelFn = std::function<void(WorkerContext&)>;

class WorkerContext {
 public:
  const Worker& worker() const { return *worker_; }
  Tile tile() const { return worker_->tile; }
  const nlohmann::json& params() const { return worker_->params; }
  // Handle of the fifo `name` with an end on this tile (throws if none).
  int fifo(const std::string& name) const;
  // Objects this end sees per launch (= the fifo's objects()).
  int64_t objects(int handle) const;
  // Acquires the next object: for a fill fifo the DMA has written it into the slot; for a
  // drain fifo it is the slot to write (holding whatever it held before). Holding more
  // than `depth` objects at once, or more objects than the transfer moves, throws (the
  // device would hang).
  ObjectRef acquire(int handle);
  // Releases the oldest held object: a fill slot goes back to the DMA; a drain object is
  // written to DDR through the memory tile and the shim's access pattern.
  void release(int handle);
  // A local L1 buffer of this worker (Worker::buffers), slot `index` < depth.
  std::span<uint8_t> buffer(const std::string& name, int index = 0);

  struct End;  // engine internals

 private:
  friend class Engine;
  const Worker* worker_ = nullptr;
  std::vector<End*> ends_;
  std::map<std::string, std::vector<uint8_t>>* locals_ = nullptr;
  std::map<std::string, int64_t> local_slot_bytes_;
};

class Engine {
 public:
  explicit Engine(Device device, int threads = 0);  // threads <= 0: default_threads()
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Device& device() const;
  void register_kernel(const std::string& name, KernelFn fn);
  bool has_kernel(const std::string& name) const;

  // Runs one launch; its fifos' tensors are read and written in place (as zero-copy DDR).
  // Throws tessera::Error with the checker's refusals if the launch does not fit the device.
  void run(const Launch& launch, const Bindings& ddr);
  // The same, with its device state (L1 rings, resident fifos) kept under `state_key`
  // instead of the launch's name (one state per layer of a Program's layer dispatch).
  void run(const Launch& launch, const Bindings& ddr, const std::string& state_key);
  // Runs one host call: syncs host buffers per HostBuffer::sync (EveryCall copies, Once
  // only on the first call of this dispatch name, ZeroCopy maps, DeviceOnly never seen by
  // the host), then the launches in order, then copies outputs back.
  void run(const Dispatch& dispatch, const Bindings& host);
  // Forgets all device state (L1 slots, resident buffers), as after reloading the design.
  void reset();

  struct Stats {
    int64_t launches = 0;
    int64_t dma_in_bytes = 0;   // DDR -> L1, every end counted
    int64_t dma_out_bytes = 0;  // L1 -> DDR
    int64_t host_copy_bytes = 0;
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::npusim
