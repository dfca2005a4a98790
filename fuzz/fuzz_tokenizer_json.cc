// tokenizer.json loading (BPE model, pre-tokenizers, normalizers, added tokens), then a
// short encode and decode with what loaded.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_temp("tokenizer.json", fuzz::as_view(data, size)).string();
  try {
    Tokenizer t = Tokenizer::from_json_file(path);
    std::vector<int32_t> ids = t.encode("Hello, world! It's 2024 \xC3\xA9t\xC3\xA9 <|im_end|>");
    (void)t.decode(ids);
    for (int32_t id = 0; id < std::min(t.vocab_size(), 64); ++id) (void)t.token_string(id);
  } catch (const Error&) {
  } catch (const nlohmann::json::exception&) {
  }
  return 0;
}
