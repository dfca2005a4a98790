#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "util/error.h"

namespace tessera {

double GenerationResult::prefill_tokens_per_second() const {
  return prefill_seconds > 0 ? double(prompt_tokens) / prefill_seconds : 0.0;
}

double GenerationResult::decode_tokens_per_second() const {
  // The first generated token comes from the prefill's logits; decode time covers the rest.
  const size_t decoded = tokens.empty() ? 0 : tokens.size() - 1;
  return decode_seconds > 0 ? double(decoded) / decode_seconds : 0.0;
}

namespace {
// Length of the longest prefix of `s` that does not end inside a UTF-8 sequence.
size_t complete_utf8_prefix(const std::string& s) {
  size_t n = s.size();
  // Look back at most 3 bytes for the lead byte of an unfinished sequence.
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? n - back : n;
  }
  return n;
}
}  // namespace

std::string Utf8Stream::push(const std::string& bytes) {
  pending_ += bytes;
  const size_t n = complete_utf8_prefix(pending_);
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

std::vector<int32_t> stop_ids(const Tokenizer& tokenizer, const ModelSpec& spec) {
  std::vector<int32_t> ids = tokenizer.eos_ids();
  for (const int64_t id : spec.eos_ids)
    if (id >= 0 && id < spec.vocab) ids.push_back(int32_t(id));
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

Generator::Generator(ModelRunner& runner, const Tokenizer& tokenizer)
    : Generator(runner, tokenizer, tessera::stop_ids(tokenizer, runner.spec())) {}

Generator::Generator(ModelRunner& runner, const Tokenizer& tokenizer, std::vector<int32_t> stop_ids)
    : runner_(runner), tokenizer_(tokenizer), stop_ids_(std::move(stop_ids)) {
  std::sort(stop_ids_.begin(), stop_ids_.end());
}

GenerationResult Generator::generate(const std::vector<int32_t>& prompt, const GenerationOptions& options,
                                     const TokenCallback& on_token) {
  const ModelSpec& spec = runner_.spec();
  if (prompt.empty()) fail("the prompt is empty: give some text to continue");
  if (options.max_new_tokens < 0) fail("-n must be >= 0, got {}", options.max_new_tokens);
  if (runner_.position() + int64_t(prompt.size()) > spec.max_position)
    fail("the prompt has {} tokens{}, more than the model's context of {} tokens", prompt.size(),
         runner_.position() > 0 ? fmt::format(" after {} already in the conversation", runner_.position()) : "",
         spec.max_position);
  Sampler sampler(options.sampling);
  const std::vector<int32_t>& eos = stop_ids_;
  GenerationResult r;
  r.prompt_tokens = int64_t(prompt.size());
  r.stop_reason = "length";
  Utf8Stream stream;

  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  std::vector<float> logits = runner_.forward(prompt, /*all_logits=*/false);
  r.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();

  t0 = clock::now();
  for (int i = 0; i < options.max_new_tokens; ++i) {
    const int32_t next = sampler.sample(logits);
    if (options.stop_on_eos && std::binary_search(eos.begin(), eos.end(), next)) {
      r.stop_reason = "eos";
      break;
    }
    r.tokens.push_back(next);
    const std::string text = stream.push(tokenizer_.is_special(next) ? tokenizer_.token_string(next)
                                                                      : tokenizer_.token_bytes(next));
    r.text += text;
    if (on_token && !on_token(next, text)) {
      r.stop_reason = "stopped";
      break;
    }
    if (i + 1 == options.max_new_tokens) break;
    if (runner_.position() + 1 > spec.max_position) {
      r.stop_reason = "context";
      break;
    }
    logits = runner_.forward(std::span(&next, 1), /*all_logits=*/false);
  }
  r.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  const std::string rest = stream.flush();
  r.text += rest;
  if (on_token && !rest.empty()) on_token(-1, rest);
  return r;
}

}  // namespace tessera
