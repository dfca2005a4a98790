// UTF-8 and Unicode helpers for the tokenizer: strict validation (the text must be what a
// Rust &str may hold, since `tokenizers` takes nothing else), code point iteration, NFC,
// and the character classes Rust's char methods define (tokenizers' added-token and Digits
// rules are written with them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::unicode {

// Byte offset of the first byte that does not start a well-formed UTF-8 sequence
// (overlong forms, surrogates, code points above U+10FFFF and truncated sequences are all
// ill-formed); nullopt when the whole text is valid.
std::optional<size_t> first_invalid_utf8(std::string_view text);

// Decodes the code point at text[pos] of valid UTF-8 and returns its length in bytes.
inline size_t decode(std::string_view text, size_t pos, char32_t& cp) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  auto cont = [&](size_t i) { return char32_t(static_cast<unsigned char>(text[pos + i]) & 0x3F); };
  if (b0 < 0xE0) {
    cp = (char32_t(b0 & 0x1F) << 6) | cont(1);
    return 2;
  }
  if (b0 < 0xF0) {
    cp = (char32_t(b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2);
    return 3;
  }
  cp = (char32_t(b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
  return 4;
}

// Length in bytes of the UTF-8 sequence a valid lead byte starts.
inline size_t sequence_length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

void append_utf8(std::string& out, char32_t cp);

// Unicode Normalization Form C of valid UTF-8 (utf8proc), what tokenizers' NFC normalizer does.
std::string nfc(std::string_view text);

// Rust's char::is_whitespace (the White_Space property).
bool is_whitespace(char32_t cp);
// Rust's char::is_numeric: general categories Nd, Nl, No.
bool is_numeric(char32_t cp);
// Rust's char::is_alphanumeric (letters and numbers), as tokenizers' single_word rule uses it.
bool is_alphanumeric(char32_t cp);

}  // namespace tessera::unicode
