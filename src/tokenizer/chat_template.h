// Chat templates: render exactly what transformers' apply_chat_template(messages,
// tokenize=False, add_generation_prompt=...) renders, for the templates tessera knows: Llama 3,
// Qwen2.5, Qwen3 (thinking switch), SmolLM2 and plain ChatML. The template the model ships is
// recognised by its exact source and rendered by C++ code written for it (no Jinja engine);
// any other template is refused by name.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (anything else is refused at render time)
  std::string content;
  // Qwen3 only: the assistant's reasoning, when the caller keeps it apart from the content
  // (transformers' message["reasoning_content"]). Unset: the template takes it from a
  // "<think>...</think>" block inside the content instead.
  std::optional<std::string> reasoning_content = std::nullopt;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  // Qwen3 only (others ignore it); unset = the template's default
};

class ChatTemplate {
 public:
  // Recognises the template from its Jinja source (tokenizer_config.json's chat_template or
  // GGUF tokenizer.chat_template). Throws tessera::Error naming the template (sha256 prefix,
  // size, the family it resembles) when it is not one tessera renders exactly.
  static ChatTemplate from_source(const std::string& jinja_source, const std::string& bos_token,
                                  const std::string& eos_token);

  // Throws tessera::Error for an empty conversation and for roles the template would need
  // tools for ("tool") or does not define.
  std::string render(const std::vector<ChatMessage>& messages, const ChatOptions& options = {}) const;
  const std::string& family() const { return family_; }  // "llama3", "chatml", "qwen2.5", "qwen3", "smollm2"

 private:
  // The exact template recognised; several may share a family name.
  enum class Kind { Llama3, Llama3AlwaysPrompt, ChatML, Qwen25, Qwen3, SmolLM2 };
  ChatTemplate(Kind kind, std::string family, std::string bos, std::string eos)
      : kind_(kind), family_(std::move(family)), bos_token_(std::move(bos)), eos_token_(std::move(eos)) {}

  Kind kind_;
  std::string family_;
  std::string bos_token_, eos_token_;
};

// Lower-case hex SHA-256 of a template source: how error messages and the golden fixtures name
// a template.
std::string chat_template_sha256(std::string_view source);

// The Jinja sources from_source recognises, one per family and variant (for the fuzz harness).
std::vector<std::string> known_chat_template_sources();

}  // namespace tessera
