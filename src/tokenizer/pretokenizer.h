// Pre-tokenization: how a normalized segment of text is cut into the words that BPE sees,
// as tokenizers' pre_tokenizer does it. Supported steps, applied in order to every piece the
// previous step produced: Split (a regex, "Isolated": matches and the text between them
// both become pieces), Digits (numbers apart, each digit alone when individual), and
// ByteLevel (optional leading space, optional GPT-2 split, then bytes to GPT-2 characters).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/split_regex.h"

namespace tessera {

// GPT-2's split, which ByteLevel(use_regex=true) uses.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's split: case-insensitive contractions, letters with one leading non-letter,
// numbers in runs of at most three digits, newlines kept with what precedes them.
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2's split: as Llama 3's, but every digit alone.
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreTokenizerStep {
  enum class Kind { Split, Digits, ByteLevel };
  Kind kind = Kind::Split;
  std::shared_ptr<const SplitRegex> regex;  // Split; ByteLevel with use_regex
  bool individual_digits = false;           // Digits
  bool add_prefix_space = false;            // ByteLevel

  static PreTokenizerStep split(std::string_view pattern);
  static PreTokenizerStep digits(bool individual);
  static PreTokenizerStep byte_level(bool add_prefix_space, bool use_regex);
};

class PreTokenizer {
 public:
  void add(PreTokenizerStep step) { steps_.push_back(std::move(step)); }
  bool empty() const { return steps_.empty(); }
  const std::vector<PreTokenizerStep>& steps() const { return steps_; }

  // Appends the words of `segment` (valid UTF-8) to `words`.
  void run(std::string_view segment, std::vector<std::string>& words) const;

 private:
  std::vector<PreTokenizerStep> steps_;
};

}  // namespace tessera
