#include "model/weights.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string_view>

#include "io/safetensors.h"
#include "model/tensors.h"
#include "util/error.h"
#include "util/mapped_file.h"

namespace fs = std::filesystem;

namespace tessera {

int64_t Weight::source_row(int64_t r) const {
  if (unpermute_head_dim <= 0) return r;
  // llama.cpp's converter reorders each head's rows from [half, i] to [i, half] so that its
  // interleaved RoPE sees the pairs Hugging Face rotates as (i, i + d/2).
  const int64_t hd = unpermute_head_dim, half_dim = hd / 2;
  const int64_t head = r / hd, rem = r % hd;
  const int64_t half = rem / half_dim, i = rem % half_dim;
  return head * hd + 2 * i + half;
}

void Weight::row_f32(int64_t r, float* out) const {
  const int64_t cols = info.cols();
  const uint64_t row_bytes = dtype_bytes(info.dtype, cols);
  tessera::to_f32(info.dtype, info.data + uint64_t(source_row(r)) * row_bytes, out, cols);
}

std::vector<float> Weight::to_f32() const {
  std::vector<float> out(size_t(info.numel()));
  if (info.shape.size() == 1 && unpermute_head_dim > 0) {
    // A permuted bias: each element is a "row" of the permutation.
    std::vector<float> raw(out.size());
    tessera::to_f32(info.dtype, info.data, raw.data(), info.numel());
    for (int64_t r = 0; r < info.numel(); ++r) out[size_t(r)] = raw[size_t(source_row(r))];
    return out;
  }
  for (int64_t r = 0; r < rows(); ++r) row_f32(r, out.data() + r * cols());
  return out;
}

const Weight* Model::find(const std::string& name) const {
  auto it = weights_.find(name);
  return it == weights_.end() ? nullptr : &it->second;
}

const Weight& Model::get(const std::string& name) const {
  const Weight* w = find(name);
  if (!w) fail("{}: missing tensor '{}'", path_, name);
  return *w;
}

const Weight& Model::lm_head() const {
  return spec_.tie_embeddings ? get("model.embed_tokens.weight") : get("lm_head.weight");
}

std::string gguf_to_canonical(const std::string& n) {
  static const std::pair<const char*, const char*> globals[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  for (auto [g, c] : globals)
    if (n == g) return c;
  static const std::regex blk(R"(blk\.(\d+)\.([a-z_]+)\.(weight|bias))");
  std::smatch m;
  if (!std::regex_match(n, m, blk)) return "";
  static const std::pair<const char*, const char*> parts[] = {
      {"attn_norm", "input_layernorm"},     {"attn_q", "self_attn.q_proj"},
      {"attn_k", "self_attn.k_proj"},       {"attn_v", "self_attn.v_proj"},
      {"attn_output", "self_attn.o_proj"},  {"attn_q_norm", "self_attn.q_norm"},
      {"attn_k_norm", "self_attn.k_norm"},  {"ffn_norm", "post_attention_layernorm"},
      {"ffn_gate", "mlp.gate_proj"},        {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},
  };
  for (auto [g, c] : parts)
    if (m[2] == g) return fmt::format("model.layers.{}.{}.{}", m[1].str(), c, m[3].str());
  return "";
}

namespace {

nlohmann::json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  if (!in) fail("cannot read {}", p.string());
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("{} is not valid JSON: {}", p.string(), e.what());
  }
}

bool is_gguf_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::equal(magic, magic + 4, "GGUF");
}

// The safetensors files of a Hugging Face directory: the index's shards, or the single file.
std::vector<fs::path> safetensors_files(const fs::path& dir) {
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    nlohmann::json j = read_json_file(index);
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail("{}: no weight_map object", index.string());
    std::set<std::string> files;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) fail("{}: weight_map entry '{}' is not a file name", index.string(), name);
      std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f.find("..") != std::string::npos)
        fail("{}: shard name '{}' leaves the model directory", index.string(), f);
      files.insert(f);
    }
    std::vector<fs::path> out;
    for (const auto& f : files) out.push_back(dir / f);
    return out;
  }
  if (fs::exists(dir / "model.safetensors")) return {dir / "model.safetensors"};
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") out.push_back(e.path());
  if (out.size() != 1)
    fail("{}: expected model.safetensors or model.safetensors.index.json, found {} .safetensors files",
         dir.string(), out.size());
  return out;
}

// Checks every tensor the forward pass needs: present, right shape, usable dtype.
void check_against_spec(const std::string& path, const ModelSpec& spec,
                        const std::map<std::string, Weight>& weights, bool quantized_ok) {
  for (const ExpectedTensor& e : expected_tensors(spec)) {
    auto it = weights.find(e.name);
    if (it == weights.end()) fail("{}: missing tensor '{}'", path, e.name);
    const TensorInfo& t = it->second.info;
    if (t.shape != e.shape)
      fail("{}: tensor '{}' has shape {}, the config needs {}", path, e.name, t.shape_str(),
           TensorInfo{.shape = e.shape}.shape_str());
    bool plain = t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16;
    if (!plain && !quantized_ok)
      fail("{}: tensor '{}' has dtype {}, expected F32, F16 or BF16", path, e.name, dtype_name(t.dtype));
    if (t.nbytes != dtype_bytes(t.dtype, t.numel()))
      fail("{}: tensor '{}' holds {} bytes, {} x {} needs {}", path, e.name, t.nbytes, t.shape_str(),
           dtype_name(t.dtype), dtype_bytes(t.dtype, t.numel()));
  }
}

}  // namespace

Model Model::open(const std::string& path_in) {
  Model m;
  m.path_ = path_in;
  const fs::path path(path_in);
  if (!fs::exists(path)) fail("{}: no such file or directory", path_in);

  if (fs::is_directory(path)) {
    const fs::path config = path / "config.json";
    if (!fs::exists(config)) fail("{}: not a model directory (no config.json)", path_in);
    m.format_ = "safetensors";
    try {
      m.spec_ = spec_from_hf_config(read_json_file(config));
    } catch (const Error& e) {
      fail("{}: {}", config.string(), e.what());
    }
    // generation_config.json may declare more end-of-sequence ids than config.json does
    // (Qwen2.5 instruct: <|im_end|> and <|endoftext|>); generation stops on all of them.
    if (const fs::path gen = path / "generation_config.json"; fs::exists(gen)) add_eos_ids(read_json_file(gen), m.spec_.eos_ids);
    for (const fs::path& f : safetensors_files(path)) {
      SafetensorsFile st = SafetensorsFile::open(f.string());
      for (const TensorInfo& t : st.tensors()) {
        Weight w{t.name, t.name, t, 0};
        if (!m.weights_.emplace(t.name, std::move(w)).second)
          fail("{}: tensor '{}' appears in more than one file", path_in, t.name);
      }
    }
    check_against_spec(path_in, m.spec_, m.weights_, /*quantized_ok=*/false);
    return m;
  }

  if (!is_gguf_file(path) && path.extension() != ".gguf")
    fail("{}: neither a Hugging Face model directory nor a GGUF file", path_in);
  m.format_ = "gguf";
  m.gguf_ = GgufFile::open(path_in);
  try {
    m.spec_ = spec_from_gguf(*m.gguf_);  // an unsupported architecture is named first
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with(path_in)) throw;
    fail("{}: {}", path_in, e.what());
  }
  if (!m.gguf_->unsupported().empty())
    fail("{}: {}{}", path_in, GgufFile::describe(m.gguf_->unsupported().front()),
         m.gguf_->unsupported().size() > 1 ? fmt::format(" (and {} more)", m.gguf_->unsupported().size() - 1) : "");
  ModelSpec& s = m.spec_;
  for (const TensorInfo& t : m.gguf_->tensors()) {
    if (t.name == "rope_freqs.weight") {
      Weight w{t.name, t.name, t, 0};
      s.rope_freq_factors = w.to_f32();
      continue;
    }
    std::string canonical = gguf_to_canonical(t.name);
    if (canonical.empty()) continue;  // tensors tessera does not read
    Weight w{canonical, t.name, t, 0};
    if (s.arch == Arch::Llama) {
      bool is_q = canonical.find("self_attn.q_proj.") != std::string::npos;
      bool is_k = canonical.find("self_attn.k_proj.") != std::string::npos;
      if (is_q || is_k) w.unpermute_head_dim = s.head_dim;
    }
    m.weights_.emplace(canonical, std::move(w));
  }
  // GGUF has no flags for these: the tensor list says.
  s.tie_embeddings = m.weights_.count("lm_head.weight") == 0;
  s.qkv_bias = m.weights_.count(layer_tensor(0, "self_attn.q_proj.bias")) != 0;
  s.o_bias = m.weights_.count(layer_tensor(0, "self_attn.o_proj.bias")) != 0;
  s.mlp_bias = m.weights_.count(layer_tensor(0, "mlp.gate_proj.bias")) != 0;
  if (s.vocab == 0) {
    if (const Weight* e = m.find("model.embed_tokens.weight")) s.vocab = e->info.shape.at(0);
  }
  if (!s.rope_freq_factors.empty() && int64_t(s.rope_freq_factors.size()) != s.head_dim / 2)
    fail("{}: rope_freqs.weight has {} entries, head_dim/2 is {}", path_in, s.rope_freq_factors.size(),
         s.head_dim / 2);
  try {
    s.validate();
  } catch (const Error& e) {
    fail("{}: {}", path_in, e.what());
  }
  check_against_spec(path_in, s, m.weights_, /*quantized_ok=*/true);
  return m;
}

}  // namespace tessera
