// The npusim target's model runner: the shared forward pass (targets/layered_runner.h) run
// as the plan's lowered Program (npusim/program.h): each pass is lowered once for its shape,
// and every stage runs its step of that Program on the executor (npusim/executor.h: launches
// tile by tile with the hardware's numerics, the dispatch's buffers in device memory) or on
// the host (fp32, as a host CPU would run it), as the plan places it. A kernel called by
// itself (phase 1) runs as a one-step program of its own. The KV cache is bf16 in
// device-visible memory, one [K | V] row per position and layer. Faults (`--inject`) are
// mapping bugs (a transposed access pattern, a stale buffer, an over-size tile, a BD-hungry
// transfer) and a merge lowered without one wait.
#pragma once
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "targets/npusim/npusim_weights.h"
#include "targets/layered_runner.h"
#include "targets/npusim/device.h"
#include "targets/npusim/plans.h"
#include "targets/npusim/predict.h"
#include "targets/npusim/program.h"

namespace tessera {

namespace cpu {
class ThreadPool;
}
namespace npusim {
class ProgramExecutor;
struct StepArgs;
}

// The npusim target as the registry knows it: plans baseline (default), naive, merged;
// device profiles built in (xdna2) or from a JSON file; the four mapping faults.
TargetDef npusim_target_def();
const std::vector<FaultInfo>& npusim_faults();
// Phases 4 and 5's plan rewrites on npusim (targets/npusim/skills.cc): promote, merge,
// buffer-reuse, zero-copy.
const std::vector<OptSkill>& npusim_skills();

class NpuSimRunner final : public LayeredRunner {
 public:
  NpuSimRunner(const Model& model, const TargetOptions& options);
  ~NpuSimRunner() override;

  std::string target() const override { return "npusim"; }
  std::string description() const override;  // "npusim (xdna2 model, plan merged, 2 host threads)"
  std::string isa() const override;
  nlohmann::json predict_pass(bool decode, int64_t tokens, bool with_program = false) const override;          // "aie2p (modelled)"
  // The array's numerics (npusim/numerics.h) where the plan places the stage on the NPU;
  // the host's fp32 where it places it on the host.
  oracle::Numerics numerics(Stage s, int64_t T, int64_t layer = 0) const override;
  void kv_read(int64_t layer, int64_t rel, int64_t T, float* k, float* v) override;
  // Stages the plan leaves on the host are counted as "host:<stage>" (never silently).
  std::map<std::string, int64_t> op_counters() const override;
  std::string handover(Stage from, Stage to, int64_t T) const override;
  std::string shared_memory(Stage consumer, int64_t T) const override;
  nlohmann::json build_plan(const Model& model) const override;
  int64_t weight_bytes_per_token() const override;
  int64_t kv_bytes_per_position() const override;
  // Predicted prefill (2048 tokens, or the model's context if shorter) and decode at 512.
  nlohmann::json predicted_figures() const override;
  // The lowered Program of the prefill and decode passes above, priced per launch (predict.h: timeline_json).
  nlohmann::json predicted_timeline() const override;
  // The timing model's prediction for the plan (deterministic): the same figures.
  PassFigure measure(Pass pass) override;

  const npusim::Device& device() const { return device_; }
  const npusim::NpuPlan& plan() const { return plan_; }
  // Each weight buffer's format on the array (quantized blocks or bf16): what lower() takes.
  const npusim::WeightFormats& weight_formats() const { return weights_->formats(); }
  const npusim::NpuWeightStore& weights() const { return *weights_; }
  // The plan lowered at `shape` (cached), as the runner executes it.
  std::shared_ptr<const npusim::Program> program(const npusim::PassShape& shape);
  // The timing of the last forward pass as it ran: every dispatch call priced with the
  // launches it ran (equal to price(program(shape)) for that pass's shape).
  const npusim::PassPrediction& last_pass_timing() const { return last_pass_; }
  npusim::ProgramExecutor& executor() { return *executor_; }

 protected:
  void kernel_embedding(const int32_t* ids, int64_t T, float* out) override;
  void kernel_rmsnorm(Stage which, int64_t layer, const float* w, const float* x, int64_t T, float* out) override;
  void kernel_linear(Stage s, const float* x, int64_t T, const std::string& weight, const float* bias,
                     float* y) override;
  void kernel_linears(Stage s, const float* x, int64_t T, std::span<const LinearOut> outs) override;
  void kernel_rope(int64_t layer, float* q, float* k, int64_t T, int64_t pos) override;
  void kv_store(int64_t layer, int64_t rel, const float* k, const float* v, int64_t T) override;
  void kernel_kv_write(int64_t layer, int64_t rel, const float* k, const float* v, int64_t T) override;
  void kernel_attention(int64_t layer, const float* q, int64_t T, int64_t rel, float* out) override;
  void kernel_silu_mul(const float* gate, const float* up, int64_t T, float* out) override;
  void kernel_add(Stage which, float* acc, const float* x, int64_t T) override;
  int oracle_threads() const override { return threads_; }
  void begin_pass(int64_t T, int64_t head_rows) override;
  void end_pass() override;

 private:
  npusim::Placement where(Stage s, int64_t T) const { return plan_.placement(s, T == 1); }
  // The shapes the predictions are made at: a 2048-token prefill and a decode step at 512
  // (or what the model's context allows).
  int64_t prefill_tokens() const { return std::min<int64_t>(2048, spec().max_position); }
  int64_t decode_context() const { return std::min<int64_t>(512, spec().max_position - 1); }
  // The step a kernel call runs: in the pass being run (its rows match), else a kernel
  // program of its own (`priced` false: not part of a pass's timing).
  struct StepRef {
    std::shared_ptr<const npusim::Program> program;
    npusim::Program::Where where;
    bool priced = false;
  };
  StepRef step_for(Stage s, int64_t rows, int64_t context);
  npusim::Placement placement(const StepRef& r) const;
  int64_t step_layer(Stage s) const;
  int64_t weights_layer_ = -1;  // the layer of the projection being run (kernel_linears), else -1
  // Runs the stage's step on the executor (only the launches writing `outputs`, if given).
  void run(Stage s, int64_t rows, int64_t context, npusim::StepArgs& args, const std::set<std::string>& outputs = {});
  // Whether the plan puts the stage on the host for this call (then counted and priced).
  bool on_host(Stage s, int64_t rows, int64_t context);
  const uint16_t* bf16_copy(const float* p, int64_t n);
  void host_reads(const char* buffer, const float* data, int64_t n);
  bool fault(const char* name) const { return faults_.count(name) > 0; }  // its own mapping faults
  uint16_t* kv_layer(int64_t layer, int64_t rows_needed);
  void host_attention(int64_t layer, const float* q, int64_t T, int64_t rel, float* out);
  void split_attention(const StepRef& r, int64_t layer, const float* q, int64_t T, int64_t rel, float* out);

  FaultSet faults_;  // npusim_faults() only: the porting faults are applied from outside
  npusim::Device device_;
  npusim::NpuPlan plan_;
  int threads_ = 1;
  npusim::LoweringFaults lowering_faults_;
  std::unique_ptr<npusim::ProgramExecutor> executor_;
  std::map<npusim::PassShape, std::shared_ptr<const npusim::Program>> programs_;
  std::map<std::pair<Stage, npusim::PassShape>, std::shared_ptr<const npusim::Program>> kernel_programs_;
  std::shared_ptr<const npusim::Program> pass_;  // the pass being run
  npusim::PassPrediction last_pass_;
  std::unique_ptr<cpu::ThreadPool> host_pool_;
  std::unique_ptr<npusim::NpuWeightStore> weights_;
  std::vector<std::vector<uint16_t>> kv_;  // per layer: rows of [K | V], bf16
  std::map<Stage, int64_t> host_calls_;
  int64_t host_softmax_calls_ = 0;
  std::vector<float> scratch_;
  std::vector<std::vector<uint16_t>> bf16_scratch_;
};

}  // namespace tessera
