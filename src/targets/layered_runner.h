// The forward pass every target shares: embedding, the layers' stages in order, final norm
// and LM head, the KV cache positions, the oracle's probe names, per-stage execution
// counters and wall-time profile, and the per-stage swap to the oracle's kernel that phase
// 2's bisect runs. A target derives from LayeredRunner and supplies its kernels (kernel_*)
// and its KV cache; which kernel runs a stage (the target's or the oracle's twin) is
// decided here, once, so every target swaps the same way.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "model/layer_params.h"
#include "targets/bf16_weights.h"
#include "targets/staged_runner.h"

namespace tessera {

class LayeredRunner : public StagedRunner {
 public:
  // ModelRunner
  const ModelSpec& spec() const override { return model_.spec(); }
  std::vector<float> forward(std::span<const int32_t> ids, bool all_logits = true, const ProbeFn& probe = {},
                             ProbeLevel level = ProbeLevel::None) override;
  int64_t position() const override { return position_; }
  void reset(int64_t start_position = 0) override;
  void truncate(int64_t positions) override;
  // Per stage: calls of the target's kernel ("attention") and of the oracle's twin
  // ("oracle:attention"), counted by the forward pass (phase 1's direct op_* calls are not).
  std::map<std::string, int64_t> op_counters() const override;
  // Sequences: as many as the target's KV storage holds (kv_sequences); the selected one's
  // positions are position_/base_, the others wait in seqs_.
  int max_sequences() const override { return kv_sequences(); }
  void select_sequence(int seq) override;
  int selected_sequence() const override { return selected_; }
  // One pass over the layers for all the sequences' rows: the linears take every row at once
  // (the target sees batched_rows() and keeps each row's one-row numerics); the row-wise
  // stages and attention run row by row on each sequence's own cache.
  using ModelRunner::decode_batch;
  void decode_batch(std::span<const int> seqs, std::span<const int32_t> ids, std::vector<float>& logits) override;

  // StagedRunner
  void forward_layers(float* h, int64_t T, int64_t n_layers, const ProbeFn& probe = {},
                      ProbeLevel level = ProbeLevel::None) override;
  void set_oracle_stages(std::set<Stage> stages) override { oracle_stages_ = std::move(stages); }
  const std::set<Stage>& oracle_stages() const override { return oracle_stages_; }
  // Each op runs the oracle's twin when its stage is swapped, else the target's kernel.
  void op_embedding(const int32_t* ids, int64_t T, float* out) final;
  void op_rmsnorm(Stage which, int64_t layer, const float* x, int64_t T, float* out) final;
  void op_linear(Stage s, const float* x, int64_t T, const std::string& weight, const std::vector<float>& bias,
                 float* y) final;
  void op_linears(Stage s, const float* x, int64_t T, std::span<const LinearOut> outs) final;
  void op_rope(int64_t layer, float* q, float* k, int64_t T, int64_t pos) final;
  void op_kv_write(int64_t layer, int64_t rel, const float* k, const float* v, int64_t T) final;
  void op_attention(int64_t layer, const float* q, int64_t T, int64_t rel, float* out) final;
  void op_silu_mul(const float* gate, const float* up, int64_t T, float* out) final;
  void op_add(Stage which, float* acc, const float* x, int64_t T) final;

  void set_output_tap(std::shared_ptr<OutputTap> tap) override { tap_ = std::move(tap); }
  std::shared_ptr<OutputTap> output_tap() const override { return tap_; }
  void set_kernel_interceptor(std::shared_ptr<KernelInterceptor> i) override { interceptor_ = std::move(i); }

  // With profiling on: wall seconds spent in each stage since construction (or clear).
  std::map<std::string, double> stage_seconds() const override;
  void clear_profile() override { stage_seconds_.fill(0); }

 protected:
  // Loads every layer's parameters, the final norm and the RoPE frequencies.
  LayeredRunner(const Model& model, std::set<Stage> oracle_stages, bool profile);

  const LayerParams& layer(int64_t l) const;
  // Every matrix the forward pass multiplies by (each layer's q, k, v, o, gate, up, down),
  // then the embedding table and the LM head.
  std::vector<const Weight*> matrix_weights() const;
  // Into the target's weight store (load(const Weight&)).
  template <typename Store>
  void load_matrices(Store& store) const {
    for (const Weight* w : matrix_weights()) store.load(*w);
  }
  // Bytes of those matrices one decode step reads (every layer's seven and the LM head: the
  // embedding row read is negligible), as the store holds them (get(name).bytes()).
  template <typename Store>
  int64_t decode_weight_bytes(const Store& store) const {
    int64_t bytes = 0;
    for (const Weight* w : matrix_weights())
      if (w->name != "model.embed_tokens.weight" || w == &model_.lm_head()) bytes += store.get(w->name).bytes();
    return bytes;
  }
  const std::vector<float>& norm_weight(Stage which, int64_t layer) const;
  // Frequencies for RoPE (the model's scaling applied).
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  int64_t rel_position() const { return position_ - base_; }  // the KV cache row of the next token

  // The target's kernels. Shapes as StagedRunner's op_*.
  virtual void kernel_embedding(const int32_t* ids, int64_t T, float* out) = 0;
  virtual void kernel_rmsnorm(Stage which, int64_t layer, const float* w, const float* x, int64_t T, float* out) = 0;
  virtual void kernel_linear(Stage s, const float* x, int64_t T, const std::string& weight, const float* bias,
                             float* y) = 0;
  // The linears of one stage that share their input (q|k|v, gate|up). A target may run them
  // as one kernel (and say so in fuses_linears); by default, one kernel_linear after another.
  virtual void kernel_linears(Stage s, const float* x, int64_t T, std::span<const LinearOut> outs) {
    for (const LinearOut& o : outs) kernel_linear(s, x, T, o.weight, o.bias, o.y);
  }
  virtual void kernel_rope(int64_t layer, float* q, float* k, int64_t T, int64_t pos) = 0;  // + Qwen3 q/k norm
  // The KV cache write itself (the target's storage): the oracle swap of the kv_write stage
  // uses it too. kernel_kv_write is the target's kernel around it.
  virtual void kv_store(int64_t layer, int64_t rel, const float* k, const float* v, int64_t T) = 0;
  virtual void kernel_kv_write(int64_t layer, int64_t rel, const float* k, const float* v, int64_t T) {
    kv_store(layer, rel, k, v, T);
  }
  virtual void kernel_attention(int64_t layer, const float* q, int64_t T, int64_t rel, float* out) = 0;
  // A batched decode step's attention, one row per sequence (when no oracle swap, interceptor
  // or tap wraps the stage): by default kernel_attention row by row; a target may run them
  // in one call, each row's numbers its own.
  struct AttentionRowJob {
    int seq;
    int64_t rel;
    const float* q;
    float* out;
  };
  virtual void kernel_attention_rows(int64_t layer, std::span<const AttentionRowJob> rows);
  virtual void kernel_silu_mul(const float* gate, const float* up, int64_t T, float* out) = 0;
  virtual void kernel_add(Stage which, float* acc, const float* x, int64_t T) = 0;
  // The KV caches the target can hold (1: the one it always has) and the choice of the one
  // kv_store, kv_read and kernel_attention use next.
  virtual int kv_sequences() const { return 1; }
  virtual void kv_select(int seq) {}
  // Inside decode_batch: the T rows of a linear are T sequences' decode rows, not one
  // sequence's tokens (a target keeps each row's one-row numerics).
  bool batched_rows() const { return !batch_.empty(); }
  // Host threads the oracle's twins may use.
  virtual int oracle_threads() const { return 0; }
  // Called around every forward pass (and every forward_layers call outside one) before any
  // stage runs and after the last: the tokens and the rows the head will project (0 when the
  // head does not run). A target may lower, group or price the pass it is about to run.
  virtual void begin_pass(int64_t T, int64_t head_rows) {}
  virtual void end_pass() {}
  // The short name of a projection's output ("q", "k", "v", "o", "gate", "up", "down"), or ""
  // (the probe and tap names; npusim's buffer names).
  static const char* projection_output(const std::string& weight);
  // The layer run_layer is in (0 for phase 1's direct op_* calls).
  int64_t current_layer() const { return current_layer_; }

  const Model& model_;

 private:
  void run_layer(int64_t l, float* h, int64_t T, const ProbeFn& probe, ProbeLevel level);
  void grow_buffers(int64_t T);  // the working buffers, for T rows
  bool by_oracle(Stage s) const { return oracle_stages_.count(s) > 0; }
  // Shows a stage's output to the tap, if any (layer -2: the layer being run).
  void tap(Stage s, int64_t layer, int64_t T, const char* name, float* data, int64_t rows, int64_t cols, bool fused = false);
  void count(Stage s);
  void oracle_rope(int64_t layer, float* q, float* k, int64_t T, int64_t pos);
  void lap(Stage next);

  std::set<Stage> oracle_stages_;
  std::shared_ptr<OutputTap> tap_;
  std::shared_ptr<KernelInterceptor> interceptor_;
  int64_t current_layer_ = 0;  // the layer run_layer is in (phase 1's direct op_* calls: layer 0)
  bool in_pass_ = false;       // inside forward(): forward_layers does not begin a pass of its own
  bool profile_ = false;
  std::vector<LayerParams> layers_;
  std::vector<float> final_norm_;
  std::vector<float> inv_freq_;
  int64_t position_ = 0, base_ = 0;  // the selected sequence's
  struct SequencePositions {
    int64_t position = 0, base = 0;
  };
  std::vector<SequencePositions> seqs_ = std::vector<SequencePositions>(1);  // the others' (selected_'s stale)
  int selected_ = 0;
  std::span<const int> batch_;  // inside decode_batch: the sequence of each row
  std::vector<AttentionRowJob> batch_attention_;  // a batched step's attention rows (reused)
  std::array<int64_t, kStageCount> target_calls_{}, oracle_calls_{};
  std::array<double, kStageCount> stage_seconds_{};
  Stage current_ = Stage::Count;
  std::chrono::steady_clock::time_point last_lap_;
  // Working buffers, grown to the largest T seen.
  std::vector<float> x_, q_, k_, v_, attn_, o_, gate_, up_, act_, down_, scratch_;
};

}  // namespace tessera
