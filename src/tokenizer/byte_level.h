// GPT-2's byte-level alphabet: every byte is shown as one printable Unicode character
// (bytes_to_unicode), so a byte-level BPE vocabulary is a set of ordinary strings.
// Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space,
// 0x7F-0xA0, 0xAD) take U+0100 upwards in byte order ("Ġ" = U+0120 is the space).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::byte_level {

// The code point that stands for byte b.
char32_t byte_to_char(uint8_t b);
// The UTF-8 encoding of that character (1 or 2 bytes).
const std::string& byte_to_utf8(uint8_t b);
// The byte a code point stands for, or -1 when it is not in the alphabet.
int char_to_byte(char32_t cp);

// Maps every byte of `bytes` to its character (what tokenizers' ByteLevel pre-tokenizer does).
void encode(std::string_view bytes, std::string& out);
inline std::string encode(std::string_view bytes) {
  std::string out;
  encode(bytes, out);
  return out;
}

// The bytes a token string (valid UTF-8) stands for. Like tokenizers' ByteLevel decoder, a
// token with any character outside the alphabet (an added token such as "<|im_start|>" is
// inside it, but one with a real space is not) stands for its own UTF-8 bytes.
std::string decode_token(std::string_view token);

}  // namespace tessera::byte_level
