#include "synth/synth.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <unordered_set>
#include <vector>

#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/default_model.h"
#include "model/presets.h"
#include "util/data_paths.h"
#include "util/error.h"
#include "util/half.h"

// Reproducibility across machines needs every floating-point operation of the normal
// generator to be an IEEE basic operation (+ - * / sqrt, each correctly rounded). A fused
// multiply-add changes the last bit, and compilers fuse on their own where the ISA has FMA
// (aarch64, x86 with -march=native), so contraction is switched off for this file.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace tessera {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;


namespace {

// ---------------------------------------------------------------------------------------
// Random numbers: splitmix64 used as a counter-based generator. Output k of the stream
// keyed by `key` is mix(key + k * gamma), so any element can be computed on its own: the
// values do not depend on chunk sizes or on how work is split between threads.

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// One stream per (seed, tensor name): renaming or reordering other tensors leaves a
// tensor's values unchanged.
uint64_t stream_key(uint64_t seed, const std::string& name) {
  return mix64(mix64(seed + kGamma) ^ fnv1a64(name));
}

inline uint64_t draw(uint64_t key, uint64_t k) { return mix64(key + (k + 1) * kGamma); }

// ---------------------------------------------------------------------------------------
// log and sin/cos from basic operations only (no libm: its last bit differs between
// implementations). Accuracy is ~1e-15 relative, far below what BF16 keeps.

// ln(u) for normal (not subnormal) u > 0.
double det_log(double u) {
  // Split u = m * 2^e, m in [0.5, 1), on the bits (exact, and no libm call per value).
  uint64_t bits;
  std::memcpy(&bits, &u, 8);
  int e = int((bits >> 52) & 0x7ff) - 1022;
  bits = (bits & ~(uint64_t(0x7ff) << 52)) | (uint64_t(1022) << 52);
  double m;
  std::memcpy(&m, &bits, 8);
  if (m < 0.70710678118654752) {
    m *= 2.0;  // exact
    --e;
  }
  // ln(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716: the odd series converges fast.
  const double s = (m - 1.0) / (m + 1.0);
  const double z = s * s;
  double p = 1.0 / 23.0;
  for (int k = 10; k >= 0; --k) p = p * z + 1.0 / double(2 * k + 1);
  return double(e) * 0.69314718055994531 + 2.0 * s * p;
}

// sin and cos of 2*pi*t for t in [0, 1), reduced in turns (exact) to |x| <= pi/4.
void det_sincos_turns(double t, double* sin_out, double* cos_out) {
  const double t4 = t * 4.0;          // exact
  double q = std::floor(t4);          // quadrant 0..3
  double f = t4 - q;                  // exact, [0, 1)
  if (f >= 0.5) {                     // nearest quadrant: |f| <= 0.5
    f -= 1.0;                         // exact
    q += 1.0;
  }
  const double x = f * 1.5707963267948966;  // |x| <= pi/4
  const double x2 = x * x;
  // Taylor series to x^17 / x^16: the first omitted term is < 1e-16 for |x| <= pi/4.
  double sp = -1.0 / 355687428096000.0;  // -1/17!
  sp = sp * x2 + 1.0 / 1307674368000.0;  // 1/15!
  sp = sp * x2 - 1.0 / 6227020800.0;     // -1/13!
  sp = sp * x2 + 1.0 / 39916800.0;       // 1/11!
  sp = sp * x2 - 1.0 / 362880.0;         // -1/9!
  sp = sp * x2 + 1.0 / 5040.0;           // 1/7!
  sp = sp * x2 - 1.0 / 120.0;            // -1/5!
  sp = sp * x2 + 1.0 / 6.0;              // 1/3!
  const double sn = x - x * x2 * sp;
  double cp = 1.0 / 20922789888000.0;    // 1/16!
  cp = cp * x2 - 1.0 / 87178291200.0;    // -1/14!
  cp = cp * x2 + 1.0 / 479001600.0;      // 1/12!
  cp = cp * x2 - 1.0 / 3628800.0;        // -1/10!
  cp = cp * x2 + 1.0 / 40320.0;          // 1/8!
  cp = cp * x2 - 1.0 / 720.0;            // -1/6!
  cp = cp * x2 + 1.0 / 24.0;             // 1/4!
  cp = cp * x2 - 0.5;                    // -1/2!
  const double cs = 1.0 + x2 * cp;
  switch (int(q) & 3) {  // rotate by q quarter turns (exact)
    case 0: *sin_out = sn; *cos_out = cs; break;
    case 1: *sin_out = cs; *cos_out = -sn; break;
    case 2: *sin_out = -sn; *cos_out = -cs; break;
    default: *sin_out = -cs; *cos_out = sn; break;
  }
}

// Box-Muller: pair p of the stream gives normals 2p (cos branch) and 2p+1 (sin branch).
inline void normal_pair(uint64_t key, uint64_t p, double* z0, double* z1) {
  const double u1 = double((draw(key, 2 * p) >> 11) + 1) * 0x1.0p-53;  // (0, 1]
  const double u2 = double(draw(key, 2 * p + 1) >> 11) * 0x1.0p-53;    // [0, 1)
  const double r = std::sqrt(-2.0 * det_log(u1));
  double s, c;
  det_sincos_turns(u2, &s, &c);
  *z0 = r * c;
  *z1 = r * s;
}

struct Init {
  double mean, std;
};

// The transformers initialization, with norms and biases moved off their trivial values
// so that a missing norm or bias changes the output.
Init init_for(TensorRole role) {
  switch (role) {
    case TensorRole::Norm: return {1.0, 0.1};
    case TensorRole::Bias: return {0.0, 0.2};
    default: return {0.0, 0.02};  // Linear weights, embedding, untied lm_head
  }
}

// Calls sink(i, z) for the normals of indices [offset, offset + n), in order.
template <typename Sink>
void for_normals(uint64_t key, uint64_t offset, uint64_t n, Sink&& sink) {
  uint64_t i = offset;
  const uint64_t end = offset + n;
  while (i < end) {
    double z0, z1;
    normal_pair(key, i / 2, &z0, &z1);
    if (i % 2 == 0) {
      sink(i, z0);
      if (++i == end) break;
    }
    sink(i, z1);
    ++i;
  }
}

void fill_bf16(uint64_t key, Init init, uint64_t offset, uint64_t n, uint16_t* out) {
  for_normals(key, offset, n, [&](uint64_t i, double z) {
    out[i - offset] = f32_to_bf16(float(init.mean + init.std * z));
  });
}

// Fills out[0, n) with up to two threads: values never depend on the split.
void fill_bf16_parallel(uint64_t key, Init init, uint64_t offset, uint64_t n, uint16_t* out) {
  if (n < (uint64_t(1) << 16)) {
    fill_bf16(key, init, offset, n, out);
    return;
  }
  const uint64_t half = (n / 2) & ~uint64_t(1);  // even: no Box-Muller pair is split
  std::thread helper([&] { fill_bf16(key, init, offset + half, n - half, out + half); });
  fill_bf16(key, init, offset, half, out);
  helper.join();
}

// ---------------------------------------------------------------------------------------
// Files

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("cannot write {}", path.string());
  f << text;
  f.close();
  if (!f) fail("cannot write {} (disk full?)", path.string());
}

void write_json(const fs::path& path, const ojson& j) { write_text(path, j.dump(2) + "\n"); }

uint64_t numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

// The places the tokenizer folder (llama3/, qwen3/) is looked for: $TESSERA_TOKENIZERS alone
// when it is set, else tokenizers/ under each data directory (util/data_paths.h).
std::vector<fs::path> tokenizers_candidates() {
  if (const char* env = std::getenv("TESSERA_TOKENIZERS"); env && *env) return {fs::path(env)};
  return data_candidates("tokenizers");
}

constexpr const char* kMarker = "tessera_synth.json";

// Files a synth run writes; a re-run removes them first so stale shards never linger.
bool is_synth_output(const std::string& name) {
  if (name == "config.json" || name == "tokenizer.json" || name == "tokenizer_config.json" ||
      name == "model.safetensors.index.json" || name == kMarker)
    return true;
  return name.rfind("model", 0) == 0 && name.size() > 12 &&
         name.compare(name.size() - 12, 12, ".safetensors") == 0;
}

// Creates `dir`, or clears the previous synth output in it; refuses anything else.
void prepare_out_dir(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) fail("--out {} exists and is not a directory", dir.string());
    bool empty = fs::directory_iterator(dir, ec) == fs::directory_iterator();
    if (!empty) {
      if (!fs::exists(dir / kMarker))
        fail("--out {} is not empty and is not a previous `tessera synth` output "
             "(no {}); choose an empty or new directory",
             dir.string(), kMarker);
      for (const auto& entry : fs::directory_iterator(dir))
        if (entry.is_regular_file() && is_synth_output(entry.path().filename().string()))
          fs::remove(entry.path());
    }
  } else {
    fs::create_directories(dir, ec);
    if (ec) fail("cannot create --out {}: {}", dir.string(), ec.message());
  }
}

void copy_tokenizer(const fs::path& src_dir, const fs::path& out_dir) {
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    const fs::path src = src_dir / f;
    if (!fs::is_regular_file(src))
      fail("tokenizer file {} is missing: pass --tokenizers DIR (the folder holding llama3/ "
           "and qwen3/) or set TESSERA_TOKENIZERS",
           src.string());
    std::error_code ec;
    fs::copy_file(src, out_dir / f, fs::copy_options::overwrite_existing, ec);
    if (ec) fail("cannot copy {} to {}: {}", src.string(), out_dir.string(), ec.message());
    // The shared copies are read-only; the checkpoint's own files belong to the user.
    fs::permissions(out_dir / f, fs::perms::owner_read | fs::perms::owner_write,
                    fs::perm_options::add, ec);
  }
}

std::string human_bytes(uint64_t b) {
  if (b >= (uint64_t(1) << 30)) return fmt::format("{:.1f} GiB", double(b) / double(1 << 30));
  return fmt::format("{:.1f} MiB", double(b) / double(1 << 20));
}

}  // namespace

// ---------------------------------------------------------------------------------------

double synth_normal(uint64_t seed, const std::string& name, uint64_t index) {
  double z0, z1;
  normal_pair(stream_key(seed, name), index / 2, &z0, &z1);
  return index % 2 == 0 ? z0 : z1;
}

void synth_values(const std::string& name, TensorRole role, uint64_t seed, uint64_t offset,
                  uint64_t n, float* out) {
  const Init init = init_for(role);
  for_normals(stream_key(seed, name), offset, n, [&](uint64_t i, double z) {
    out[i - offset] = float(init.mean + init.std * z);
  });
}

uint64_t write_synth_weights(const ModelSpec& spec, const std::string& dir, uint64_t seed,
                             const SynthProgress& progress, uint64_t shard_bytes) {
  const std::vector<ExpectedTensor> tensors = expected_tensors(spec);
  if (tensors.empty()) fail("expected_tensors returned no tensors for this spec");

  // Greedy sharding in canonical order; a tensor larger than a shard gets a shard alone.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t total = 0, in_shard = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = numel(tensors[i].shape) * 2;
    if (in_shard > 0 && in_shard + bytes > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
    total += bytes;
  }

  const fs::path out(dir);
  const size_t n_shards = shards.size();
  auto file_name = [&](size_t s) {
    return n_shards == 1 ? std::string("model.safetensors")
                         : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, n_shards);
  };

  // Values are generated and written in chunks of 4 Mi (large enough to amortize thread
  // start-up), so memory stays at one chunk whatever the model's size.
  constexpr uint64_t kChunk = uint64_t(1) << 22;
  std::vector<uint16_t> buf(kChunk);
  uint64_t done = 0;
  ojson weight_map = ojson::object();
  for (size_t s = 0; s < n_shards; ++s) {
    std::vector<SafetensorsWriter::Entry> entries;
    for (size_t i : shards[s]) entries.push_back({tensors[i].name, DType::BF16, tensors[i].shape});
    SafetensorsWriter writer((out / file_name(s)).string(), entries, {{"format", "pt"}});
    for (size_t i : shards[s]) {
      const ExpectedTensor& t = tensors[i];
      const uint64_t key = stream_key(seed, t.name);
      const Init init = init_for(t.role);
      const uint64_t n = numel(t.shape);
      for (uint64_t off = 0; off < n; off += kChunk) {
        const uint64_t len = std::min(kChunk, n - off);
        fill_bf16_parallel(key, init, off, len, buf.data());
        writer.write_part(t.name, buf.data(), len * 2);
        done += len * 2;
        if (progress) progress(done, total);
      }
      weight_map[t.name] = file_name(s);
    }
    writer.close();
  }

  if (n_shards > 1) {
    ojson index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    write_json(out / "model.safetensors.index.json", index);
  }
  return total;
}

void write_smollm2_tokenizer(const std::string& gguf_path, const std::string& dir) {
  if (!fs::is_regular_file(gguf_path))
    fail("the SmolLM2 tokenizer comes from the default model's GGUF, which is missing at {}: "
         "run scripts/setup.sh (or set TESSERA_DEFAULT_MODEL)",
         gguf_path);
  const GgufFile gguf = GgufFile::open(gguf_path);

  const std::string model = gguf.get("tokenizer.ggml.model").as_string();
  if (model != "gpt2")
    fail("{}: tokenizer.ggml.model is '{}', expected 'gpt2' (byte-level BPE) for SmolLM2",
         gguf_path, model);
  const std::vector<std::string>& tokens = gguf.get("tokenizer.ggml.tokens").strings;
  const std::vector<std::string>& merges = gguf.get("tokenizer.ggml.merges").strings;
  if (tokens.size() != 49152)
    fail("{}: {} tokens, expected SmolLM2's 49152", gguf_path, tokens.size());
  std::vector<double> types;
  if (const GgufValue* v = gguf.find("tokenizer.ggml.token_type")) types = v->numbers;
  if (!types.empty() && types.size() != tokens.size())
    fail("{}: tokenizer.ggml.token_type has {} entries for {} tokens", gguf_path, types.size(),
         tokens.size());

  // GGUF token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
  // Control and user-defined tokens are matched whole before BPE (added tokens).
  ojson added = ojson::array();
  ojson added_decoder = ojson::object();
  // The vocab is kept in id order, as Hugging Face writes it. ordered_json looks keys up
  // linearly, so entries are appended to its vector directly and duplicates are caught
  // with a hash set (49152 tokens: quadratic lookups would take seconds).
  ojson::object_t vocab_entries;
  vocab_entries.reserve(tokens.size());
  std::unordered_set<std::string> seen;
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (!seen.insert(tokens[id]).second) fail("{}: token '{}' appears twice", gguf_path, tokens[id]);
    vocab_entries.ojson::object_t::Container::emplace_back(tokens[id], ojson(id));
    const int type = types.empty() ? 1 : int(types[id]);
    if (type != 3 && type != 4) continue;
    ojson tok;
    tok["id"] = id;
    tok["content"] = tokens[id];
    tok["single_word"] = false;
    tok["lstrip"] = false;
    tok["rstrip"] = false;
    tok["normalized"] = false;
    tok["special"] = type == 3;
    added.push_back(tok);
    ojson dec = tok;
    dec.erase("id");
    added_decoder[std::to_string(id)] = dec;
  }

  // The pre-tokenizer of SmolLM2's own tokenizer.json (llama.cpp names it "smollm"): every
  // digit is its own piece, then the GPT-2 byte-level split.
  ojson tj;
  tj["version"] = "1.0";
  tj["truncation"] = nullptr;
  tj["padding"] = nullptr;
  tj["added_tokens"] = added;
  tj["normalizer"] = nullptr;
  tj["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       ojson::array({{{"type", "Digits"}, {"individual_digits", true}},
                     {{"type", "ByteLevel"},
                      {"add_prefix_space", false},
                      {"trim_offsets", true},
                      {"use_regex", true}}})}};
  tj["post_processor"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  tj["decoder"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  ojson bpe;
  bpe["type"] = "BPE";
  bpe["dropout"] = nullptr;
  bpe["unk_token"] = nullptr;
  bpe["continuing_subword_prefix"] = nullptr;
  bpe["end_of_word_suffix"] = nullptr;
  bpe["fuse_unk"] = false;
  bpe["byte_fallback"] = false;
  bpe["ignore_merges"] = false;
  bpe["vocab"] = ojson(std::move(vocab_entries));
  bpe["merges"] = merges;  // "left right" strings, as GGUF stores them
  tj["model"] = std::move(bpe);
  write_json(fs::path(dir) / "tokenizer.json", tj);

  auto token_of = [&](const char* key) -> ojson {
    const GgufValue* v = gguf.find(key);
    if (!v) return nullptr;
    const int64_t id = v->as_int();
    if (id < 0 || id >= int64_t(tokens.size())) return nullptr;
    return tokens[size_t(id)];
  };
  int64_t max_length = 8192;
  if (const GgufValue* arch = gguf.find("general.architecture"))
    if (const GgufValue* ctx = gguf.find(arch->as_string() + ".context_length"))
      max_length = ctx->as_int();

  ojson tc;
  tc["add_bos_token"] = false;  // SmolLM2 adds no BOS; its chat template writes <|im_start|>
  tc["add_prefix_space"] = false;
  tc["added_tokens_decoder"] = added_decoder;
  tc["bos_token"] = token_of("tokenizer.ggml.bos_token_id");
  tc["eos_token"] = token_of("tokenizer.ggml.eos_token_id");
  tc["unk_token"] = token_of("tokenizer.ggml.unknown_token_id");
  tc["pad_token"] = token_of("tokenizer.ggml.padding_token_id");
  if (const GgufValue* t = gguf.find("tokenizer.chat_template")) tc["chat_template"] = t->as_string();
  tc["clean_up_tokenization_spaces"] = false;
  tc["model_max_length"] = max_length;
  tc["tokenizer_class"] = "GPT2Tokenizer";
  write_json(fs::path(dir) / "tokenizer_config.json", tc);
}

void synth(const SynthOptions& opts, const SynthProgress& progress) {
  const Preset& preset = find_preset(opts.preset);
  if (opts.out_dir.empty()) fail("synth needs an output directory (--out DIR)");
  const ModelSpec& spec = opts.tiny ? preset.tiny : preset.full;
  spec.validate();

  // Check the tokenizer sources before spending minutes on weights.
  fs::path tok_src;
  std::string gguf_path;
  if (preset.family == "smollm2") {
    gguf_path = opts.smollm2_gguf.empty() ? default_model_path() : opts.smollm2_gguf;
    if (!fs::is_regular_file(gguf_path)) {
      std::vector<fs::path> places;
      if (opts.smollm2_gguf.empty())
        for (const std::string& c : default_model_candidates()) places.emplace_back(c);
      else
        places.emplace_back(gguf_path);
      fail("the SmolLM2 tokenizer comes from the default model's GGUF ({}), which is missing; looked in: {}: "
           "run scripts/setup.sh (or set TESSERA_DEFAULT_MODEL)",
           kDefaultModelFile, list_places(places));
    }
  } else {
    const std::string family = preset.family == "llama3" ? "llama3" : "qwen3";
    std::vector<fs::path> places;
    if (!opts.tokenizers_dir.empty()) places.push_back(fs::path(opts.tokenizers_dir) / family);
    else
      for (const fs::path& d : tokenizers_candidates()) places.push_back(d / family);
    for (const fs::path& p : places)
      if (std::error_code ec; fs::is_directory(p, ec)) {
        tok_src = p;
        break;
      }
    if (tok_src.empty())
      fail("tokenizer folder {}/ is missing; looked in: {}: run scripts/setup.sh, pass --tokenizers DIR "
           "(the folder holding llama3/ and qwen3/) or set TESSERA_TOKENIZERS",
           family, list_places(places));
  }

  const fs::path out(opts.out_dir);
  prepare_out_dir(out);

  uint64_t total = 0;
  for (const ExpectedTensor& t : expected_tensors(spec)) total += numel(t.shape) * 2;
  std::error_code ec;
  const fs::space_info space = fs::space(out, ec);
  if (!ec && space.available < total + (uint64_t(64) << 20))
    fail("not enough disk space in {}: the weights need {}, {} available", out.string(),
         human_bytes(total), human_bytes(space.available));

  // The marker goes first (complete: false) so that an interrupted run can be re-run
  // into the same directory, and last (complete: true) once everything is written.
  ojson marker;
  marker["preset"] = preset.name;
  marker["tiny"] = opts.tiny;
  marker["seed"] = opts.seed;
  marker["tessera_version"] = TESSERA_VERSION;
  marker["family"] = preset.family;
  marker["params"] = count_params(spec);
  marker["weight_bytes"] = total;
  marker["init"] = "linear/embedding N(0,0.02); rmsnorm 1+0.1*N(0,1); bias 0.2*N(0,1); bf16";
  marker["complete"] = false;
  write_json(out / kMarker, marker);

  if (preset.family == "smollm2")
    write_smollm2_tokenizer(gguf_path, out.string());
  else
    copy_tokenizer(tok_src, out);

  nlohmann::json config = spec_to_hf_config(spec);
  if (!config.contains("torch_dtype") && !config.contains("dtype")) config["torch_dtype"] = "bfloat16";
  write_text(out / "config.json", config.dump(2) + "\n");

  write_synth_weights(spec, out.string(), opts.seed, progress);

  marker["complete"] = true;
  write_json(out / kMarker, marker);
}

}  // namespace tessera
