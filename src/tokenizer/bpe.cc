#include "tokenizer/bpe.h"

#include <fmt/format.h>

#include <queue>

#include "tokenizer/unicode.h"
#include "util/error.h"

namespace tessera {

Bpe::Bpe(std::unordered_map<std::string, int32_t> vocab,
         const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end()) {
      const std::string missing = ia == vocab_.end() ? a : ib == vocab_.end() ? b : a + b;
      fail("BPE merge {} ('{} {}') needs the token '{}', which is not in the vocabulary", rank, a, b, missing);
    }
    // A pair listed twice keeps its last rank, as tokenizers' map building does.
    merges_.insert_or_assign(key(ia->second, ib->second), Merge{int32_t(rank), iab->second});
  }
  if (options_.unk_token) {
    const auto it = vocab_.find(*options_.unk_token);
    if (it == vocab_.end()) fail("BPE unk_token '{}' is not in the vocabulary", *options_.unk_token);
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

std::optional<int32_t> Bpe::token_id(std::string_view token) const {
  const auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const std::string w(word);
  if (options_.ignore_merges) {
    const auto it = vocab_.find(w);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = w.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    const auto it = cache_.find(w);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    // A full cache is simply cleared: cheap, and running text refills it with the words
    // that matter within a few sentences.
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(w, std::move(ids));
  }
}

// tokenizers' Word::merge_all, step for step: a heap of candidate merges ordered by
// (rank, position); a popped candidate is stale when its left symbol was absorbed or its
// pair now makes a different token; each merge offers the new pairs with both neighbours.
void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id) {
    const int32_t n = int32_t(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, true});
  };

  // One symbol per character; unknown characters go to byte tokens, the unk token or nowhere.
  int32_t pending_unk = -1;  // an unk not yet added (-1: none), so that fuse_unk can extend it
  std::string ch;
  for (size_t i = 0; i < word.size();) {
    const size_t len = unicode::sequence_length(static_cast<unsigned char>(word[i]));
    ch.assign(word.substr(i, len));
    i += len;
    if (const auto it = vocab_.find(ch); it != vocab_.end()) {
      if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
      add(it->second);
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (char c : ch) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : ch) add(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      // fuse_unk merges a run of unknown characters into one unk.
      if (pending_unk >= 0 && !options_.fuse_unk) add(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) add(pending_unk);

  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator<(const Candidate& o) const {  // std::priority_queue pops the greatest
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  auto offer = [&](int32_t pos) {
    const int32_t nx = symbols[size_t(pos)].next;
    if (nx < 0) return;
    const auto it = merges_.find(key(symbols[size_t(pos)].id, symbols[size_t(nx)].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int32_t i = 0; i + 1 < int32_t(symbols.size()); ++i) offer(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[size_t(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[size_t(left.next)];
    const auto it = merges_.find(key(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = top.pos;
    if (left.prev >= 0) offer(left.prev);
    offer(top.pos);
  }
  for (const Symbol& s : symbols)
    if (s.alive) out.push_back(s.id);
}

}  // namespace tessera
