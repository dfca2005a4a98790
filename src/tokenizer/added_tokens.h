// Added tokens (special tokens such as "<|im_start|>" and user-defined ones): found in the
// text before anything else runs and never split by BPE, as tokenizers' AddedVocabulary
// does. Tokens with normalized=false are matched in the raw text, those with
// normalized=true in each normalized segment. Matching is leftmost-longest (an
// Aho-Corasick scan in tokenizers); single_word, lstrip and rstrip are honoured.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// A piece of text: either an added token (id >= 0) or text to tokenize further (id == -1).
struct TextSegment {
  size_t start = 0, end = 0;
  int32_t id = -1;
};

class AddedTokenMatcher {
 public:
  // Adds `content` (already normalized when the token is matched after normalization).
  void add(std::string_view content, const AddedToken& token);
  bool empty() const { return tokens_.empty(); }

  // Cuts `text` into token and text segments; no segment is empty (an empty text gives none:
  // tokenizers encodes "" to no ids even when ByteLevel would add a prefix space).
  void split(std::string_view text, std::vector<TextSegment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;  // byte -> node
    int32_t token = -1;                                    // index into tokens_ when a token ends here
  };
  struct Entry {
    AddedToken token;
    size_t length;  // bytes of the matched content
  };
  // The longest token starting at text[pos] (index into tokens_), or -1.
  int32_t longest_at(std::string_view text, size_t pos, size_t& length) const;

  std::vector<Node> nodes_{Node{}};
  std::vector<Entry> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace tessera
