// Tokenizer: runs the pipeline the loaders built (added tokens, normalizer, pre-tokenizer,
// BPE, post-processor) and answers the id questions generation asks.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>

#include "model/weights.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_data.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace tessera {

namespace detail {

void StringTable::push_back(std::string_view s) {
  if (bytes_.size() + s.size() > UINT32_MAX) fail("tokenizer: the token strings exceed 4 GiB");
  bytes_.append(s);
  end_.push_back(uint32_t(bytes_.size()));
}

void finalize(TokenizerData& d) {
  if (!d.bpe) fail("{}: the tokenizer has no model", d.source);
  int64_t n = 0;
  for (const auto& [tok, id] : d.bpe->vocab()) n = std::max<int64_t>(n, int64_t(id) + 1);
  for (const AddedToken& a : d.added) n = std::max<int64_t>(n, int64_t(a.id) + 1);
  std::vector<std::string_view> strings(static_cast<size_t>(n));  // views of the vocabulary's and added tokens' strings
  d.present.assign(size_t(n), 0);
  d.special.assign(size_t(n), 0);
  for (const auto& [tok, id] : d.bpe->vocab()) {
    strings[size_t(id)] = tok;
    d.present[size_t(id)] = 1;
  }
  // Added tokens take precedence over the model's entry for the same id, as in tokenizers.
  for (const AddedToken& a : d.added) {
    strings[size_t(a.id)] = a.content;
    d.present[size_t(a.id)] = 1;
    d.special[size_t(a.id)] = a.special;
    d.added_ids[a.content] = a.id;
    if (a.normalized) d.normalized_matcher.add(d.normalizer.run(a.content), a);
    else d.raw_matcher.add(a.content, a);
  }
  d.token_strings = {};
  d.token_bytes = {};
  for (const std::string_view s : strings) {
    d.token_strings.push_back(s);
    if (d.byte_level_decoder) d.token_bytes.push_back(byte_level::decode_token(s));
    else d.token_bytes.push_back(s);
  }

  // The stop set: the declared end-of-sequence token plus every well-known end-of-turn or
  // end-of-text token the vocabulary has as a special token (Llama 3 instruct ends turns
  // with <|eot_id|> and tool calls with <|eom_id|>; ChatML models with <|im_end|>).
  if (!d.eos_token.empty())
    if (const auto id = find_token(d, d.eos_token)) d.eos_ids.push_back(*id);
  for (const char* name : {"<|end_of_text|>", "<|eom_id|>", "<|eot_id|>", "<|endoftext|>", "<|im_end|>"})
    if (const auto it = d.added_ids.find(name); it != d.added_ids.end()) d.eos_ids.push_back(it->second);
  // Llama 3.1/3.2 generation configs stop on 128001, 128008 and 128009. The Llama 3 vocabulary
  // calls 128008 <|reserved_special_token_4|> (3.1 renamed it <|eom_id|>), so the Llama 3
  // family's stop set is given by id.
  const auto bot = d.added_ids.find("<|begin_of_text|>");
  if (bot != d.added_ids.end() && bot->second == 128000)
    for (const int32_t id : {128001, 128008, 128009})
      if (size_t(id) < d.special.size() && d.special[size_t(id)]) d.eos_ids.push_back(id);
  std::sort(d.eos_ids.begin(), d.eos_ids.end());
  d.eos_ids.erase(std::unique(d.eos_ids.begin(), d.eos_ids.end()), d.eos_ids.end());
  if (d.bos_id && d.bos_token.empty()) d.bos_token = std::string(d.token_strings[size_t(*d.bos_id)]);
  if (d.eos_token.empty() && !d.eos_ids.empty()) d.eos_token = std::string(d.token_strings[size_t(d.eos_ids.front())]);
}

std::optional<int32_t> find_token(const TokenizerData& d, std::string_view token) {
  if (const auto it = d.added_ids.find(std::string(token)); it != d.added_ids.end()) return it->second;
  return d.bpe->token_id(token);
}

}  // namespace detail

struct Tokenizer::Impl : detail::TokenizerData {};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json_file(const std::string& tokenizer_json_path) {
  auto impl = std::make_unique<Impl>();
  detail::load_tokenizer_json(tokenizer_json_path, *impl);
  detail::finalize(*impl);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_gguf(const GgufFile& gguf) {
  auto impl = std::make_unique<Impl>();
  detail::load_tokenizer_gguf(gguf, *impl);
  detail::finalize(*impl);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::for_model(const Model& model) {
  if (const GgufFile* g = model.gguf()) return from_gguf(*g);
  const fs::path path = fs::path(model.path()) / "tokenizer.json";
  if (!fs::is_regular_file(path))
    fail("{}: no tokenizer.json in the model directory (tessera reads the model's tokenizer from it)", model.path());
  return from_json_file(path.string());
}

std::vector<int32_t> Tokenizer::encode_raw(std::string_view text) const {
  const Impl& d = *impl_;
  if (const auto bad = unicode::first_invalid_utf8(text))
    fail("the text is not valid UTF-8: byte 0x{:02X} at byte offset {} does not start a valid character",
         static_cast<unsigned char>(text[*bad]), *bad);

  std::vector<int32_t> ids;
  std::vector<std::string> words;
  auto tokenize_segment = [&](std::string_view segment) {
    words.clear();
    if (d.pre_tokenizer.empty()) words.emplace_back(segment);
    else d.pre_tokenizer.run(segment, words);
    for (const std::string& w : words) d.bpe->encode_word(w, ids);
  };

  std::vector<TextSegment> raw, normalized;
  d.raw_matcher.split(text, raw);
  for (const TextSegment& seg : raw) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    const std::string_view piece = text.substr(seg.start, seg.end - seg.start);
    const std::string norm = d.normalizer.empty() ? std::string(piece) : d.normalizer.run(piece);
    normalized.clear();
    d.normalized_matcher.split(norm, normalized);
    for (const TextSegment& sub : normalized) {
      if (sub.id >= 0) ids.push_back(sub.id);
      else tokenize_segment(std::string_view(norm).substr(sub.start, sub.end - sub.start));
    }
  }
  return ids;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> body = encode_raw(text);
  if (impl_->prefix_ids.empty() && impl_->suffix_ids.empty()) return body;
  std::vector<int32_t> ids = impl_->prefix_ids;
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), impl_->suffix_ids.begin(), impl_->suffix_ids.end());
  return ids;
}

std::vector<int32_t> Tokenizer::encode_prompt(std::string_view text) const {
  std::vector<int32_t> ids = encode_raw(text);
  const auto bos = impl_->bos_id;
  // A templated prompt often starts with the BOS text already (Llama 3's template writes
  // <|begin_of_text|>); a second BOS would change what the model sees.
  if (impl_->adds_bos && bos && (ids.empty() || ids.front() != *bos)) ids.insert(ids.begin(), *bos);
  return ids;
}

namespace {

void check_id(const detail::TokenizerData& d, int32_t id) {
  if (id < 0 || size_t(id) >= d.present.size() || !d.present[size_t(id)])
    fail("unknown token id {} (the tokenizer's ids run from 0 to {})", id, int64_t(d.present.size()) - 1);
}

}  // namespace

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& d = *impl_;
  std::string out;
  bool first = true;
  for (const int32_t id : ids) {
    check_id(d, id);
    if (skip_special && d.special[size_t(id)]) continue;
    if (!d.byte_level_decoder && !first) out += ' ';
    out += d.token_bytes[size_t(id)];
    first = false;
  }
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  check_id(*impl_, id);
  return std::string(impl_->token_bytes[size_t(id)]);
}

std::string Tokenizer::token_string(int32_t id) const {
  check_id(*impl_, id);
  return std::string(impl_->token_strings[size_t(id)]);
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->present.size()); }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const { return detail::find_token(*impl_, token); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->special.size() && impl_->special[size_t(id)];
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos_id; }
bool Tokenizer::adds_bos() const { return impl_->adds_bos && impl_->bos_id.has_value(); }
const std::vector<int32_t>& Tokenizer::eos_ids() const { return impl_->eos_ids; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }

}  // namespace tessera
