// The split patterns of tokenizer.json, run with PCRE2 (UTF, Unicode properties, JIT) with
// the meaning they have in `tokenizers`, which runs them with Oniguruma (Ruby syntax).
// The two engines agree on everything these patterns use (alternation order, \p{..},
// (?i:..) with Unicode case folding, lookahead) except \s: Oniguruma's \s is U+0009-U+000D,
// U+0085 and the separators Zs/Zl/Zp, while PCRE2 adds U+180E. \s and \S are therefore
// rewritten as explicit classes before compiling.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera {

class SplitRegex {
 public:
  // Throws tessera::Error naming the pattern when it cannot be compiled or uses a construct
  // whose meaning differs between the engines in a way the rewrite does not cover.
  explicit SplitRegex(std::string_view pattern);
  SplitRegex(SplitRegex&&) noexcept;
  SplitRegex& operator=(SplitRegex&&) noexcept;
  ~SplitRegex();

  // Appends the [start, end) byte ranges of the successive leftmost non-overlapping matches in
  // `text`, which must be valid UTF-8 (checked once by the caller; PCRE2 is told not to
  // re-check it on every call). Empty matches are skipped, as tokenizers' splitting drops them.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::string pattern_;
  std::unique_ptr<Code> code_;
};

// The Oniguruma pattern rewritten for PCRE2 (exposed for tests).
std::string onig_to_pcre2(std::string_view pattern);

}  // namespace tessera
