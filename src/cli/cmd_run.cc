// `tessera run` and `tessera chat`: generate text with a model, streaming tokens as they come.
// The executor is a deployment's frozen plan, or a model on a registered target (cpu by
// default, or the oracle).
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "model/weights.h"
#include "model/default_model.h"
#include "pipeline/executor.h"
#include "runtime/chat_session.h"
#include "runtime/generate.h"
#include "targets/registry.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace tessera::cli {

namespace {

struct RunArgs {
  std::string model;
  std::string prompt;
  bool prompt_given = false;
  bool chat = false;
  std::string system;
  std::string thinking;  // "", "on", "off"
  int n = 128;
  float temp = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  bool json = false;
  int threads = 0;
  std::string target;
};

GenerationOptions generation_options(const RunArgs& a) {
  GenerationOptions g;
  g.max_new_tokens = a.n;
  g.sampling = {a.temp, a.top_k, a.top_p, a.seed};
  g.sampling.validate();
  if (a.n < 0) fail("-n must be >= 0, got {}", a.n);
  return g;
}

ChatOptions chat_options(const RunArgs& a) {
  ChatOptions c;
  if (a.thinking == "on") c.enable_thinking = true;
  else if (a.thinking == "off") c.enable_thinking = false;
  else if (!a.thinking.empty()) fail("--thinking must be 'on' or 'off', got '{}'", a.thinking);
  return c;
}

// Text shaped like a special token ("<|...|>") that the tokenizer does not know is almost
// always a typo; the tokenizer would silently split it into ordinary pieces.
void refuse_unknown_special_tokens(const Tokenizer& tok, const std::string& text) {
  size_t at = 0;
  while ((at = text.find("<|", at)) != std::string::npos) {
    const size_t end = text.find("|>", at + 2);
    if (end == std::string::npos) break;
    const std::string name = text.substr(at, end + 2 - at);
    if (name.find_first_of(" \n\t") == std::string::npos && !tok.token_id(name))
      fail("unknown special token '{}' in the prompt: this tokenizer has no such token", name);
    at = end + 2;
  }
}

void print_stats(const GenerationResult& r) {
  fmt::print(stderr, "\n[prompt {} tokens, {:.1f} tok/s | generated {} tokens, {:.1f} tok/s | stop: {}]\n",
             r.prompt_tokens, r.prefill_tokens_per_second(), r.tokens.size(), r.decode_tokens_per_second(),
             r.stop_reason);
}

// `first_line` goes to stderr once, when the first token arrives: what runs (and, for a
// deployment, whether phase 0 was verified), after the prompt was accepted.
TokenCallback streaming(bool enabled, std::string first_line = "") {
  if (!enabled) return {};
  return [first_line, said = false](int32_t, const std::string& text) mutable {
    if (!said && !first_line.empty()) fmt::print(stderr, "{}\n", first_line);
    said = true;
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return true;
  };
}

void run_run(const RunArgs& a) {
  if (!a.prompt_given) fail("--prompt is required (use `tessera chat` for a conversation)");
  const GenerationOptions gen = generation_options(a);
  Executor ex = open_executor(a.model, a.target, a.threads);
  Tokenizer tok = Tokenizer::for_model(*ex.model);
  ModelRunner& runner = *ex.runner;
  const std::string first_line = fmt::format("running {} on {}", ex.model->path(), ex.description);

  refuse_unknown_special_tokens(tok, a.prompt);
  refuse_unknown_special_tokens(tok, a.system);
  GenerationResult r;
  std::vector<int32_t> prompt_ids;
  if (a.chat || !a.system.empty()) {
    ChatSession chat(runner, tok, a.system.empty() ? std::nullopt : std::optional(a.system), chat_options(a));
    r = chat.reply(a.prompt, gen, streaming(!a.json, first_line));
    prompt_ids = chat.last_prompt_ids();
  } else {
    if (a.prompt.empty()) fail("the prompt is empty: give some text to continue");
    prompt_ids = tok.encode_prompt(a.prompt);
    r = Generator(runner, tok).generate(prompt_ids, gen, streaming(!a.json, first_line));
  }
  if (a.json) {
    nlohmann::json j;
    j["model"] = ex.model->path();
    j["source"] = ex.source;
    j["prompt_ids"] = prompt_ids;
    j["generated_ids"] = r.tokens;
    j["text"] = r.text;
    j["stop_reason"] = r.stop_reason;
    j["prefill_tokens_per_second"] = r.prefill_tokens_per_second();
    j["decode_tokens_per_second"] = r.decode_tokens_per_second();
    j["executor"] = runner.target();
    j["executor_description"] = ex.description;
    fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    if (r.tokens.empty()) fmt::print(stderr, "{}\n", first_line);  // nothing streamed: say it here
    print_stats(r);
  }
}

void run_chat(const RunArgs& a) {
  const GenerationOptions gen = generation_options(a);
  Executor ex = open_executor(a.model, a.target, a.threads);
  Tokenizer tok = Tokenizer::for_model(*ex.model);
  ChatSession chat(*ex.runner, tok, a.system.empty() ? std::nullopt : std::optional(a.system), chat_options(a));
  fmt::print(stderr, "chatting with {} ({} layers) on {}; /reset forgets the conversation, /exit or Ctrl-D ends it\n",
             ex.model->path(), ex.model->spec().n_layers, ex.description);
  std::string line;
  while (true) {
    fmt::print(stderr, "> ");
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      chat.reset();
      fmt::print(stderr, "(conversation forgotten)\n");
      continue;
    }
    if (line.empty()) continue;
    try {
      refuse_unknown_special_tokens(tok, line);
      GenerationResult r = chat.reply(line, gen, streaming(true));
      print_stats(r);
    } catch (const Error& e) {  // a bad message should not end the conversation
      fmt::print(stderr, "tessera: error: {}\n", e.what());
    }
  }
  fmt::print(stderr, "\n");
}

void add_generation_options(CLI::App* cmd, RunArgs& a) {
  cmd->add_option("model", a.model,
                  "A deployment directory (runs its frozen plan), or a Hugging Face directory or .gguf file "
                  "(default: SmolLM2-135M-Instruct)");
  cmd->add_option("--target", a.target,
                  "For a model: " + target_choices() + " or oracle (the FP32 reference); a deployment runs on its own target");
  cmd->add_option("--system", a.system, "System message (implies the chat template)");
  cmd->add_option("--thinking", a.thinking, "Qwen3 thinking switch: on or off (default: the template's)");
  cmd->add_option("-n,--max-tokens", a.n, "Most tokens to generate")->capture_default_str();
  cmd->add_option("--temp", a.temp, "Sampling temperature; 0 is greedy")->capture_default_str();
  cmd->add_option("--top-k", a.top_k, "Sample among the K most likely tokens; 0 is no limit")->capture_default_str();
  cmd->add_option("--top-p", a.top_p, "Nucleus sampling mass")->capture_default_str();
  cmd->add_option("--seed", a.seed, "Random seed for sampling")->capture_default_str();
  cmd->add_option("--threads", a.threads, "Worker threads (default: all cores)");
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Generate text from a prompt, streaming tokens as they are produced (a deployment's plan or the cpu target)");
  add_generation_options(cmd, *a);
  cmd->add_option("--prompt", a->prompt, "Prompt text")->each([a](const std::string&) { a->prompt_given = true; });
  cmd->add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template as a user message");
  cmd->add_flag("--json", a->json, "Print one JSON object at the end instead of streaming");
  cmd->callback([a] { run_run(*a); });
}

void add_chat_command(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand("chat", "Interactive conversation with a model's chat template (reads stdin)");
  add_generation_options(cmd, *a);
  cmd->callback([a] { run_chat(*a); });
}

}  // namespace tessera::cli
