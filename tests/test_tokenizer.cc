// Tokenizer: exactness against Hugging Face `tokenizers` (fixtures made with it for Llama 3,
// Qwen3 and SmolLM2), plus unit tests of the pieces: GPT-2's byte alphabet, merge ranks,
// added tokens, the BOS rule, the stop set, GGUF loading, refusals, and the CLI.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "model/weights.h"
#include "synth/synth.h"
#include "test_support.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/split_regex.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing_support::run_tessera;
using testing_support::ScratchDir;
using testing_support::slurp;
using testing_support::write_file;

using testing_support::tokenizers_dir;
std::string fixture_dir() { return std::string(TESSERA_SOURCE_DIR) + "/tests/fixtures/tokenizer"; }

// Loading Llama 3's 9 MB tokenizer.json takes a moment (much longer under sanitizers): each
// real tokenizer is loaded once for the whole suite. nullptr when its files are absent.
const Tokenizer* real_tokenizer(const std::string& family) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  if (auto it = cache.find(family); it != cache.end()) return it->second.get();
  std::unique_ptr<Tokenizer> tok;
  if (family == "smollm2") {
    const std::string gguf = testing_support::default_gguf();
    if (fs::exists(gguf)) tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(GgufFile::open(gguf)));
  } else {
    const std::string path = tokenizers_dir() + "/" + family + "/tokenizer.json";
    if (fs::exists(path)) tok = std::make_unique<Tokenizer>(Tokenizer::from_json_file(path));
  }
  return (cache[family] = std::move(tok)).get();
}

#define REQUIRE_TOKENIZER(var, family)                                                          \
  const Tokenizer* var = real_tokenizer(family);                                                \
  if (!var) GTEST_SKIP() << "the " << family << " tokenizer is not on this machine (shared data " \
                            "or the default model from scripts/setup.sh)"

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

// ---- exactness against the fixtures made with `tokenizers` -----------------------------

class TokenizerFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerFixture, IdsAndRoundTripMatchTokenizers) {
  const std::string family = GetParam();
  const fs::path path = fs::path(fixture_dir()) / (family + ".json");
  if (!fs::exists(path)) GTEST_SKIP() << "no fixture " << path << " yet (tools/reference/tokenizer_fixtures.py)";
  REQUIRE_TOKENIZER(tok, family);
  const json fx = json::parse(slurp(path));
  ASSERT_EQ(fx.value("family", ""), family);
  ASSERT_TRUE(fx.contains("cases") && fx["cases"].is_array());
  ASSERT_GT(fx["cases"].size(), 0u);
  int id_mismatches = 0, roundtrip_failures = 0, roundtrips = 0;
  for (const json& c : fx["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok->encode(text);
    if (got != want) {
      ++id_mismatches;
      ADD_FAILURE() << family << ": ids differ for " << json(text).dump() << "\n  tokenizers: " << ids_text(want)
                    << "\n  tessera:    " << ids_text(got);
    }
    if (c.value("roundtrip", false)) {
      ++roundtrips;
      const std::string back = tok->decode(got);
      if (back != text) {
        ++roundtrip_failures;
        ADD_FAILURE() << family << ": decode(encode(s)) != s for " << json(text).dump();
      }
    }
  }
  EXPECT_EQ(id_mismatches, 0) << "of " << fx["cases"].size() << " cases";
  EXPECT_EQ(roundtrip_failures, 0) << "of " << roundtrips << " round trips";
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizerFixture, ::testing::Values("llama3", "qwen3", "smollm2"));

// ---- GPT-2's byte alphabet -------------------------------------------------------------

TEST(ByteLevel, BytesToUnicodeIsGpt2s) {
  EXPECT_EQ(byte_level::byte_to_char('!'), U'!');
  EXPECT_EQ(byte_level::byte_to_char('~'), U'~');
  EXPECT_EQ(byte_level::byte_to_char(' '), U'\u0120');   // Ġ
  EXPECT_EQ(byte_level::byte_to_char('\n'), U'\u010A');  // Ċ
  EXPECT_EQ(byte_level::byte_to_char(0x00), U'\u0100');
  EXPECT_EQ(byte_level::byte_to_char(0x7F), U'\u0121');
  EXPECT_EQ(byte_level::byte_to_char(0xA0), U'\u0142');
  EXPECT_EQ(byte_level::byte_to_char(0xAD), U'\u0143');
  EXPECT_EQ(byte_level::byte_to_char(0xA1), U'\u00A1');
  EXPECT_EQ(byte_level::byte_to_char(0xFF), U'\u00FF');
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t c = byte_level::byte_to_char(uint8_t(b));
    EXPECT_TRUE(seen.insert(c).second) << "byte " << b << " shares its character";
    EXPECT_EQ(byte_level::char_to_byte(c), b);
  }
  EXPECT_EQ(byte_level::char_to_byte(U' '), -1);
  EXPECT_EQ(byte_level::encode("a b\n"), "a\xC4\xA0" "b\xC4\x8A");
  EXPECT_EQ(byte_level::decode_token("\xC4\xA0world"), " world");
  // A token with a character outside the alphabet stands for its own bytes.
  EXPECT_EQ(byte_level::decode_token("a b"), "a b");
}

// ---- the regex rewrite -------------------------------------------------------------------

TEST(SplitRegex, BackslashSIsOnigurumasClass) {
  EXPECT_EQ(onig_to_pcre2(R"(\s+(?!\S))"), R"([\t-\r\x{85}\p{Z}]+(?![^\t-\r\x{85}\p{Z}]))");
  EXPECT_EQ(onig_to_pcre2(R"([^\s\p{L}])"), R"([^\t-\r\x{85}\p{Z}\p{L}])");
  EXPECT_EQ(onig_to_pcre2(R"(\\s)"), R"(\\s)");  // an escaped backslash, then a plain s
  EXPECT_EQ(onig_to_pcre2(R"([]s])"), R"([]s])");
  EXPECT_THROW(onig_to_pcre2(R"([\S])"), Error);

  // U+180E (Mongolian vowel separator) is whitespace to PCRE2 but not to Oniguruma.
  SplitRegex re(R"(\s+|\S+)");
  std::vector<std::pair<size_t, size_t>> m;
  re.find_all("a\xE1\xA0\x8E b", m);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0], std::make_pair(size_t(0), size_t(4)));  // "a" + U+180E
  EXPECT_EQ(m[1], std::make_pair(size_t(4), size_t(5)));
}

TEST(SplitRegex, OddCharactersMatchTokenizers) {
  REQUIRE_TOKENIZER(llama, "llama3");
  REQUIRE_TOKENIZER(qwen, "qwen3");
  // Expected ids from tokenizers 0.23: U+180E, U+0085, long s after an apostrophe.
  EXPECT_EQ(llama->encode("a\u180e b"), (std::vector<int32_t>{64, 157, 254, 236, 293}));
  EXPECT_EQ(qwen->encode("x\u180e\u180e  y"), (std::vector<int32_t>{87, 123970, 236, 123970, 236, 220, 379}));
  EXPECT_EQ(llama->encode("I'\u017f DON'T"), (std::vector<int32_t>{40, 6, 129, 123, 45373, 17773}));
  EXPECT_EQ(qwen->encode("I'\u017f DON'T"), (std::vector<int32_t>{40, 6, 144815, 44273, 17323}));
  EXPECT_EQ(llama->encode("a\u0085b  c"), (std::vector<int32_t>{64, 116360, 65, 220, 272}));
  EXPECT_EQ(llama->encode("we'LL"), (std::vector<int32_t>{906, 6, 4178}));
  // NFC: Qwen composes e + U+0301 and the Angstrom sign; Llama 3 does not normalize.
  EXPECT_EQ(qwen->encode("cafe\u0301"), (std::vector<int32_t>{924, 58858}));
  EXPECT_EQ(llama->encode("cafe\u0301"), (std::vector<int32_t>{936, 1897, 54939}));
  EXPECT_EQ(qwen->encode("\u212b"), (std::vector<int32_t>{144044}));
}

// ---- toy tokenizers built in the test ----------------------------------------------------

// A byte-level tokenizer.json whose first 256 ids are the bytes (id = byte value), then
// `extra` tokens in order (ids 256...).
json toy_tokenizer(const json& merges, const std::vector<std::string>& extra, const json& added = json::array(),
                   bool ignore_merges = false, bool add_prefix_space = false) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::byte_to_utf8(uint8_t(b))] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + i;
  json bl = {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", false}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", bl},
          {"post_processor", nullptr},
          {"decoder", bl},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
            {"ignore_merges", ignore_merges}, {"vocab", vocab}, {"merges", merges}}}};
}

json added_token(int id, const std::string& content, bool lstrip = false, bool rstrip = false, bool single_word = false) {
  return {{"id", id}, {"content", content}, {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", false}, {"special", true}};
}

Tokenizer load_json(const ScratchDir& dir, const json& j, const json& config = nullptr) {
  write_file(dir.path() / "tokenizer.json", j.dump());
  if (!config.is_null()) write_file(dir.path() / "tokenizer_config.json", config.dump());
  return Tokenizer::from_json_file(dir.str("tokenizer.json"));
}

using Ids = std::vector<int32_t>;

TEST(Bpe, MergesApplyLowestRankFirst) {
  ScratchDir dir("tok_merges");
  // The same two merges in both orders: rank decides which pair of "abc" merges.
  EXPECT_EQ(load_json(dir, toy_tokenizer({"b c", "a b"}, {"bc", "ab"})).encode("abc"), (Ids{'a', 256}));
  EXPECT_EQ(load_json(dir, toy_tokenizer({"a b", "b c"}, {"ab", "bc"})).encode("abc"), (Ids{256, 'c'}));
  // Merges written as [left, right] pairs; merged tokens merge again.
  EXPECT_EQ(load_json(dir, toy_tokenizer(json::parse(R"([["a","b"],["ab","c"]])"), {"ab", "abc"})).encode("abc"),
            (Ids{257}));
  // ignore_merges: a word in the vocabulary is one token even with no merge path to it.
  EXPECT_EQ(load_json(dir, toy_tokenizer(json::array(), {"abc"}, json::array(), true)).encode("abc abc"),
            (Ids{256, ' ', 'a', 'b', 'c'}));
  EXPECT_EQ(load_json(dir, toy_tokenizer(json::array(), {"abc"})).encode("abc"), (Ids{'a', 'b', 'c'}));
  // A merge whose result is not in the vocabulary is a broken file.
  try {
    load_json(dir, toy_tokenizer({"a b"}, {}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not in the vocabulary"), std::string::npos) << e.what();
  }
}

TEST(AddedTokens, MatchedInTextLeftmostLongestWithStripRules) {
  ScratchDir dir("tok_added");
  const json added = json::array({added_token(256, "<x>"), added_token(257, "<x><y>"), added_token(258, "<L>", true),
                      added_token(259, "<R>", false, true), added_token(260, "<w>", false, false, true)});
  const Tokenizer tok = load_json(dir, toy_tokenizer(json::array(), {}, added));
  // Expected ids from tokenizers 0.23 on the same file.
  EXPECT_EQ(tok.encode("a<x><y>b<x>"), (Ids{'a', 257, 'b', 256}));
  EXPECT_EQ(tok.encode("a  <L>b"), (Ids{'a', 258, 'b'}));
  EXPECT_EQ(tok.encode("a<R>  b"), (Ids{'a', 259, 'b'}));
  EXPECT_EQ(tok.encode("a<w>"), (Ids{'a', '<', 'w', '>'}));  // not a word of its own
  EXPECT_EQ(tok.encode("a <w> b"), (Ids{'a', ' ', 260, ' ', 'b'}));
  EXPECT_EQ(tok.encode("<w>"), (Ids{260}));
  EXPECT_EQ(tok.encode("<x"), (Ids{'<', 'x'}));
  EXPECT_EQ(tok.encode(""), Ids{});
  EXPECT_TRUE(tok.is_special(256));
  EXPECT_FALSE(tok.is_special('a'));
  EXPECT_EQ(tok.decode(Ids{'a', 256, 'b'}), "a<x>b");
  EXPECT_EQ(tok.decode(Ids{'a', 256, 'b'}, /*skip_special=*/true), "ab");

  // ByteLevel's add_prefix_space applies to every text segment between added tokens.
  const Tokenizer spaced = load_json(dir, toy_tokenizer(json::array(), {}, json::array({added_token(256, "<x>")}), false, true));
  EXPECT_EQ(spaced.encode("a<x>b"), (Ids{' ', 'a', 256, ' ', 'b'}));
  EXPECT_EQ(spaced.encode(" a"), (Ids{' ', 'a'}));
  EXPECT_EQ(spaced.encode(""), Ids{});
}

TEST(AddedTokens, SpecialTokensInRealText) {
  REQUIRE_TOKENIZER(qwen, "qwen3");
  REQUIRE_TOKENIZER(llama, "llama3");
  EXPECT_EQ(qwen->encode("<|im_start|>user\nHi<|im_end|>\n<think>"),
            (Ids{151644, 872, 198, 13048, 151645, 198, 151667}));
  EXPECT_TRUE(qwen->is_special(151644));
  EXPECT_FALSE(qwen->is_special(151667));  // <think> is an added token but not special
  EXPECT_EQ(qwen->token_id("<think>"), 151667);
  EXPECT_EQ(qwen->decode(Ids{151644, 872, 151645}, true), "user");
  EXPECT_EQ(qwen->decode(Ids{151644, 872, 151645}), "<|im_start|>user<|im_end|>");
  // Llama 3 has no <|im_start|>: it is ordinary text there.
  EXPECT_EQ(llama->encode("<|begin_of_text|>Hello"), (Ids{128000, 9906}));
  EXPECT_EQ(llama->encode("<|im_start|>")[0], 27);
  EXPECT_EQ(llama->token_string(1917), "\xC4\xA0world");
  EXPECT_EQ(llama->token_bytes(1917), " world");
}

// ---- errors ------------------------------------------------------------------------------

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "not one line: " << what;
  }
}

TEST(Tokenizer, InvalidUtf8IsRefusedWithItsOffset) {
  ScratchDir dir("tok_utf8");
  const Tokenizer tok = load_json(dir, toy_tokenizer(json::array(), {}));
  expect_error([&] { tok.encode("ab\xFF"); }, "byte offset 2");
  expect_error([&] { tok.encode("a\xC0\x80"); }, "byte offset 1");            // overlong NUL
  expect_error([&] { tok.encode("xyz\xED\xA0\x80"); }, "byte offset 3");      // a surrogate
  expect_error([&] { tok.encode("\xF4\x90\x80\x80"); }, "byte offset 0");     // above U+10FFFF
  expect_error([&] { tok.encode("ok \xE2\x82"); }, "byte offset 3");          // truncated
  expect_error([&] { tok.encode_prompt("\x80"); }, "byte offset 0");
  EXPECT_NO_THROW(tok.encode(std::string("nul \0 inside", 12)));
  EXPECT_EQ(tok.encode("\xF0\x9F\x98\x80").size(), 4u);  // a 4-byte character: four byte tokens
}

TEST(Tokenizer, UnsupportedFeaturesAreRefusedByName) {
  ScratchDir dir("tok_refuse");
  auto with = [&](const std::string& key, const json& value) {
    json j = toy_tokenizer(json::array(), {});
    j[key] = value;
    return j;
  };
  expect_error([&] { load_json(dir, with("pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "_"}})); },
               "unsupported tokenizer feature: pre_tokenizer Metaspace");
  expect_error([&] { load_json(dir, with("normalizer", {{"type", "NFKC"}})); },
               "unsupported tokenizer feature: normalizer NFKC");
  expect_error([&] { load_json(dir, with("normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}})); },
               "unsupported tokenizer feature: normalizer Lowercase");
  expect_error([&] { load_json(dir, with("post_processor", {{"type", "RobertaProcessing"}})); },
               "unsupported tokenizer feature: post_processor RobertaProcessing");
  expect_error([&] { load_json(dir, with("decoder", {{"type", "Metaspace"}})); },
               "unsupported tokenizer feature: decoder Metaspace");
  expect_error([&] { load_json(dir, with("model", {{"type", "WordPiece"}, {"vocab", json::object()}})); },
               "unsupported tokenizer feature: model WordPiece");
  expect_error([&] {
    load_json(dir, with("pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Removed"}, {"invert", false}}));
  }, "unsupported tokenizer feature: pre_tokenizer Split with behavior Removed");
  json dropout = toy_tokenizer(json::array(), {});
  dropout["model"]["dropout"] = 0.1;
  expect_error([&] { load_json(dir, dropout); }, "unsupported tokenizer feature: model BPE dropout");
  expect_error([&] { Tokenizer::from_json_file(dir.str("missing.json")); }, "cannot read tokenizer file");
}

// ---- the family rules: BOS, stop set, special token names, chat template -----------------

TEST(Tokenizer, Llama3PrependsOneBosNeverTwo) {
  REQUIRE_TOKENIZER(llama, "llama3");
  EXPECT_EQ(llama->bos_id(), 128000);
  EXPECT_TRUE(llama->adds_bos());
  EXPECT_EQ(llama->bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(llama->eos_token(), "<|end_of_text|>");
  // This tokenizer.json has no BOS post-processor, so encode (= tokenizers) adds none...
  EXPECT_EQ(llama->encode("Hello world"), (Ids{9906, 1917}));
  // ...while a prompt gets exactly one.
  EXPECT_EQ(llama->encode_prompt("Hello world"), (Ids{128000, 9906, 1917}));
  EXPECT_EQ(llama->encode_prompt("<|begin_of_text|>Hello world"), (Ids{128000, 9906, 1917}));
  EXPECT_EQ(llama->encode_prompt(""), (Ids{128000}));
  EXPECT_EQ(llama->eos_ids(), (Ids{128001, 128008, 128009}));
  EXPECT_NE(llama->chat_template().find("start_header_id"), std::string::npos);
}

TEST(Tokenizer, QwenHasNoBos) {
  REQUIRE_TOKENIZER(qwen, "qwen3");
  EXPECT_FALSE(qwen->bos_id().has_value());
  EXPECT_FALSE(qwen->adds_bos());
  EXPECT_EQ(qwen->encode_prompt("Hello world"), qwen->encode("Hello world"));
  EXPECT_EQ(qwen->eos_ids(), (Ids{151643, 151645}));
  EXPECT_EQ(qwen->eos_token(), "<|im_end|>");
  EXPECT_EQ(qwen->bos_token(), "");
  EXPECT_EQ(qwen->vocab_size(), 151669);
  EXPECT_NE(qwen->chat_template().find("<|im_start|>"), std::string::npos);
}

TEST(Tokenizer, BosFromTemplateProcessingIsNotDoubled) {
  ScratchDir dir("tok_template");
  json j = toy_tokenizer(json::array(), {}, json::array({added_token(256, "<s>")}));
  j["post_processor"] = json::parse(R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [256], "tokens": ["<s>"]}}}]})");
  const Tokenizer tok = load_json(dir, j, json{{"bos_token", "<s>"}, {"eos_token", {{"content", "<s>"}}}});
  EXPECT_EQ(tok.encode("ab"), (Ids{256, 'a', 'b'}));       // tokenizers' post-processor
  EXPECT_EQ(tok.encode("<s>ab"), (Ids{256, 256, 'a', 'b'}));  // it does double, as tokenizers does
  EXPECT_EQ(tok.encode_raw("<s>ab"), (Ids{256, 'a', 'b'}));
  EXPECT_TRUE(tok.adds_bos());
  EXPECT_EQ(tok.encode_prompt("ab"), (Ids{256, 'a', 'b'}));
  EXPECT_EQ(tok.encode_prompt("<s>ab"), (Ids{256, 'a', 'b'}));  // a prompt never does
  EXPECT_EQ(tok.eos_ids(), (Ids{256}));

  // add_bos_token in tokenizer_config.json overrides the guess.
  const Tokenizer off = load_json(dir, j, json{{"bos_token", "<s>"}, {"add_bos_token", false}});
  EXPECT_FALSE(off.adds_bos());
  EXPECT_EQ(off.encode_prompt("ab"), (Ids{'a', 'b'}));
}

TEST(Tokenizer, SmolLM2FromGguf) {
  REQUIRE_TOKENIZER(smol, "smollm2");
  EXPECT_EQ(smol->vocab_size(), 49152);
  EXPECT_EQ(smol->token_string(1), "<|im_start|>");
  EXPECT_EQ(smol->token_string(2), "<|im_end|>");
  EXPECT_TRUE(smol->is_special(0));
  EXPECT_FALSE(smol->is_special(905));
  EXPECT_EQ(smol->bos_id(), 1);
  EXPECT_FALSE(smol->adds_bos());  // tokenizer.ggml.add_bos_token = false
  EXPECT_EQ(smol->eos_ids(), (Ids{0, 2}));
  EXPECT_EQ(smol->eos_token(), "<|im_end|>");
  EXPECT_EQ(smol->encode("Hello world"), (Ids{19556, 905}));
  EXPECT_EQ(smol->encode_prompt("Hello world"), (Ids{19556, 905}));
  // SmolLM2's own pre-tokenizer (GGUF "smollm") splits digits first: "  12" keeps its two
  // spaces together, where a plain GPT-2 split (transformers' GGUF loader) gives 216, 216.
  EXPECT_EQ(smol->encode("  12"), (Ids{256, 33, 34}));
  EXPECT_EQ(smol->encode("<|im_start|>user\nHi<|im_end|>"), (Ids{1, 4093, 198, 26843, 2}));
  EXPECT_NE(smol->chat_template().find("<|im_start|>"), std::string::npos);
  expect_error([&] { smol->token_string(49152); }, "unknown token id 49152");
  expect_error([&] { smol->decode(Ids{-1}); }, "unknown token id -1");
}

// The tokenizer.json that `tessera synth` writes for SmolLM2 (from the GGUF's metadata, in
// SmolLM2's own layout) and the GGUF route give the same ids and the same family facts.
TEST(Tokenizer, SmolLM2JsonFromGgufAgreesWithGguf) {
  REQUIRE_TOKENIZER(smol, "smollm2");
  ScratchDir dir("tok_smol_json");
  write_smollm2_tokenizer(testing_support::default_gguf(), dir.str());
  const Tokenizer json_tok = Tokenizer::from_json_file(dir.str("tokenizer.json"));
  std::vector<std::string> texts = {"Hello world", "  12", "x \u00b2", "<|im_start|>user\nHi<|im_end|>",
                                    "DON'T 1234 caf\u00e9 \u4e2d\u6587 \U0001F600"};
  const fs::path fx = fs::path(fixture_dir()) / "smollm2.json";
  if (fs::exists(fx)) {
    const json cases = json::parse(slurp(fx))["cases"];
    for (const json& c : cases) texts.push_back(c["text"].get<std::string>());
  }
  for (const std::string& t : texts) EXPECT_EQ(json_tok.encode(t), smol->encode(t)) << json(t).dump();
  EXPECT_EQ(json_tok.vocab_size(), smol->vocab_size());
  EXPECT_EQ(json_tok.bos_id(), smol->bos_id());
  EXPECT_EQ(json_tok.adds_bos(), smol->adds_bos());
  EXPECT_EQ(json_tok.eos_ids(), smol->eos_ids());
  EXPECT_EQ(json_tok.eos_token(), smol->eos_token());
  EXPECT_EQ(json_tok.chat_template(), smol->chat_template());
  for (int32_t id : {0, 1, 2, 16, 17, 905, 49151}) {
    EXPECT_EQ(json_tok.token_string(id), smol->token_string(id));
    EXPECT_EQ(json_tok.is_special(id), smol->is_special(id));
  }
}

TEST(Tokenizer, ForModelReadsTheGgufMetadata) {
  if (!fs::exists(testing_support::default_gguf())) GTEST_SKIP() << "default model absent (scripts/setup.sh)";
  const Model model = Model::open(testing_support::default_gguf());
  const Tokenizer tok = Tokenizer::for_model(model);
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.encode("Hello world"), (Ids{19556, 905}));
}

// A small GGUF with only tokenizer metadata.
void write_tokenizer_gguf(const std::string& path, const std::string& model, const std::string& pre,
                          const std::vector<std::string>& extra_tokens = {}) {
  GgufWriter w(path);
  w.add_string("general.architecture", "llama");
  w.add_string("tokenizer.ggml.model", model);
  if (!pre.empty()) w.add_string("tokenizer.ggml.pre", pre);
  std::vector<std::string> tokens;
  std::vector<double> types;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_level::byte_to_utf8(uint8_t(b))), types.push_back(1);
  tokens.push_back("ab"), types.push_back(1);
  tokens.push_back("<|eot|>"), types.push_back(3);
  for (const auto& t : extra_tokens) tokens.push_back(t), types.push_back(4);
  w.add_array("tokenizer.ggml.tokens", tokens);
  w.add_array("tokenizer.ggml.token_type", GgufValue::Type::I32, types);
  w.add_array("tokenizer.ggml.merges", std::vector<std::string>{"a b"});
  w.add_u32("tokenizer.ggml.bos_token_id", 257);
  w.add_u32("tokenizer.ggml.eos_token_id", 257);
  w.close();
}

TEST(Tokenizer, GgufPreTokenizersAndRefusals) {
  ScratchDir dir("tok_gguf");
  const std::string path = dir.str("t.gguf");
  write_tokenizer_gguf(path, "gpt2", "llama-bpe", {"<user>"});
  const Tokenizer llama = Tokenizer::from_gguf(GgufFile::open(path));
  // Llama 3's split keeps numbers in runs of three; add_bos_token is absent, and llama-bpe
  // then adds BOS (llama.cpp's rule) both in encode and in prompts.
  EXPECT_EQ(llama.encode("ab 12345"), (Ids{257, 256, ' ', '1', '2', '3', '4', '5'}));
  EXPECT_EQ(llama.encode_prompt("<|eot|>ab"), (Ids{257, 256}));
  EXPECT_TRUE(llama.is_special(257));
  EXPECT_FALSE(llama.is_special(258));
  EXPECT_EQ(llama.encode_raw("x<user>"), (Ids{'x', 258}));

  write_tokenizer_gguf(path, "gpt2", "smollm");
  const Tokenizer smol = Tokenizer::from_gguf(GgufFile::open(path));
  EXPECT_FALSE(smol.adds_bos());
  EXPECT_EQ(smol.encode("  12"), (Ids{' ', ' ', '1', '2'}));  // no "ĠĠ" token in this vocabulary
  EXPECT_EQ(smol.eos_ids(), (Ids{257}));

  write_tokenizer_gguf(path, "gpt2", "");  // no pre name: GPT-2's split
  EXPECT_EQ(Tokenizer::from_gguf(GgufFile::open(path)).encode("ab"), (Ids{256}));

  write_tokenizer_gguf(path, "gpt2", "deepseek-coder");
  expect_error([&] { Tokenizer::from_gguf(GgufFile::open(path)); },
               "unsupported tokenizer feature: tokenizer.ggml.pre 'deepseek-coder'");
  write_tokenizer_gguf(path, "llama", "default");
  expect_error([&] { Tokenizer::from_gguf(GgufFile::open(path)); },
               "unsupported tokenizer feature: tokenizer.ggml.model 'llama' (SentencePiece)");
}

// fuzz_gguf (the campaign, 2026-12-06): a token type far outside int's range (2.7e9 in a
// truncated copy of the default model's header; the input is fuzz/corpus/gguf/crash-token-type)
// was converted to int, undefined behaviour; a token type that is not an integer 0-6 is now
// refused by name.
TEST(Tokenizer, FuzzTokenTypeOutOfRangeIsRefused) {
  ScratchDir dir("tok_gguf_type");
  const std::string path = dir.str("t.gguf");
  for (const auto& [type, elem] : std::vector<std::pair<double, GgufValue::Type>>{
           {2697200000.0, GgufValue::Type::U32}, {-1, GgufValue::Type::I32}, {7, GgufValue::Type::I32},
           {1.5, GgufValue::Type::F32}}) {
    SCOPED_TRACE(type);
    GgufWriter w(path);
    w.add_string("tokenizer.ggml.model", "gpt2");
    std::vector<std::string> tokens;
    std::vector<double> types;
    for (int b = 0; b < 256; ++b) tokens.push_back(byte_level::byte_to_utf8(uint8_t(b))), types.push_back(1);
    types[42] = type;
    w.add_array("tokenizer.ggml.tokens", tokens);
    w.add_array("tokenizer.ggml.token_type", elem, types);
    w.add_array("tokenizer.ggml.merges", std::vector<std::string>{});
    w.close();
    expect_error([&] { Tokenizer::from_gguf(GgufFile::open(path)); },
                 "tokenizer.ggml.token_type of token 42 is");
  }
  const std::string verbatim = std::string(TESSERA_SOURCE_DIR) + "/fuzz/corpus/gguf/crash-token-type";
  ASSERT_TRUE(fs::exists(verbatim));
  expect_error([&] { Tokenizer::from_gguf(GgufFile::open(verbatim)); }, "tokenizer.ggml.token_type of token");
}

// ---- the CLI -------------------------------------------------------------------------------

TEST(TokenizeCli, TokenizeAndDetokenize) {
  const std::string llama_dir = tokenizers_dir() + "/llama3";
  if (!fs::exists(llama_dir + "/tokenizer.json")) GTEST_SKIP() << "no shared llama3 tokenizer";
  auto r = run_tessera("tokenize " + llama_dir + " --text 'Hello world'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "9906,1917\n");
  r = run_tessera("tokenize " + llama_dir + "/tokenizer.json --text 'Hello world' --prompt");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "128000,9906,1917\n");
  r = run_tessera("tokenize " + llama_dir + " --text ' world' --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out), json::parse(R"([{"id": 1917, "piece": "Ġworld", "text": " world"}])"));
  r = run_tessera("detokenize " + llama_dir + " --ids 128000,9906,1917");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<|begin_of_text|>Hello world\n");
  r = run_tessera("detokenize " + llama_dir + " --ids 128000,9906,1917 --skip-special");
  EXPECT_EQ(r.out, "Hello world\n");

  r = run_tessera("detokenize " + llama_dir + " --ids 9906,999999");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown token id 999999"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  r = run_tessera("detokenize " + llama_dir + " --ids 1,x");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("'x' is not a token id"), std::string::npos) << r.err;

  ScratchDir dir("tok_cli");
  write_file(dir.path() / "bad.txt", "ok\xC3");
  r = run_tessera("tokenize " + llama_dir + " --file " + dir.str("bad.txt"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("byte offset 2"), std::string::npos) << r.err;
  r = run_tessera("tokenize " + dir.str() + " --text hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no tokenizer.json"), std::string::npos) << r.err;
  r = run_tessera("tokenize " + llama_dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("exactly one of --text or --file"), std::string::npos) << r.err;
}

TEST(TokenizeCli, DefaultModel) {
  if (!fs::exists(testing_support::default_gguf())) GTEST_SKIP() << "default model absent (scripts/setup.sh)";
  auto r = run_tessera("tokenize --text '<|im_start|>user'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "1,4093\n");
  r = run_tessera("detokenize --ids 1,4093,2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<|im_start|>user<|im_end|>\n");
}

}  // namespace
}  // namespace tessera
