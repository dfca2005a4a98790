// The server's request bodies: /v1/chat/completions and /v1/completions.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "serve/openai_api.h"
#include "util/error.h"

using namespace tessera;
using namespace tessera::serve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(fuzz::as_view(data, size));
  try {
    ChatCompletionRequest r = parse_chat_request(body);
    (void)r;
  } catch (const ApiError&) {
  }
  try {
    CompletionRequest r = parse_completion_request(body);
    (void)r;
  } catch (const ApiError&) {
  }
  return 0;
}
