// npusim Program: one pass of a plan lowered for a model (design: "one lowering"). The
// lowering (lower()) is the only place that turns a plan's steps into launches, buffers and
// host work; the executor (executor.h) runs exactly this Program and the timing model
// (predict.h: price()) prices exactly this Program, so a rewrite that changes the time
// changes what runs.
//
// A Program lists its dispatches in pass order (a layer's dispatches once, with count =
// layers). Each dispatch holds its steps (a plan step each: one stage, placed on the NPU or
// the host), each step its launches (a Launch with its arguments: which of the dispatch's
// buffers each DDR tensor of the launch is) and its host work. A dispatch's buffers say how
// the host and the device share them (spatial.h's Sync). Inside a dispatch the launches run
// back to back on the array; a launch that reads a buffer an earlier launch of the same
// dispatch writes must wait for that launch's drain (a `waits` entry): without the wait it
// reads the buffer as it was when the dispatch started, which is the previous call's data
// (the stale intermediate of porting pitfall 10).
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/spec.h"
#include "targets/npusim/device.h"
#include "targets/npusim/mappings.h"
#include "targets/npusim/plans.h"
#include "targets/npusim/spatial.h"

namespace tessera::npusim {

// The shape a pass is lowered at: `tokens` new tokens after `context` cached positions; the
// head normalizes and projects `head_rows` rows (1 when generating, every row when all
// logits are asked for). decode: the plan's decode pass (tokens == 1).
struct PassShape {
  bool decode = false;
  int64_t tokens = 1, context = 0, head_rows = 1;
  bool operator<(const PassShape& o) const;
};

// One launch of a step and its arguments.
struct LaunchCall {
  Launch launch;
  std::map<std::string, std::string> args;  // the launch's DDR tensor -> the dispatch's buffer
  std::map<std::string, int64_t> offsets;   // where in the buffer the tensor starts (elements; default 0)
  // Buffers this launch reads that an earlier launch of the dispatch wrote, whose drain it
  // waits for (the runtime sequence's token between them).
  std::set<std::string> waits;
  // The embedding's gather: the row addresses are patched with the token ids for every call
  // (as the host patches the instruction words); the structure, and so the time, is fixed.
  bool patched_by_ids = false;

  std::set<std::string> reads() const;   // buffers bound to the launch's fill fifos
  std::set<std::string> writes() const;  // buffers bound to its drain fifos
};

// Work a step leaves on the host, priced at the device profile's host speed:
// max(flops / host_flops_per_s, bytes / host_read_bytes_per_s).
struct HostWork {
  std::string what;
  double flops = 0, bytes = 0;
  double us(const Device& d) const;
};

struct ProgramStep {
  Stage stage = Stage::Count;
  Placement placement = Placement::Npu;
  std::vector<LaunchCall> launches;
  std::vector<HostWork> host;
};

// A buffer of a dispatch as the device holds it: the host-visible part (`buffer.elems`) and
// the rows the launches read past it (a GEMM pads M to whole tiles: zeros).
struct ProgramBuffer {
  HostBuffer buffer;
  int64_t device_elems = 0;  // >= buffer.elems
  // Bound by the caller, not held by the dispatch (weights, the KV cache, the RoPE table):
  // the device reads them where they are.
  bool external = false;
  // Held by the dispatch's memory tiles (L2) instead of DDR: a device-only intermediate that
  // fits. L2 buffers share one arena per dispatch: `l2_offset` (bytes) is where this one
  // starts; buffers whose live ranges (`live`: the first launch writing it to the last
  // launch reading it, launch indices in the dispatch) do not overlap may share bytes.
  bool in_l2 = false;
  int64_t l2_offset = 0;
  std::pair<int, int> live{-1, -1};
};

struct ProgramDispatch {
  std::string name;     // "layer.o+mlp"
  std::string section;  // "embedding", "layer" or "head"
  int64_t count = 1;    // calls per pass (the model's layers for a layer's dispatch)
  bool host = false;    // host work only: no NPU call
  std::vector<ProgramStep> steps;
  std::vector<ProgramBuffer> buffers;
  int64_t l2_arena_bytes = 0;  // the memory tiles' bytes the L2 buffers take together

  const ProgramBuffer* buffer(const std::string& name) const;
  // The engine's and the timing model's view: every launch in order and the host buffers.
  Dispatch dispatch() const;
  double host_us(const Device& d) const;
  int launches() const;
};

struct Program {
  std::string plan;  // the plan's name
  PassShape shape;
  std::vector<ProgramDispatch> dispatches;

  // The dispatch and step that run `stage` in `section` ("layer" for a layer's stages).
  struct Where {
    size_t dispatch = 0, step = 0;
  };
  Where find(Stage stage) const;
  nlohmann::json to_json() const;
};

// The element type each weight buffer holds ("w.q", "w.k", "w.v", "w.o", "w.gate", "w.up",
// "w.down", "w.lm_head"): bf16 unless listed. A block type (spatial.h: Q4_0 ... Q6_K) lowers the
// projection's GEMV and GEMM on the file's blocks (W4A16, W8A16); its DMA moves blocks and its
// workers unpack them (weight_blocks.h). One type per buffer for every layer: the layer's
// dispatches are lowered once.
struct WeightFormats {
  std::map<std::string, ElemType> by_buffer;
  ElemType of(const std::string& buffer) const;
  nlohmann::json to_json() const;                         // {"w.q": "q4_0", ...} (bf16 left out)
  static WeightFormats from_json(const nlohmann::json& j);  // null or {}: every weight bf16
};

// Faults of the lowering itself (the target's own mapping faults), applied as the Program is
// built: mapping faults per op kind ("gemv", "gemm", "rmsnorm", "rope", "attention",
// "silu_mul", "add", "embedding" or "*"), and a merge that forgets one wait.
struct LoweringFaults {
  std::map<std::string, MappingFaults> mapping;
  // merged-stale-intermediate: in a dispatch that runs the O projection and the residual add
  // together, the add does not wait for the projection's drain of `o`.
  bool drop_o_wait = false;
  // A lowering that asks only the NPU's dispatches who reads a buffer next: what a host step
  // reads (decode attention on the host) is kept device-only, never synced to the host.
  bool ignore_host_readers = false;
  // reuse-while-live: the L2 allocator ends a buffer's live range at its producer's last
  // launch (its readers forgotten), so a later intermediate takes its bytes before it is read.
  bool live_until_written = false;
  MappingFaults for_op(const std::string& op) const;
};

// The one lowering: `plan`'s pass for `spec` at `shape` on `device`.
Program lower(const NpuPlan& plan, const ModelSpec& spec, const Device& device, const PassShape& shape,
              const LoweringFaults& faults = {}, const WeightFormats& formats = {});
// One stage as a kernel program of its own (one dispatch, one step, placed as `plan` places
// it, every buffer synced): how phase 1 runs a kernel by itself.
Program lower_stage(const NpuPlan& plan, Stage stage, const ModelSpec& spec, const Device& device,
                    const PassShape& shape, const LoweringFaults& faults = {}, const WeightFormats& formats = {});

// Rows of KV cache a layer needs for `positions` positions (whole key tiles of the default
// attention tiling).
inline int64_t kv_rows_for(int64_t positions) { return (positions + 63) / 64 * 64; }

}  // namespace tessera::npusim
