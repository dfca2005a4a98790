// The BPE model of tokenizers: a word (one pre-tokenized piece) starts as one symbol per
// character and pairs are merged lowest rank first (leftmost first among equal ranks) until
// no adjacent pair has a merge. Results are cached per word.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tessera {

struct BpeOptions {
  bool ignore_merges = false;  // a word that is itself in the vocabulary is one token
  bool byte_fallback = false;  // unknown characters become <0xXX> byte tokens
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
};

class Bpe {
 public:
  // `vocab` maps token strings to ids; `merges` are (left, right) token strings in rank order.
  // Throws tessera::Error when a merge names a token the vocabulary lacks.
  Bpe(std::unordered_map<std::string, int32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
      BpeOptions options);
  Bpe(const Bpe&) = delete;
  Bpe& operator=(const Bpe&) = delete;

  // Appends the ids of one word.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }
  std::optional<int32_t> token_id(std::string_view token) const;
  size_t merge_count() const { return merges_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  BpeOptions options_;
  std::optional<int32_t> unk_id_;
  int32_t byte_ids_[256];  // <0xXX> tokens for byte_fallback, -1 where absent

  // Word cache: most words of running text repeat, and a hit skips all merging.
  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kCacheMaxWordBytes = 128;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace tessera
