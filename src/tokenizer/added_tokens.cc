#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace tessera {

namespace {

// The code point that ends / starts a valid UTF-8 string.
char32_t last_char(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  char32_t cp;
  unicode::decode(s, i, cp);
  return cp;
}

char32_t first_char(std::string_view s) {
  char32_t cp;
  unicode::decode(s, 0, cp);
  return cp;
}

bool is_word_char(char32_t cp) { return cp == '_' || unicode::is_alphanumeric(cp); }

// Start of the whitespace run that ends `s` (s.size() when there is none).
size_t trailing_space_start(std::string_view s) {
  size_t i = s.size();
  while (i > 0) {
    size_t j = i - 1;
    while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
    char32_t cp;
    unicode::decode(s, j, cp);
    if (!unicode::is_whitespace(cp)) break;
    i = j;
  }
  return i;
}

// Bytes of the whitespace run that starts `s`.
size_t leading_space_length(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    const size_t len = unicode::decode(s, i, cp);
    if (!unicode::is_whitespace(cp)) break;
    i += len;
  }
  return i;
}

}  // namespace

void AddedTokenMatcher::add(std::string_view content, const AddedToken& token) {
  if (content.empty()) return;  // nothing to find; tokenizers never matches an empty token
  int32_t node = 0;
  for (char c : content) {
    const auto b = static_cast<unsigned char>(c);
    auto& next = nodes_[size_t(node)].next;
    const auto it = std::find_if(next.begin(), next.end(), [&](const auto& e) { return e.first == b; });
    if (it != next.end()) {
      node = it->second;
    } else {
      const auto child = int32_t(nodes_.size());
      next.emplace_back(b, child);  // may reallocate nodes_ below: `next` is not used again
      nodes_.emplace_back();
      node = child;
    }
  }
  first_byte_[static_cast<unsigned char>(content[0])] = true;
  // The same content twice: the later entry wins, as re-adding a token does in tokenizers.
  if (nodes_[size_t(node)].token >= 0) {
    tokens_[size_t(nodes_[size_t(node)].token)] = {token, content.size()};
  } else {
    nodes_[size_t(node)].token = int32_t(tokens_.size());
    tokens_.push_back({token, content.size()});
  }
}

int32_t AddedTokenMatcher::longest_at(std::string_view text, size_t pos, size_t& length) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    const auto& next = nodes_[size_t(node)].next;
    const auto it = std::find_if(next.begin(), next.end(), [&](const auto& e) { return e.first == b; });
    if (it == next.end()) break;
    node = it->second;
    if (nodes_[size_t(node)].token >= 0) {
      best = nodes_[size_t(node)].token;
      length = i + 1 - pos;
    }
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<TextSegment>& out) const {
  size_t emitted = 0;  // end of what has been emitted so far
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    size_t length = 0;
    const int32_t index = longest_at(text, pos, length);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[size_t(index)].token;
    size_t start = pos, stop = pos + length;
    pos = stop;  // the scan resumes after this match even when the match is then discarded
    if (tok.single_word) {
      const bool free_before = start == 0 || !is_word_char(last_char(text.substr(0, start)));
      const bool free_after = stop == text.size() || !is_word_char(first_char(text.substr(stop)));
      if (!free_before || !free_after) continue;
    }
    if (tok.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), emitted);
    if (tok.rstrip) stop += leading_space_length(text.substr(stop));
    start = std::max(start, emitted);
    if (start > emitted) out.push_back({emitted, start, -1});
    out.push_back({start, stop, tok.id});
    emitted = stop;
    pos = std::max(pos, stop);
  }
  if (emitted < text.size()) out.push_back({emitted, text.size(), -1});
}

}  // namespace tessera
