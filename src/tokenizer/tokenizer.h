// Byte-level BPE tokenizers, exact to Hugging Face `tokenizers`: loaded from tokenizer.json
// (Llama 3, Qwen2/2.5/3) or from GGUF metadata (tokenizer.ggml.*: SmolLM2 and GGUF files in
// general). Normalizer, pre-tokenizer split regexes, added/special tokens matched before BPE,
// merges by rank, post-processor, decoder.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

class GgufFile;
class Model;

class Tokenizer {
 public:
  // tokenizer.json (+ tokenizer_config.json beside it, when present, for BOS/EOS and
  // add_bos_token). Throws tessera::Error naming what is missing or unsupported.
  static Tokenizer from_json_file(const std::string& tokenizer_json_path);
  static Tokenizer from_gguf(const GgufFile& gguf);
  // The tokenizer that travels with a model: tokenizer.json in its directory, or its GGUF metadata.
  static Tokenizer for_model(const Model& model);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Exactly what `tokenizers`' Tokenizer.encode(text).ids gives (special tokens written in
  // the text are matched; the post-processor runs, adding BOS only if the file says so).
  // Throws tessera::Error on invalid UTF-8.
  std::vector<int32_t> encode(std::string_view text) const;
  // The same without the post-processor (no BOS/EOS added).
  std::vector<int32_t> encode_raw(std::string_view text) const;
  // Ids for generation from a plain or already-templated prompt, with the family's BOS rule:
  // one BOS at the start when the family uses one (never two), none otherwise.
  std::vector<int32_t> encode_prompt(std::string_view text) const;

  // Text of the ids (byte-level decoded; invalid UTF-8 from partial sequences is kept as bytes).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // Raw bytes one token stands for (special tokens: their content).
  std::string token_bytes(int32_t id) const;
  // The token string as stored in the vocabulary ("Ġworld").
  std::string token_string(int32_t id) const;

  int32_t vocab_size() const;
  std::optional<int32_t> token_id(std::string_view token) const;  // vocabulary or added token
  bool is_special(int32_t id) const;
  std::optional<int32_t> bos_id() const;
  bool adds_bos() const;                 // the family prepends BOS to prompts
  const std::vector<int32_t>& eos_ids() const;  // the stop set
  const std::string& chat_template() const;     // Jinja source, "" when none shipped
  const std::string& bos_token() const;
  const std::string& eos_token() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
