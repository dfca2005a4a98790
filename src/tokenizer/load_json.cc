// tokenizer.json (Hugging Face `tokenizers` format) into TokenizerData, plus the
// tokenizer_config.json beside it for BOS/EOS, add_bos_token and the chat template.
// Every component tessera does not run exactly is refused by name.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer_data.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace tessera::detail {

namespace {

// Ids beyond this would only come from a corrupt file; refusing them keeps the id tables small.
constexpr int64_t kMaxTokenId = 1 << 24;

class JsonLoader {
 public:
  JsonLoader(std::string path, TokenizerData& d) : path_(std::move(path)), d_(d) {}

  [[noreturn]] void unsupported(const std::string& what) const {
    fail("{}: unsupported tokenizer feature: {}", path_, what);
  }
  [[noreturn]] void malformed(const std::string& what) const { fail("{}: malformed tokenizer.json: {}", path_, what); }

  static std::string type_of(const json& j) { return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : ""; }

  bool flag(const json& j, const char* key, bool fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean()) malformed(fmt::format("'{}' must be true or false", key));
    return j[key].get<bool>();
  }

  int32_t token_id(const json& j, const std::string& what) const {
    if (!j.is_number_integer()) malformed(what + " is not an integer id");
    const int64_t id = j.get<int64_t>();
    if (id < 0 || id >= kMaxTokenId) malformed(fmt::format("{} has id {}, outside 0..{}", what, id, kMaxTokenId - 1));
    return int32_t(id);
  }

  void normalizer(const json& j) {
    if (j.is_null()) return;
    const std::string type = type_of(j);
    if (type == "NFC") {
      d_.normalizer.add(Normalizer::Step::NFC);
    } else if (type == "Sequence") {
      if (!j.contains("normalizers") || !j["normalizers"].is_array()) malformed("normalizer Sequence without a list");
      for (const json& n : j["normalizers"]) normalizer(n);
    } else {
      unsupported("normalizer " + (type.empty() ? j.dump() : type));
    }
  }

  static std::string escape_literal(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (static_cast<unsigned char>(c) < 0x80 && !std::isalnum(static_cast<unsigned char>(c))) out += '\\';
      out += c;
    }
    return out;
  }

  void pre_tokenizer(const json& j) {
    if (j.is_null()) return;
    const std::string type = type_of(j);
    if (type == "Sequence") {
      if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) malformed("pre_tokenizer Sequence without a list");
      for (const json& p : j["pretokenizers"]) pre_tokenizer(p);
    } else if (type == "Split") {
      const std::string behavior = j.value("behavior", std::string());
      if (behavior != "Isolated") unsupported("pre_tokenizer Split with behavior " + behavior);
      if (flag(j, "invert", false)) unsupported("pre_tokenizer Split with invert");
      const json& pat = j.value("pattern", json());
      if (pat.contains("Regex") && pat["Regex"].is_string()) {
        d_.pre_tokenizer.add(PreTokenizerStep::split(pat["Regex"].get<std::string>()));
      } else if (pat.contains("String") && pat["String"].is_string()) {
        d_.pre_tokenizer.add(PreTokenizerStep::split(escape_literal(pat["String"].get<std::string>())));
      } else {
        malformed("pre_tokenizer Split without a Regex or String pattern");
      }
    } else if (type == "ByteLevel") {
      // tokenizers' defaults when a field is absent: add_prefix_space and use_regex both true.
      d_.pre_tokenizer.add(PreTokenizerStep::byte_level(flag(j, "add_prefix_space", true), flag(j, "use_regex", true)));
    } else if (type == "Digits") {
      d_.pre_tokenizer.add(PreTokenizerStep::digits(flag(j, "individual_digits", false)));
    } else {
      unsupported("pre_tokenizer " + (type.empty() ? j.dump() : type));
    }
  }

  void model(const json& j) {
    if (!j.is_object()) malformed("no model");
    const std::string type = type_of(j);
    if (type != "BPE" && !(type.empty() && j.contains("merges")))
      unsupported("model " + (type.empty() ? std::string("without a type") : type));
    if (j.contains("dropout") && !j["dropout"].is_null() && j["dropout"].get<double>() != 0.0)
      unsupported("model BPE dropout");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (j.contains(key) && !j[key].is_null() && !j[key].get<std::string>().empty())
        unsupported(fmt::format("model BPE {} '{}'", key, j[key].get<std::string>()));

    BpeOptions opt;
    opt.ignore_merges = flag(j, "ignore_merges", false);
    opt.byte_fallback = flag(j, "byte_fallback", false);
    opt.fuse_unk = flag(j, "fuse_unk", false);
    if (j.contains("unk_token") && j["unk_token"].is_string()) opt.unk_token = j["unk_token"].get<std::string>();

    if (!j.contains("vocab") || !j["vocab"].is_object()) malformed("model has no vocab object");
    std::unordered_map<std::string, int32_t> vocab;
    vocab.reserve(j["vocab"].size());
    for (const auto& [tok, id] : j["vocab"].items()) {
      if (unicode::first_invalid_utf8(tok)) malformed("a vocabulary token is not valid UTF-8");
      vocab[tok] = token_id(id, "vocabulary token '" + tok + "'");
    }

    std::vector<std::pair<std::string, std::string>> merges;
    if (j.contains("merges")) {
      if (!j["merges"].is_array()) malformed("model merges is not a list");
      merges.reserve(j["merges"].size());
      for (const json& m : j["merges"]) {
        if (m.is_string()) {
          // "left right": tokens never contain a space (byte-level tokens write it as Ġ).
          const std::string& s = m.get_ref<const std::string&>();
          const size_t sp = s.find(' ');
          if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
            malformed(fmt::format("merge '{}' is not two tokens separated by one space", s));
          merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
          merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
        } else {
          malformed("a merge is neither \"a b\" nor [a, b]");
        }
      }
    }
    try {
      d_.bpe = std::make_unique<Bpe>(std::move(vocab), merges, std::move(opt));
    } catch (const Error& e) {
      fail("{}: {}", path_, e.what());
    }
  }

  void added_tokens(const json& j) {
    if (j.is_null()) return;
    if (!j.is_array()) malformed("added_tokens is not a list");
    for (const json& t : j) {
      AddedToken a;
      if (!t.contains("content") || !t["content"].is_string()) malformed("an added token has no content");
      a.content = t["content"].get<std::string>();
      if (unicode::first_invalid_utf8(a.content)) malformed("an added token is not valid UTF-8");
      a.id = token_id(t.value("id", json()), "added token '" + a.content + "'");
      a.single_word = flag(t, "single_word", false);
      a.lstrip = flag(t, "lstrip", false);
      a.rstrip = flag(t, "rstrip", false);
      a.special = flag(t, "special", false);
      // tokenizers' default: special tokens are matched in the raw text, others after normalization.
      a.normalized = flag(t, "normalized", !a.special);
      d_.added.push_back(std::move(a));
    }
  }

  void post_processor(const json& j) {
    if (j.is_null()) return;
    const std::string type = type_of(j);
    if (type == "ByteLevel") return;  // only adjusts offsets; ids are untouched
    if (type == "Sequence") {
      if (!j.contains("processors") || !j["processors"].is_array()) malformed("post_processor Sequence without a list");
      for (const json& p : j["processors"]) post_processor(p);
      return;
    }
    if (type != "TemplateProcessing") unsupported("post_processor " + (type.empty() ? j.dump() : type));
    // Only the single-sequence template matters: tessera never encodes pairs.
    const json& special = j.value("special_tokens", json::object());
    std::vector<int32_t>* side = &d_.prefix_ids;
    bool seen_sequence = false;
    for (const json& item : j.value("single", json::array())) {
      if (item.contains("Sequence")) {
        if (seen_sequence || item["Sequence"].value("id", std::string()) != "A")
          unsupported("post_processor TemplateProcessing with a single template other than one $A");
        seen_sequence = true;
        side = &d_.suffix_ids;
      } else if (item.contains("SpecialToken")) {
        const std::string name = item["SpecialToken"].value("id", std::string());
        if (!special.contains(name) || !special[name].contains("ids"))
          malformed(fmt::format("post_processor names special token '{}' without ids", name));
        for (const json& id : special[name]["ids"]) side->push_back(token_id(id, "post_processor token " + name));
      } else {
        malformed("post_processor TemplateProcessing item " + item.dump());
      }
    }
    if (!seen_sequence) unsupported("post_processor TemplateProcessing without $A");
  }

  void decoder(const json& j) {
    if (j.is_null()) {
      d_.byte_level_decoder = false;
      return;
    }
    const std::string type = type_of(j);
    if (type != "ByteLevel") unsupported("decoder " + (type.empty() ? j.dump() : type));
    d_.byte_level_decoder = true;
  }

  void load() {
    std::ifstream in(path_, std::ios::binary);
    if (!in) fail("cannot read tokenizer file {}", path_);
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      fail("{}: not valid JSON ({})", path_, e.what());
    }
    if (!j.is_object()) malformed("not a JSON object");
    try {
      for (const char* key : {"truncation", "padding"})
        if (j.contains(key) && !j[key].is_null()) unsupported(key);
      added_tokens(j.value("added_tokens", json()));
      normalizer(j.value("normalizer", json()));
      pre_tokenizer(j.value("pre_tokenizer", json()));
      model(j.value("model", json()));
      post_processor(j.value("post_processor", json()));
      decoder(j.value("decoder", json()));
    } catch (const json::exception& e) {
      malformed(e.what());
    }
  }

 private:
  std::string path_;
  TokenizerData& d_;
};

// bos_token / eos_token in tokenizer_config.json: a string, {"content": ...} or null.
std::string config_token(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

std::optional<int32_t> lookup(const TokenizerData& d, const std::string& token) {
  for (const AddedToken& a : d.added)
    if (a.content == token) return a.id;
  return d.bpe->token_id(token);
}

}  // namespace

void load_tokenizer_json(const std::string& path, TokenizerData& d) {
  d.source = path;
  JsonLoader(path, d).load();

  // tokenizer_config.json beside it: special token names, the BOS switch, the chat template.
  json cfg = json::object();
  bool have_config = false;
  const fs::path cfg_path = fs::path(path).parent_path() / "tokenizer_config.json";
  if (fs::is_regular_file(cfg_path)) {
    std::ifstream in(cfg_path, std::ios::binary);
    try {
      cfg = json::parse(in);
      have_config = cfg.is_object();
      if (!have_config) cfg = json::object();
    } catch (const json::exception& e) {
      fail("{}: not valid JSON ({})", cfg_path.string(), e.what());
    }
  }
  d.bos_token = config_token(cfg, "bos_token");
  d.eos_token = config_token(cfg, "eos_token");
  if (cfg.contains("chat_template")) {
    const json& t = cfg["chat_template"];
    if (t.is_string()) {
      d.chat_template = t.get<std::string>();
    } else if (t.is_array()) {  // named templates: the "default" one, else the first
      for (const json& e : t)
        if (e.is_object() && e.value("name", std::string()) == "default") d.chat_template = e.value("template", std::string());
      if (d.chat_template.empty() && !t.empty() && t[0].is_object()) d.chat_template = t[0].value("template", std::string());
    }
  }
  // Without a config, Llama 3's BOS is still known by name.
  const bool llama3 = lookup(d, "<|begin_of_text|>").has_value();
  if (!have_config && llama3) d.bos_token = "<|begin_of_text|>";
  if (!d.bos_token.empty()) d.bos_id = lookup(d, d.bos_token);

  // The family's BOS rule: the config's add_bos_token when it has one; else BOS when the
  // post-processor adds it (Meta's Llama 3 file) or the tokenizer is Llama 3's (whose
  // tokenizer.json may lack that post-processor, yet the model expects a BOS first).
  if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
    d.adds_bos = cfg["add_bos_token"].get<bool>();
  } else if (d.bos_id) {
    const bool template_adds = std::find(d.prefix_ids.begin(), d.prefix_ids.end(), *d.bos_id) != d.prefix_ids.end();
    d.adds_bos = template_adds || (llama3 && d.bos_token == "<|begin_of_text|>");
  }
}

}  // namespace tessera::detail
