#include "tokenizer/pretokenizer.h"

#include <utility>

#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace tessera {

namespace {

// Splits `piece` at the regex matches; matches and the gaps between them are both kept,
// empty pieces are not (tokenizers' SplitDelimiterBehavior::Isolated).
void split_isolated(const SplitRegex& re, std::string_view piece, std::vector<std::string>& out,
                    std::vector<std::pair<size_t, size_t>>& matches) {
  matches.clear();
  re.find_all(piece, matches);
  size_t prev = 0;
  for (const auto& [start, end] : matches) {
    if (start > prev) out.emplace_back(piece.substr(prev, start - prev));
    out.emplace_back(piece.substr(start, end - start));
    prev = end;
  }
  if (prev < piece.size()) out.emplace_back(piece.substr(prev));
}

// tokenizers' Digits: numeric characters (Rust's char::is_numeric, so also "²" or "Ⅻ") apart
// from the rest; each alone (individual) or in runs.
void split_digits(std::string_view piece, bool individual, std::vector<std::string>& out) {
  size_t run_start = 0;
  bool run_numeric = false;
  for (size_t i = 0; i < piece.size();) {
    char32_t cp;
    const size_t len = unicode::decode(piece, i, cp);
    const bool numeric = unicode::is_numeric(cp);
    if (i > run_start && (numeric != run_numeric || (numeric && individual))) {
      out.emplace_back(piece.substr(run_start, i - run_start));
      run_start = i;
    }
    run_numeric = numeric;
    i += len;
  }
  if (run_start < piece.size()) out.emplace_back(piece.substr(run_start));
}

}  // namespace

PreTokenizerStep PreTokenizerStep::split(std::string_view pattern) {
  PreTokenizerStep s;
  s.kind = Kind::Split;
  s.regex = std::make_shared<const SplitRegex>(pattern);
  return s;
}

PreTokenizerStep PreTokenizerStep::digits(bool individual) {
  PreTokenizerStep s;
  s.kind = Kind::Digits;
  s.individual_digits = individual;
  return s;
}

PreTokenizerStep PreTokenizerStep::byte_level(bool add_prefix_space, bool use_regex) {
  // One compiled GPT-2 pattern serves every tokenizer that asks for it.
  static const auto gpt2 = std::make_shared<const SplitRegex>(kGpt2Pattern);
  PreTokenizerStep s;
  s.kind = Kind::ByteLevel;
  s.add_prefix_space = add_prefix_space;
  if (use_regex) s.regex = gpt2;
  return s;
}

void PreTokenizer::run(std::string_view segment, std::vector<std::string>& words) const {
  if (segment.empty()) return;
  std::vector<std::string> pieces;
  pieces.emplace_back(segment);
  std::vector<std::string> next;
  std::vector<std::pair<size_t, size_t>> matches;
  for (const PreTokenizerStep& step : steps_) {
    next.clear();
    for (std::string& piece : pieces) {
      switch (step.kind) {
        case PreTokenizerStep::Kind::Split:
          split_isolated(*step.regex, piece, next, matches);
          break;
        case PreTokenizerStep::Kind::Digits:
          split_digits(piece, step.individual_digits, next);
          break;
        case PreTokenizerStep::Kind::ByteLevel: {
          // tokenizers adds the prefix space to every piece that reaches this step, not only
          // to the first one of the text.
          if (step.add_prefix_space && piece[0] != ' ') piece.insert(piece.begin(), ' ');
          const size_t first = next.size();
          if (step.regex) split_isolated(*step.regex, piece, next, matches);
          else if (!piece.empty()) next.push_back(std::move(piece));
          for (size_t k = first; k < next.size(); ++k) next[k] = byte_level::encode(next[k]);
          break;
        }
      }
    }
    std::swap(pieces, next);
  }
  for (std::string& p : pieces)
    if (!p.empty()) words.push_back(std::move(p));
}

}  // namespace tessera
