// The seed models tessera knows by name: their exact configurations (full) and a tiny
// form of each that keeps every architecture feature but fits in a test's time budget.
// `tessera synth` turns a preset into a random-weight Hugging Face checkpoint.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/spec.h"

namespace tessera {

struct Preset {
  std::string name;    // "Llama-3.2-1B", as in docs and models.md
  std::string family;  // tokenizer family: "llama3", "qwen" or "smollm2"
  ModelSpec full;      // the real model's configuration, value for value
  // Same arch, GQA ratio, head_dim, biases, q/k norm, rope (theta and scaling), eps,
  // tying and vocab as `full`; only width and depth (2 to 4 layers) are small.
  ModelSpec tiny;
};

// The 11 seed models, in the order of models.md.
const std::vector<Preset>& presets();

// Exact name first, then a case-insensitive match; throws tessera::Error listing the
// valid names otherwise.
const Preset& find_preset(const std::string& name);

// Number of parameters the checkpoint of `spec` stores (sum over expected_tensors).
int64_t count_params(const ModelSpec& spec);

}  // namespace tessera
