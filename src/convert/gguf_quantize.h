// A model (Hugging Face directory, or an F32/F16/BF16 GGUF) written as a quantized GGUF:
// the export of convert/gguf_export.h (same names, order, q/k permutation, metadata, tokenizer)
// with each tensor's type chosen by io/quant_plan.h and encoded by io/quantize.h.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "convert/gguf_export.h"
#include "io/quant_plan.h"
#include "model/weights.h"

namespace tessera {

// The type of every tensor a quantized export of `spec` writes, in file order.
struct QuantizedTensor {
  ExportTensor tensor;
  PlanChoice choice;
};
std::vector<QuantizedTensor> plan_quantized_export(const ModelSpec& spec, const QuantScheme& scheme);

// Called as each tensor begins: its index and the count, and the plan for it.
using QuantizeTensorCallback = std::function<void(size_t index, size_t count, const QuantizedTensor&, uint64_t bytes)>;

struct QuantizeOptions {
  std::string out_path;
  int threads = 1;
  QuantizeTensorCallback on_tensor;
};

struct QuantizeResult {
  int64_t tensors = 0;
  uint64_t bytes = 0;  // tensor data
  uint32_t file_type = 0;
};

// Throws tessera::Error naming the problem: a source whose weights are already quantized
// (quantizing rounded values again compounds both roundings, so tessera refuses, as
// llama-quantize does without --allow-requantize), an output it cannot write, or one that
// would overwrite the input. The output appears whole or not at all.
QuantizeResult quantize_model(const Model& model, const QuantScheme& scheme, const QuantizeOptions& opts);

}  // namespace tessera
