// Chat templates against transformers: every case of the golden fixtures in tests/fixtures/chat
// (made by tools/reference/chat_fixtures.py with apply_chat_template) must render byte for byte
// from the template the model ships; then recognition, refusals and each template's quirks,
// with expected strings taken from transformers 5.24.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "io/gguf.h"
#include "tokenizer/chat_template.h"
#include "util/error.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kSmolLM2Gguf = fs::path(TESSERA_SOURCE_DIR) / "models/SmolLM2-135M-Instruct.Q4_1.gguf";

// The Jinja source a family ships: tokenizer_config.json's chat_template for llama3 and qwen3
// (shared tokenizer files), the GGUF's tokenizer.chat_template for smollm2. nullopt when the
// file is not on this machine.
std::optional<std::string> shipped_template(const std::string& family) {
  if (family == "smollm2") {
    if (!fs::exists(kSmolLM2Gguf)) return std::nullopt;
    return GgufFile::open(kSmolLM2Gguf.string()).get("tokenizer.chat_template").as_string();
  }
  const fs::path config = fs::path(TESSERA_TOKENIZERS_DIR) / family / "tokenizer_config.json";
  if (!fs::exists(config)) return std::nullopt;
  json j;
  std::ifstream(config) >> j;
  return j.at("chat_template").get<std::string>();
}

std::string read_template(const std::string& family) {
  std::optional<std::string> s = shipped_template(family);
  if (!s) throw std::runtime_error("no template source for " + family);
  return *s;
}

ChatOptions options(bool add_generation_prompt, std::optional<bool> enable_thinking = std::nullopt) {
  ChatOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.enable_thinking = enable_thinking;
  return o;
}

// Runs f, which must throw tessera::Error; returns the message.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no tessera::Error thrown";
  return "";
}

// ---------------------------------------------------------------------------------------------
// Golden fixtures.

class ChatFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatFixture, RendersLikeTransformers) {
  const std::string family = GetParam();
  const fs::path path = fs::path(TESSERA_SOURCE_DIR) / "tests/fixtures/chat" / (family + ".json");
  if (!fs::exists(path)) GTEST_SKIP() << "no fixture " << path << " yet (tools/reference/chat_fixtures.py)";
  const std::optional<std::string> source = shipped_template(family);
  if (!source) GTEST_SKIP() << "the " << family << " template source is not on this machine";

  json fx;
  std::ifstream(path) >> fx;
  // The fixture must come from this very template, or a mismatch would prove nothing.
  ASSERT_EQ(chat_template_sha256(*source), fx.at("template_sha256").get<std::string>());
  auto token = [&](const char* key) { return fx.at(key).is_null() ? std::string() : fx.at(key).get<std::string>(); };
  const ChatTemplate tpl = ChatTemplate::from_source(*source, token("bos_token"), token("eos_token"));
  EXPECT_EQ(tpl.family(), family);

  const json& cases = fx.at("cases");
  ASSERT_FALSE(cases.empty());
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    std::vector<ChatMessage> messages;
    for (const json& m : c.at("messages")) {
      ChatMessage msg{m.at("role").get<std::string>(), m.at("content").get<std::string>()};
      if (m.contains("reasoning_content") && !m.at("reasoning_content").is_null())
        msg.reasoning_content = m.at("reasoning_content").get<std::string>();
      messages.push_back(std::move(msg));
    }
    const json& o = c.at("options");
    ChatOptions opts;
    opts.add_generation_prompt = o.value("add_generation_prompt", true);
    if (o.contains("enable_thinking") && !o.at("enable_thinking").is_null())
      opts.enable_thinking = o.at("enable_thinking").get<bool>();
    EXPECT_EQ(tpl.render(messages, opts), c.at("rendered").get<std::string>())
        << family << " case " << i << ": " << c.at("messages").dump() << " " << o.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ChatFixture, ::testing::Values("llama3", "qwen3", "smollm2"),
                         [](const auto& info) { return info.param; });

// ---------------------------------------------------------------------------------------------
// Recognition and refusal.

TEST(ChatTemplate, RecognisesShippedTemplates) {
  for (const std::string family : {"llama3", "qwen3", "smollm2"}) {
    const std::optional<std::string> source = shipped_template(family);
    if (!source) continue;
    EXPECT_EQ(ChatTemplate::from_source(*source, "", "").family(), family);
    // Jinja drops one trailing newline of the source, so both spellings are the same template.
    EXPECT_EQ(ChatTemplate::from_source(*source + "\n", "", "").family(), family);
  }
}

TEST(ChatTemplate, RefusesUnknownTemplateByName) {
  const std::string gemma =
      "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\\n' + "
      "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}";
  const std::string msg = error_of([&] { ChatTemplate::from_source(gemma, "<bos>", "<eos>"); });
  EXPECT_NE(msg.find("unrecognised chat template"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sha256 " + chat_template_sha256(gemma).substr(0, 16)), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "errors are one line: " << msg;

  EXPECT_NE(error_of([] { ChatTemplate::from_source("", "", ""); }).find("no chat template"), std::string::npos);

  // One character away from a known template is a different template: it is refused, and the
  // message says what it resembles.
  if (std::optional<std::string> llama3 = shipped_template("llama3")) {
    std::string edited = *llama3;
    edited.replace(edited.find("| trim"), 6, "|trim");
    const std::string m = error_of([&] { ChatTemplate::from_source(edited, "", ""); });
    EXPECT_NE(m.find("Llama 3-style"), std::string::npos) << m;
  }
  if (std::optional<std::string> smol = shipped_template("smollm2")) {
    std::string edited = *smol;
    edited.replace(edited.find("SmolLM"), 6, "TinyLM");
    EXPECT_NE(error_of([&] { ChatTemplate::from_source(edited, "", ""); }).find("ChatML-style"), std::string::npos);
  }
}

TEST(ChatTemplate, RefusesToolAndUnknownRolesAndEmptyConversations) {
  if (!shipped_template("qwen3")) GTEST_SKIP() << "no qwen3 tokenizer_config.json";
  const ChatTemplate qwen3 = ChatTemplate::from_source(read_template("qwen3"), "", "<|im_end|>");
  const std::string tool = error_of([&] {
    qwen3.render({{"user", "weather?"}, {"assistant", "calling"}, {"tool", "{\"temp\": 21}"}});
  });
  EXPECT_NE(tool.find("\"tool\""), std::string::npos) << tool;
  EXPECT_NE(tool.find("qwen3"), std::string::npos) << tool;
  const std::string other = error_of([&] { qwen3.render({{"developer", "x"}}); });
  EXPECT_NE(other.find("\"developer\""), std::string::npos) << other;
  EXPECT_NE(error_of([&] { qwen3.render({}); }).find("no messages"), std::string::npos);
}

TEST(ChatTemplate, Sha256KnownVectors) {
  EXPECT_EQ(chat_template_sha256(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(chat_template_sha256("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 56 and 64 bytes: the padding spills into a second block.
  EXPECT_EQ(chat_template_sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(chat_template_sha256(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

// ---------------------------------------------------------------------------------------------
// Each template's behaviour (expected strings rendered by transformers).

TEST(ChatTemplate, Llama3WritesBosOnceTrimsContentAndAlwaysPrompts) {
  if (!shipped_template("llama3")) GTEST_SKIP() << "no llama3 tokenizer_config.json";
  const ChatTemplate t = ChatTemplate::from_source(read_template("llama3"), "<|begin_of_text|>", "<|end_of_text|>");
  EXPECT_EQ(t.family(), "llama3");
  // |trim is Python's str.strip(): U+3000 and U+00A0 go, U+200B (not whitespace) stays.
  EXPECT_EQ(t.render({{"system", "\u3000 Be brief.\n"}, {"user", "\xc2\xa0Hi\u200b"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi\u200b<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // This (first) Llama 3 template ignores add_generation_prompt: the header is always there.
  EXPECT_EQ(t.render({{"user", "Hi"}, {"assistant", "Hello."}}, options(false)),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, Llama3RevisedHonoursAddGenerationPrompt) {
  if (!shipped_template("llama3")) GTEST_SKIP() << "no llama3 tokenizer_config.json";
  // Meta's later revision of the same template wraps the header in {% if add_generation_prompt %}.
  std::string source = read_template("llama3");
  const std::string header = "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}";
  ASSERT_NE(source.find(header), std::string::npos);
  source.replace(source.find(header), header.size(), "{% if add_generation_prompt %}" + header + "{% endif %}");
  const ChatTemplate t = ChatTemplate::from_source(source, "<|begin_of_text|>", "<|end_of_text|>");
  EXPECT_EQ(t.family(), "llama3");
  const std::vector<ChatMessage> conv = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", " Bye \n"}};
  EXPECT_EQ(t.render(conv, options(false)),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
            "\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>");
  EXPECT_EQ(t.render(conv, options(true)), t.render(conv, options(false)) + "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, SmolLM2AddsDefaultSystemPrompt) {
  if (!shipped_template("smollm2")) GTEST_SKIP() << "default model missing: run scripts/setup.sh";
  const ChatTemplate t = ChatTemplate::from_source(read_template("smollm2"), "<|im_start|>", "<|im_end|>");
  EXPECT_EQ(t.render({{"user", " Hi "}}),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\n Hi <|im_end|>\n<|im_start|>assistant\n");
  // An empty system message is still a system message: no default.
  EXPECT_EQ(t.render({{"system", ""}, {"user", "Hi"}}, options(false)),
            "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, ChatMLInBothSpellings) {
  const std::string real_newlines =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
      "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  const std::string escaped =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  for (const std::string& source : {real_newlines, escaped}) {
    const ChatTemplate t = ChatTemplate::from_source(source, "", "");
    EXPECT_EQ(t.family(), "chatml");
    EXPECT_EQ(t.render({{"user", "Hi"}}), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_EQ(t.render({{"user", "Hi"}}, options(false)), "<|im_start|>user\nHi<|im_end|>\n");
  }
}

// Qwen2.5-7B-Instruct's template (as llama.cpp keeps it), verbatim.
constexpr const char* kQwen25Template = R"jinja({%- if tools %}
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

TEST(ChatTemplate, Qwen25AddsDefaultSystemPrompt) {
  EXPECT_EQ(chat_template_sha256(kQwen25Template), "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f");
  const ChatTemplate t = ChatTemplate::from_source(kQwen25Template, "", "<|im_end|>");
  EXPECT_EQ(t.family(), "qwen2.5");
  EXPECT_EQ(t.render({{"user", "Hi"}}),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.render({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", " Bye \n"}}, options(false)),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "Hello.<|im_end|>\n<|im_start|>user\n Bye \n<|im_end|>\n");
}

class Qwen3Template : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!shipped_template("qwen3")) GTEST_SKIP() << "no qwen3 tokenizer_config.json";
    tpl_.emplace(ChatTemplate::from_source(read_template("qwen3"), "", "<|im_end|>"));
  }
  std::optional<ChatTemplate> tpl_;
};

TEST_F(Qwen3Template, ThinkingSwitch) {
  const std::vector<ChatMessage> conv = {{"user", "Hi"}};
  const std::string base = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(tpl_->render(conv, options(true)), base);                // unset: the model decides
  EXPECT_EQ(tpl_->render(conv, options(true, true)), base);          // true: nothing added either
  EXPECT_EQ(tpl_->render(conv, options(true, false)), base + "<think>\n\n</think>\n\n");
  // Without a generation prompt the switch has nothing to act on.
  EXPECT_EQ(tpl_->render(conv, options(false, false)), "<|im_start|>user\nHi<|im_end|>\n");
  // Other templates ignore the switch.
  if (std::optional<std::string> smol = shipped_template("smollm2")) {
    const ChatTemplate s = ChatTemplate::from_source(*smol, "", "");
    EXPECT_EQ(s.render(conv, options(true, false)), s.render(conv, options(true)));
  }
}

TEST_F(Qwen3Template, ReasoningOnlyKeptAfterTheLastQuery) {
  // Before the last user query the <think> block is dropped from the history...
  EXPECT_EQ(tpl_->render({{"user", "q1"}, {"assistant", "<think>\nr1\n</think>\n\na1"}, {"user", "q2"}}),
            "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
            "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n");
  // ...after it, it is kept; the last assistant turn always gets a (possibly empty) think block.
  EXPECT_EQ(tpl_->render({{"user", "q1"}, {"assistant", "<think>\nr1\n</think>\n\na1"}}, options(false)),
            "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>\n");
  EXPECT_EQ(tpl_->render({{"user", "q1"}, {"assistant", "plain"}}, options(false)),
            "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nplain<|im_end|>\n");
  // A non-last assistant turn after the query keeps a think block only when it has reasoning.
  EXPECT_EQ(tpl_->render({{"user", "q"}, {"assistant", "a1"}, {"assistant", "<think>r</think>a2"}}, options(false)),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr\n</think>\n\na2<|im_end|>\n");
  // A user turn that is a wrapped tool response is not a query.
  EXPECT_EQ(tpl_->render({{"user", "q"}, {"user", "<tool_response>x</tool_response>"}, {"assistant", "<think>t</think>a"}},
                         options(false)),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>user\n<tool_response>x</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\nt\n</think>\n\na<|im_end|>\n");
  // Without any query no assistant turn keeps reasoning, not even the last.
  EXPECT_EQ(tpl_->render({{"system", "s"}, {"assistant", "<think>t</think>a"}}, options(false)),
            "<|im_start|>system\ns<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n");
}

TEST_F(Qwen3Template, ThinkSplittingFollowsPythonSplit) {
  // Content: after the LAST </think>; reasoning: before the FIRST </think>, after the last <think>.
  EXPECT_EQ(tpl_->render({{"user", "q"}, {"assistant", "x</think>y</think>\nz"}}, options(false)),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nx\n</think>\n\nz<|im_end|>\n");
  EXPECT_EQ(tpl_->render({{"user", "q"}, {"assistant", "<think>a<think>b</think>c"}}, options(false)),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nb\n</think>\n\nc<|im_end|>\n");
}

TEST_F(Qwen3Template, ReasoningContentField) {
  ChatMessage a{"assistant", "<think>in content</think>ans"};
  a.reasoning_content = "explicit wins";
  // Given reasoning_content, the content is used as it is (its <think> block included).
  EXPECT_EQ(tpl_->render({{"user", "q"}, a}, options(false)),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nexplicit wins\n</think>\n\n"
            "<think>in content</think>ans<|im_end|>\n");
  // A reasoning of "\n" is non-empty, so it opens a think block though it strips to nothing.
  ChatMessage b{"assistant", "b"};
  b.reasoning_content = "\n";
  EXPECT_EQ(tpl_->render({{"user", "q"}, b, {"assistant", "c"}}, options(false)),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nb<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nc<|im_end|>\n");
}

}  // namespace
}  // namespace tessera
