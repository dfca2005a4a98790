// `tessera synth`: the tensor set, dtype and shapes, determinism across runs, the
// initialization statistics, sharding, the output directory rules, tokenizers, the CLI.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "model/default_model.h"
#include "model/presets.h"
#include "model/spec.h"
#include "model/tensors.h"
#include "synth/synth.h"
#include "util/error.h"
#include "test_support.h"
#include "util/half.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kTokenizers = std::string(TESSERA_TOKENIZERS_DIR);

// Scratch directories and the CLI runner come from the shared test support.
using TempDir = testing_support::ScratchDir;

using testing_support::slurp;

json read_json(const fs::path& p) { return json::parse(slurp(p)); }

std::vector<float> to_floats(const TensorInfo& t) {
  std::vector<float> v(size_t(t.numel()));
  to_f32(t.dtype, t.data, v.data(), t.numel());
  return v;
}

// All tensors of a synth directory (single file or shards), by name.
std::map<std::string, TensorInfo> load_dir(const fs::path& dir) {
  std::map<std::string, TensorInfo> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    const SafetensorsFile file = SafetensorsFile::open(e.path().string());
    for (const TensorInfo& t : file.tensors()) {
      EXPECT_TRUE(out.emplace(t.name, t).second) << "tensor twice: " << t.name;
    }
  }
  return out;
}

// A small Qwen2-shaped spec: every role (biases included) at a size that writes in ms.
ModelSpec small_qwen2() {
  ModelSpec s = find_preset("Qwen2.5-1.5B").tiny;
  s.vocab = 1024;
  s.hidden = 256;
  s.intermediate = 512;
  s.n_heads = 2;
  s.n_kv_heads = 1;
  s.n_layers = 2;
  return s;
}

void expect_exact_tensor_set(const ModelSpec& spec, const fs::path& dir) {
  const auto got = load_dir(dir);
  const auto want = expected_tensors(spec);
  EXPECT_EQ(got.size(), want.size());
  for (const ExpectedTensor& e : want) {
    auto it = got.find(e.name);
    ASSERT_NE(it, got.end()) << "missing " << e.name;
    EXPECT_EQ(it->second.dtype, DType::BF16) << e.name;
    EXPECT_EQ(it->second.shape, e.shape) << e.name;
  }
}

// --- generator --------------------------------------------------------------------------

TEST(SynthRandom, NormalStatistics) {
  const int n = 400000;
  double sum = 0, sum2 = 0, sum4 = 0;
  int within1 = 0;
  for (int i = 0; i < n; ++i) {
    const double z = synth_normal(7, "stats", uint64_t(i));
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
    within1 += std::fabs(z) < 1.0;
  }
  const double mean = sum / n, var = sum2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var, 1.0, 0.01);
  EXPECT_NEAR(sum4 / n, 3.0, 0.05);  // a normal's kurtosis, not a uniform's 1.8
  EXPECT_NEAR(double(within1) / n, 0.682689, 0.005);
}

TEST(SynthRandom, KeyedBySeedAndName) {
  EXPECT_EQ(synth_normal(1, "a", 5), synth_normal(1, "a", 5));
  EXPECT_NE(synth_normal(1, "a", 5), synth_normal(2, "a", 5));
  EXPECT_NE(synth_normal(1, "a", 5), synth_normal(1, "b", 5));
}

TEST(SynthRandom, ValuesIndependentOfChunking) {
  std::vector<float> whole(1001), parts(1001);
  synth_values("model.layers.0.mlp.up_proj.weight", TensorRole::Weight, 3, 0, 1001, whole.data());
  synth_values("model.layers.0.mlp.up_proj.weight", TensorRole::Weight, 3, 0, 333, parts.data());
  synth_values("model.layers.0.mlp.up_proj.weight", TensorRole::Weight, 3, 333, 668, parts.data() + 333);
  EXPECT_EQ(whole, parts);
}

// Golden BF16 bits: the test fixtures depend on synth being byte-identical on every
// machine. If this fails on a new platform, the generator is not portable there.
TEST(SynthRandom, GoldenValues) {
  std::vector<float> v(8);
  synth_values("model.embed_tokens.weight", TensorRole::Embedding, 0, 0, 8, v.data());
  std::vector<uint16_t> bits;
  for (float x : v) bits.push_back(f32_to_bf16(x));
  const std::vector<uint16_t> golden = {0x3ccc, 0x3d1d, 0x3b49, 0xbc80, 0x3c11, 0x3aca, 0xbca0, 0xbc9e};
  EXPECT_EQ(bits, golden);
  synth_values("model.norm.weight", TensorRole::Norm, 42, 1000, 8, v.data());
  bits.clear();
  for (float x : v) bits.push_back(f32_to_bf16(x));
  const std::vector<uint16_t> golden_norm = {0x3fa1, 0x3f69, 0x3f53, 0x3f8a, 0x3f60, 0x3f87, 0x3f85, 0x3f67};
  EXPECT_EQ(bits, golden_norm);
}

// --- weights ------------------------------------------------------------------------------

TEST(SynthWeights, ExactTensorsBf16AndRoles) {
  TempDir dir("roles");
  fs::create_directories(dir.path());
  const ModelSpec spec = small_qwen2();
  write_synth_weights(spec, dir.str(), 1);
  ASSERT_TRUE(fs::exists(dir.path() / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir.path() / "model.safetensors.index.json"));
  expect_exact_tensor_set(spec, dir.path());

  const auto tensors = load_dir(dir.path());
  int norms = 0, biases = 0;
  for (const ExpectedTensor& e : expected_tensors(spec)) {
    const std::vector<float> v = to_floats(tensors.at(e.name));
    double sum = 0, sum2 = 0;
    int ones = 0, zeros = 0;
    for (float x : v) {
      sum += x;
      sum2 += double(x) * x;
      ones += x == 1.0f;
      zeros += x == 0.0f;
    }
    const double mean = sum / double(v.size());
    const double sd = std::sqrt(sum2 / double(v.size()) - mean * mean);
    if (e.role == TensorRole::Norm) {
      ++norms;
      EXPECT_LT(ones, int(v.size())) << e.name << " is all ones";
      EXPECT_NEAR(mean, 1.0, 0.05) << e.name;
      EXPECT_GT(sd, 0.05) << e.name;
    } else if (e.role == TensorRole::Bias) {
      ++biases;
      EXPECT_LT(zeros, int(v.size()) / 20) << e.name << " is (nearly) zero";
      EXPECT_GT(sd, 0.1) << e.name;
    }
  }
  EXPECT_EQ(norms, 2 * 2 + 1);  // two per layer + final
  EXPECT_EQ(biases, 3 * 2);     // q, k, v per layer
}

TEST(SynthWeights, LargeWeightStatistics) {
  TempDir dir("stats");
  fs::create_directories(dir.path());
  const ModelSpec spec = small_qwen2();
  write_synth_weights(spec, dir.str(), 5);
  const auto tensors = load_dir(dir.path());
  for (const char* name : {"model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight"}) {
    const std::vector<float> v = to_floats(tensors.at(name));
    ASSERT_GT(v.size(), 100000u);
    double sum = 0, sum2 = 0;
    for (float x : v) {
      sum += x;
      sum2 += double(x) * x;
    }
    const double mean = sum / double(v.size());
    EXPECT_NEAR(mean, 0.0, 0.0005) << name;
    EXPECT_NEAR(std::sqrt(sum2 / double(v.size()) - mean * mean), 0.02, 0.0005) << name;
  }
}

TEST(SynthWeights, QkNormTensorsOfQwen3) {
  TempDir dir("qknorm");
  fs::create_directories(dir.path());
  ModelSpec spec = find_preset("Qwen3-0.6B").tiny;
  spec.vocab = 512;  // everything else as the tiny preset
  write_synth_weights(spec, dir.str(), 0);
  expect_exact_tensor_set(spec, dir.path());
  const auto tensors = load_dir(dir.path());
  const TensorInfo& qn = tensors.at("model.layers.0.self_attn.q_norm.weight");
  EXPECT_EQ(qn.shape, (std::vector<int64_t>{128}));
  const std::vector<float> v = to_floats(qn);
  int ones = 0;
  for (float x : v) ones += x == 1.0f;
  EXPECT_LT(ones, 128);
  // o_proj reads the decoupled q dim: [hidden, heads * head_dim] = [256, 512].
  EXPECT_EQ(tensors.at("model.layers.0.self_attn.o_proj.weight").shape,
            (std::vector<int64_t>{256, 512}));
}

TEST(SynthWeights, ShardsWithIndex) {
  TempDir dir("shards");
  fs::create_directories(dir.path());
  const ModelSpec spec = small_qwen2();
  const uint64_t shard = 1 << 20;  // 1 MiB: forces several shards
  const uint64_t total = write_synth_weights(spec, dir.str(), 1, {}, shard);
  EXPECT_FALSE(fs::exists(dir.path() / "model.safetensors"));
  const json index = read_json(dir.path() / "model.safetensors.index.json");
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  std::set<std::string> files;
  for (auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  ASSERT_GT(files.size(), 1u);
  const std::string n = std::to_string(files.size());
  int i = 1;
  for (const std::string& f : files) {  // model-00001-of-0000N ... in order
    char want[64];
    std::snprintf(want, sizeof want, "model-%05d-of-%05zu.safetensors", i++, files.size());
    EXPECT_EQ(f, want);
    EXPECT_TRUE(fs::exists(dir.path() / f));
  }
  // Every tensor sits in the file the index names; small shards stay within the limit
  // (a tensor larger than the limit gets a shard of its own).
  uint64_t bytes = 0;
  for (const std::string& f : files) {
    uint64_t in_file = 0;
    const auto st = SafetensorsFile::open((dir.path() / f).string());
    for (const TensorInfo& t : st.tensors()) {
      EXPECT_EQ(index["weight_map"][t.name].get<std::string>(), f) << t.name;
      in_file += t.nbytes;
    }
    if (st.tensors().size() > 1) {
      EXPECT_LE(in_file, shard) << f;
    }
    bytes += in_file;
  }
  EXPECT_EQ(bytes, total);
  expect_exact_tensor_set(spec, dir.path());

  // Sharding does not change the values.
  TempDir single("single");
  fs::create_directories(single.path());
  write_synth_weights(spec, single.str(), 1);
  const auto a = load_dir(dir.path()), b = load_dir(single.path());
  for (const auto& [name, t] : a) {
    ASSERT_EQ(t.nbytes, b.at(name).nbytes);
    EXPECT_EQ(0, std::memcmp(t.data, b.at(name).data, t.nbytes)) << name;
  }
}

// --- whole directory ---------------------------------------------------------------------

SynthOptions tiny_opts(const std::string& preset, const TempDir& dir, uint64_t seed) {
  SynthOptions o;
  o.preset = preset;
  o.out_dir = dir.str();
  o.tiny = true;
  o.seed = seed;
  o.tokenizers_dir = kTokenizers;
  return o;
}

TEST(Synth, TinyQwen3Directory) {
  TempDir dir("qwen3");
  synth(tiny_opts("Qwen3-0.6B", dir, 0));
  const ModelSpec& spec = find_preset("Qwen3-0.6B").tiny;
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                        "tessera_synth.json"})
    EXPECT_TRUE(fs::exists(dir.path() / f)) << f;
  expect_exact_tensor_set(spec, dir.path());

  // The tokenizer is the family's real one, byte for byte.
  EXPECT_EQ(slurp(dir.path() / "tokenizer.json"), slurp(fs::path(kTokenizers) / "qwen3/tokenizer.json"));

  // config.json describes the same model.
  const ModelSpec back = spec_from_hf_config(read_json(dir.path() / "config.json"));
  EXPECT_EQ(back.arch, Arch::Qwen3);
  EXPECT_EQ(back.hidden, spec.hidden);
  EXPECT_EQ(back.head_dim, 128);
  EXPECT_EQ(back.n_layers, spec.n_layers);
  EXPECT_EQ(back.n_kv_heads, spec.n_kv_heads);
  EXPECT_TRUE(back.qk_norm);
  EXPECT_TRUE(back.tie_embeddings);

  const json marker = read_json(dir.path() / "tessera_synth.json");
  EXPECT_EQ(marker["preset"], "Qwen3-0.6B");
  EXPECT_EQ(marker["tiny"], true);
  EXPECT_EQ(marker["seed"], 0);
  EXPECT_EQ(marker["complete"], true);
  EXPECT_TRUE(marker.contains("tessera_version"));
}

TEST(Synth, OpensAsModelShardedOrNot) {
  // tessera's own loader reads the directory back, with the same spec.
  TempDir dir("open");
  synth(tiny_opts("Qwen3-0.6B", dir, 2));
  const Model m = Model::open(dir.str());
  const ModelSpec& spec = find_preset("Qwen3-0.6B").tiny;
  EXPECT_EQ(m.format(), "safetensors");
  EXPECT_EQ(m.spec().q_dim(), spec.q_dim());
  EXPECT_EQ(m.spec().n_layers, spec.n_layers);
  EXPECT_TRUE(m.spec().qk_norm);
  EXPECT_EQ(m.weights().size(), expected_tensors(spec).size());
  EXPECT_EQ(m.lm_head().name, "model.embed_tokens.weight");
  // Re-shard the same weights and open again: the index path.
  for (const auto& e : fs::directory_iterator(dir.path()))
    if (e.path().extension() == ".safetensors") fs::remove(e.path());
  write_synth_weights(spec, dir.str(), 2, {}, 8 << 20);
  ASSERT_TRUE(fs::exists(dir.path() / "model.safetensors.index.json"));
  const Model sharded = Model::open(dir.str());
  EXPECT_EQ(sharded.weights().size(), expected_tensors(spec).size());
  std::vector<float> a(size_t(spec.intermediate)), b(size_t(spec.intermediate));  // a down_proj row
  m.get("model.layers.2.mlp.down_proj.weight").row_f32(7, a.data());
  sharded.get("model.layers.2.mlp.down_proj.weight").row_f32(7, b.data());
  EXPECT_EQ(a, b);
}

TEST(Synth, TinyLlamaConfigKeepsRopeScaling) {
  TempDir dir("llama");
  synth(tiny_opts("Llama-3.2-1B", dir, 3));
  const ModelSpec back = spec_from_hf_config(read_json(dir.path() / "config.json"));
  EXPECT_EQ(back.rope_scaling.type, RopeScaling::Type::Llama3);
  EXPECT_EQ(back.rope_scaling.factor, 32.0);
  EXPECT_EQ(back.rope_scaling.original_max_position, 8192);
  EXPECT_EQ(back.vocab, 128256);
  EXPECT_EQ(back.bos_id, 128000);
  expect_exact_tensor_set(find_preset("Llama-3.2-1B").tiny, dir.path());
  EXPECT_EQ(slurp(dir.path() / "tokenizer_config.json"),
            slurp(fs::path(kTokenizers) / "llama3/tokenizer_config.json"));
}

TEST(Synth, SameSeedSameBytesOtherSeedDiffers) {
  TempDir a("seed_a"), b("seed_b"), c("seed_c");
  synth(tiny_opts("Qwen3-1.7B", a, 11));
  synth(tiny_opts("Qwen3-1.7B", b, 11));
  synth(tiny_opts("Qwen3-1.7B", c, 12));
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.json", "tessera_synth.json"})
    EXPECT_EQ(slurp(a.path() / f), slurp(b.path() / f)) << f;
  EXPECT_NE(slurp(a.path() / "model.safetensors"), slurp(c.path() / "model.safetensors"));
  // Every tensor differs with the seed, not only some.
  const auto ta = load_dir(a.path()), tc = load_dir(c.path());
  for (const auto& [name, t] : ta)
    EXPECT_NE(0, std::memcmp(t.data, tc.at(name).data, t.nbytes)) << name;
}

TEST(Synth, RefusesForeignNonEmptyDir) {
  TempDir dir("foreign");
  fs::create_directories(dir.path());
  std::ofstream(dir.path() / "notes.txt") << "mine";
  try {
    synth(tiny_opts("Qwen3-1.7B", dir, 0));
    FAIL() << "overwrote a foreign directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not empty"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(dir.path() / "notes.txt"), "mine");
  EXPECT_FALSE(fs::exists(dir.path() / "model.safetensors"));
}

TEST(Synth, RerunReplacesPreviousOutput) {
  TempDir dir("rerun");
  fs::create_directories(dir.path());
  // A previous run that was sharded: its shards must not survive the next run.
  SynthOptions o = tiny_opts("Qwen3-1.7B", dir, 0);
  synth(o);
  std::ofstream(dir.path() / "model-00001-of-00002.safetensors") << "stale";
  std::ofstream(dir.path() / "model.safetensors.index.json") << "{}";
  std::ofstream(dir.path() / "README.md") << "user file";
  o.seed = 1;
  synth(o);
  EXPECT_FALSE(fs::exists(dir.path() / "model-00001-of-00002.safetensors"));
  EXPECT_FALSE(fs::exists(dir.path() / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir.path() / "README.md"));
  EXPECT_EQ(read_json(dir.path() / "tessera_synth.json")["seed"], 1);
}

TEST(Synth, MissingTokenizersNamed) {
  TempDir dir("notok");
  SynthOptions o = tiny_opts("Llama-3.2-1B", dir, 0);
  o.tokenizers_dir = "/nonexistent/tokenizers";
  try {
    synth(o);
    FAIL() << "no error without tokenizer files";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizers/llama3"), std::string::npos) << e.what();
  }
}

TEST(Synth, MissingGgufForSmolLM2TellsToRunSetup) {
  TempDir dir("nogguf");
  SynthOptions o = tiny_opts("SmolLM2-360M", dir, 0);
  o.smollm2_gguf = "/nonexistent/SmolLM2.gguf";
  try {
    synth(o);
    FAIL() << "no error without the GGUF";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scripts/setup.sh"), std::string::npos) << e.what();
  }
}

TEST(Synth, SmolLM2TokenizerFromGguf) {
  const std::string gguf = default_model_path();
  if (!fs::exists(gguf)) GTEST_SKIP() << "default model missing at " << gguf << ": run scripts/setup.sh";
  TempDir dir("smol");
  SynthOptions o = tiny_opts("SmolLM2-360M", dir, 0);
  synth(o);
  expect_exact_tensor_set(find_preset("SmolLM2-360M").tiny, dir.path());

  const json tj = read_json(dir.path() / "tokenizer.json");
  EXPECT_EQ(tj["model"]["type"], "BPE");
  EXPECT_EQ(tj["model"]["vocab"].size(), 49152u);
  EXPECT_EQ(tj["model"]["vocab"]["<|im_end|>"], 2);
  EXPECT_EQ(tj["model"]["merges"].size(), GgufFile::open(gguf).get("tokenizer.ggml.merges").strings.size());
  EXPECT_EQ(tj["pre_tokenizer"]["pretokenizers"][0]["type"], "Digits");
  EXPECT_EQ(tj["pre_tokenizer"]["pretokenizers"][1]["type"], "ByteLevel");
  EXPECT_EQ(tj["decoder"]["type"], "ByteLevel");
  EXPECT_EQ(tj["post_processor"]["type"], "ByteLevel");
  ASSERT_GE(tj["added_tokens"].size(), 3u);
  EXPECT_EQ(tj["added_tokens"][0]["content"], "<|endoftext|>");
  EXPECT_EQ(tj["added_tokens"][1]["content"], "<|im_start|>");
  EXPECT_EQ(tj["added_tokens"][1]["id"], 1);
  EXPECT_EQ(tj["added_tokens"][1]["special"], true);

  const json tc = read_json(dir.path() / "tokenizer_config.json");
  EXPECT_EQ(tc["bos_token"], "<|im_start|>");
  EXPECT_EQ(tc["eos_token"], "<|im_end|>");
  EXPECT_EQ(tc["add_bos_token"], false);
  EXPECT_EQ(tc["tokenizer_class"], "GPT2Tokenizer");
  EXPECT_NE(tc["chat_template"].get<std::string>().find("<|im_start|>"), std::string::npos);

  const ModelSpec back = spec_from_hf_config(read_json(dir.path() / "config.json"));
  EXPECT_EQ(back.bos_id, 1);
  EXPECT_EQ(back.vocab, 49152);
}

// --- CLI ----------------------------------------------------------------------------------

struct RunResult {
  int rc;
  std::string out;
};

RunResult run_cli(const std::string& args) {
  const std::string cmd = std::string(TESSERA_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(SynthCli, ListsPresets) {
  const RunResult r = run_cli("synth --list");
  EXPECT_EQ(r.rc, 0) << r.out;
  for (const Preset& p : presets()) EXPECT_NE(r.out.find(p.name), std::string::npos) << p.name;
  EXPECT_NE(r.out.find("1.24B"), std::string::npos) << r.out;  // Llama-3.2-1B
}

TEST(SynthCli, UserErrorsAreOneLine) {
  RunResult r = run_cli("synth --out /tmp/x");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("--preset"), std::string::npos) << r.out;
  r = run_cli("synth --preset NoSuchModel --out /tmp/x");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("Qwen3-4B"), std::string::npos) << r.out;
}

TEST(SynthCli, WritesTinyModel) {
  TempDir dir("cli");
  const RunResult r = run_cli("synth --preset Qwen3-1.7B --tiny --seed 4 --out " + dir.str() +
                              " --tokenizers " + kTokenizers);
  ASSERT_EQ(r.rc, 0) << r.out;
  expect_exact_tensor_set(find_preset("Qwen3-1.7B").tiny, dir.path());
  // Same bytes as the library call with the same seed.
  TempDir lib("cli_lib");
  synth(tiny_opts("Qwen3-1.7B", lib, 4));
  EXPECT_EQ(slurp(dir.path() / "model.safetensors"), slurp(lib.path() / "model.safetensors"));
}

}  // namespace
}  // namespace tessera
