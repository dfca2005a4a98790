// The cpu target's model runner: the transformer wired from the cpu kernels, with BF16
// weights (memory-mapped when the file already holds BF16 in Hugging Face layout,
// converted once otherwise), a KV cache, the oracle's probe names, per-stage execution
// counters, injectable faults, and per-stage substitution by the oracle's kernel (the
// experiment phase 2's bisect runs). The pipeline sees it as a StagedRunner, made by the
// registry from cpu_target_def().
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "targets/cpu/kernels.h"
#include "targets/staged_runner.h"

namespace tessera {

struct CpuOptions {
  int threads = 0;                 // 0: default_threads()
  FaultSet faults;                 // --inject
  std::set<Stage> oracle_stages;   // stages run by the oracle's kernel instead (bisect)
  bool profile = false;            // accumulate wall time per stage (stage_seconds)
};

// The cpu target as the registry knows it: CpuRunner, known_faults(), and the thread count
// a frozen plan recorded. Its only plan is "cpu-naive"; it has no devices to choose.
TargetDef cpu_target_def();

class CpuRunner final : public StagedRunner {
 public:
  CpuRunner(const Model& model, CpuOptions options = {});
  ~CpuRunner() override;

  // ModelRunner
  std::string target() const override { return "cpu"; }
  const ModelSpec& spec() const override { return model_.spec(); }
  std::vector<float> forward(std::span<const int32_t> ids, bool all_logits = true, const ProbeFn& probe = {},
                             ProbeLevel level = ProbeLevel::None) override;
  int64_t position() const override { return position_; }
  void reset(int64_t start_position = 0) override;
  void truncate(int64_t positions) override;
  std::map<std::string, int64_t> op_counters() const override;

  // StagedRunner
  std::string description() const override;  // "cpu (avx512bf16, 2 threads)"
  std::string isa() const override;          // cpu::isa()
  void forward_layers(float* h, int64_t T, int64_t n_layers, const ProbeFn& probe = {},
                      ProbeLevel level = ProbeLevel::None) override;
  void set_oracle_stages(std::set<Stage> stages) override { options_.oracle_stages = std::move(stages); }
  const std::set<Stage>& oracle_stages() const override { return options_.oracle_stages; }
  // The stage operations, faults included, as the forward pass calls them. op_rope,
  // op_kv_write and op_attention count their stage in op_counters; the forward pass counts
  // the other stages itself (a direct call to them is not counted).
  void op_embedding(const int32_t* ids, int64_t T, float* out) override;
  void op_rmsnorm(Stage which, int64_t layer, const float* x, int64_t T, float* out) override;
  void op_linear(Stage s, const float* x, int64_t T, const std::string& weight, const std::vector<float>& bias,
                 float* y) override;
  void op_rope(int64_t layer, float* q, float* k, int64_t T, int64_t pos) override;  // + Qwen3 q/k norm
  void op_kv_write(int64_t layer, int64_t rel, const float* k, const float* v, int64_t T) override;
  void kv_read(int64_t layer, int64_t rel, int64_t T, float* k, float* v) override;
  void op_attention(int64_t layer, const float* q, int64_t T, int64_t rel, float* out) override;
  void op_silu_mul(const float* gate, const float* up, int64_t T, float* out) override;
  void op_add(Stage which, float* acc, const float* x, int64_t T) override;
  // Plan "cpu-naive": every op on the cpu, one per dispatch, with the ISA, threads, the
  // weights' residency and the KV cache.
  nlohmann::json build_plan(const Model& model) const override;
  int64_t weight_bytes_per_token() const override;
  int64_t kv_bytes_per_position() const override;

  // cpu only.
  // With CpuOptions::profile: wall seconds spent in each stage since construction.
  std::map<std::string, double> stage_seconds() const;
  void clear_profile() { stage_seconds_.fill(0); }
  const CpuOptions& options() const { return options_; }
  int threads() const;
  // Weight bytes the runner reads from the file mapping vs holds converted in memory.
  int64_t mapped_weight_bytes() const { return mapped_bytes_; }
  int64_t owned_weight_bytes() const { return owned_bytes_; }
  // The weights as the kernels see them.
  const cpu::Bf16Matrix& matrix(const std::string& canonical_name) const;
  cpu::ThreadPool& pool() { return *pool_; }
  cpu::KvCache& cache() { return *cache_; }

 private:
  struct Layer;
  void run_layer(int64_t l, float* h, int64_t T, const ProbeFn& probe, ProbeLevel level);
  bool by_oracle(Stage s) const { return options_.oracle_stages.count(s) > 0; }
  bool fault(const char* name) const { return options_.faults.count(name) > 0; }
  void count(Stage s);
  void lap(Stage next);
  const cpu::Bf16Matrix& load_matrix(const Weight& w);
  const std::vector<float>& norm_weight(Stage which, int64_t layer) const;

  const Model& model_;
  CpuOptions options_;
  std::unique_ptr<cpu::ThreadPool> pool_;
  std::unique_ptr<cpu::KvCache> cache_;
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  std::vector<float> inv_freq_, inv_freq_unscaled_;
  std::map<std::string, cpu::Bf16Matrix> matrices_;
  std::vector<std::vector<uint16_t>> owned_;  // converted weights, when the file's are not BF16
  int64_t mapped_bytes_ = 0, owned_bytes_ = 0;
  int64_t position_ = 0, base_ = 0;
  std::array<int64_t, kStageCount> target_calls_{}, oracle_calls_{};
  std::array<double, kStageCount> stage_seconds_{};
  Stage current_ = Stage::Count;
  std::chrono::steady_clock::time_point last_lap_;
  // Working buffers, grown to the largest T seen.
  std::vector<float> x_, q_, k_, v_, attn_, o_, gate_, up_, act_, down_, scratch_;
};

}  // namespace tessera
