#include "tokenizer/split_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "util/error.h"

namespace tessera {

namespace {

// Oniguruma's Unicode \s, as the members of a character class.
constexpr std::string_view kSpaceMembers = "\\t-\\r\\x{85}\\p{Z}";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match resources: matching allocates nothing per call, and several threads
// may encode with the same tokenizer at once.
struct MatchResources {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  MatchResources() {
    data = pcre2_match_data_create(1, nullptr);  // the whole match is all a split needs
    context = pcre2_match_context_create(nullptr);
    // The JIT's default 32 KiB stack is too small for some backtracking on long inputs;
    // this one is reserved lazily up to 64 MiB.
    jit_stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    if (!data || !context || !jit_stack) fail("out of memory creating regex match state");
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
    // The default match limit (10 million steps) could stop `\s*[\r\n]+` on a multi-megabyte
    // run of spaces, where each attempt backtracks over the run; these patterns are linear
    // per match, so no limit is needed to stop a runaway.
    pcre2_set_match_limit(context, UINT32_MAX);
  }
  ~MatchResources() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchResources(const MatchResources&) = delete;
  MatchResources& operator=(const MatchResources&) = delete;
};

MatchResources& match_resources() {
  thread_local MatchResources r;
  return r;
}

}  // namespace

std::string onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  size_t class_start = 0;  // index just past "[" or "[^" of the open class
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) fail("regex '{}' ends with a lone backslash", p);
      const char e = p[++i];
      if (e == 's') {
        out += in_class ? std::string(kSpaceMembers) : "[" + std::string(kSpaceMembers) + "]";
      } else if (e == 'S') {
        if (in_class) fail("unsupported tokenizer feature: regex '\\S' inside a character class in '{}'", p);
        out += "[^" + std::string(kSpaceMembers) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class) {
      if (c == '[') {
        in_class = true;
        out += c;
        if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
        class_start = i + 1;
        continue;
      }
      out += c;
      continue;
    }
    // Inside a class: "]" first in the class is a literal; POSIX [:name:] passes through;
    // any other "[" would open a nested class in Oniguruma but be a literal in PCRE2.
    if (c == ']' && i != class_start) {
      in_class = false;
      out += c;
    } else if (c == '[') {
      if (i + 1 < p.size() && p[i + 1] == ':') {
        const size_t end = p.find(":]", i + 2);
        if (end == std::string_view::npos) fail("regex '{}': unterminated [: class", p);
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
      } else {
        fail("unsupported tokenizer feature: nested character class in regex '{}'", p);
      }
    } else {
      out += c;
    }
  }
  if (in_class) fail("regex '{}' has an unterminated character class", p);
  return out;
}

struct SplitRegex::Code {
  pcre2_code* re = nullptr;
  ~Code() { pcre2_code_free(re); }
};

SplitRegex::SplitRegex(std::string_view pattern) : pattern_(pattern), code_(std::make_unique<Code>()) {
  const std::string translated = onig_to_pcre2(pattern);
  int err = 0;
  PCRE2_SIZE offset = 0;
  code_->re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                            PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (!code_->re)
    fail("cannot compile tokenizer regex '{}': {} at offset {}", pattern, pcre2_message(err), size_t(offset));
  // Without JIT (a build of PCRE2 that lacks it) the interpreter gives the same matches.
  (void)pcre2_jit_compile(code_->re, PCRE2_JIT_COMPLETE);
}

SplitRegex::SplitRegex(SplitRegex&&) noexcept = default;
SplitRegex& SplitRegex::operator=(SplitRegex&&) noexcept = default;
SplitRegex::~SplitRegex() = default;

void SplitRegex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  MatchResources& r = match_resources();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(code_->re, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, r.data, r.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) fail("tokenizer regex '{}' failed on the text: {}", pattern_, pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(r.data);
    const size_t start = ov[0], end = ov[1];
    if (end > start) {
      out.emplace_back(start, end);
      pos = end;
    } else {
      // An empty match: step over one character, as Oniguruma's iteration does.
      pos = end + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
}

}  // namespace tessera
