// The cpu target's model runner: the transformer wired from the cpu kernels, with BF16
// weights (memory-mapped when the file already holds BF16 in Hugging Face layout,
// converted once otherwise), a KV cache, the oracle's probe names, per-stage execution
// counters, and per-stage substitution by the oracle's kernel (the
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
#include "targets/cpu/weight_store.h"
#include "targets/layered_runner.h"

namespace tessera {

// The cpu plans: "cpu-fused" (the default) runs the linears of a stage that share their
// input (q|k|v, gate|up) as one kernel; "cpu-naive" runs one kernel per matrix. Phases 4
// and 5 may turn the fusion on per pass (the merge skill).
const std::vector<std::string>& cpu_plan_names();
// The plan's name for a fusion setting: "cpu-fused", "cpu-naive", or, when phases 4 and 5
// fused one pass only, "cpu-fused-prefill" / "cpu-fused-decode".
std::string cpu_plan_name(bool fused_prefill, bool fused_decode);

struct CpuOptions {
  int threads = 0;                 // 0: default_threads()
  bool fused_prefill = true;       // the merge: shared-input linears as one kernel, per pass
  bool fused_decode = true;
  cpu::GemmBlocking blocking;      // the prefill GEMM's cache blocking (tile-tune)
  std::set<Stage> oracle_stages;   // stages run by the oracle's kernel instead (bisect)
  bool profile = false;            // accumulate wall time per stage (stage_seconds)
};

// The cpu target as the registry knows it: CpuRunner, the thread count a frozen plan
// recorded, its plans and its skills; it has no devices to choose and no faults of its own
// (the porting faults are applied from outside, faults/).
TargetDef cpu_target_def();

class CpuRunner final : public LayeredRunner {
 public:
  CpuRunner(const Model& model, CpuOptions options = {});
  ~CpuRunner() override;

  std::string target() const override { return "cpu"; }
  std::string description() const override;  // "cpu (avx512bf16, 2 threads)"
  std::string isa() const override;          // cpu::isa()
  // bf16 weights and GEMM operands, fp32 accumulation and activations, an fp16 KV cache.
  oracle::Numerics numerics(Stage s, int64_t T, int64_t layer = 0) const override;
  bool fuses_linears(Stage s, int64_t T) const override;
  void kv_read(int64_t layer, int64_t rel, int64_t T, float* k, float* v) override;
  // Every op on the cpu, one per dispatch, with the ISA, threads, the kernels' fusion per
  // pass (plan["cpu"]["kernels"]), the weights' residency and the KV cache.
  nlohmann::json build_plan(const Model& model) const override;
  int64_t weight_bytes_per_token() const override;
  int64_t kv_bytes_per_position() const override;
  // Wall time: a prefill of min(128, context) tokens, or a decode step after it (median).
  PassFigure measure(Pass pass) override;
  // cpu::matmul's bf16 GEMM rate on this machine with this runner's threads (StagedRunner).
  double measure_gemm_gflops() override;

  // cpu only.
  static constexpr int kMaxSequences = 256;  // KV caches one runner holds (continuous batching)
  const CpuOptions& options() const { return options_; }
  int threads() const;
  // The weights as the kernels read them (see cpu/weight_store.h).
  const CpuWeightStore& weights() const { return *weights_; }
  const cpu::WeightMatrix& matrix(const std::string& canonical_name) const;
  cpu::ThreadPool& pool() { return *pool_; }
  cpu::KvCache& cache() { return *cache_; }  // the selected sequence's

 protected:
  // The cpu kernels.
  void kernel_embedding(const int32_t* ids, int64_t T, float* out) override;
  void kernel_rmsnorm(Stage which, int64_t layer, const float* w, const float* x, int64_t T, float* out) override;
  void kernel_linear(Stage s, const float* x, int64_t T, const std::string& weight, const float* bias,
                     float* y) override;
  void kernel_linears(Stage s, const float* x, int64_t T, std::span<const LinearOut> outs) override;
  // Sequences for continuous batching: each its own KV cache (grown on demand, as the first).
  int kv_sequences() const override { return kMaxSequences; }
  void kv_select(int seq) override;
  void kernel_rope(int64_t layer, float* q, float* k, int64_t T, int64_t pos) override;
  void kv_store(int64_t layer, int64_t rel, const float* k, const float* v, int64_t T) override;
  void kernel_attention(int64_t layer, const float* q, int64_t T, int64_t rel, float* out) override;
  void kernel_attention_rows(int64_t layer, std::span<const AttentionRowJob> rows) override;
  void kernel_silu_mul(const float* gate, const float* up, int64_t T, float* out) override;
  void kernel_add(Stage which, float* acc, const float* x, int64_t T) override;
  int oracle_threads() const override { return threads(); }
  bool stage_matrix_quantized(Stage s, int64_t layer) const;  // every matrix of the stage in that layer

 private:
  // Gives back the model file's pages the cpu no longer reads (see the definition).
  void release_copied_file_pages() const;

  CpuOptions options_;
  std::unique_ptr<cpu::ThreadPool> pool_;
  std::vector<std::unique_ptr<cpu::KvCache>> caches_;  // one per sequence, made when first selected
  cpu::KvCache* cache_ = nullptr;                       // the selected one
  std::unique_ptr<const CpuWeightStore> weights_;
};

}  // namespace tessera
