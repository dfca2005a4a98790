// The OpenAI API as tessera serves it, without HTTP: request bodies parsed and validated
// into typed structs (a bad field is an ApiError with the status, type and param OpenAI
// would give), responses, streamed chunks and error objects rendered as JSON, and the
// stop-string holdback that keeps a partial stop string out of streamed text. Unit-tested
// (tests/test_serve_api.cc); http_server.cc only moves these strings.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/sampler.h"
#include "tokenizer/chat_template.h"

namespace tessera::serve {

// An error as OpenAI reports it: {"error": {"message", "type", "param", "code"}} with an
// HTTP status.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string type = "invalid_request_error", std::string param = "",
           std::string code = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string type, param, code;
};
std::string error_body(const ApiError& e);
std::string error_body(int status, const std::string& message, const std::string& type = "invalid_request_error",
                       const std::string& param = "", const std::string& code = "");

// What a request asks of generation (both endpoints).
struct SamplingParams {
  std::optional<int> max_tokens;  // unset: until the end of the slot's context
  SamplingOptions sampling;       // temperature default 1 as OpenAI's; seed random when not given
  bool seed_given = false;
  std::vector<std::string> stop;      // stop strings (not part of the text returned)
  std::vector<int32_t> stop_token_ids;  // stop ids beside the model's EOS set (vLLM's field)
  bool ignore_eos = false;
  bool logprobs = false;
  int top_logprobs = 0;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

struct ChatCompletionRequest {
  std::string model;
  std::vector<ChatMessage> messages;
  std::optional<bool> enable_thinking;  // chat_template_kwargs.enable_thinking (Qwen3)
  SamplingParams params;
};

struct CompletionRequest {
  std::string model;
  std::optional<std::string> prompt_text;  // one of these two
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
};

// Throw ApiError(400, ...) for malformed JSON (invalid UTF-8 included), a wrong type, an
// empty or malformed message list, a value out of range, and fields tessera does not honour
// where ignoring them would change the answer (n > 1, tools, logit_bias, echo, best_of,
// suffix, response_format other than text).
ChatCompletionRequest parse_chat_request(const std::string& body);
CompletionRequest parse_completion_request(const std::string& body);

// One generated token as the responses show it.
struct TokenOut {
  int32_t id = -1;
  std::string bytes;           // its raw bytes (may be part of a UTF-8 character)
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  // bytes, logprob
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens whose KV the slot already held
};

enum class Endpoint { Chat, Completion };

// Non-streamed answers.
nlohmann::json chat_response(const std::string& id, int64_t created, const std::string& model, const std::string& text,
                             const std::string& finish_reason, const Usage& usage, const std::vector<TokenOut>* logprobs);
nlohmann::json completion_response(const std::string& id, int64_t created, const std::string& model,
                                   const std::string& text, const std::string& finish_reason, const Usage& usage,
                                   const std::vector<TokenOut>* logprobs);
// Streamed chunks: one `data: {...}\n\n` event each. A chunk carries text (and the logprobs
// of the tokens it completes), or the finish_reason; usage_chunk is the last one when
// stream_options.include_usage (choices empty); done_event is `data: [DONE]\n\n`.
std::string sse_event(const nlohmann::json& j);
nlohmann::json stream_chunk(Endpoint ep, const std::string& id, int64_t created, const std::string& model,
                            const std::string& text, const std::optional<std::string>& finish_reason,
                            const std::vector<TokenOut>* logprobs, bool first);
nlohmann::json usage_chunk(Endpoint ep, const std::string& id, int64_t created, const std::string& model,
                           const Usage& usage);
inline const char* done_event() { return "data: [DONE]\n\n"; }
nlohmann::json usage_json(const Usage& u);
nlohmann::json models_response(const std::string& model_id, int64_t created);
// JSON text of a value whose strings may hold invalid UTF-8 (token bytes): replaced by U+FFFD.
std::string dump(const nlohmann::json& j);

// Holds back streamed text that could be the start of a stop string, so a client never sees
// part of a stop string: push() returns the text safe to emit now; once a stop string is
// complete, stopped() is true and push() returned everything before it. flush() gives back
// what is held when generation ends for another reason.
class StopHoldback {
 public:
  explicit StopHoldback(std::vector<std::string> stops);
  std::string push(const std::string& text);
  std::string flush();
  bool stopped() const { return stopped_; }
  size_t held() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace tessera::serve
