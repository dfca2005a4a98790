// A model opened for reading: its spec and its tensors under canonical (Hugging Face)
// names, memory-mapped from safetensors (single or sharded) or GGUF. Every tensor the
// spec needs is checked (present, shape, dtype, byte range) before anything runs.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/tensor.h"
#include "model/spec.h"

namespace tessera {

// One weight as the forward pass sees it. Rows are in Hugging Face layout even when the
// file stores them otherwise (GGUF llama q/k rows are permuted for interleaved RoPE).
struct Weight {
  std::string name;          // canonical name
  std::string source_name;   // name in the file
  TensorInfo info;           // shape in Hugging Face layout
  int64_t unpermute_head_dim = 0;  // > 0: GGUF llama q/k; row r comes from a permuted row

  int64_t rows() const { return info.rows(); }
  int64_t cols() const { return info.cols(); }
  int64_t source_row(int64_t r) const;
  // Upcast row r (Hugging Face layout) to fp32: the oracle never holds an fp32 copy.
  void row_f32(int64_t r, float* out) const;
  // Upcast the whole tensor (small tensors: norms, biases).
  std::vector<float> to_f32() const;
};

class Model {
 public:
  // `path` is a Hugging Face directory (config.json + *.safetensors [+ index.json]) or a
  // .gguf file. Throws tessera::Error naming the problem.
  static Model open(const std::string& path);

  const ModelSpec& spec() const { return spec_; }
  const std::string& path() const { return path_; }
  const std::string& format() const { return format_; }  // "safetensors" or "gguf"
  const GgufFile* gguf() const { return gguf_ ? &*gguf_ : nullptr; }

  const Weight& get(const std::string& name) const;  // throws naming the tensor
  const Weight* find(const std::string& name) const;
  const std::map<std::string, Weight>& weights() const { return weights_; }
  // The output projection: lm_head.weight, or the embedding when tied.
  const Weight& lm_head() const;

 private:
  ModelSpec spec_;
  std::string path_;
  std::string format_;
  std::optional<GgufFile> gguf_;
  std::map<std::string, Weight> weights_;
};

// GGUF tensor name -> canonical name ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight");
// empty when the name is not one tessera knows.
std::string gguf_to_canonical(const std::string& gguf_name);

}  // namespace tessera
