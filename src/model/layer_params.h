// One transformer layer's parameters as every executor needs them: its matrices (left in
// the file, to be read the executor's way) and its small vectors (norms, biases) upcast to
// fp32. Biases are read only when the spec says the architecture has them.
#pragma once
#include <cstdint>
#include <vector>

#include "model/weights.h"

namespace tessera {

struct LayerParams {
  const Weight *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  const Weight *gate = nullptr, *up = nullptr, *down = nullptr;
  std::vector<float> attn_norm, mlp_norm, q_norm, k_norm;  // q/k norm: Qwen3 only
  std::vector<float> q_bias, k_bias, v_bias, o_bias, gate_bias, up_bias, down_bias;  // empty: none
};

LayerParams load_layer_params(const Model& model, int64_t layer);

}  // namespace tessera
