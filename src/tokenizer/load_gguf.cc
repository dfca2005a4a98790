// GGUF tokenizer metadata (tokenizer.ggml.*) into the same structure tokenizer.json gives:
// the byte-level BPE of Hugging Face's original file, rebuilt from the vocabulary, the
// merges, the token types and the pre-tokenizer name llama.cpp's converter recorded.
#include <cmath>

#include "io/gguf.h"
#include "tokenizer/tokenizer_data.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace tessera::detail {

namespace {

// The pre-tokenizer (and normalizer) of the Hugging Face tokenizer.json that llama.cpp's
// converter names `pre`. Returns false for names tessera does not know.
bool set_pre_tokenizer(const std::string& pre, TokenizerData& d, bool& ignore_merges) {
  if (pre == "default" || pre == "gpt2" || pre == "gpt-2") {
    d.pre_tokenizer.add(PreTokenizerStep::byte_level(false, true));
  } else if (pre == "smollm") {
    // SmolLM's tokenizer.json: every digit alone, then the GPT-2 byte-level split.
    d.pre_tokenizer.add(PreTokenizerStep::digits(true));
    d.pre_tokenizer.add(PreTokenizerStep::byte_level(false, true));
  } else if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") {
    d.pre_tokenizer.add(PreTokenizerStep::split(kLlama3Pattern));
    d.pre_tokenizer.add(PreTokenizerStep::byte_level(false, false));
    ignore_merges = true;  // Llama 3's tokenizer.json sets it: a word in the vocabulary is one token
  } else if (pre == "qwen2") {
    d.normalizer.add(Normalizer::Step::NFC);  // Qwen2's tokenizer.json normalizes to NFC
    d.pre_tokenizer.add(PreTokenizerStep::split(kQwen2Pattern));
    d.pre_tokenizer.add(PreTokenizerStep::byte_level(false, false));
  } else {
    return false;
  }
  return true;
}

std::optional<int32_t> optional_id(const GgufFile& g, const char* key, size_t n_tokens) {
  const GgufValue* v = g.find(key);
  if (!v) return std::nullopt;
  const int64_t id = v->as_int();
  if (id < 0 || id >= int64_t(n_tokens)) return std::nullopt;  // llama.cpp writes -1 for "none"
  return int32_t(id);
}

}  // namespace

void load_tokenizer_gguf(const GgufFile& g, TokenizerData& d) {
  const std::string& path = g.path();
  d.source = path;
  const GgufValue* model = g.find("tokenizer.ggml.model");
  if (!model) fail("{}: the GGUF file carries no tokenizer (no tokenizer.ggml.model)", path);
  const std::string& kind = model->as_string();
  if (kind == "llama") fail("{}: unsupported tokenizer feature: tokenizer.ggml.model 'llama' (SentencePiece)", path);
  if (kind != "gpt2")
    fail("{}: unsupported tokenizer feature: tokenizer.ggml.model '{}' (tessera reads byte-level BPE, 'gpt2')", path, kind);

  const GgufValue& tokens_v = g.get("tokenizer.ggml.tokens");
  const std::vector<std::string>& tokens = tokens_v.strings;
  if (!tokens_v.is_array() || tokens.empty()) fail("{}: tokenizer.ggml.tokens is not a list of strings", path);
  const GgufValue* merges_v = g.find("tokenizer.ggml.merges");
  if (!merges_v) fail("{}: a byte-level BPE tokenizer needs tokenizer.ggml.merges, which is missing", path);
  std::vector<double> types;
  if (const GgufValue* t = g.find("tokenizer.ggml.token_type")) types = t->numbers;
  if (!types.empty() && types.size() != tokens.size())
    fail("{}: tokenizer.ggml.token_type has {} entries for {} tokens", path, types.size(), tokens.size());
  for (size_t id = 0; id < types.size(); ++id)  // checked before any is converted to int
    if (!(types[id] >= 0 && types[id] <= 6 && types[id] == std::floor(types[id])))
      fail("{}: tokenizer.ggml.token_type of token {} is {}, not a GGUF token type (an integer 0-6)", path, id,
           types[id]);

  std::string pre = "default";  // llama.cpp's choice when the converter recorded none
  if (const GgufValue* p = g.find("tokenizer.ggml.pre")) pre = p->as_string();
  bool ignore_merges = false;
  if (!set_pre_tokenizer(pre, d, ignore_merges))
    fail("{}: unsupported tokenizer feature: tokenizer.ggml.pre '{}' (known: default, gpt2, smollm, llama-bpe, qwen2)",
         path, pre);

  // GGUF token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
  // Control and user-defined tokens are the added tokens of the original tokenizer.json
  // (matched whole in the raw text); control ones are special.
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (unicode::first_invalid_utf8(tokens[id])) fail("{}: token {} is not valid UTF-8", path, id);
    vocab[tokens[id]] = int32_t(id);  // a repeated string keeps its last id, as a Python dict would
    const int type = types.empty() ? 1 : int(types[id]);
    if (type == 3 || type == 4) {
      AddedToken a;
      a.id = int32_t(id);
      a.content = tokens[id];
      a.special = type == 3;
      a.normalized = false;
      d.added.push_back(std::move(a));
    }
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_v->strings.size());
  for (const std::string& m : merges_v->strings) {
    const size_t sp = m.find(' ');
    if (sp == std::string::npos || m.find(' ', sp + 1) != std::string::npos)
      fail("{}: merge '{}' is not two tokens separated by one space", path, m);
    merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  BpeOptions opt;
  opt.ignore_merges = ignore_merges;
  try {
    d.bpe = std::make_unique<Bpe>(std::move(vocab), merges, std::move(opt));
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
  d.byte_level_decoder = true;

  d.bos_id = optional_id(g, "tokenizer.ggml.bos_token_id", tokens.size());
  const auto eos = optional_id(g, "tokenizer.ggml.eos_token_id", tokens.size());
  if (d.bos_id) d.bos_token = tokens[size_t(*d.bos_id)];
  if (eos) d.eos_token = tokens[size_t(*eos)];
  // add_bos_token decides; without it, llama.cpp adds BOS for Llama 3 and not for other BPE vocabularies.
  const bool llama3 = pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3";
  if (const GgufValue* v = g.find("tokenizer.ggml.add_bos_token")) d.adds_bos = v->as_bool();
  else d.adds_bos = llama3;
  // The same switches as the post-processor of the original file (Llama 3's adds BOS).
  if (d.adds_bos && d.bos_id) d.prefix_ids.push_back(*d.bos_id);
  if (const GgufValue* v = g.find("tokenizer.ggml.add_eos_token"); v && v->as_bool() && eos) d.suffix_ids.push_back(*eos);
  if (const GgufValue* t = g.find("tokenizer.chat_template")) d.chat_template = t->as_string();
}

}  // namespace tessera::detail
