#include "model/spec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "io/gguf.h"
#include "util/error.h"
#include "util/json_fields.h"

namespace tessera {

using nlohmann::json;

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
  }
  return "?";
}

const char* arch_hf_class(Arch a) {
  switch (a) {
    case Arch::Llama: return "LlamaForCausalLM";
    case Arch::Qwen2: return "Qwen2ForCausalLM";
    case Arch::Qwen3: return "Qwen3ForCausalLM";
  }
  return "?";
}

double ModelSpec::attn_scale() const { return 1.0 / std::sqrt(double(head_dim)); }

void ModelSpec::validate() const {
  auto positive = [](const char* field, int64_t v) {
    if (v <= 0) fail("model spec: {} must be positive, got {}", field, v);
  };
  positive("hidden_size", hidden);
  positive("intermediate_size", intermediate);
  positive("num_hidden_layers", n_layers);
  positive("num_attention_heads", n_heads);
  positive("num_key_value_heads", n_kv_heads);
  positive("head_dim", head_dim);
  positive("vocab_size", vocab);
  if (n_heads % n_kv_heads != 0)
    fail("model spec: num_attention_heads {} is not a multiple of num_key_value_heads {}", n_heads,
         n_kv_heads);
  if (head_dim % 2 != 0) fail("model spec: head_dim {} must be even for RoPE", head_dim);
  if (!(rms_eps > 0)) fail("model spec: rms_norm_eps must be positive");
  if (!(rope_theta > 0)) fail("model spec: rope_theta must be positive");
  if (rope_scaling.type == RopeScaling::Type::Llama3) {
    if (!(rope_scaling.factor > 0) || !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) ||
        rope_scaling.original_max_position <= 0)
      fail("model spec: llama3 rope_scaling needs factor > 0, high_freq_factor > low_freq_factor "
           "and original_max_position_embeddings > 0");
  }
}

json ModelSpec::to_json() const {
  json j;
  j["arch"] = arch_name(arch);
  j["model_type"] = model_type;
  j["hidden_size"] = hidden;
  j["intermediate_size"] = intermediate;
  j["num_hidden_layers"] = n_layers;
  j["num_attention_heads"] = n_heads;
  j["num_key_value_heads"] = n_kv_heads;
  j["head_dim"] = head_dim;
  j["vocab_size"] = vocab;
  j["max_position_embeddings"] = max_position;
  j["rope_theta"] = rope_theta;
  if (rope_scaling.type == RopeScaling::Type::Llama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", rope_scaling.factor},
                         {"low_freq_factor", rope_scaling.low_freq_factor},
                         {"high_freq_factor", rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", rope_scaling.original_max_position}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (!rope_freq_factors.empty()) j["rope_freq_factors"] = rope_freq_factors.size();
  j["rms_norm_eps"] = rms_eps;
  j["qkv_bias"] = qkv_bias;
  j["o_bias"] = o_bias;
  j["mlp_bias"] = mlp_bias;
  j["qk_norm"] = qk_norm;
  j["tie_word_embeddings"] = tie_embeddings;
  j["bos_token_id"] = bos_id;
  j["eos_token_ids"] = eos_ids;
  return j;
}

namespace {

// Reads an integer field that must be present.
int64_t required_int(const json& c, const char* key) {
  if (!c.contains(key) || c[key].is_null()) fail("config.json: missing required field '{}'", key);
  return json_integer(c[key], fmt::format("config.json: field '{}'", key));
}

template <typename T>
T optional_value(const json& c, const char* key, T def) {
  if (!c.contains(key) || c[key].is_null()) return def;
  // An integer field takes integers only (fuzz/fuzz_config.cc found 6.1e60 cast to int64_t).
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
    return T(json_integer(c[key], fmt::format("config.json: field '{}'", key), std::numeric_limits<T>::min(),
                          std::numeric_limits<T>::max()));
  else
    try {
      return c[key].get<T>();
    } catch (const json::exception&) {
      fail("config.json: field '{}' has the wrong type", key);
    }
}

bool truthy(const json& c, const char* key) {
  return c.contains(key) && c[key].is_boolean() && c[key].get<bool>();
}

bool positive_number(const json& c, const char* key) {
  return c.contains(key) && c[key].is_number() && c[key].get<double>() > 0;
}

// Refuses configs whose forward pass tessera does not implement, naming the feature.
void refuse_unsupported(const json& c, const std::string& model_type, int64_t max_position) {
  static const char* moe_keys[] = {"num_experts", "num_local_experts", "n_routed_experts",
                                   "moe_intermediate_size", "num_experts_per_tok"};
  for (const char* k : moe_keys)
    if (positive_number(c, k))
      fail("unsupported feature: mixture of experts ('{}' in config.json, model_type '{}')", k,
           model_type);
  if (positive_number(c, "kv_lora_rank") || positive_number(c, "q_lora_rank"))
    fail("unsupported feature: multi-head latent attention (MLA: kv_lora_rank/q_lora_rank in "
         "config.json)");
  if (c.contains("use_sliding_window")) {
    if (truthy(c, "use_sliding_window"))
      fail("unsupported feature: sliding-window attention layers (use_sliding_window is true)");
  } else if (c.contains("sliding_window") && c["sliding_window"].is_number_integer() &&
             c["sliding_window"].get<int64_t>() < max_position) {
    fail("unsupported feature: sliding-window attention (sliding_window {} < context {})",
         c["sliding_window"].get<int64_t>(), max_position);
  }
  if (c.contains("layer_types") && c["layer_types"].is_array())
    for (const auto& t : c["layer_types"])
      if (t.is_string() && t.get<std::string>() != "full_attention")
        fail("unsupported feature: layer type '{}' (only full attention is supported)",
             t.get<std::string>());
  std::string act = optional_value<std::string>(c, "hidden_act", "silu");
  if (act != "silu") fail("unsupported feature: hidden_act '{}' (only silu/SwiGLU is supported)", act);
  if (c.contains("is_encoder_decoder") && truthy(c, "is_encoder_decoder"))
    fail("unsupported feature: encoder-decoder models");
}

RopeScaling parse_rope_scaling(const json& c, double* theta) {
  RopeScaling rs;
  // transformers >= 4.56 moved these into rope_parameters; older configs use rope_scaling.
  const json* r = nullptr;
  if (c.contains("rope_scaling") && c["rope_scaling"].is_object()) r = &c["rope_scaling"];
  if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) {
    r = &c["rope_parameters"];
    if ((*r).contains("rope_theta")) *theta = (*r)["rope_theta"].get<double>();
  }
  if (!r) return rs;
  std::string type;
  if (r->contains("rope_type")) type = (*r)["rope_type"].get<std::string>();
  else if (r->contains("type")) type = (*r)["type"].get<std::string>();
  if (type.empty() || type == "default") return rs;
  if (type != "llama3") fail("unsupported feature: rope scaling type '{}' (supported: llama3)", type);
  rs.type = RopeScaling::Type::Llama3;
  auto num = [&](const char* k) {
    if (!r->contains(k) || !(*r)[k].is_number())
      fail("config.json: llama3 rope scaling is missing '{}'", k);
    return (*r)[k].get<double>();
  };
  rs.factor = num("factor");
  rs.low_freq_factor = num("low_freq_factor");
  rs.high_freq_factor = num("high_freq_factor");
  rs.original_max_position = int64_t(num("original_max_position_embeddings"));
  return rs;
}

}  // namespace

ModelSpec spec_from_hf_config(const json& c) {
  if (!c.is_object()) fail("config.json: expected a JSON object");
  ModelSpec s;
  s.model_type = optional_value<std::string>(c, "model_type", "");
  if (s.model_type.empty()) fail("config.json: missing required field 'model_type'");
  const std::string& mt = s.model_type;
  if (mt.find("moe") != std::string::npos || mt == "mixtral" || mt == "deepseek_v2" ||
      mt == "deepseek_v3")
    fail("unsupported feature: mixture of experts (model_type '{}')", mt);
  if (mt == "llama") s.arch = Arch::Llama;
  else if (mt == "qwen2") s.arch = Arch::Qwen2;
  else if (mt == "qwen3") s.arch = Arch::Qwen3;
  else fail("unsupported architecture: model_type '{}' (supported: llama, qwen2, qwen3)", mt);

  s.hidden = required_int(c, "hidden_size");
  s.intermediate = required_int(c, "intermediate_size");
  s.n_layers = required_int(c, "num_hidden_layers");
  s.n_heads = required_int(c, "num_attention_heads");
  s.vocab = required_int(c, "vocab_size");
  s.n_kv_heads = optional_value<int64_t>(c, "num_key_value_heads", s.n_heads);
  int64_t default_head_dim = s.n_heads > 0 ? s.hidden / s.n_heads : 0;
  if (s.arch == Arch::Qwen3) default_head_dim = 128;  // Qwen3Config's default
  s.head_dim = optional_value<int64_t>(c, "head_dim", default_head_dim);
  s.max_position = optional_value<int64_t>(c, "max_position_embeddings", 2048);
  s.rope_theta = optional_value<double>(c, "rope_theta", 10000.0);
  s.rms_eps = optional_value<double>(c, "rms_norm_eps", 1e-6);
  s.tie_embeddings = optional_value<bool>(c, "tie_word_embeddings", false);
  refuse_unsupported(c, mt, s.max_position);
  s.rope_scaling = parse_rope_scaling(c, &s.rope_theta);

  switch (s.arch) {
    case Arch::Llama:
      s.qkv_bias = s.o_bias = optional_value<bool>(c, "attention_bias", false);
      s.mlp_bias = optional_value<bool>(c, "mlp_bias", false);
      break;
    case Arch::Qwen2:  // q/k/v always carry a bias, o never
      s.qkv_bias = true;
      break;
    case Arch::Qwen3:
      s.qkv_bias = s.o_bias = optional_value<bool>(c, "attention_bias", false);
      s.qk_norm = true;
      break;
  }
  if (c.contains("bos_token_id") && c["bos_token_id"].is_number_integer())
    s.bos_id = c["bos_token_id"].get<int64_t>();
  add_eos_ids(c, s.eos_ids);
  s.validate();
  return s;
}

void add_eos_ids(const json& config, std::vector<int64_t>& ids) {
  const auto it = config.find("eos_token_id");
  if (it == config.end()) return;
  auto add = [&](const json& x) {
    if (x.is_number_integer() && std::find(ids.begin(), ids.end(), x.get<int64_t>()) == ids.end()) ids.push_back(x.get<int64_t>());
  };
  if (it->is_array())
    for (const auto& x : *it) add(x);
  else add(*it);
}

ModelSpec spec_from_gguf(const GgufFile& g) {
  if (!g.has("general.architecture")) fail("{}: GGUF has no general.architecture", g.path());
  const std::string arch = g.get("general.architecture").as_string();
  ModelSpec s;
  s.model_type = arch;
  if (arch == "llama") s.arch = Arch::Llama;
  else if (arch == "qwen2") s.arch = Arch::Qwen2;
  else if (arch == "qwen3") s.arch = Arch::Qwen3;
  else if (arch.find("moe") != std::string::npos)
    fail("unsupported feature: mixture of experts (GGUF architecture '{}')", arch);
  else fail("unsupported architecture: GGUF general.architecture '{}' (supported: llama, qwen2, qwen3)", arch);

  auto key = [&](const std::string& k) { return arch + "." + k; };
  auto req = [&](const std::string& k) -> int64_t {
    const GgufValue* v = g.find(key(k));
    if (!v) fail("{}: GGUF metadata is missing '{}'", g.path(), key(k));
    return v->as_int();
  };
  auto opt_int = [&](const std::string& k, int64_t def) {
    const GgufValue* v = g.find(key(k));
    return v ? v->as_int() : def;
  };
  auto opt_num = [&](const std::string& k, double def) {
    const GgufValue* v = g.find(key(k));
    return v ? v->as_double() : def;
  };
  if (opt_int("expert_count", 0) > 0)
    fail("unsupported feature: mixture of experts ({} = {})", key("expert_count"), opt_int("expert_count", 0));
  if (g.has(key("attention.sliding_window")))
    fail("unsupported feature: sliding-window attention ({})", key("attention.sliding_window"));

  s.hidden = req("embedding_length");
  s.intermediate = req("feed_forward_length");
  s.n_layers = req("block_count");
  s.n_heads = req("attention.head_count");
  s.n_kv_heads = opt_int("attention.head_count_kv", s.n_heads);
  s.head_dim = opt_int("attention.key_length", s.n_heads > 0 ? s.hidden / s.n_heads : 0);
  s.max_position = opt_int("context_length", 2048);
  s.rope_theta = opt_num("rope.freq_base", 10000.0);
  s.rms_eps = opt_num("attention.layer_norm_rms_epsilon", 1e-6);
  if (const GgufValue* v = g.find(key("rope.scaling.type"))) {
    const std::string& t = v->as_string();
    if (t != "none") fail("unsupported feature: GGUF rope scaling type '{}'", t);
  }
  if (const GgufValue* v = g.find(key("vocab_size"))) s.vocab = v->as_int();
  else if (const GgufValue* t = g.find("tokenizer.ggml.tokens")) s.vocab = int64_t(t->strings.size());
  s.qk_norm = s.arch == Arch::Qwen3;
  s.qkv_bias = s.arch == Arch::Qwen2;  // refined from the tensor list by Model::open
  if (const GgufValue* v = g.find("tokenizer.ggml.bos_token_id")) s.bos_id = v->as_int();
  if (const GgufValue* v = g.find("tokenizer.ggml.eos_token_id")) s.eos_ids.push_back(v->as_int());
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})  // end of turn, of message
    if (const GgufValue* v = g.find(key)) {
      const int64_t id = v->as_int();
      if (std::find(s.eos_ids.begin(), s.eos_ids.end(), id) == s.eos_ids.end()) s.eos_ids.push_back(id);
    }
  // vocab may still be 0 here; Model::open fills it from the embedding and validates.
  return s;
}

json spec_to_hf_config(const ModelSpec& s) {
  json c;
  c["architectures"] = {arch_hf_class(s.arch)};
  c["model_type"] = arch_name(s.arch);
  c["hidden_size"] = s.hidden;
  c["intermediate_size"] = s.intermediate;
  c["num_hidden_layers"] = s.n_layers;
  c["num_attention_heads"] = s.n_heads;
  c["num_key_value_heads"] = s.n_kv_heads;
  c["head_dim"] = s.head_dim;
  c["vocab_size"] = s.vocab;
  c["max_position_embeddings"] = s.max_position;
  c["rope_theta"] = s.rope_theta;
  c["rms_norm_eps"] = s.rms_eps;
  c["hidden_act"] = "silu";
  c["tie_word_embeddings"] = s.tie_embeddings;
  c["torch_dtype"] = "bfloat16";
  c["initializer_range"] = 0.02;
  c["attention_dropout"] = 0.0;
  c["use_cache"] = true;
  if (s.bos_id >= 0) c["bos_token_id"] = s.bos_id;
  if (s.eos_ids.size() == 1) c["eos_token_id"] = s.eos_ids[0];
  else if (!s.eos_ids.empty()) c["eos_token_id"] = s.eos_ids;
  if (s.rope_scaling.type == RopeScaling::Type::Llama3) {
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.rope_scaling.factor},
                         {"low_freq_factor", s.rope_scaling.low_freq_factor},
                         {"high_freq_factor", s.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", s.rope_scaling.original_max_position}};
  } else {
    c["rope_scaling"] = nullptr;
  }
  switch (s.arch) {
    case Arch::Llama:
      c["attention_bias"] = s.qkv_bias;
      c["mlp_bias"] = s.mlp_bias;
      break;
    case Arch::Qwen2:
      c["use_sliding_window"] = false;
      c["sliding_window"] = s.max_position;
      c["max_window_layers"] = s.n_layers;
      break;
    case Arch::Qwen3:
      c["attention_bias"] = s.qkv_bias;
      c["use_sliding_window"] = false;
      c["sliding_window"] = nullptr;
      c["max_window_layers"] = s.n_layers;
      break;
  }
  return c;
}

std::vector<std::pair<std::string, std::string>> spec_features(const ModelSpec& s) {
  std::vector<std::pair<std::string, std::string>> f;
  f.emplace_back("architecture", fmt::format("{} ({})", arch_name(s.arch), arch_hf_class(s.arch)));
  if (s.n_kv_heads == s.n_heads) f.emplace_back("attention", fmt::format("MHA, {} heads", s.n_heads));
  else
    f.emplace_back("attention", fmt::format("GQA {}/{} (group of {})", s.n_heads, s.n_kv_heads, s.gqa_group()));
  f.emplace_back("head_dim", fmt::format("{}{}", s.head_dim,
                                          s.q_dim() != s.hidden ? fmt::format(" (decoupled: q dim {} != hidden {})", s.q_dim(), s.hidden) : ""));
  f.emplace_back("attention scale", fmt::format("head_dim^-0.5 = {:.6f}", s.attn_scale()));
  std::string bias = s.qkv_bias ? (s.o_bias ? "q, k, v, o" : "q, k, v") : "none";
  f.emplace_back("projection bias", bias);
  f.emplace_back("mlp bias", s.mlp_bias ? "gate, up, down" : "none");
  f.emplace_back("q/k norm", s.qk_norm ? "per-head RMSNorm before RoPE" : "none");
  if (s.rope_scaling.type == RopeScaling::Type::Llama3)
    f.emplace_back("rope", fmt::format("theta {:g}, llama3 scaling (factor {:g}, low {:g}, high {:g}, original {})",
                                       s.rope_theta, s.rope_scaling.factor, s.rope_scaling.low_freq_factor,
                                       s.rope_scaling.high_freq_factor, s.rope_scaling.original_max_position));
  else if (!s.rope_freq_factors.empty())
    f.emplace_back("rope", fmt::format("theta {:g}, per-frequency factors from the file ({})", s.rope_theta,
                                       s.rope_freq_factors.size()));
  else
    f.emplace_back("rope", fmt::format("theta {:g}, no scaling", s.rope_theta));
  f.emplace_back("rope pairing", "half-split (rotate_half)");
  f.emplace_back("rms eps", fmt::format("{:g}", s.rms_eps));
  f.emplace_back("embeddings", s.tie_embeddings ? "tied (lm_head = embed_tokens)" : "separate lm_head");
  return f;
}

}  // namespace tessera
