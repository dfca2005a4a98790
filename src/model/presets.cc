#include "model/presets.h"

#include <algorithm>
#include <cctype>

#include "model/tensors.h"
#include "util/error.h"

namespace tessera {
namespace {

// Width and depth: the only things a tiny form changes.
struct Shape {
  int64_t hidden, intermediate, layers, heads, kv_heads, head_dim;
};

void apply(ModelSpec& s, const Shape& sh) {
  s.hidden = sh.hidden;
  s.intermediate = sh.intermediate;
  s.n_layers = sh.layers;
  s.n_heads = sh.heads;
  s.n_kv_heads = sh.kv_heads;
  s.head_dim = sh.head_dim;
}

// Llama 3.2: llama3 rope scaling, 128256-token vocab, BOS added by the tokenizer,
// instruct stops on end_of_text, eom and eot.
ModelSpec llama32(const Shape& sh) {
  ModelSpec s;
  s.arch = Arch::Llama;
  s.model_type = "llama";
  apply(s, sh);
  s.vocab = 128256;
  s.max_position = 131072;
  s.rope_theta = 500000.0;
  s.rope_scaling.type = RopeScaling::Type::Llama3;
  s.rope_scaling.factor = 32.0;
  s.rope_scaling.low_freq_factor = 1.0;
  s.rope_scaling.high_freq_factor = 4.0;
  s.rope_scaling.original_max_position = 8192;
  s.rms_eps = 1e-5;
  s.tie_embeddings = true;
  s.bos_id = 128000;
  s.eos_ids = {128001, 128008, 128009};
  return s;
}

// SmolLM2: Llama architecture without rope scaling; ChatML ids <|im_start|> = 1,
// <|im_end|> = 2, and <|endoftext|> = 0 also ends generation (base-model style text).
ModelSpec smollm2(const Shape& sh, double rope_theta) {
  ModelSpec s;
  s.arch = Arch::Llama;
  s.model_type = "llama";
  apply(s, sh);
  s.vocab = 49152;
  s.max_position = 8192;
  s.rope_theta = rope_theta;
  s.rms_eps = 1e-5;
  s.tie_embeddings = true;
  s.bos_id = 1;
  s.eos_ids = {2, 0};
  return s;
}

// Qwen2 / Qwen3 share vocab (151936, padded past the ~151665-entry tokenizer), theta,
// eps and special ids (no BOS; <|endoftext|> and <|im_end|> end generation).
ModelSpec qwen(Arch arch, const Shape& sh, int64_t max_position) {
  ModelSpec s;
  s.arch = arch;
  s.model_type = arch == Arch::Qwen2 ? "qwen2" : "qwen3";
  apply(s, sh);
  s.vocab = 151936;
  s.max_position = max_position;
  s.rope_theta = 1e6;
  s.rms_eps = 1e-6;
  s.qkv_bias = arch == Arch::Qwen2;  // Qwen2 always has q/k/v bias
  s.qk_norm = arch == Arch::Qwen3;   // Qwen3 has per-head q/k RMSNorm instead
  s.tie_embeddings = true;
  s.bos_id = -1;
  s.eos_ids = {151643, 151645};
  return s;
}

ModelSpec qwen2(const Shape& sh) { return qwen(Arch::Qwen2, sh, 32768); }
ModelSpec qwen3(const Shape& sh) { return qwen(Arch::Qwen3, sh, 40960); }

std::vector<Preset> build() {
  // Full shapes: models.md, column for column (hidden, intermediate, layers, heads, kv, head_dim).
  // Tiny shapes: hidden = heads x head_dim except where the real model decouples them
  // (Qwen3-0.6B and -4B: q dim > hidden); GQA group and head_dim as the full model;
  // intermediate a multiple of 64 at 2 to 3x hidden; depth varies over 2..4 so layer-count
  // bugs show.
  std::vector<Preset> p;
  p.push_back({"Llama-3.2-1B", "llama3", llama32({2048, 8192, 16, 32, 8, 64}),
               llama32({256, 768, 2, 4, 1, 64})});
  p.push_back({"Llama-3.2-3B", "llama3", llama32({3072, 8192, 28, 24, 8, 128}),
               llama32({384, 1024, 3, 3, 1, 128})});
  p.push_back({"SmolLM2-135M", "smollm2", smollm2({576, 1536, 30, 9, 3, 64}, 100000.0),
               smollm2({576, 1536, 2, 9, 3, 64}, 100000.0)});
  p.push_back({"SmolLM2-360M", "smollm2", smollm2({960, 2560, 32, 15, 5, 64}, 100000.0),
               smollm2({192, 512, 3, 3, 1, 64}, 100000.0)});
  p.push_back({"SmolLM2-1.7B", "smollm2", smollm2({2048, 8192, 24, 32, 32, 64}, 130000.0),
               smollm2({256, 768, 4, 4, 4, 64}, 130000.0)});
  p.push_back({"Qwen2.5-0.5B", "qwen", qwen2({896, 4864, 24, 14, 2, 64}),
               qwen2({896, 1792, 2, 14, 2, 64})});
  p.push_back({"Qwen2.5-1.5B", "qwen", qwen2({1536, 8960, 28, 12, 2, 128}),
               qwen2({768, 2048, 3, 6, 1, 128})});
  p.push_back({"Qwen2.5-3B", "qwen", qwen2({2048, 11008, 36, 16, 2, 128}),
               qwen2({1024, 2816, 2, 8, 1, 128})});
  p.push_back({"Qwen3-0.6B", "qwen", qwen3({1024, 3072, 28, 16, 8, 128}),
               qwen3({256, 768, 3, 4, 2, 128})});
  p.push_back({"Qwen3-1.7B", "qwen", qwen3({2048, 6144, 28, 16, 8, 128}),
               qwen3({256, 768, 2, 2, 1, 128})});
  p.push_back({"Qwen3-4B", "qwen", qwen3({2560, 9728, 36, 32, 8, 128}),
               qwen3({320, 960, 4, 4, 1, 128})});
  return p;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> table = build();
  return table;
}

const Preset& find_preset(const std::string& name) {
  for (const Preset& p : presets())
    if (p.name == name) return p;
  for (const Preset& p : presets())
    if (lower(p.name) == lower(name)) return p;
  std::string names;
  for (const Preset& p : presets()) names += (names.empty() ? "" : ", ") + p.name;
  fail("unknown preset '{}'; valid presets: {}", name, names);
}

int64_t count_params(const ModelSpec& spec) {
  int64_t n = 0;
  for (const ExpectedTensor& t : expected_tensors(spec)) {
    int64_t e = 1;
    for (int64_t d : t.shape) e *= d;
    n += e;
  }
  return n;
}

}  // namespace tessera
