#include "convert/gguf_quantize.h"

#include <fmt/format.h>

#include "util/error.h"

namespace tessera {

std::vector<QuantizedTensor> plan_quantized_export(const ModelSpec& spec, const QuantScheme& scheme) {
  const std::vector<ExportTensor> tensors = export_tensors(spec);
  std::vector<PlanTensor> plan_in;
  for (const ExportTensor& t : tensors)
    plan_in.push_back({t.gguf_name, t.shape, t.shape.size() <= 1 ? DType::F32 : DType::BF16});
  const std::vector<PlanChoice> choices = plan_quant_types(scheme, plan_in, spec.n_layers);
  std::vector<QuantizedTensor> out;
  for (size_t i = 0; i < tensors.size(); ++i) out.push_back({tensors[i], choices[i]});
  return out;
}

QuantizeResult quantize_model(const Model& model, const QuantScheme& scheme, const QuantizeOptions& opts) {
  for (const auto& [name, w] : model.weights()) {
    const DType t = w.info.dtype;
    if (t != DType::F32 && t != DType::F16 && t != DType::BF16)
      fail("{}: tensor '{}' is already quantized ({}); tessera quantizes only F32, F16 or BF16 weights, "
           "because quantizing rounded values again adds a second rounding error to the first: start "
           "from the original model (a Hugging Face directory, or a BF16/F16/F32 GGUF of it)",
           model.path(), w.source_name, dtype_name(t));
  }
  std::vector<QuantizedTensor> plan;
  try {
    plan = plan_quantized_export(model.spec(), scheme);
  } catch (const Error& e) {
    fail("{}: {}", model.path(), e.what());
  }
  GgufExportOptions eo;
  eo.out_path = opts.out_path;
  eo.file_type = scheme.file_type;
  eo.threads = opts.threads;
  for (const QuantizedTensor& q : plan) eo.types.push_back(q.choice.type);
  if (opts.on_tensor)
    eo.on_tensor = [&](size_t i, size_t n, const ExportTensor&, DType, uint64_t bytes) { opts.on_tensor(i, n, plan[i], bytes); };
  const GgufExportResult r = export_gguf(model, eo);
  return {r.tensors, r.tensor_bytes, scheme.file_type};
}

}  // namespace tessera
