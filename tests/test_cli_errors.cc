// Bad input at the command line: every case gives one line naming the problem on stderr
// and a non-zero exit, never a crash.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "model/spec.h"
#include "synth/synth.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing_support::run_tessera;
using testing_support::ScratchDir;
using testing_support::slurp;
using testing_support::write_file;

// A model small enough to build in a test: 2 layers, hidden 16, vocab 32.
ModelSpec micro_spec() {
  ModelSpec s;
  s.arch = Arch::Llama;
  s.model_type = "llama";
  s.hidden = 16;
  s.intermediate = 32;
  s.n_layers = 2;
  s.n_heads = 2;
  s.n_kv_heads = 1;
  s.head_dim = 8;
  s.vocab = 32;
  s.max_position = 64;
  s.tie_embeddings = true;
  return s;
}

void write_micro_model(const ScratchDir& dir) {
  write_file(dir.path() / "config.json", spec_to_hf_config(micro_spec()).dump());
  write_synth_weights(micro_spec(), dir.str(), /*seed=*/1);
}

// Expects exit code 1 and exactly one line on stderr that contains `needle`.
void expect_one_line_error(const std::string& args, const std::string& needle) {
  auto r = run_tessera(args);
  EXPECT_EQ(r.exit_code, 1) << args << "\nstderr: " << r.err;
  ASSERT_FALSE(r.err.empty()) << args;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line: " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
}

// Little-endian byte builder for hand-made corrupt files.
struct Bytes {
  std::string b;
  template <typename T>
  Bytes& put(T v) {
    char raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    b.append(raw, sizeof(T));
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b += s;
    return *this;
  }
};

// A GGUF v3 with one F32 tensor "t" of 4 values at `offset` with ggml type `type`.
std::string gguf_one_tensor(uint32_t type, uint64_t offset, uint64_t n_tensors = 1) {
  Bytes g;
  g.b = "GGUF";
  g.put<uint32_t>(3).put<uint64_t>(n_tensors).put<uint64_t>(0);
  g.str("t").put<uint32_t>(1).put<uint64_t>(32).put<uint32_t>(type).put<uint64_t>(offset);
  while (g.b.size() % 32) g.b.push_back('\0');
  g.b.append(128, '\0');
  return g.b;
}

TEST(CliErrors, MicroModelLoads) {
  ScratchDir dir("micro");
  write_micro_model(dir);
  auto r = run_tessera("inspect " + dir.str());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("GQA 2/1"), std::string::npos) << r.out;
}

TEST(CliErrors, TruncatedSafetensors) {
  ScratchDir dir("trunc");
  write_micro_model(dir);
  const auto st = dir.path() / "model.safetensors";
  std::string bytes = slurp(st);
  write_file(st, bytes.substr(0, bytes.size() - 100));
  expect_one_line_error("inspect " + dir.str(), "model.safetensors");
}

TEST(CliErrors, SafetensorsOffsetsPastTheEnd) {
  ScratchDir dir("offsets");
  write_micro_model(dir);
  const std::string header = R"({"model.embed_tokens.weight":{"dtype":"F32","shape":[32,16],"data_offsets":[0,2048]}})";
  Bytes b;
  b.put<uint64_t>(header.size());
  b.b += header;
  b.b.append(64, '\0');
  write_file(dir.path() / "model.safetensors", b.b);
  expect_one_line_error("inspect " + dir.str(), "past");
}

TEST(CliErrors, SafetensorsHeaderNotJson) {
  ScratchDir dir("notjson");
  write_micro_model(dir);
  const std::string header = "{this is not json}";
  Bytes b;
  b.put<uint64_t>(header.size());
  b.b += header;
  write_file(dir.path() / "model.safetensors", b.b);
  expect_one_line_error("inspect " + dir.str(), "JSON");
}

TEST(CliErrors, GgufWrongMagic) {
  ScratchDir dir("magic");
  std::string g = gguf_one_tensor(0, 0);
  g[0] = 'X';
  // Not starting with GGUF, the file is not recognised as a model at all.
  write_file(dir.path() / "m.gguf", g);
  expect_one_line_error("inspect " + dir.str("m.gguf"), "GGUF");
}

TEST(CliErrors, GgufWrongVersion) {
  ScratchDir dir("version");
  std::string g = gguf_one_tensor(0, 0);
  g[4] = 7;
  write_file(dir.path() / "m.gguf", g);
  expect_one_line_error("inspect " + dir.str("m.gguf"), "version 7");
}

TEST(CliErrors, GgufTensorCountLargerThanFile) {
  ScratchDir dir("count");
  write_file(dir.path() / "m.gguf", gguf_one_tensor(0, 0, /*n_tensors=*/1'000'000'000'000ull));
  expect_one_line_error("inspect " + dir.str("m.gguf"), "tensor count");
}

TEST(CliErrors, GgufOffsetPastTheEnd) {
  ScratchDir dir("gguf_offset");
  write_file(dir.path() / "m.gguf", gguf_one_tensor(0, 1 << 20));
  expect_one_line_error("inspect " + dir.str("m.gguf"), "past the end");
}

TEST(CliErrors, GgufTensorTypeErrors) {
  ScratchDir dir("quant");
  // A q4_K row of 32 values: not a whole super block.
  write_file(dir.path() / "m.gguf", gguf_one_tensor(12, 0));
  expect_one_line_error("inspect " + dir.str("m.gguf"), "of type q4_K has inner dimension 32, not a multiple of its block size 256");
  // A type tessera does not read (iq2_xxs) waits for the architecture check, which comes first.
  write_file(dir.path() / "m.gguf", gguf_one_tensor(16, 0));
  expect_one_line_error("inspect " + dir.str("m.gguf"), "GGUF has no general.architecture");
}

TEST(CliErrors, ConfigMissingHiddenSize) {
  ScratchDir dir("nohidden");
  auto c = spec_to_hf_config(micro_spec());
  c.erase("hidden_size");
  write_file(dir.path() / "config.json", c.dump());
  expect_one_line_error("inspect " + dir.str(), "hidden_size");
}

TEST(CliErrors, MoeConfigRefusedWithReason) {
  ScratchDir dir("moe");
  auto c = spec_to_hf_config(micro_spec());
  c["num_local_experts"] = 8;
  c["num_experts_per_tok"] = 2;
  write_file(dir.path() / "config.json", c.dump());
  expect_one_line_error("inspect " + dir.str(), "mixture of experts");
}

TEST(CliErrors, SlidingWindowConfigRefused) {
  ScratchDir dir("swa");
  auto c = spec_to_hf_config(micro_spec());
  c["model_type"] = "qwen2";
  c["use_sliding_window"] = true;
  c["sliding_window"] = 16;
  write_file(dir.path() / "config.json", c.dump());
  expect_one_line_error("inspect " + dir.str(), "sliding-window");
}

TEST(CliErrors, NotAModelAtAll) {
  ScratchDir dir("notmodel");
  write_file(dir.path() / "notes.txt", "hello");
  expect_one_line_error("inspect " + dir.str("notes.txt"), "neither");
  expect_one_line_error("inspect " + dir.str("missing"), "no such file");
  expect_one_line_error("inspect " + dir.str(), "no config.json");
}

TEST(CliErrors, MissingTensorNamed) {
  ScratchDir dir("missing_tensor");
  write_micro_model(dir);
  auto c = spec_to_hf_config(micro_spec());
  c["num_hidden_layers"] = 3;  // the file holds only 2 layers
  write_file(dir.path() / "config.json", c.dump());
  expect_one_line_error("inspect " + dir.str(), "model.layers.2.");
}

TEST(CliErrors, DumpRejectsBadIds) {
  ScratchDir dir("ids");
  write_micro_model(dir);
  expect_one_line_error("dump " + dir.str() + " --ids 1,x,3 --out " + dir.str("o"), "not a token id");
  expect_one_line_error("dump " + dir.str() + " --ids 1,99 --out " + dir.str("o"), "outside the vocabulary");
}

}  // namespace
}  // namespace tessera
