// A GGUF file: header, metadata, tensor infos; then the spec and the tokenizer read from
// its keys, as `tessera inspect` and `run` do.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "io/gguf.h"
#include "model/spec.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_temp("model.gguf", fuzz::as_view(data, size)).string();
  try {
    GgufFile g = GgufFile::open(path);
    for (const auto& [key, v] : g.metadata()) (void)gguf_type_name(v.type);
    for (const auto& u : g.unsupported()) (void)GgufFile::describe(u);
    try {
      ModelSpec spec = spec_from_gguf(g);
      (void)spec_features(spec);
    } catch (const Error&) {
    }
    Tokenizer t = Tokenizer::from_gguf(g);
    std::vector<int32_t> ids = t.encode("Hello, world! 123 ...");
    (void)t.decode(ids);
  } catch (const Error&) {
  } catch (const nlohmann::json::exception&) {
  }
  return 0;
}
