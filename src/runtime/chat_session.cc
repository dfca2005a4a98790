#include "runtime/chat_session.h"

#include <algorithm>

#include "util/error.h"

namespace tessera {

namespace {
ChatTemplate template_for(const Tokenizer& tok) {
  if (tok.chat_template().empty()) fail("this model ships no chat template: use --prompt without --chat");
  return ChatTemplate::from_source(tok.chat_template(), tok.bos_token(), tok.eos_token());
}
}  // namespace

ChatSession::ChatSession(ModelRunner& runner, const Tokenizer& tokenizer, std::optional<std::string> system,
                         ChatOptions chat_options)
    : runner_(runner),
      tokenizer_(tokenizer),
      template_(template_for(tokenizer)),
      chat_options_(chat_options),
      system_(std::move(system)) {
  reset();
}

void ChatSession::reset() {
  history_.clear();
  if (system_) history_.push_back({"system", *system_});
  runner_.reset();
  cached_.clear();
}

GenerationResult ChatSession::reply(const std::string& user_text, const GenerationOptions& options,
                                    const TokenCallback& on_token) {
  if (user_text.empty()) fail("the prompt is empty: type a message");
  std::vector<ChatMessage> messages = history_;
  messages.push_back({"user", user_text});
  ChatOptions opts = chat_options_;
  opts.add_generation_prompt = true;
  // The template writes BOS and the special tokens itself, so no post-processor here.
  const std::vector<int32_t> ids = tokenizer_.encode_raw(template_.render(messages, opts));

  // Reuse the cache for the unchanged prefix; at least one token must run to get logits.
  size_t keep = size_t(std::mismatch(cached_.begin(), cached_.end(), ids.begin(), ids.end()).first - cached_.begin());
  keep = std::min(keep, ids.size() - 1);
  runner_.truncate(int64_t(keep));
  cached_.resize(keep);
  const std::vector<int32_t> fresh(ids.begin() + long(keep), ids.end());
  GenerationResult r = Generator(runner_, tokenizer_).generate(fresh, options, on_token);
  last_prompt_ = ids;

  cached_ = ids;
  cached_.insert(cached_.end(), r.tokens.begin(), r.tokens.end());
  cached_.resize(size_t(runner_.position()));  // the last sampled token was never run
  history_ = std::move(messages);
  history_.push_back({"assistant", r.text});
  return r;
}

}  // namespace tessera
