// The npusim target's model runner: the shared forward pass (targets/layered_runner.h) with
// each stage run where the plan puts it: on the modelled NPU (npusim/ops.h: a Launch per
// op, executed tile by tile with the hardware's numerics) or on the host (fp32, as a host
// CPU would run it). The KV cache is bf16 in device-visible memory, one [K | V] row per
// position and layer. Faults (`--inject`) are mapping bugs: a transposed access pattern,
// a stale buffer, an over-size tile, a BD-hungry transfer.
#pragma once
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "targets/bf16_weights.h"
#include "targets/layered_runner.h"
#include "targets/npusim/device.h"
#include "targets/npusim/plans.h"

namespace tessera {

namespace cpu {
class ThreadPool;
}
namespace npusim {
class NpuOps;
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
  std::string isa() const override;          // "aie2p (modelled)"
  // The array's numerics (npusim/numerics.h) where the plan places the stage on the NPU;
  // the host's fp32 where it places it on the host.
  oracle::Numerics numerics(Stage s, int64_t T) const override;
  void kv_read(int64_t layer, int64_t rel, int64_t T, float* k, float* v) override;
  // Stages the plan leaves on the host are counted as "host:<stage>" (never silently).
  std::map<std::string, int64_t> op_counters() const override;
  nlohmann::json build_plan(const Model& model) const override;
  int64_t weight_bytes_per_token() const override;
  int64_t kv_bytes_per_position() const override;
  // Predicted prefill (2048 tokens, or the model's context if shorter) and decode at 512.
  nlohmann::json predicted_figures() const override;
  // The timing model's prediction for the plan (deterministic): the same figures.
  PassFigure measure(Pass pass) override;

  const npusim::Device& device() const { return device_; }
  const npusim::NpuPlan& plan() const { return plan_; }
  npusim::NpuOps& ops() { return *ops_; }

 protected:
  void kernel_embedding(const int32_t* ids, int64_t T, float* out) override;
  void kernel_rmsnorm(Stage which, int64_t layer, const float* w, const float* x, int64_t T, float* out) override;
  void kernel_linear(Stage s, const float* x, int64_t T, const std::string& weight, const float* bias,
                     float* y) override;
  void kernel_rope(int64_t layer, float* q, float* k, int64_t T, int64_t pos) override;
  void kv_store(int64_t layer, int64_t rel, const float* k, const float* v, int64_t T) override;
  void kernel_attention(int64_t layer, const float* q, int64_t T, int64_t rel, float* out) override;
  void kernel_silu_mul(const float* gate, const float* up, int64_t T, float* out) override;
  void kernel_add(Stage which, float* acc, const float* x, int64_t T) override;
  int oracle_threads() const override { return threads_; }

 private:
  npusim::Placement where(Stage s, int64_t T) const { return plan_.placement(s, T == 1); }
  // The shapes the predictions are made at: a 2048-token prefill and a decode step at 512
  // (or what the model's context allows).
  int64_t prefill_tokens() const { return std::min<int64_t>(2048, spec().max_position); }
  int64_t decode_context() const { return std::min<int64_t>(512, spec().max_position - 1); }
  void on_host(Stage s) { host_calls_[s]++; }
  bool fault(const char* name) const { return faults_.count(name) > 0; }  // its own mapping faults
  uint16_t* kv_layer(int64_t layer, int64_t rows_needed);
  void host_attention(int64_t layer, const float* q, int64_t T, int64_t rel, float* out);
  void split_attention(int64_t layer, const float* q, int64_t T, int64_t rel, float* out);

  FaultSet faults_;  // npusim_faults() only: the porting faults are applied from outside
  npusim::Device device_;
  npusim::NpuPlan plan_;
  int threads_ = 1;
  std::unique_ptr<npusim::NpuOps> ops_;
  std::unique_ptr<cpu::ThreadPool> host_pool_;
  std::unique_ptr<Bf16WeightStore> weights_;
  std::vector<std::vector<uint16_t>> kv_;  // per layer: rows of [K | V], bf16
  std::map<Stage, int64_t> host_calls_;
  int64_t host_softmax_calls_ = 0;
  std::vector<float> scratch_;
  std::vector<float> stale_o_;  // merged-stale-intermediate: the previous call's O output
};

}  // namespace tessera
