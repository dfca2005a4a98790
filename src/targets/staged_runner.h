// What the pipeline needs from any target (design sections 1, 3, 4): a ModelRunner whose
// forward pass is cut into the stages of targets/stages.h, so that
//   - phase 1 can run each stage's kernel on its own, on the oracle's real activations
//     (the op_* calls below), against the oracle's twin;
//   - phase 2 can run layer 0 alone (forward_layers) and bisect by swapping one stage at a
//     time for the oracle's kernel (set_oracle_stages);
//   - phases 3 and 6 run the whole model (forward) and read op_counters();
//   - deploy writes the target's first plan (build_plan) and names the target
//     (description(), isa());
//   - bench holds decode against its roof (weight_bytes_per_token, kv_bytes_per_position).
// Targets are constructed through targets/registry.h (make_target_runner); the pipeline
// never names a concrete runner. Target-specific extras (the cpu's matrices, thread pool,
// per-stage profile) stay on the concrete class; callers that need them dynamic_cast.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "oracle/numerics.h"
#include "targets/opt_skills.h"
#include "targets/stages.h"
#include "targets/target.h"

namespace tessera {

// One output of one stage, as a tap sees it (StagedRunner::set_output_tap).
struct StageOutput {
  Stage stage = Stage::Count;
  int64_t layer = -1;   // -1: not a per-layer stage (embedding, final norm, LM head)
  int64_t tokens = 0;   // tokens in the step (1: a decode step)
  bool fused = false;   // computed by a fused kernel (fuses_linears)
  const char* name = "";  // which output of the stage: "q", "k", "v", "gate", "up", or ""
  float* data = nullptr;  // rows x cols, changeable
  int64_t rows = 0, cols = 0;
};
class OutputTap {
 public:
  virtual ~OutputTap() = default;
  virtual void on_output(const StageOutput& out) = 0;
};

class KernelInterceptor;

class StagedRunner : public ModelRunner {
 public:
  // One line naming the target and how it runs: "cpu (avx512bf16, 2 threads)".
  virtual std::string description() const = 0;
  // The instruction set the target's kernels run (cpu: "avx512bf16", "hwy-avx2", "scalar";
  // an NPU: its core architecture). Phase 1's summary and kernel_registry name it.
  virtual std::string isa() const = 0;

  // Runs layers [0, n_layers) on hidden states h [T, hidden] (in place) at the next
  // positions, without embedding or head: phase 2 drives one layer with the oracle's inputs.
  virtual void forward_layers(float* h, int64_t T, int64_t n_layers, const ProbeFn& probe = {},
                              ProbeLevel level = ProbeLevel::None) = 0;

  // Stages run by the oracle's kernel instead of the target's (phase 2's bisect experiment).
  virtual void set_oracle_stages(std::set<Stage> stages) = 0;
  virtual const std::set<Stage>& oracle_stages() const = 0;

  // The stage operations as the forward pass runs them (oracle swaps and the interceptor
  // included); phase 1 calls them one at a time on the oracle's activations. Shapes: H =
  // hidden, Q = q_dim, KV = kv_dim, I = intermediate; `rel` is the KV cache row (position
  // minus the start position given to reset()). Every output buffer is written in full and
  // nothing outside it (phase 1 surrounds each with guard bytes).
  //   embedding: ids [T] -> out [T, H]
  virtual void op_embedding(const int32_t* ids, int64_t T, float* out) = 0;
  //   rmsnorm with the weights of `which` (AttnNorm, MlpNorm: of `layer`; FinalNorm: layer
  //   ignored): x [T, H] -> out [T, H]
  virtual void op_rmsnorm(Stage which, int64_t layer, const float* x, int64_t T, float* out) = 0;
  //   y [T, N] = x [T, K] . W^T (+ bias); `s` the stage it belongs to (QkvProj, OProj,
  //   GateUpProj, DownProj, LmHead), `weight` its canonical tensor name
  virtual void op_linear(Stage s, const float* x, int64_t T, const std::string& weight, const std::vector<float>& bias,
                         float* y) = 0;
  //   the linears of one stage that share their input (q|k|v, gate|up), as the forward pass
  //   runs them: one fused kernel where the plan fuses them (fuses_linears), else one
  //   op_linear each. Phase 1 gates this call, so the fused kernel is the one gated.
  struct LinearOut {
    const std::string& weight;
    const float* bias;  // may be null
    float* y;
  };
  virtual void op_linears(Stage s, const float* x, int64_t T, std::span<const LinearOut> outs) = 0;
  //   whether op_linears runs stage `s`'s linears as one kernel for a step of T tokens
  virtual bool fuses_linears(Stage s, int64_t T) const { return false; }
  // Where the output of stage `from` reaches stage `to` (a merged dispatch: "dispatch
  // `layer.o+mlp`, buffer `o`"; a buffer a dispatch keeps on the device that host code reads
  // next), for the debug skills to name; "" when nothing is handed over that way.
  virtual std::string handover(Stage from, Stage to, int64_t T) const { return ""; }
  // Which inputs of `consumer` share device memory with a buffer written while they are still
  // to be read (an intermediate reused while live: "dispatch `layer.o+mlp`: buffer `gate`
  // (L2 bytes 4096-36864) is overwritten by `up` (launch 4) before launch 5 reads it"), for the
  // debug skills to name; "" when none.
  virtual std::string shared_memory(Stage consumer, int64_t T) const { return ""; }

  // Test scaffolding hooks in from outside, never inside a kernel: a tap sees every stage's
  // output as the forward pass (or an op_* call) produced it, and may change it (the
  // perturbations of pipeline/perturb.h). nullptr: none.
  virtual void set_output_tap(std::shared_ptr<OutputTap> tap) = 0;
  virtual std::shared_ptr<OutputTap> output_tap() const = 0;
  // The second hook: an interceptor stands in for the target's kernel of a stage, given the
  // stage's inputs and that kernel (the named faults of faults/). nullptr: none.
  virtual void set_kernel_interceptor(std::shared_ptr<KernelInterceptor> interceptor) = 0;

  // Where this target rounds and which approximations it uses (oracle/numerics.h) for
  // stage `s` of `layer` in a step of T tokens (a plan may place a stage on another
  // processor; a file may store a stage's matrices in other formats in other layers): the
  // expected error of each of its kernels, and so phase 1's limits, follow from it.
  virtual oracle::Numerics numerics(Stage s, int64_t T, int64_t layer = 0) const = 0;
  //   RoPE at positions [pos, pos + T) on q [T, Q] and k [T, KV] in place (Qwen3: q/k norm first)
  virtual void op_rope(int64_t layer, float* q, float* k, int64_t T, int64_t pos) = 0;
  //   k, v [T, KV] into the cache rows [rel, rel + T) of `layer`
  virtual void op_kv_write(int64_t layer, int64_t rel, const float* k, const float* v, int64_t T) = 0;
  //   the cache rows [rel, rel + T) of `layer` back as fp32 k, v [T, KV] (phase 1's round trip)
  virtual void kv_read(int64_t layer, int64_t rel, int64_t T, float* k, float* v) = 0;
  //   causal GQA attention of q [T, Q] (rows at cache rows rel..rel+T-1, written before)
  //   over the cache rows [0, rel + T) -> out [T, Q]
  virtual void op_attention(int64_t layer, const float* q, int64_t T, int64_t rel, float* out) = 0;
  //   out [T, I] = silu(gate) * up
  virtual void op_silu_mul(const float* gate, const float* up, int64_t T, float* out) = 0;
  //   acc [T, H] += x [T, H]; `which` is AttnResidual or MlpResidual
  virtual void op_add(Stage which, float* acc, const float* x, int64_t T) = 0;

  // The deployment's first plan for this model (design section 4): "format", "name",
  // "target", "model", "dispatches" (see one_op_per_dispatch), "host_ops", "frozen": false,
  // plus whatever the target records about itself. deploy writes it after phase 1.
  virtual nlohmann::json build_plan(const Model& model) const = 0;

  // Figures the target predicts for itself rather than measures (a modelled NPU: prefill
  // and decode times from its timing model), as JSON for report.json; empty when the
  // target's figures are measured (the cpu).
  virtual nlohmann::json predicted_figures() const { return nlohmann::json::object(); }
  // A modelled target's prediction of one pass as its timing model prices the lowered program:
  // a prefill of `tokens` positions from an empty cache (decode false), or one decode step
  // after `tokens` cached positions. {"device", "plan", "plan_description", "us",
  // "npu_dispatches", "prediction" (every dispatch priced), "describe" (the profile table)}, and
  // with_program "program" (what the engine runs) and "plan_spec" (the plan, whole); null for a
  // target whose figures are measured.
  virtual nlohmann::json predict_pass(bool decode, int64_t tokens, bool with_program = false) const {
    return nlohmann::json();
  }
  // With TargetOptions::profile: wall seconds per stage since construction or clear_profile()
  // (empty where the target keeps no such record).
  virtual std::map<std::string, double> stage_seconds() const { return {}; }
  virtual void clear_profile() {}
  // What the report draws of a modelled target's passes (the npusim timeline and tile maps
  // of one prefill and one decode step, from the lowered Program): {"prefill": ..., "decode":
  // ...}; empty when the target has no such model.
  virtual nlohmann::json predicted_timeline() const { return nlohmann::json::object(); }
  // The compute roof a measured target's prefill is held against: its own GEMM kernel's rate
  // in GFLOP/s on a bf16 problem of [256 x 2048] x [2048 x 2048]^T, measured now (best of 3);
  // 0 when the target has none (a modelled target predicts its figures).
  virtual double measure_gemm_gflops() { return 0; }

  // This runner's figure of merit for one pass, what phases 4 and 5 compare plans by: a
  // real target times itself (which resets its cache), a modelled one predicts.
  virtual PassFigure measure(Pass pass) = 0;

  // Bytes of weights one decode step reads (every layer's matrices plus the LM head), and
  // KV cache bytes per cached position (all layers, keys and values).
  virtual int64_t weight_bytes_per_token() const = 0;
  virtual int64_t kv_bytes_per_position() const = 0;
};

// Runs in place of a target's kernel for the stages it overrides: each call gets the stage's
// inputs and the target's own kernel as `kernel`, to call unchanged, with other arguments,
// or not at all (a fault that computes the stage its own wrong way). The defaults call the
// kernel unchanged. Stages swapped to the oracle's twin are not intercepted, and the output
// tap sees what the interceptor leaves.
class KernelInterceptor {
 public:
  using LinearOut = StagedRunner::LinearOut;
  virtual ~KernelInterceptor() = default;
  // op_linear (one output) and op_linears; `kernel` runs the target's kernel(s) on (x, outs).
  using LinearsKernel = std::function<void(const float* x, std::span<const LinearOut> outs)>;
  virtual void linears(StagedRunner& runner, Stage s, const float* x, int64_t T, std::span<const LinearOut> outs,
                       const LinearsKernel& kernel) {
    kernel(x, outs);
  }
  // op_rope at positions [pos, pos + T); `kernel` rotates (and Qwen3: q/k-normalizes) in place.
  using RopeKernel = std::function<void(float* q, float* k)>;
  virtual void rope(StagedRunner& runner, int64_t layer, float* q, float* k, int64_t T, int64_t pos,
                    const RopeKernel& kernel) {
    kernel(q, k);
  }
  // op_kv_write into cache rows [rel, rel + T); `kernel` writes k, v into `layer`'s rows.
  using KvWriteKernel = std::function<void(int64_t layer, const float* k, const float* v)>;
  virtual void kv_write(StagedRunner& runner, int64_t layer, int64_t rel, const float* k, const float* v, int64_t T,
                        const KvWriteKernel& kernel) {
    kernel(layer, k, v);
  }
  // op_attention of q's T rows at cache rows rel..; `kernel` attends over `layer`'s cache.
  using AttentionKernel = std::function<void(int64_t layer, float* out)>;
  virtual void attention(StagedRunner& runner, int64_t layer, const float* q, int64_t T, int64_t rel, float* out,
                         const AttentionKernel& kernel) {
    kernel(layer, out);
  }
};

// How a target runner is made (targets/registry.h).
struct TargetOptions {
  int threads = 0;                // host worker threads; 0: default_threads()
  FaultSet faults;                // the target's own faults (TargetDef::faults; the others: faults/)
  std::set<Stage> oracle_stages;  // stages run by the oracle's kernel (bisect)
  bool profile = false;           // accumulate wall time per stage, where the target can
  std::string plan_name;          // "": the target's default plan
  std::string device;             // "": the target's default device (profile)
  // A plan this target wrote (build_plan's JSON, perhaps rewritten by phases 4 and 5) to run
  // exactly as it says; null: the plan named by plan_name.
  nlohmann::json plan;
};

// A target as the registry knows it. Each target's header declares a function returning
// its definition (cpu: cpu_target_def() in targets/cpu/cpu_runner.h).
struct TargetDef {
  std::string name;  // "cpu", "npusim"
  std::function<std::unique_ptr<StagedRunner>(const Model&, const TargetOptions&)> make;
  // The faults the target itself commits on purpose (npusim's mapping bugs); the porting
  // and runtime faults every target takes are faults/'s, applied from outside.
  std::function<const std::vector<FaultInfo>&()> faults;
  // Refuses options the target cannot honour (an unknown plan or device), cheaply, before
  // any model is loaded; may be empty. Faults are checked by the registry.
  std::function<void(const TargetOptions&)> check_options;
  // Options a frozen plan fixes when a deployment is run again (cpu: its thread count when
  // none is asked); may be empty. Called before make().
  std::function<void(const nlohmann::json& plan, TargetOptions& options)> options_from_plan;
  // The optimization skills phases 4 and 5 try, in order; may be empty.
  std::function<const std::vector<OptSkill>&()> skills;
  // Capabilities the commands above the pipeline ask for, never a target's name:
  // `tessera serve` runs requests on it (it runs them at a useful speed, batched decode).
  bool serves = false;
  // Why `tessera serve` refuses it (serves false), one clause: "a modelled device ...".
  std::string serve_refusal;
};

}  // namespace tessera
