// `tessera synth`: random-weight Hugging Face checkpoints with the exact configuration of a
// seed model (or its tiny form), paired with the real tokenizer of its family.
//
// Weights are initialized like transformers does (so a dropped or misplaced piece shows in
// the numbers): Linear weights and embeddings ~ N(0, 0.02), RMSNorm weights 1 + 0.1 N(0, 1),
// biases 0.2 N(0, 1). Every value comes from a counter-based generator keyed by (seed,
// tensor name) and a Box-Muller transform built from IEEE-exact operations only, so a seed
// gives byte-identical files on every machine, whatever the chunking or thread count.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "model/spec.h"
#include "model/tensors.h"

namespace tessera {

struct SynthOptions {
  std::string preset;          // a name from presets()
  std::string out_dir;         // created if missing; must be empty or a previous synth output
  bool tiny = false;           // the preset's tiny form instead of the full model
  uint64_t seed = 0;
  // Folder holding llama3/ and qwen3/ tokenizer files; empty: $TESSERA_TOKENIZERS, else
  // the first data directory's tokenizers/ that has the family's folder (util/data_paths.h).
  std::string tokenizers_dir;
  // GGUF whose metadata carries the SmolLM2 tokenizer; empty: default_model_path().
  std::string smollm2_gguf;
};

// Called after each chunk of weights is written: bytes written so far and in total.
using SynthProgress = std::function<void(uint64_t done_bytes, uint64_t total_bytes)>;

// Writes config.json, model.safetensors (or shards of at most 2 GiB each plus
// model.safetensors.index.json), tokenizer.json, tokenizer_config.json and
// tessera_synth.json into opts.out_dir. Throws tessera::Error on user errors (unknown
// preset, non-empty foreign out dir, missing tokenizer source, not enough disk space).
void synth(const SynthOptions& opts, const SynthProgress& progress = {});

// --- pieces, public for tests and for other tools ---------------------------------------

constexpr uint64_t kSynthShardBytes = uint64_t(2) << 30;  // 2 GiB

// Writes the BF16 safetensors of `spec` (exactly expected_tensors(spec)) into `dir`: one
// model.safetensors when the total fits in `shard_bytes`, else model-0000i-of-0000n
// shards plus model.safetensors.index.json. Returns the total tensor bytes.
uint64_t write_synth_weights(const ModelSpec& spec, const std::string& dir, uint64_t seed,
                             const SynthProgress& progress = {},
                             uint64_t shard_bytes = kSynthShardBytes);

// Values [offset, offset + n) of tensor `name` for `seed`, as fp32 before the cast to
// BF16. The same (seed, name, index) always gives the same value.
void synth_values(const std::string& name, TensorRole role, uint64_t seed, uint64_t offset,
                  uint64_t n, float* out);

// Standard normal number `index` of the stream keyed by (seed, name): the building block
// of synth_values, exposed so tests can check its statistics and its golden values.
double synth_normal(uint64_t seed, const std::string& name, uint64_t index);

// Writes tokenizer.json and tokenizer_config.json for SmolLM2 (Hugging Face `tokenizers`
// format) from the tokenizer.ggml.* metadata of `gguf_path`.
void write_smollm2_tokenizer(const std::string& gguf_path, const std::string& dir);

}  // namespace tessera
