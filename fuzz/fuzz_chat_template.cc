// Chat-template rendering of arbitrary messages with every template family tessera knows
// (and from_source on arbitrary sources). The first byte picks the template and the options;
// the rest is NUL-separated fields: role, content, [reasoning marker + reasoning], ...
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer/chat_template.h"
#include "util/error.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::string> sources = known_chat_template_sources();
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  std::string_view rest = fuzz::as_view(data + 1, size - 1);
  std::vector<std::string> fields;
  while (true) {
    const size_t nul = rest.find('\0');
    fields.emplace_back(rest.substr(0, nul));
    if (nul == std::string_view::npos) break;
    rest.remove_prefix(nul + 1);
  }
  try {
    const size_t pick = mode % (sources.size() + 1);
    const std::string& bos = "<|begin_of_text|>";
    const std::string& eos = "<|eot_id|>";
    if (pick == sources.size()) {  // an arbitrary source: refused unless it is a known one
      (void)ChatTemplate::from_source(fields[0], bos, eos);
      return 0;
    }
    ChatTemplate t = ChatTemplate::from_source(sources[pick], bos, eos);
    std::vector<ChatMessage> messages;
    static const char* kRoles[] = {"system", "user", "assistant", "tool"};
    for (size_t i = 0; i + 1 < fields.size(); i += 2) {
      ChatMessage m;
      const std::string& role = fields[i];
      // A one-byte role field names a usual role; longer ones are taken as they are.
      m.role = role.size() == 1 ? kRoles[uint8_t(role[0]) % 4] : role;
      m.content = fields[i + 1];
      if (!m.content.empty() && m.content[0] == '\x01') {  // "\x01reasoning\x02content"
        const size_t split = m.content.find('\x02');
        m.reasoning_content = m.content.substr(1, split == std::string::npos ? std::string::npos : split - 1);
        m.content = split == std::string::npos ? "" : m.content.substr(split + 1);
      }
      messages.push_back(std::move(m));
    }
    ChatOptions options;
    options.add_generation_prompt = (mode & 0x40) != 0;
    if (mode & 0x80) options.enable_thinking = (mode & 0x20) != 0;
    (void)t.render(messages, options);
  } catch (const Error&) {
  }
  return 0;
}
