#include "model/layer_params.h"

#include "model/tensors.h"

namespace tessera {

LayerParams load_layer_params(const Model& model, int64_t l) {
  const ModelSpec& s = model.spec();
  LayerParams L;
  auto w = [&](const char* suffix) { return &model.get(layer_tensor(l, suffix)); };
  auto f32 = [&](const char* suffix) { return model.get(layer_tensor(l, suffix)).to_f32(); };
  auto optional_f32 = [&](const char* suffix) {
    const Weight* p = model.find(layer_tensor(l, suffix));
    return p ? p->to_f32() : std::vector<float>{};
  };
  L.q = w("self_attn.q_proj.weight");
  L.k = w("self_attn.k_proj.weight");
  L.v = w("self_attn.v_proj.weight");
  L.o = w("self_attn.o_proj.weight");
  L.gate = w("mlp.gate_proj.weight");
  L.up = w("mlp.up_proj.weight");
  L.down = w("mlp.down_proj.weight");
  L.attn_norm = f32("input_layernorm.weight");
  L.mlp_norm = f32("post_attention_layernorm.weight");
  if (s.qk_norm) {
    L.q_norm = f32("self_attn.q_norm.weight");
    L.k_norm = f32("self_attn.k_norm.weight");
  }
  if (s.qkv_bias) {
    L.q_bias = optional_f32("self_attn.q_proj.bias");
    L.k_bias = optional_f32("self_attn.k_proj.bias");
    L.v_bias = optional_f32("self_attn.v_proj.bias");
  }
  if (s.o_bias) L.o_bias = optional_f32("self_attn.o_proj.bias");
  if (s.mlp_bias) {
    L.gate_bias = optional_f32("mlp.gate_proj.bias");
    L.up_bias = optional_f32("mlp.up_proj.bias");
    L.down_bias = optional_f32("mlp.down_proj.bias");
  }
  return L;
}

}  // namespace tessera
