#include "serve/openai_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace tessera::serve {

using json = nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, "invalid_request_error", param);
}

[[noreturn]] void unsupported(const std::string& param, const std::string& message) {
  throw ApiError(400, message, "invalid_request_error", param, "unsupported_parameter");
}

constexpr int kMaxDepth = 64;  // no request needs more; a deeper body is refused while parsing

json parse_body(const std::string& body) {
  if (body.empty()) bad("", "the request body is empty: expected a JSON object");
  json j;
  try {
    j = json::parse(body, [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxDepth) throw ApiError(400, fmt::format("the request body nests deeper than {} levels", kMaxDepth));
      return true;
    });
  } catch (const json::exception& e) {
    // nlohmann reports invalid UTF-8 inside a string as a parse error too.
    bad("", fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) bad("", "the request body must be a JSON object");
  return j;
}

// A field that is absent or null is unset.
const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> opt_number(const json& j, const char* key, double lo, double hi) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(key, fmt::format("'{}' must be a number, got {}", key, v->type_name()));
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) bad(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, d));
  return d;
}

std::optional<int64_t> opt_int(const json& j, const char* key, int64_t lo, int64_t hi) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) bad(key, fmt::format("'{}' must be an integer, got {}", key, v->type_name()));
  int64_t i;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) bad(key, fmt::format("'{}' is out of range", key));
    i = int64_t(u);
  } else {
    i = v->get<int64_t>();
  }
  if (i < lo || i > hi) bad(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, i));
  return i;
}

std::optional<bool> opt_bool(const json& j, const char* key) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(key, fmt::format("'{}' must be a boolean, got {}", key, v->type_name()));
  return v->get<bool>();
}

std::optional<std::string> opt_string(const json& j, const char* key) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad(key, fmt::format("'{}' must be a string, got {}", key, v->type_name()));
  return v->get<std::string>();
}

std::vector<int32_t> token_ids(const json& v, const std::string& param) {
  std::vector<int32_t> ids;
  for (const json& e : v) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > std::numeric_limits<int32_t>::max())
      bad(param, fmt::format("'{}' must hold non-negative integer token ids", param));
    ids.push_back(int32_t(e.get<int64_t>()));
  }
  return ids;
}

// Fields both endpoints share.
SamplingParams parse_params(const json& j) {
  SamplingParams p;
  const std::optional<int64_t> mt = opt_int(j, "max_tokens", 1, std::numeric_limits<int32_t>::max());
  const std::optional<int64_t> mct = opt_int(j, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max());
  if (mct) p.max_tokens = int(*mct);
  else if (mt) p.max_tokens = int(*mt);
  p.sampling.temperature = float(opt_number(j, "temperature", 0, 2).value_or(1.0));
  p.sampling.top_p = float(opt_number(j, "top_p", 0, 1).value_or(1.0));
  if (p.sampling.top_p <= 0) bad("top_p", "'top_p' must be in (0, 1]");
  p.sampling.top_k = int(opt_int(j, "top_k", 0, std::numeric_limits<int32_t>::max()).value_or(0));
  p.sampling.frequency_penalty = float(opt_number(j, "frequency_penalty", -2, 2).value_or(0));
  p.sampling.presence_penalty = float(opt_number(j, "presence_penalty", -2, 2).value_or(0));
  p.sampling.repetition_penalty = float(opt_number(j, "repetition_penalty", 0, 100).value_or(1));
  if (p.sampling.repetition_penalty <= 0) bad("repetition_penalty", "'repetition_penalty' must be > 0");
  if (const std::optional<int64_t> seed = opt_int(j, "seed", std::numeric_limits<int64_t>::min(),
                                                  std::numeric_limits<int64_t>::max())) {
    p.sampling.seed = uint64_t(*seed);
    p.seed_given = true;
  } else {
    p.sampling.seed = std::random_device{}();
  }
  if (const json* s = field(j, "stop")) {
    if (s->is_string()) {
      p.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      if (s->size() > 16) bad("stop", "'stop' holds at most 16 strings");
      for (const json& e : *s) {
        if (!e.is_string()) bad("stop", "'stop' must be a string or an array of strings");
        p.stop.push_back(e.get<std::string>());
      }
    } else {
      bad("stop", fmt::format("'stop' must be a string or an array of strings, got {}", s->type_name()));
    }
    for (const std::string& st : p.stop)
      if (st.empty()) bad("stop", "'stop' strings must not be empty");
  }
  if (const json* s = field(j, "stop_token_ids")) {
    if (!s->is_array()) bad("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    p.stop_token_ids = token_ids(*s, "stop_token_ids");
  }
  p.ignore_eos = opt_bool(j, "ignore_eos").value_or(false);
  p.stream = opt_bool(j, "stream").value_or(false);
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    p.include_usage = opt_bool(*so, "include_usage").value_or(false);
  }
  if (opt_int(j, "n", 1, std::numeric_limits<int32_t>::max()).value_or(1) != 1)
    unsupported("n", "'n' must be 1: tessera serve returns one choice per request");
  if (const json* lb = field(j, "logit_bias")) {
    if (!lb->is_object()) bad("logit_bias", "'logit_bias' must be an object");
    if (!lb->empty()) unsupported("logit_bias", "'logit_bias' is not supported");
  }
  for (const char* k : {"tools", "functions", "tool_choice", "function_call"}) {
    const json* t = field(j, k);
    if (t && !(t->is_array() && t->empty()) && !(t->is_string() && t->get<std::string>() == "none"))
      unsupported(k, fmt::format("'{}' is not supported: tessera serve has no tool calling", k));
  }
  if (const json* rf = field(j, "response_format")) {
    if (!rf->is_object() || opt_string(*rf, "type").value_or("text") != "text")
      unsupported("response_format", "'response_format' other than {\"type\": \"text\"} is not supported");
  }
  try {
    p.sampling.validate();
  } catch (const std::exception& e) {
    bad("", e.what());
  }
  return p;
}

std::string message_content(const json& m, size_t i) {
  const std::string param = fmt::format("messages[{}].content", i);
  const json* c = field(m, "content");
  if (!c) return "";
  if (c->is_string()) return c->get<std::string>();
  if (c->is_array()) {
    std::string text;
    for (const json& part : *c) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
        unsupported(param, fmt::format("'{}' parts must be {{\"type\": \"text\", \"text\": ...}}: tessera serves text only", param));
      text += part["text"].get<std::string>();
    }
    return text;
  }
  bad(param, fmt::format("'{}' must be a string or an array of text parts, got {}", param, c->type_name()));
}

}  // namespace

std::string error_body(int status, const std::string& message, const std::string& type, const std::string& param,
                       const std::string& code) {
  json e = {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}};
  return dump(json{{"error", e}});
}

std::string error_body(const ApiError& e) { return error_body(e.status, e.what(), e.type, e.param, e.code); }

ChatCompletionRequest parse_chat_request(const std::string& body) {
  const json j = parse_body(body);
  ChatCompletionRequest r;
  r.model = opt_string(j, "model").value_or("");
  const json* ms = field(j, "messages");
  if (!ms) bad("messages", "'messages' is required");
  if (!ms->is_array()) bad("messages", fmt::format("'messages' must be an array, got {}", ms->type_name()));
  if (ms->empty()) bad("messages", "'messages' must not be empty");
  for (size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(param, fmt::format("'{}' must be an object", param));
    const json* role = field(m, "role");
    if (!role || !role->is_string()) bad(param + ".role", fmt::format("'{}.role' must be a string", param));
    std::string rs = role->get<std::string>();
    if (rs == "developer") rs = "system";
    if (rs != "system" && rs != "user" && rs != "assistant")
      bad(param + ".role", fmt::format("'{}.role' must be system, developer, user or assistant, got '{}'", param, rs));
    if (field(m, "tool_calls")) unsupported(param + ".tool_calls", "tool calls are not supported");
    ChatMessage cm{rs, message_content(m, i)};
    if (const std::optional<std::string> rc = opt_string(m, "reasoning_content")) cm.reasoning_content = *rc;
    r.messages.push_back(std::move(cm));
  }
  if (const json* kw = field(j, "chat_template_kwargs")) {
    if (!kw->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    r.enable_thinking = opt_bool(*kw, "enable_thinking");
  }
  r.params = parse_params(j);
  if (const std::optional<bool> lp = opt_bool(j, "logprobs")) r.params.logprobs = *lp;
  if (const std::optional<int64_t> tl = opt_int(j, "top_logprobs", 0, 20)) {
    if (!r.params.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.params.top_logprobs = int(*tl);
  }
  return r;
}

CompletionRequest parse_completion_request(const std::string& body) {
  const json j = parse_body(body);
  CompletionRequest r;
  r.model = opt_string(j, "model").value_or("");
  const json* p = field(j, "prompt");
  if (!p) bad("prompt", "'prompt' is required");
  // A one-element batch is the same prompt; tessera answers one prompt per request.
  const json* one = p;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) one = &(*p)[0];
  if (one->is_string()) {
    r.prompt_text = one->get<std::string>();
    if (r.prompt_text->empty()) bad("prompt", "'prompt' must not be empty");
  } else if (one->is_array() && !one->empty() && std::all_of(one->begin(), one->end(), [](const json& e) { return e.is_number(); })) {
    r.prompt_ids = token_ids(*one, "prompt");
  } else if (one->is_array() && one->empty()) {
    bad("prompt", "'prompt' must not be empty");
  } else if (one->is_array()) {
    unsupported("prompt", "'prompt' must be a string or an array of token ids (one prompt per request)");
  } else {
    bad("prompt", fmt::format("'prompt' must be a string or an array of token ids, got {}", one->type_name()));
  }
  r.params = parse_params(j);
  if (const std::optional<int64_t> lp = opt_int(j, "logprobs", 0, 20)) {
    r.params.logprobs = true;
    r.params.top_logprobs = int(*lp);
  }
  if (opt_bool(j, "echo").value_or(false)) unsupported("echo", "'echo' is not supported");
  if (opt_int(j, "best_of", 1, 1 << 20).value_or(1) != 1) unsupported("best_of", "'best_of' must be 1");
  if (!opt_string(j, "suffix").value_or("").empty()) unsupported("suffix", "'suffix' is not supported");
  return r;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {

json byte_list(const std::string& s) {
  json b = json::array();
  for (const unsigned char c : s) b.push_back(int(c));
  return b;
}

json chat_logprobs(const std::vector<TokenOut>& toks) {
  json content = json::array();
  for (const TokenOut& t : toks) {
    json top = json::array();
    for (const auto& [bytes, lp] : t.top) top.push_back({{"token", bytes}, {"logprob", lp}, {"bytes", byte_list(bytes)}});
    content.push_back({{"token", t.bytes}, {"logprob", t.logprob}, {"bytes", byte_list(t.bytes)}, {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

json completion_logprobs(const std::vector<TokenOut>& toks, size_t offset0) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  size_t at = offset0;
  for (const TokenOut& t : toks) {
    tokens.push_back(t.bytes);
    lps.push_back(t.logprob);
    json top = json::object();
    for (const auto& [bytes, lp] : t.top) top[bytes] = lp;
    tops.push_back(top);
    offsets.push_back(at);
    at += t.bytes.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json finish(const std::optional<std::string>& f) { return f ? json(*f) : json(nullptr); }

}  // namespace

json chat_response(const std::string& id, int64_t created, const std::string& model, const std::string& text,
                   const std::string& finish_reason, const Usage& usage, const std::vector<TokenOut>* logprobs) {
  json choice = {{"index", 0},
                 {"message", {{"role", "assistant"}, {"content", text}}},
                 {"logprobs", logprobs ? chat_logprobs(*logprobs) : json(nullptr)},
                 {"finish_reason", finish_reason}};
  return {{"id", id},           {"object", "chat.completion"}, {"created", created},
          {"model", model},     {"choices", json::array({choice})}, {"usage", usage_json(usage)},
          {"system_fingerprint", "tessera-" TESSERA_VERSION}};
}

json completion_response(const std::string& id, int64_t created, const std::string& model, const std::string& text,
                         const std::string& finish_reason, const Usage& usage, const std::vector<TokenOut>* logprobs) {
  json choice = {{"index", 0},
                 {"text", text},
                 {"logprobs", logprobs ? completion_logprobs(*logprobs, 0) : json(nullptr)},
                 {"finish_reason", finish_reason}};
  return {{"id", id},       {"object", "text_completion"}, {"created", created},
          {"model", model}, {"choices", json::array({choice})}, {"usage", usage_json(usage)},
          {"system_fingerprint", "tessera-" TESSERA_VERSION}};
}

std::string sse_event(const json& j) { return "data: " + dump(j) + "\n\n"; }

json stream_chunk(Endpoint ep, const std::string& id, int64_t created, const std::string& model, const std::string& text,
                  const std::optional<std::string>& finish_reason, const std::vector<TokenOut>* logprobs, bool first) {
  json choice = {{"index", 0}, {"finish_reason", finish(finish_reason)}};
  if (ep == Endpoint::Chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && !finish_reason)) delta["content"] = text;
    choice["delta"] = delta;
    choice["logprobs"] = logprobs && !logprobs->empty() ? chat_logprobs(*logprobs) : json(nullptr);
  } else {
    choice["text"] = text;
    choice["logprobs"] = logprobs && !logprobs->empty() ? completion_logprobs(*logprobs, 0) : json(nullptr);
  }
  return {{"id", id},
          {"object", ep == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})},
          {"system_fingerprint", "tessera-" TESSERA_VERSION}};
}

json usage_chunk(Endpoint ep, const std::string& id, int64_t created, const std::string& model, const Usage& usage) {
  return {{"id", id},
          {"object", ep == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array()},
          {"usage", usage_json(usage)}};
}

json models_response(const std::string& model_id, int64_t created) {
  return {{"object", "list"},
          {"data", json::array({{{"id", model_id}, {"object", "model"}, {"created", created}, {"owned_by", "tessera"}}})}};
}

StopHoldback::StopHoldback(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove_if(stops_.begin(), stops_.end(), [](const std::string& s) { return s.empty(); }), stops_.end());
}

std::string StopHoldback::push(const std::string& text) {
  if (stopped_) return "";
  held_ += text;
  size_t best = std::string::npos;
  for (const std::string& s : stops_) best = std::min(best, held_.find(s));
  if (best != std::string::npos) {
    std::string out = held_.substr(0, best);
    held_.clear();
    stopped_ = true;
    return out;
  }
  // Keep the longest end of the text that a stop string begins with: only there can one
  // still complete.
  size_t keep = 0;
  for (const std::string& s : stops_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopHoldback::flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  held_.clear();
  return out;
}

}  // namespace tessera::serve
