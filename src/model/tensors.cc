#include "model/tensors.h"

#include <fmt/format.h>

namespace tessera {

std::string layer_tensor(int64_t layer, const std::string& suffix) {
  return fmt::format("model.layers.{}.{}", layer, suffix);
}

std::vector<ExpectedTensor> expected_tensors(const ModelSpec& s) {
  const int64_t H = s.hidden, Q = s.q_dim(), KV = s.kv_dim(), I = s.intermediate;
  std::vector<ExpectedTensor> t;
  t.push_back({"model.embed_tokens.weight", {s.vocab, H}, TensorRole::Embedding});
  for (int64_t l = 0; l < s.n_layers; ++l) {
    auto add = [&](const std::string& suffix, std::vector<int64_t> shape, TensorRole role) {
      t.push_back({layer_tensor(l, suffix), std::move(shape), role});
    };
    add("input_layernorm.weight", {H}, TensorRole::Norm);
    add("self_attn.q_proj.weight", {Q, H}, TensorRole::Weight);
    if (s.qkv_bias) add("self_attn.q_proj.bias", {Q}, TensorRole::Bias);
    add("self_attn.k_proj.weight", {KV, H}, TensorRole::Weight);
    if (s.qkv_bias) add("self_attn.k_proj.bias", {KV}, TensorRole::Bias);
    add("self_attn.v_proj.weight", {KV, H}, TensorRole::Weight);
    if (s.qkv_bias) add("self_attn.v_proj.bias", {KV}, TensorRole::Bias);
    if (s.qk_norm) {
      add("self_attn.q_norm.weight", {s.head_dim}, TensorRole::Norm);
      add("self_attn.k_norm.weight", {s.head_dim}, TensorRole::Norm);
    }
    add("self_attn.o_proj.weight", {H, Q}, TensorRole::Weight);
    if (s.o_bias) add("self_attn.o_proj.bias", {H}, TensorRole::Bias);
    add("post_attention_layernorm.weight", {H}, TensorRole::Norm);
    add("mlp.gate_proj.weight", {I, H}, TensorRole::Weight);
    if (s.mlp_bias) add("mlp.gate_proj.bias", {I}, TensorRole::Bias);
    add("mlp.up_proj.weight", {I, H}, TensorRole::Weight);
    if (s.mlp_bias) add("mlp.up_proj.bias", {I}, TensorRole::Bias);
    add("mlp.down_proj.weight", {H, I}, TensorRole::Weight);
    if (s.mlp_bias) add("mlp.down_proj.bias", {H}, TensorRole::Bias);
  }
  t.push_back({"model.norm.weight", {H}, TensorRole::Norm});
  if (!s.tie_embeddings) t.push_back({"lm_head.weight", {s.vocab, H}, TensorRole::LmHead});
  return t;
}

}  // namespace tessera
