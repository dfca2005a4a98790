// A conversation with a model: the history rendered through the model's chat template, and
// the KV cache reused for the part of the rendered prompt that did not change.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "runtime/generate.h"
#include "tokenizer/chat_template.h"

namespace tessera {

class ChatSession {
 public:
  // Throws tessera::Error when the model ships no chat template or an unrecognised one.
  ChatSession(ModelRunner& runner, const Tokenizer& tokenizer, std::optional<std::string> system,
              ChatOptions chat_options = {});

  // Adds the user's message, generates the reply, adds it to the history.
  GenerationResult reply(const std::string& user_text, const GenerationOptions& options,
                         const TokenCallback& on_token = {});
  void reset();  // forget the conversation (keeps the system message)
  const std::vector<ChatMessage>& history() const { return history_; }
  // The token ids of the prompt the last reply was generated from (for tests and --json).
  const std::vector<int32_t>& last_prompt_ids() const { return last_prompt_; }

 private:
  ModelRunner& runner_;
  const Tokenizer& tokenizer_;
  ChatTemplate template_;
  ChatOptions chat_options_;
  std::optional<std::string> system_;
  std::vector<ChatMessage> history_;
  std::vector<int32_t> cached_;  // ids whose keys and values the runner holds, in order
  std::vector<int32_t> last_prompt_;
};

}  // namespace tessera
