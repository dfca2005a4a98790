// The FP32 oracle: a plain forward pass with Hugging Face transformers' semantics. Weights
// stay in their file dtype and are upcast row by row as they are used, so a 4B model never
// needs an FP32 copy. Every kernel output of every layer is a named probe point.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/layer_params.h"
#include "model/weights.h"

namespace tessera {

enum class ProbeLevel {
  None,
  Layers,  // layers.{i}.out, final_norm, logits
  All,     // every kernel output: see probe_names()
};

// Receives a probe's value: `rows` positions by `cols` values, row-major fp32.
using ProbeFn = std::function<void(const std::string& name, const float* data, int64_t rows, int64_t cols)>;

// The per-layer probe suffixes in execution order ("attn_norm", "q", ..., "out").
const std::vector<std::string>& layer_probe_suffixes();

class Oracle {
 public:
  explicit Oracle(const Model& model, int threads = 0);  // 0: default_threads()

  // Runs `ids` at the next positions, appends their keys and values to the KV cache, and
  // returns logits for every position ([T, vocab]) or only the last ([1, vocab]).
  std::vector<float> forward(std::span<const int32_t> ids, bool all_logits = true,
                             const ProbeFn& probe = {}, ProbeLevel level = ProbeLevel::None);

  int64_t position() const { return position_; }
  // Empties the KV cache. A start position > 0 runs the next tokens as if that many had
  // come before them (RoPE at long positions without paying for the context): attention
  // sees only what was run since.
  void reset(int64_t start_position = 0);
  // Keeps the first `positions` entries of the KV cache (a chat reusing a shared prefix).
  void truncate(int64_t positions);
  const ModelSpec& spec() const { return model_.spec(); }

 private:
  struct Layer {
    LayerParams p;
    std::vector<float> k_cache, v_cache;  // [positions, kv_dim]
  };
  const Model& model_;
  int threads_;
  int64_t position_ = 0;
  int64_t base_ = 0;  // the position the cache starts at
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  std::vector<float> inv_freq_;
};

}  // namespace tessera
