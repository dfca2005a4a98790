// `tessera tokenize` and `tessera detokenize`: text to token ids and back with a model's
// tokenizer (or a bare tokenizer.json), exactly as Hugging Face `tokenizers` encodes.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "io/gguf.h"
#include "model/default_model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace tessera::cli {

namespace {

constexpr const char* kSourceHelp =
    "Model (Hugging Face directory or .gguf file), a directory holding tokenizer.json, or a tokenizer.json "
    "file (default: SmolLM2-135M-Instruct)";

// The tokenizer behind a command-line argument: a .gguf's metadata, tokenizer.json in a
// directory, or a tokenizer.json file. Only the tokenizer is read, never the weights.
Tokenizer open_tokenizer(const std::string& arg) {
  const std::string path = resolve_model_path(arg);
  if (fs::is_directory(path)) {
    const fs::path tj = fs::path(path) / "tokenizer.json";
    if (!fs::is_regular_file(tj)) fail("{}: no tokenizer.json in this directory", path);
    return Tokenizer::from_json_file(tj.string());
  }
  if (!fs::is_regular_file(path)) fail("{} does not exist", path);
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  if (in.gcount() == 4 && std::string_view(magic, 4) == "GGUF") return Tokenizer::from_gguf(GgufFile::open(path));
  if (fs::path(path).extension() == ".json") return Tokenizer::from_json_file(path);
  fail("{} is neither a GGUF file, a tokenizer.json nor a directory", path);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct TokenizeArgs {
  std::string source, text, file;
  bool text_given = false;
  bool json = false;
  bool prompt = false;
  bool bench = false;
};

void run_bench(const std::string& source, const std::string& text, bool prompt) {
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  const Tokenizer tok = open_tokenizer(source);
  const double load_s = std::chrono::duration<double>(clock::now() - t0).count();
  auto encode = [&] { return prompt ? tok.encode_prompt(text) : tok.encode(text); };
  // The first pass starts with an empty word cache (what a new text costs); later passes
  // find every word cached, the speed of text in a familiar vocabulary.
  t0 = clock::now();
  const size_t n_tokens = encode().size();
  const double first_s = std::chrono::duration<double>(clock::now() - t0).count();
  double best_s = first_s;
  int passes = 1;
  const auto start = clock::now();
  while (std::chrono::duration<double>(clock::now() - start).count() < 2.0 && passes < 50) {
    t0 = clock::now();
    (void)encode();
    best_s = std::min(best_s, std::chrono::duration<double>(clock::now() - t0).count());
    ++passes;
  }
  const double mb = double(text.size()) / 1e6;
  fmt::print("tokenizer loaded in {:.2f} s\n", load_s);
  fmt::print("{} bytes -> {} tokens ({:.2f} bytes/token), one thread\n", text.size(), n_tokens,
             n_tokens ? double(text.size()) / double(n_tokens) : 0.0);
  fmt::print("first pass (empty word cache): {:.3f} s, {:.2f} MB/s\n", first_s, mb / first_s);
  fmt::print("best of {} passes (warm cache): {:.3f} s, {:.2f} MB/s\n", passes, best_s, mb / best_s);
}

void run_tokenize(const TokenizeArgs& a) {
  if (a.text_given == !a.file.empty()) fail("give the text with exactly one of --text or --file");
  const std::string text = a.file.empty() ? a.text : read_file(a.file);
  if (a.bench) return run_bench(a.source, text, a.prompt);
  const Tokenizer tok = open_tokenizer(a.source);
  const std::vector<int32_t> ids = a.prompt ? tok.encode_prompt(text) : tok.encode(text);
  if (!a.json) {
    fmt::print("{}\n", fmt::join(ids, ","));
    return;
  }
  nlohmann::json out = nlohmann::json::array();
  for (const int32_t id : ids)
    out.push_back({{"id", id}, {"piece", tok.token_string(id)}, {"text", tok.token_bytes(id)}});
  // A byte-level token can be part of a multi-byte character: its text shows U+FFFD there.
  fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

struct DetokenizeArgs {
  std::string source, ids;
  bool skip_special = false;
};

void run_detokenize(const DetokenizeArgs& a) {
  const std::vector<int32_t> ids = parse_ids(a.ids);
  const Tokenizer tok = open_tokenizer(a.source);
  const std::string text = tok.decode(ids, a.skip_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Encode text into token ids with a model's tokenizer, exactly as Hugging Face `tokenizers` "
                  "does (special tokens written in the text are matched); prints the ids comma-separated");
  cmd->add_option("model", args->source, kSourceHelp);
  CLI::Option* text = cmd->add_option("--text", args->text, "The text to encode");
  cmd->add_option("--file", args->file, "Encode the bytes of this file instead (must be UTF-8)");
  cmd->add_flag("--json", args->json,
                "Print a JSON list of {\"id\", \"piece\" (the vocabulary string), \"text\" (what the token decodes to)}");
  cmd->add_flag("--prompt", args->prompt,
                "Encode as a generation prompt: the family's BOS rule (one BOS first where the family uses one, "
                "never two) instead of the tokenizer's post-processor");
  cmd->add_flag("--bench", args->bench,
                "Instead of printing ids, time the encoding on one thread and print the speed in MB/s");
  cmd->callback([args, text] {
    args->text_given = text->count() > 0;  // --text "" is a text too
    run_tokenize(*args);
  });
}

void add_detokenize_command(CLI::App& app) {
  auto args = std::make_shared<DetokenizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "detokenize", "Decode token ids back into text with a model's tokenizer; prints the text and a newline");
  cmd->add_option("model", args->source, kSourceHelp);
  cmd->add_option("--ids", args->ids, "Comma-separated token ids, e.g. 1,9690,42")->required();
  cmd->add_flag("--skip-special", args->skip_special, "Leave out special tokens (such as <|im_start|>)");
  cmd->callback([args] { run_detokenize(*args); });
}

}  // namespace tessera::cli
