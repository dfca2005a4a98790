#include "tokenizer/byte_level.h"

#include "tokenizer/unicode.h"

namespace tessera::byte_level {

namespace {

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::array<std::string, 256> to_utf8;
  std::array<int16_t, 324> from_char{};  // every character of the alphabet is below U+0144

  Tables() {
    from_char.fill(-1);
    // GPT-2's bytes_to_unicode(): the bytes printable as Latin-1 keep their code point, the
    // rest are numbered from 256 in byte order.
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = printable(b) ? char32_t(b) : next++;
      to_char[size_t(b)] = cp;
      unicode::append_utf8(to_utf8[size_t(b)], cp);
      from_char[size_t(cp)] = int16_t(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_char(uint8_t b) { return tables().to_char[b]; }
const std::string& byte_to_utf8(uint8_t b) { return tables().to_utf8[b]; }

int char_to_byte(char32_t cp) {
  const auto& t = tables();
  return cp < t.from_char.size() ? t.from_char[cp] : -1;
}

void encode(std::string_view bytes, std::string& out) {
  const auto& t = tables();
  out.reserve(out.size() + bytes.size() * 2);
  for (char c : bytes) out += t.to_utf8[static_cast<unsigned char>(c)];
}

std::string decode_token(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    char32_t cp;
    i += unicode::decode(token, i, cp);
    const int b = char_to_byte(cp);
    if (b < 0) return std::string(token);
    out.push_back(char(b));
  }
  return out;
}

}  // namespace tessera::byte_level
