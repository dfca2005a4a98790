// Encoding arbitrary bytes with the real Llama 3 and Qwen3 tokenizers (data/tokenizers), and
// decoding arbitrary ids. The first byte picks the tokenizer and the entry point. Text that
// is valid UTF-8 must decode back to itself through encode_raw for llama3 (no normalizer).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

using namespace tessera;

namespace {
std::unique_ptr<Tokenizer> llama3, qwen3;
std::unique_ptr<Tokenizer> load(const char* name) {
  return std::make_unique<Tokenizer>(Tokenizer::from_json_file(fuzz::tokenizers_dir() + "/" + name + "/tokenizer.json"));
}
}  // namespace

// Loaded once, before the first input (-timeout counts per input).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  llama3 = load("llama3");
  qwen3 = load("qwen3");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view text = fuzz::as_view(data + 1, size - 1);
  const Tokenizer& t = (mode & 1) ? *qwen3 : *llama3;
  try {
    switch ((mode >> 1) % 4) {
      case 0: {
        const std::vector<int32_t> ids = t.encode_raw(text);
        const std::string back = t.decode(ids);
        if (&t == llama3.get() && back != text) {
          std::fprintf(stderr, "llama3: decode(encode_raw(text)) != text (%zu bytes in, %zu out)\n", text.size(), back.size());
          std::abort();
        }
        break;
      }
      case 1: (void)t.decode(t.encode(text), true); break;
      case 2: (void)t.decode(t.encode_prompt(text)); break;
      case 3: {
        std::vector<int32_t> ids(text.size() / 4);
        if (!ids.empty()) std::memcpy(ids.data(), text.data(), ids.size() * 4);
        (void)t.decode(ids, (mode & 0x80) != 0);
        for (int32_t id : ids) {
          (void)t.is_special(id);
        }
        break;
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
