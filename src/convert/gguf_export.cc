#include "convert/gguf_export.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "io/gguf_writer.h"
#include "io/quantize.h"
#include "model/tensors.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/half.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace tessera {

namespace {

// llama.cpp's LlamaFileType.MOSTLY_BF16 ("except 1d tensors") and GGML_QNT_VERSION.
constexpr uint32_t kFileTypeBf16 = 32;
constexpr uint32_t kQuantizationVersion = 2;
// GGUF token types.
constexpr int kTokenNormal = 1, kTokenControl = 3, kTokenUserDefined = 4, kTokenUnused = 5;

const std::pair<const char*, const char*> kLayerParts[] = {
    {"input_layernorm", "attn_norm"},     {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},       {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"},  {"self_attn.q_norm", "attn_q_norm"},
    {"self_attn.k_norm", "attn_k_norm"},  {"post_attention_layernorm", "ffn_norm"},
    {"mlp.gate_proj", "ffn_gate"},        {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
};

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<double> types;
  std::vector<std::string> merges;
  std::string pre;
  std::optional<int64_t> bos, eos;
  bool add_bos = false;
  std::string chat_template;
};

json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) fail("cannot read {}", p.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{} is not valid JSON: {}", p.string(), e.what());
  }
}

// Flattens a tokenizer.json pre_tokenizer into "kind[:detail]" steps.
void pre_steps(const json& j, std::vector<std::string>& out) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& p : j.value("pretokenizers", json::array())) pre_steps(p, out);
  } else if (type == "Split") {
    const json& pat = j.value("pattern", json::object());
    out.push_back("Split:" + (pat.contains("Regex") ? pat["Regex"].get<std::string>()
                                                     : pat.value("String", std::string())));
  } else if (type == "ByteLevel") {
    out.push_back(std::string("ByteLevel:") + (j.value("use_regex", true) ? "regex" : "plain"));
  } else if (type == "Digits") {
    out.push_back(std::string("Digits:") + (j.value("individual_digits", false) ? "individual" : "runs"));
  } else {
    out.push_back(type.empty() ? j.dump() : type);
  }
}

// llama.cpp's name for the pre-tokenizer of a tokenizer.json (the names its converter
// records by hashing a test string's tokens; here recognised from the definition).
std::string detect_pre(const json& tok, const std::string& path) {
  std::vector<std::string> steps;
  pre_steps(tok.value("pre_tokenizer", json()), steps);
  auto is = [&](std::vector<std::string> want) { return steps == want; };
  if (is({"Split:" + std::string(kLlama3Pattern), "ByteLevel:plain"})) return "llama-bpe";
  if (is({"Split:" + std::string(kQwen2Pattern), "ByteLevel:plain"})) return "qwen2";
  if (is({"Digits:individual", "ByteLevel:regex"})) return "smollm";
  if (is({"ByteLevel:regex"})) return "gpt-2";
  std::string desc;
  for (const std::string& s : steps) desc += (desc.empty() ? "" : ", ") + s;
  fail("{}: no llama.cpp pre-tokenizer name known for pre_tokenizer [{}]; pass --tokenizer-pre NAME",
       path, desc);
}

bool looks_special(const std::string& t) {
  auto wrapped = [&](std::string_view a, std::string_view b) {
    return t.size() >= a.size() + b.size() && t.starts_with(a) && t.ends_with(b);
  };
  return wrapped("<|", "|>") || wrapped("<\xef\xbd\x9c", "\xef\xbd\x9c>") || t == "<pad>" || t == "<mask>";
}

// tokenizer.ggml.* from a Hugging Face directory, as convert_hf_to_gguf.py builds them
// (get_vocab_base + SpecialVocab): ids without a token become "[PAD<id>]" (unused), added
// tokens are control (special) or user-defined, merges are "a b".
Vocab vocab_from_hf(const Model& model, const std::string& pre_override) {
  const fs::path path = fs::path(model.path()) / "tokenizer.json";
  if (!fs::exists(path)) fail("{}: no tokenizer.json to build tokenizer.ggml.* from", model.path());
  const json tok = read_json(path);
  const json& m = tok.value("model", json::object());
  if (m.value("type", "BPE") != "BPE")
    fail("{}: tokenizer model '{}' is not byte-level BPE (gpt2)", path.string(), m.value("type", ""));
  if (!m.contains("vocab") || !m["vocab"].is_object()) fail("{}: model.vocab is not an object", path.string());

  Vocab v;
  v.pre = pre_override.empty() ? detect_pre(tok, path.string()) : pre_override;
  std::map<int64_t, std::pair<std::string, int>> by_id;
  for (const auto& [s, id] : m["vocab"].items()) {
    if (!id.is_number_integer()) fail("{}: vocabulary entry '{}' has no integer id", path.string(), s);
    by_id[id.get<int64_t>()] = {s, kTokenNormal};
  }
  for (const json& a : tok.value("added_tokens", json::array())) {
    const int64_t id = a.value("id", int64_t(-1));
    const std::string content = a.value("content", "");
    if (id < 0) fail("{}: added token '{}' has no id", path.string(), content);
    const bool control = a.value("special", false) || looks_special(content);
    by_id[id] = {content, control ? kTokenControl : kTokenUserDefined};
  }
  const int64_t n = model.spec().vocab;
  if (!by_id.empty() && (by_id.begin()->first < 0 || by_id.rbegin()->first >= n))
    fail("{}: token id {} is outside the model's vocabulary of {}", path.string(),
         by_id.begin()->first < 0 ? by_id.begin()->first : by_id.rbegin()->first, n);
  v.tokens.reserve(size_t(n));
  v.types.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    auto it = by_id.find(i);
    if (it == by_id.end()) {
      v.tokens.push_back(fmt::format("[PAD{}]", i));
      v.types.push_back(kTokenUnused);
    } else {
      v.tokens.push_back(it->second.first);
      v.types.push_back(it->second.second);
    }
  }
  for (const json& mg : m.value("merges", json::array())) {
    if (mg.is_string()) v.merges.push_back(mg.get<std::string>());
    else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string())
      v.merges.push_back(mg[0].get<std::string>() + " " + mg[1].get<std::string>());
    else fail("{}: merge {} is neither \"a b\" nor [a, b]", path.string(), mg.dump());
  }

  // BOS/EOS, add_bos and the chat template as tessera's tokenizer reads them
  // (tokenizer_config.json), falling back to config.json's ids.
  const Tokenizer t = Tokenizer::for_model(model);
  if (auto b = t.bos_id()) v.bos = *b;
  else if (model.spec().bos_id >= 0) v.bos = model.spec().bos_id;
  if (auto e = t.eos_token().empty() ? std::nullopt : t.token_id(t.eos_token())) v.eos = *e;
  else if (!model.spec().eos_ids.empty()) v.eos = model.spec().eos_ids.front();
  v.add_bos = t.adds_bos();
  v.chat_template = t.chat_template();
  return v;
}

}  // namespace

std::string canonical_to_gguf(const std::string& n) {
  if (n == "model.embed_tokens.weight") return "token_embd.weight";
  if (n == "model.norm.weight") return "output_norm.weight";
  if (n == "lm_head.weight") return "output.weight";
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.+)\.(weight|bias))");
  std::smatch m;
  if (!std::regex_match(n, m, layer)) return "";
  for (auto [hf, g] : kLayerParts)
    if (m[2] == hf) return fmt::format("blk.{}.{}.{}", m[1].str(), g, m[3].str());
  return "";
}

int64_t llama_permuted_row(int64_t r, int64_t hd) {
  const int64_t half_dim = hd / 2, head = r / hd, rem = r % hd;
  return head * hd + 2 * (rem % half_dim) + rem / half_dim;
}

int64_t llama_unpermuted_row(int64_t f, int64_t hd) {
  const int64_t half_dim = hd / 2, head = f / hd, rem = f % hd;
  return head * hd + (rem % 2) * half_dim + rem / 2;
}

std::vector<float> llama3_rope_freq_factors(const ModelSpec& s) {
  const RopeScaling& r = s.rope_scaling;
  const int64_t half = s.head_dim / 2;
  std::vector<float> out(size_t(half), 1.0f);
  const double low_wavelen = double(r.original_max_position) / r.low_freq_factor;
  const double high_wavelen = double(r.original_max_position) / r.high_freq_factor;
  for (int64_t i = 0; i < half; ++i) {
    // The unscaled inverse frequency in fp32, as both transformers and the converter have it.
    const float f = float(1.0 / std::pow(s.rope_theta, double(2 * i) / double(s.head_dim)));
    const double wavelen = 2.0 * M_PI / f;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      out[size_t(i)] = float(r.factor);
    } else {
      const double smooth = (double(r.original_max_position) / wavelen - r.low_freq_factor) /
                            (r.high_freq_factor - r.low_freq_factor);
      out[size_t(i)] = float(1.0 / ((1.0 - smooth) / r.factor + smooth));
    }
  }
  return out;
}

std::vector<ExportTensor> export_tensors(const ModelSpec& s) {
  const bool llama = s.arch == Arch::Llama;
  // The tensors, in llama.cpp's order: embedding, layers, final norm, head, rope factors.
  std::vector<ExportTensor> tensors;
  for (const ExpectedTensor& e : expected_tensors(s)) {
    ExportTensor t;
    t.gguf_name = canonical_to_gguf(e.name);
    if (t.gguf_name.empty()) fail("no GGUF name for tensor '{}'", e.name);
    t.canonical = e.name;
    t.shape = e.shape;
    if (llama && (e.name.find(".self_attn.q_proj.") != std::string::npos ||
                  e.name.find(".self_attn.k_proj.") != std::string::npos))
      t.permute_head_dim = s.head_dim;
    tensors.push_back(std::move(t));
  }
  const bool rope_factors = !s.rope_freq_factors.empty() || s.rope_scaling.type == RopeScaling::Type::Llama3;
  if (rope_factors) {
    if (!llama) fail("rope frequency factors on a {} model", arch_name(s.arch));
    const int64_t n = s.rope_freq_factors.empty() ? s.head_dim / 2 : int64_t(s.rope_freq_factors.size());
    tensors.push_back({"rope_freqs.weight", "", {n}, 0});
  }
  return tensors;
}

std::string export_temp_path(const std::string& out_path) {
  return fmt::format("{}.{}.part", out_path, long(::getpid()));
}

GgufExportResult export_gguf_bf16(const Model& model, const GgufExportOptions& opts,
                                  const ExportProgress& progress) {
  GgufExportOptions o = opts;
  o.file_type = kFileTypeBf16;
  o.types.clear();
  return export_gguf(model, o, progress);
}

GgufExportResult export_gguf(const Model& model, const GgufExportOptions& opts, const ExportProgress& progress) {
  const ModelSpec& s = model.spec();
  if (opts.out_path.empty()) fail("no output path");
  {
    std::error_code ec;
    if (fs::exists(opts.out_path) && fs::equivalent(opts.out_path, model.path(), ec))
      fail("{}: the output would overwrite the input", opts.out_path);
    if (fs::is_directory(opts.out_path, ec)) fail("{}: is a directory, not a file to write", opts.out_path);
  }
  const std::string arch = arch_name(s.arch);
  std::vector<ExportTensor> tensors;
  try {
    tensors = export_tensors(s);
  } catch (const Error& e) {
    fail("{}: {}", model.path(), e.what());
  }
  std::vector<const Weight*> sources;
  for (const ExportTensor& t : tensors) sources.push_back(t.canonical.empty() ? nullptr : &model.get(t.canonical));
  std::vector<float> rope_factors = s.rope_freq_factors;
  if (rope_factors.empty() && s.rope_scaling.type == RopeScaling::Type::Llama3)
    rope_factors = llama3_rope_freq_factors(s);
  std::vector<DType> types = opts.types;
  if (types.empty()) {
    // Norms and biases stay F32 (llama.cpp's kernels want 1-D tensors in F32).
    for (const ExportTensor& t : tensors) types.push_back(t.shape.size() <= 1 ? DType::F32 : DType::BF16);
  } else if (types.size() != tensors.size()) {
    fail("{} tensor types for {} tensors", types.size(), tensors.size());
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!can_quantize(types[i])) fail("tensor '{}': tessera does not write {}", tensors[i].gguf_name, dtype_name(types[i]));
    if (!sources[i] && types[i] != DType::F32) fail("tensor '{}' must be F32", tensors[i].gguf_name);
  }

  // An unwritable output is refused before any work, naming the path the user gave.
  const std::string temp = export_temp_path(opts.out_path);
  if (std::FILE* f = std::fopen(temp.c_str(), "wb")) {
    std::fclose(f);
    std::remove(temp.c_str());
  } else {
    fail("cannot write {}: {}", opts.out_path, std::strerror(errno));
  }

  GgufExportResult result;
  GgufWriter w(temp);
  const GgufFile* src = model.gguf();
  std::string name = fs::path(model.path()).filename().string();
  if (name.empty()) name = fs::path(model.path()).parent_path().filename().string();
  if (src && src->has("general.name")) name = src->get("general.name").as_string();
  w.add_string("general.architecture", arch);
  w.add_string("general.name", name);
  w.add_u32("general.file_type", opts.file_type);
  w.add_u32("general.quantization_version", kQuantizationVersion);
  auto key = [&](const char* k) { return arch + "." + k; };
  w.add_u32(key("vocab_size"), uint32_t(s.vocab));
  w.add_u32(key("context_length"), uint32_t(s.max_position));
  w.add_u32(key("embedding_length"), uint32_t(s.hidden));
  w.add_u32(key("block_count"), uint32_t(s.n_layers));
  w.add_u32(key("feed_forward_length"), uint32_t(s.intermediate));
  w.add_u32(key("attention.head_count"), uint32_t(s.n_heads));
  w.add_u32(key("attention.head_count_kv"), uint32_t(s.n_kv_heads));
  if (s.head_dim * s.n_heads != s.hidden) {
    w.add_u32(key("attention.key_length"), uint32_t(s.head_dim));
    w.add_u32(key("attention.value_length"), uint32_t(s.head_dim));
  }
  w.add_f32(key("attention.layer_norm_rms_epsilon"), float(s.rms_eps));
  w.add_u32(key("rope.dimension_count"), uint32_t(s.head_dim));
  w.add_f32(key("rope.freq_base"), float(s.rope_theta));

  if (src) {
    // A GGUF source: its tokenizer travels verbatim.
    int copied = 0;
    for (const auto& [k, v] : src->metadata())
      if (k.starts_with("tokenizer.")) {
        w.add(k, v);
        ++copied;
      }
    if (copied == 0) fail("{}: the GGUF file carries no tokenizer (no tokenizer.* metadata)", model.path());
    if (const GgufValue* p = src->find("tokenizer.ggml.pre")) result.tokenizer_pre = p->as_string();
  } else {
    const Vocab v = vocab_from_hf(model, opts.tokenizer_pre);
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", v.pre);
    w.add_array("tokenizer.ggml.tokens", v.tokens);
    w.add_array("tokenizer.ggml.token_type", GgufValue::Type::I32, v.types);
    w.add_array("tokenizer.ggml.merges", v.merges);
    if (v.bos) w.add_u32("tokenizer.ggml.bos_token_id", uint32_t(*v.bos));
    if (v.eos) w.add_u32("tokenizer.ggml.eos_token_id", uint32_t(*v.eos));
    w.add_bool("tokenizer.ggml.add_bos_token", v.add_bos);
    if (!v.chat_template.empty()) w.add_string("tokenizer.chat_template", v.chat_template);
    result.tokenizer_pre = v.pre;
  }

  uint64_t total = 0;
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    w.add_tensor(tensors[i].gguf_name, types[i], tensors[i].shape);
    int64_t n = 1;
    for (int64_t d : tensors[i].shape) n *= d;
    sizes.push_back(dtype_bytes(types[i], n));
    total += sizes.back();
  }

  // Data, one chunk of rows at a time: rows upcast to fp32 (in file order), then encoded,
  // the rows split between the threads.
  constexpr uint64_t kChunkBytes = 8u << 20;  // of fp32 rows
  const int threads = std::max(1, opts.threads);
  uint64_t done = 0;
  std::vector<float> chunk;
  std::vector<uint8_t> encoded;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ExportTensor& t = tensors[i];
    const DType type = types[i];
    if (opts.on_tensor) opts.on_tensor(i, tensors.size(), t, type, sizes[i]);
    const Weight* src_w = sources[i];
    if (!src_w) {
      w.write(t.gguf_name, rope_factors.data(), rope_factors.size() * sizeof(float));
      done += rope_factors.size() * sizeof(float);
      continue;
    }
    if (t.shape.size() <= 1) {  // small: whole
      const std::vector<float> hf = src_w->to_f32();
      chunk.resize(hf.size());
      for (size_t f = 0; f < hf.size(); ++f)
        chunk[f] = hf[size_t(t.permute_head_dim ? llama_unpermuted_row(int64_t(f), t.permute_head_dim) : int64_t(f))];
      encoded.resize(sizes[i]);
      quantize_f32(type, chunk.data(), encoded.data(), int64_t(chunk.size()));
      w.write(t.gguf_name, encoded.data(), encoded.size());
      done += encoded.size();
      continue;
    }
    const int64_t rows = src_w->rows(), cols = src_w->cols();
    const uint64_t row_bytes = dtype_bytes(type, cols);
    const int64_t rows_per_chunk = std::max<int64_t>(1, int64_t(kChunkBytes / (uint64_t(cols) * 4)));
    chunk.resize(size_t(std::min(rows, rows_per_chunk) * cols));
    encoded.resize(size_t(std::min(rows, rows_per_chunk)) * row_bytes);
    for (int64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
      const int64_t r1 = std::min(rows, r0 + rows_per_chunk);
      for (int64_t f = r0; f < r1; ++f) {
        const int64_t hf_row = t.permute_head_dim ? llama_unpermuted_row(f, t.permute_head_dim) : f;
        src_w->row_f32(hf_row, chunk.data() + (f - r0) * cols);
      }
      const int64_t n_rows = r1 - r0;
      auto encode = [&](int64_t a, int64_t b) {
        for (int64_t r = a; r < b; ++r)
          quantize_f32(type, chunk.data() + r * cols, encoded.data() + uint64_t(r) * row_bytes, cols);
      };
      const int64_t n_threads = std::min<int64_t>(threads, n_rows);
      if (n_threads <= 1) {
        encode(0, n_rows);
      } else {
        std::vector<std::thread> pool;
        for (int64_t k = 1; k < n_threads; ++k)
          pool.emplace_back(encode, n_rows * k / n_threads, n_rows * (k + 1) / n_threads);
        encode(0, n_rows / n_threads);
        for (std::thread& th : pool) th.join();
      }
      const uint64_t nbytes = uint64_t(n_rows) * row_bytes;
      w.write_part(t.gguf_name, encoded.data(), nbytes);
      done += nbytes;
      if (progress) progress(done, total);
    }
  }
  w.close();
  std::error_code ec;
  fs::rename(temp, opts.out_path, ec);
  if (ec) {
    std::remove(temp.c_str());
    fail("cannot write {}: {}", opts.out_path, ec.message());
  }
  if (progress) progress(total, total);
  result.tensors = int64_t(tensors.size());
  result.tensor_bytes = total;
  return result;
}

}  // namespace tessera
