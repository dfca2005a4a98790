#include "tokenizer/normalizer.h"

#include "tokenizer/unicode.h"

namespace tessera {

std::string Normalizer::run(std::string_view text) const {
  std::string s(text);
  for (Step step : steps_) {
    switch (step) {
      case Step::NFC:
        s = unicode::nfc(s);
        break;
    }
  }
  return s;
}

}  // namespace tessera
