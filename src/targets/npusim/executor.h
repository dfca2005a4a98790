// npusim program executor: runs a lowered Program (program.h) step by step on the Engine,
// with the dispatch's buffers held in device memory, and prices every dispatch call as it
// ran (predict.h: add_dispatch_call), so that a functional pass yields the dry price of its
// Program.
//
// Device memory: every activation buffer of a dispatch lives on the device, once per
// dispatch instance (pass, dispatch, layer), as the Program declares it (type, size; rows
// past the host-visible part zero, the rest poison until written): in DDR, or at its offset
// in the instance's memory-tile arena, where buffers the lowering let share bytes overwrite
// each other (a buffer reused while still live is read as its successor left it). A launch
// reads and writes these; a launch reading a buffer in another element type than it holds
// sees it converted (round to nearest even; the consumer's first vector op on the device). External buffers
// (weights, norm weights, biases, the KV cache, the RoPE table) are bound by the caller where
// they are.
//
// Inside a dispatch call, a launch that reads a buffer an earlier launch of the same
// dispatch wrote, without waiting for that launch's drain (LaunchCall::waits), reads the
// buffer as it was when the call began: the previous call's data.
//
// The host's view: the runner's fp32 arrays. After each launch, what it wrote is read back
// into the runner's arrays (a debugger's view, not a sync: it costs nothing and changes
// nothing on the device). Before a launch reads a buffer whose host array changed since the
// device and the host last agreed (the host computed it: a host-placed stage, the oracle's
// twin in a bisect, a perturbation), the host's values are written to the device first.
// A buffer a launch wrote device-only never reaches the host's memory: a later dispatch that
// takes it from the host, or host code (host_reads), gets what the host held before it.
// Syncs are priced from the Program (Sync per buffer), not simulated as copies.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "targets/npusim/engine.h"
#include "targets/npusim/predict.h"
#include "targets/npusim/program.h"

namespace tessera::npusim {

// The runner's fp32 array behind an activation buffer.
struct HostArray {
  float* data = nullptr;
  int64_t elems = 0;
};

struct StepArgs {
  std::map<std::string, HostArray> host;  // activations by buffer name
  Bindings external;                      // weights ("w.q"), norm weights, biases, "kv", "cs"
  std::span<const int32_t> ids;           // the embedding's token ids
};

class ProgramExecutor {
 public:
  ProgramExecutor(const Device& device, int threads);
  ~ProgramExecutor();
  Engine& engine() { return engine_; }
  const Device& device() const { return engine_.device(); }

  // Runs step `where` of `program` for layer `layer` (-1 outside the layers): every launch of
  // the step in order, or only those writing `outputs` when given (one projection of q|k|v).
  // A step of another dispatch instance, or an earlier step of the same one, begins a new
  // dispatch call. `priced`: the call counts in the pass's timing (a kernel program run by
  // itself does not, and does not interrupt the pass's current call).
  void run_step(std::shared_ptr<const Program> program, Program::Where where, int64_t layer, const StepArgs& args,
                bool priced = true, const std::set<std::string>& outputs = {});
  // Launch `index` of step `where` with the caller's own DDR bindings (offsets applied): for
  // steps the host orchestrates between launches (the naive plan's host softmax).
  void run_launch(std::shared_ptr<const Program> program, Program::Where where, int64_t layer, size_t index,
                  const Bindings& ddr, bool priced = true);
  // Marks step `where` as run on the host (its host work priced with its dispatch).
  void host_step(std::shared_ptr<const Program> program, Program::Where where, int64_t layer, bool priced = true);

  // The host's memory behind `name`: a buffer last written device-only (never synced) holds,
  // on the host, what the host had before, not what the debugger's view shows. host_reads
  // puts that into the runner's array before host code reads it (a host step's inputs).
  void host_reads(const std::string& name, float* data, int64_t elems);

  // Timing of the dispatch calls run since begin_pass: one entry per call, as they ran.
  void begin_pass();
  PassPrediction end_pass();
  // Forgets all device state (buffers, L1 rings, resident weights).
  void reset();

 private:
  struct Buffer;
  struct Call;
  Call& enter(std::shared_ptr<const Program> program, Program::Where where, int64_t layer, bool priced,
              bool within_step = false);
  void close(std::unique_ptr<Call>& call);
  Buffer& device_buffer(const std::string& instance, const ProgramDispatch& d, const ProgramBuffer& b);
  void run_call(Call& call, const LaunchCall& c, const Bindings& direct, const StepArgs* args);
  const float* host_memory(const std::string& name, const HostArray& a);

  Engine engine_;
  std::map<std::string, std::unique_ptr<Buffer>> buffers_;  // "instance/buffer"
  std::map<std::string, std::vector<uint8_t>> l2_;            // a dispatch instance's memory-tile arena
  std::set<std::string> seen_instances_, seen_launches_;
  std::unique_ptr<Call> call_, side_;  // the pass's current dispatch call; a kernel program's
  // Buffers last written device-only: the host's real memory and the hash of what the
  // debugger's view showed (a different array means the host wrote it since).
  struct Unsynced {
    std::vector<float> host;
    size_t shown_hash = 0;
  };
  std::map<std::string, Unsynced> unsynced_;
  PassPrediction pass_;
};

}  // namespace tessera::npusim
