// The canonical tensor set of a model: Hugging Face names and shapes, derived from the spec.
// Loaders map file names onto these; synth writes exactly these; validation checks them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/spec.h"

namespace tessera {

enum class TensorRole { Embedding, Norm, Weight, Bias, LmHead };

struct ExpectedTensor {
  std::string name;             // "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;   // outermost first
  TensorRole role;
};

std::string layer_tensor(int64_t layer, const std::string& suffix);  // model.layers.{i}.{suffix}

// Every tensor the forward pass reads, in a stable order (embedding, layers, norm, head).
// lm_head.weight appears only when embeddings are not tied.
std::vector<ExpectedTensor> expected_tensors(const ModelSpec& spec);

}  // namespace tessera
