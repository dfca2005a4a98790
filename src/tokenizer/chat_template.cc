// Chat templates rendered by per-template C++ code that reproduces transformers' Jinja output
// byte for byte (transformers compiles templates with trim_blocks and lstrip_blocks, and Jinja
// drops one trailing newline of the source; every rendering below follows from the source
// next to it under those rules). A template is recognised only by its exact source: a
// "similar" template may differ in one space or one default system prompt, and rendering it
// with the wrong code would silently change what the model sees.
#include "tokenizer/chat_template.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string_view>

#include "util/error.h"

namespace tessera {

namespace {

// ---------------------------------------------------------------------------------------------
// The templates, verbatim. Sources:
//  - Llama 3 (Meta-Llama-3-*-Instruct): first as first released (always appends the assistant
//    header, whatever add_generation_prompt says; data/tokenizers/llama3), then as
//    Meta later revised it (the header only with add_generation_prompt).
//  - Qwen3 (Qwen3-0.6B and siblings, data/tokenizers/qwen3).
//  - Qwen2.5-*-Instruct (llama.cpp's copy of Qwen2.5-7B-Instruct's template).
//  - SmolLM2-*-Instruct (tokenizer.chat_template of models/SmolLM2-135M-Instruct.Q4_1.gguf).
//  - Plain ChatML: transformers' old default_chat_template, with real newlines or with "\n"
//    escapes inside the Jinja strings (models ship both; they render identically).

constexpr std::string_view kLlama3AlwaysPromptSource =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}";

constexpr std::string_view kLlama3Source =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

constexpr std::string_view kSmolLM2Source =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}";

constexpr std::string_view kChatMLSource =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}";

constexpr std::string_view kChatMLEscapedSource =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}";

constexpr std::string_view kQwen25Source = R"jinja({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)jinja";

constexpr std::string_view kQwen3Source = R"jinja({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %})jinja";

// Jinja (keep_trailing_newline=False, transformers' setting) drops one trailing newline of the
// source, so a template differs in nothing when a model ships it with or without one.
std::string_view without_trailing_newline(std::string_view s) {
  if (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Python's string operations, as the templates use them.

// UTF-8 forms of the code points Python's str.isspace() accepts (what Jinja's |trim strips).
constexpr std::array<std::string_view, 29> kPythonWhitespace = {
    "\t", "\n", "\v", "\f", "\r", "\x1c", "\x1d", "\x1e", "\x1f", " ",
    "\xc2\x85",      // U+0085 NEXT LINE
    "\xc2\xa0",      // U+00A0 NO-BREAK SPACE
    "\xe1\x9a\x80",  // U+1680 OGHAM SPACE MARK
    "\xe2\x80\x80", "\xe2\x80\x81", "\xe2\x80\x82", "\xe2\x80\x83", "\xe2\x80\x84", "\xe2\x80\x85",
    "\xe2\x80\x86", "\xe2\x80\x87", "\xe2\x80\x88", "\xe2\x80\x89", "\xe2\x80\x8a",  // U+2000..200A
    "\xe2\x80\xa8",  // U+2028 LINE SEPARATOR
    "\xe2\x80\xa9",  // U+2029 PARAGRAPH SEPARATOR
    "\xe2\x80\xaf",  // U+202F NARROW NO-BREAK SPACE
    "\xe2\x81\x9f",  // U+205F MEDIUM MATHEMATICAL SPACE
    "\xe3\x80\x80",  // U+3000 IDEOGRAPHIC SPACE
};

// str.strip() with no argument (Jinja's |trim): Unicode whitespace at both ends.
std::string_view python_strip(std::string_view s) {
  for (bool again = true; again && !s.empty();) {
    again = false;
    for (std::string_view w : kPythonWhitespace)
      if (s.starts_with(w)) { s.remove_prefix(w.size()); again = true; break; }
  }
  for (bool again = true; again && !s.empty();) {
    again = false;
    for (std::string_view w : kPythonWhitespace)
      if (s.ends_with(w)) { s.remove_suffix(w.size()); again = true; break; }
  }
  return s;
}

// str.lstrip('\n'), str.rstrip('\n'), str.strip('\n'): newlines only.
std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}
std::string_view strip_newlines(std::string_view s) { return lstrip_newlines(rstrip_newlines(s)); }

// s.split(sep)[0] and s.split(sep)[-1]: before the first / after the last separator (all of s
// when it has none).
std::string_view before_first(std::string_view s, std::string_view sep) {
  const size_t at = s.find(sep);
  return at == std::string_view::npos ? s : s.substr(0, at);
}
std::string_view after_last(std::string_view s, std::string_view sep) {
  const size_t at = s.rfind(sep);
  return at == std::string_view::npos ? s : s.substr(at + sep.size());
}

void append(std::string& out, std::initializer_list<std::string_view> parts) {
  for (std::string_view p : parts) out.append(p);
}

// ---------------------------------------------------------------------------------------------
// The renderings. Each mirrors its template's no-tools path statement by statement.

std::string render_llama3(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::string& bos_token) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0) out += bos_token;  // the template writes BOS itself: the tokenizer must not add one
    // `'...<|end_header_id|>\n\n' + message['content'] | trim + ...`: the filter binds to the
    // content only, so only the content is trimmed (with Python's notion of whitespace).
    append(out, {"<|start_header_id|>", messages[i].role, "<|end_header_id|>\n\n",
                 python_strip(messages[i].content), "<|eot_id|>"});
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// ChatML: every message as <|im_start|>role\ncontent<|im_end|>\n, untrimmed. SmolLM2 and
// Qwen2.5 put a default system message first when the conversation does not start with one.
std::string render_chatml(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          std::string_view default_system) {
  std::string out;
  if (!default_system.empty() && messages.front().role != "system")
    append(out, {"<|im_start|>system\n", default_system, "<|im_end|>\n"});
  for (const ChatMessage& m : messages) append(out, {"<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n"});
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

bool is_tool_response(std::string_view content) {
  return content.starts_with("<tool_response>") && content.ends_with("</tool_response>");
}

std::string render_qwen3(const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  std::string out;
  const size_t n = messages.size();
  if (messages[0].role == "system") append(out, {"<|im_start|>system\n", messages[0].content, "<|im_end|>\n"});

  // The last real user query (not a tool result dressed as a user turn); assistant turns after
  // it are the current turn and keep their reasoning, earlier ones lose it. With no such user
  // message the template falls back to the last index, so no assistant turn keeps reasoning.
  size_t last_query = n - 1;
  for (size_t i = n; i-- > 0;) {
    if (messages[i].role == "user" && !is_tool_response(messages[i].content)) {
      last_query = i;
      break;
    }
  }

  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      append(out, {"<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n"});
    } else if (m.role == "assistant") {
      // Reasoning is reasoning_content when given, else the text of a <think> block that ends
      // at the first </think>; the content is what follows the last </think>.
      std::string_view content = m.content;
      std::string_view reasoning;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else if (m.content.find("</think>") != std::string::npos) {
        content = lstrip_newlines(after_last(m.content, "</think>"));
        reasoning = lstrip_newlines(after_last(rstrip_newlines(before_first(m.content, "</think>")), "<think>"));
      }
      const bool last = i + 1 == n;
      // Unstripped reasoning decides (a reasoning of "\n" still opens a think block).
      if (i > last_query && (last || !reasoning.empty())) {
        append(out, {"<|im_start|>assistant\n<think>\n", strip_newlines(reasoning), "\n</think>\n\n",
                     lstrip_newlines(content)});
      } else {
        append(out, {"<|im_start|>assistant\n", content});
      }
      out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    // `enable_thinking is defined and enable_thinking is false`: only an explicit false writes
    // the empty think block that tells the model to answer without reasoning.
    if (options.enable_thinking == false) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// SHA-256 (FIPS 180-4), for naming templates.

struct Sha256 {
  std::array<uint32_t, 8> h = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void block(const uint8_t* p) {
    static constexpr uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
  }
};

}  // namespace

std::string chat_template_sha256(std::string_view source) {
  Sha256 sha;
  const auto* data = reinterpret_cast<const uint8_t*>(source.data());
  size_t full = source.size() / 64 * 64;
  for (size_t i = 0; i < full; i += 64) sha.block(data + i);
  // Padding: 0x80, zeros, then the length in bits, big-endian, to a multiple of 64 bytes.
  uint8_t tail[128] = {};
  const size_t rest = source.size() - full;
  std::memcpy(tail, data + full, rest);
  tail[rest] = 0x80;
  const size_t tail_len = rest + 9 <= 64 ? 64 : 128;
  const uint64_t bits = uint64_t(source.size()) * 8;
  for (int i = 0; i < 8; ++i) tail[tail_len - 1 - i] = uint8_t(bits >> (8 * i));
  for (size_t i = 0; i < tail_len; i += 64) sha.block(tail + i);
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (uint32_t v : sha.h)
    for (int shift = 28; shift >= 0; shift -= 4) out += hex[(v >> shift) & 0xf];
  return out;
}

std::vector<std::string> known_chat_template_sources() {
  return {std::string(kLlama3Source), std::string(kLlama3AlwaysPromptSource), std::string(kQwen3Source),
          std::string(kQwen25Source), std::string(kSmolLM2Source), std::string(kChatMLSource),
          std::string(kChatMLEscapedSource)};
}

ChatTemplate ChatTemplate::from_source(const std::string& jinja_source, const std::string& bos_token,
                                       const std::string& eos_token) {
  struct Known {
    std::string_view source;
    Kind kind;
    const char* family;
  };
  static constexpr Known kKnown[] = {
      {kLlama3Source, Kind::Llama3, "llama3"},
      {kLlama3AlwaysPromptSource, Kind::Llama3AlwaysPrompt, "llama3"},
      {kQwen3Source, Kind::Qwen3, "qwen3"},
      {kQwen25Source, Kind::Qwen25, "qwen2.5"},
      {kSmolLM2Source, Kind::SmolLM2, "smollm2"},
      {kChatMLSource, Kind::ChatML, "chatml"},
      {kChatMLEscapedSource, Kind::ChatML, "chatml"},
  };
  if (jinja_source.empty()) fail("the model ships no chat template");
  const std::string_view given = without_trailing_newline(jinja_source);
  for (const Known& k : kKnown)
    if (given == without_trailing_newline(k.source)) return ChatTemplate(k.kind, k.family, bos_token, eos_token);

  // Name the template so that the user can tell which one it is, and say what it resembles.
  std::string resembles;
  if (jinja_source.find("<|start_header_id|>") != std::string::npos)
    resembles = ", a Llama 3-style template (Llama 3.1/3.2 templates with tools and dates are not supported)";
  else if (jinja_source.find("<|im_start|>") != std::string::npos)
    resembles = ", a ChatML-style template";
  fail("unrecognised chat template (sha256 {}, {} bytes{}): tessera renders exactly the Llama 3, Qwen2.5, "
       "Qwen3, SmolLM2 and plain ChatML templates and no others",
       chat_template_sha256(jinja_source).substr(0, 16), jinja_source.size(), resembles);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const ChatOptions& options) const {
  if (messages.empty()) fail("chat template: no messages to render");
  // The templates' no-tools paths handle these three roles; tool results need the tool path
  // (and the Qwen templates silently drop roles they do not know), so refuse the rest by name.
  for (const ChatMessage& m : messages) {
    if (m.role == "tool")
      fail("the {} chat template: tool messages (role \"tool\") are not supported; tessera renders system, "
           "user and assistant messages only",
           family_);
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      fail("the {} chat template: unknown role \"{}\" (expected system, user or assistant)", family_, m.role);
  }
  switch (kind_) {
    case Kind::Llama3: return render_llama3(messages, options.add_generation_prompt, bos_token_);
    // The first Llama 3 template appends the assistant header whatever the caller asks.
    case Kind::Llama3AlwaysPrompt: return render_llama3(messages, true, bos_token_);
    case Kind::ChatML: return render_chatml(messages, options.add_generation_prompt, {});
    case Kind::SmolLM2:
      return render_chatml(messages, options.add_generation_prompt,
                           "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    case Kind::Qwen25:
      return render_chatml(messages, options.add_generation_prompt,
                           "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    case Kind::Qwen3: return render_qwen3(messages, options);
  }
  fail("chat template: internal error (unknown kind)");
}

}  // namespace tessera
