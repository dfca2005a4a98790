// A model (Hugging Face directory or GGUF) written as a GGUF that llama.cpp loads: the
// metadata its loader reads, the tokenizer (tokenizer.ggml.*), and every tensor in BF16
// (1-D tensors in F32, as llama.cpp's convert_hf_to_gguf.py writes them). Used to run
// llama.cpp on exactly the weights tessera runs (bench/llama_cpp.sh).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/weights.h"

namespace tessera {

// One tensor of an exported GGUF, in llama.cpp's order.
struct ExportTensor {
  std::string gguf_name;          // "blk.3.attn_q.weight"
  std::string canonical;          // tessera's name; empty for rope_freqs.weight (computed)
  std::vector<int64_t> shape;     // outermost first
  int64_t permute_head_dim = 0;   // > 0: llama q/k, rows permuted for llama.cpp's RoPE
};

// The tensors an export of a model of `spec` writes: embedding, layers, final norm, head
// (when not tied), rope_freqs.weight (llama3 scaling). Throws for rope factors on a
// non-llama model.
std::vector<ExportTensor> export_tensors(const ModelSpec& spec);

struct GgufExportOptions {
  std::string out_path;
  // Overrides tokenizer.ggml.pre for a Hugging Face tokenizer whose pre-tokenizer tessera
  // does not recognise ("llama-bpe", "qwen2", "smollm", "gpt-2").
  std::string tokenizer_pre;
  // general.file_type: llama.cpp's LLAMA_FTYPE_* (32: MOSTLY_BF16).
  uint32_t file_type = 32;
  // The stored type of each tensor of export_tensors(), one each; empty: F32 for 1-D
  // tensors, BF16 otherwise. Any type io/quantize.h writes.
  std::vector<DType> types;
  // Threads encoding each chunk of rows (quantizing is the slow part).
  int threads = 1;
  // Called as each tensor begins: its index and the count, the tensor, its type and size.
  std::function<void(size_t index, size_t count, const ExportTensor&, DType, uint64_t bytes)> on_tensor;
};

// The file being written until it is complete: `out_path` appears only whole (renamed
// from this, in the same directory, at the end).
std::string export_temp_path(const std::string& out_path);

// Called after each chunk of tensor data: bytes written so far and in total.
using ExportProgress = std::function<void(uint64_t done_bytes, uint64_t total_bytes)>;

struct GgufExportResult {
  int64_t tensors = 0;
  uint64_t tensor_bytes = 0;
  std::string tokenizer_pre;  // what tokenizer.ggml.pre says
};

// Streams tensor by tensor (rows are upcast to fp32 a chunk at a time and encoded as each
// tensor's type), so no tensor is ever held whole. llama-architecture q/k rows (and biases)
// are permuted for llama.cpp's interleaved RoPE exactly as convert_hf_to_gguf.py does;
// llama3 rope scaling becomes the rope_freqs.weight tensor; tied embeddings get no
// output.weight. Writes export_temp_path(out_path) and renames it at the end. Throws
// tessera::Error naming the problem (an unwritable output before any work; the partial
// file is removed).
GgufExportResult export_gguf(const Model& model, const GgufExportOptions& opts,
                             const ExportProgress& progress = {});
// export_gguf with the default types: BF16 weights, F32 1-D tensors.
GgufExportResult export_gguf_bf16(const Model& model, const GgufExportOptions& opts,
                                  const ExportProgress& progress = {});

// GGUF name of a canonical tensor ("model.layers.3.self_attn.q_proj.weight" ->
// "blk.3.attn_q.weight"); empty when there is none. The inverse of gguf_to_canonical.
std::string canonical_to_gguf(const std::string& canonical);

// File row of Hugging Face row `r` under llama.cpp's q/k permutation (rows of each head
// reordered from [half, i] to [i, half]), and its inverse.
int64_t llama_permuted_row(int64_t hf_row, int64_t head_dim);
int64_t llama_unpermuted_row(int64_t file_row, int64_t head_dim);

// llama.cpp's per-frequency factors for llama3 rope scaling (head_dim / 2 divisors of the
// unscaled inverse frequencies), as its converter writes them into rope_freqs.weight.
std::vector<float> llama3_rope_freq_factors(const ModelSpec& spec);

}  // namespace tessera
