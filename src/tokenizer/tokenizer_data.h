// Everything a loaded tokenizer holds, filled by the two loaders (tokenizer.json in
// load_json.cc, GGUF metadata in load_gguf.cc) and run by tokenizer.cc. Internal to
// src/tokenizer/.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"

namespace tessera {
class GgufFile;
}

namespace tessera::detail {

// Strings by id, their bytes in one buffer: as std::string a vocabulary's 49k short tokens
// cost 32 bytes each (1.6 MB a table, two tables), here their bytes and a 4-byte offset.
class StringTable {
 public:
  void push_back(std::string_view s);
  std::string_view operator[](size_t i) const {
    return std::string_view(bytes_).substr(i ? end_[i - 1] : 0, end_[i] - (i ? end_[i - 1] : 0));
  }
  size_t size() const { return end_.size(); }

 private:
  std::string bytes_;
  std::vector<uint32_t> end_;  // string i is bytes_[end_[i - 1], end_[i])
};

struct TokenizerData {
  std::string source;  // the file it came from, for messages

  // The pipeline, in the order encode runs it.
  std::vector<AddedToken> added;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::unique_ptr<Bpe> bpe;
  std::vector<int32_t> prefix_ids, suffix_ids;  // what the post-processor puts around a sequence
  bool byte_level_decoder = true;               // false: tokenizers' default decoder (join with " ")

  // Family facts for generation.
  std::optional<int32_t> bos_id;
  bool adds_bos = false;
  std::vector<int32_t> eos_ids;
  std::string bos_token, eos_token, chat_template;

  // Built by finalize() from the above.
  AddedTokenMatcher raw_matcher, normalized_matcher;
  StringTable token_strings;  // by id; "" where no token has the id
  StringTable token_bytes;    // by id: what decode() produces for it
  std::vector<uint8_t> present, special;   // by id
  std::unordered_map<std::string, int32_t> added_ids;  // added token content -> id
};

// The loaders: fill everything above "Built by finalize()". Throw tessera::Error naming the
// file and what is missing or unsupported ("unsupported tokenizer feature: ...").
void load_tokenizer_json(const std::string& path, TokenizerData& d);
void load_tokenizer_gguf(const GgufFile& gguf, TokenizerData& d);

// Builds the matchers and id tables once vocabulary, added tokens and decoder are set, and
// the stop set from eos_token plus the well-known end-of-turn tokens present.
void finalize(TokenizerData& d);

// Id of a vocabulary or added token.
std::optional<int32_t> find_token(const TokenizerData& d, std::string_view token);

}  // namespace tessera::detail
