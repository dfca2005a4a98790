// Text generation: prefill the prompt, then decode token by token with the KV cache,
// streaming each token as it is produced and stopping on the family's EOS set.
// Any target executes it (ModelRunner): the cpu target normally, the oracle for reference.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "targets/target.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

struct GenerationOptions {
  int max_new_tokens = 128;
  SamplingOptions sampling;
  bool stop_on_eos = true;
};

struct GenerationResult {
  std::vector<int32_t> tokens;    // generated ids (the EOS that stopped it excluded)
  std::string text;               // their decoded text
  std::string stop_reason;        // "eos", "length", "context", "stopped"
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  double prefill_tokens_per_second() const;
  double decode_tokens_per_second() const;
};

// Called with each new id and the complete UTF-8 text it adds (possibly empty while a
// multi-byte character is still split across tokens). Return false to stop.
using TokenCallback = std::function<bool(int32_t id, const std::string& text)>;

// Emits decoded text only in whole UTF-8 characters, however tokens split the bytes.
class Utf8Stream {
 public:
  std::string push(const std::string& bytes);
  std::string flush();  // what is left, invalid or not

 private:
  std::string pending_;
};

// What generation stops on: the tokenizer's end-of-sequence set (its eos_token and the
// family's end-of-turn tokens) and every id the checkpoint declares (config.json and
// generation_config.json eos_token_id, GGUF eos/eot ids): instruct models stop on several.
std::vector<int32_t> stop_ids(const Tokenizer& tokenizer, const ModelSpec& spec);

class Generator {
 public:
  // Stops on stop_ids(tokenizer, runner.spec()), or on the ids given.
  Generator(ModelRunner& runner, const Tokenizer& tokenizer);
  Generator(ModelRunner& runner, const Tokenizer& tokenizer, std::vector<int32_t> stop_ids);
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }

  // Runs `prompt` after whatever the runner's KV cache already holds (so a chat can extend
  // its conversation) and generates up to options.max_new_tokens.
  GenerationResult generate(const std::vector<int32_t>& prompt, const GenerationOptions& options,
                            const TokenCallback& on_token = {});

 private:
  ModelRunner& runner_;
  const Tokenizer& tokenizer_;
  std::vector<int32_t> stop_ids_;  // sorted
};

}  // namespace tessera
