// Which type each tensor of a model gets when it is quantized: the schemes `tessera
// quantize --to` accepts, and llama.cpp's choices (src/llama-quant.cpp, the default case
// without an importance matrix or overrides: llama_tensor_get_type, tensor_type_fallback).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/tensor.h"

namespace tessera {

struct QuantScheme {
  std::string name;    // "q4_k_m"
  DType base;          // the type most tensors get: Q4_K
  bool mixed;          // llama.cpp's per-tensor mix (q4_k_m, q5_k_m); else every tensor gets `base`
  uint32_t file_type;  // general.file_type, llama.cpp's LLAMA_FTYPE_MOSTLY_*
};

// q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k q4_k_m q5_k_m. A single type applies to
// every quantizable tensor, like `llama-quantize --pure` (whose file_type for q2_k..q5_k is
// llama.cpp's Q2_K, Q3_K_S, Q4_K_S, Q5_K_S); the _m schemes are llama.cpp's Q4_K_M / Q5_K_M.
const std::vector<QuantScheme>& quant_schemes();
// Case-insensitive; nullptr when unknown.
const QuantScheme* find_quant_scheme(const std::string& name);
std::string quant_scheme_names();  // "q8_0, q4_0, ..."

// A tensor as the planner sees it: its GGUF name and shape (outermost first; the row length
// is the last dimension, ggml's ne[0]).
struct PlanTensor {
  std::string name;
  std::vector<int64_t> shape;
  DType unquantized = DType::F32;  // what it is stored as when it is not quantized
};

struct PlanChoice {
  DType type;
  bool quantized = false;  // false: kept as `unquantized` (1-D tensors, norms)
  std::string note;        // why a type differs from the first pick ("" when it does not)
};

// One choice per tensor, in the order given. llama.cpp quantizes only 2-D tensors whose
// names end in "weight" and are not norms. For the _m schemes: the output projection (and
// the embedding, when tied to it) gets Q6_K, or Q8_0 when its rows do not split into 256s;
// attn_v and ffn_down get Q6_K on the "more bits" layers (the first and last eighth of the
// stack and every third between: use_more_bits). A K-quant whose row length is not a
// multiple of 256 falls back (Q2_K, Q3_K -> Q4_0; Q4_K -> Q5_0; Q5_K -> Q5_1; Q6_K -> Q8_0),
// and a row that does not split into 32s is stored F16. `n_layers` is the model's block
// count (llama.cpp counts ffn_down tensors against it).
std::vector<PlanChoice> plan_quant_types(const QuantScheme& scheme, const std::vector<PlanTensor>& tensors,
                                         int64_t n_layers);

}  // namespace tessera
