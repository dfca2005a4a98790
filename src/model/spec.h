// ModelSpec: everything about a decoder-only model's architecture that changes the
// forward pass, read from a Hugging Face config.json or from GGUF metadata.
// Anything that would change the forward pass and is not supported is refused by name.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace tessera {

class GgufFile;

enum class Arch { Llama, Qwen2, Qwen3 };
const char* arch_name(Arch a);            // "llama", "qwen2", "qwen3"
const char* arch_hf_class(Arch a);        // "LlamaForCausalLM", ...

struct RopeScaling {
  enum class Type { None, Llama3 };
  Type type = Type::None;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};

struct ModelSpec {
  Arch arch = Arch::Llama;
  std::string model_type;  // as named by the source ("llama", "qwen2", "qwen3")
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab = 0;
  int64_t max_position = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // Per-frequency divisors stored by GGUF files (rope_freqs.weight: llama3 scaling baked
  // into a tensor); empty when the scaling comes from rope_scaling.
  std::vector<float> rope_freq_factors;
  double rms_eps = 1e-6;
  bool qkv_bias = false;   // bias on q, k, v projections (Qwen2; Llama attention_bias)
  bool o_bias = false;     // bias on o_proj (Llama attention_bias only)
  bool mlp_bias = false;   // bias on gate/up/down (Llama mlp_bias)
  bool qk_norm = false;    // per-head RMSNorm on q and k before RoPE (Qwen3)
  bool tie_embeddings = false;
  int64_t bos_id = -1;     // -1 when unknown
  std::vector<int64_t> eos_ids;

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t gqa_group() const { return n_heads / n_kv_heads; }
  double attn_scale() const;  // head_dim ** -0.5

  // Checks internal consistency (positive sizes, heads divisible by kv heads, ...);
  // throws tessera::Error naming the field.
  void validate() const;

  nlohmann::json to_json() const;
};

// Throws tessera::Error with one line naming the missing field or unsupported feature
// (MoE, sliding-window layers, MLA, unknown model_type, unknown rope scaling type).
ModelSpec spec_from_hf_config(const nlohmann::json& config);
// Appends the ids of a config's "eos_token_id" (an id or a list; config.json and
// generation_config.json both use it) that `ids` does not hold yet.
void add_eos_ids(const nlohmann::json& config, std::vector<int64_t>& ids);
ModelSpec spec_from_gguf(const GgufFile& gguf);

// The Hugging Face config.json that describes `spec` (used by `tessera synth`).
nlohmann::json spec_to_hf_config(const ModelSpec& spec);

// Human-readable architecture features: GQA ratio, biases, q/k norm, rope scaling, tying.
std::vector<std::pair<std::string, std::string>> spec_features(const ModelSpec& spec);

// One (kernel, shape) pair the model needs; shapes use T for the token count. The op table
// (pipeline/op_table.h) lists them, row by row.
struct KernelNeed {
  std::string kernel;  // "gemm", "rmsnorm", "rope", "attention", ...
  std::string role;    // "q_proj", "attn_norm", ...
  std::string shape;   // "[T,576] x [576,576]^T"
};

}  // namespace tessera
