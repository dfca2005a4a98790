// `tessera perplexity MODEL --file TEXT`: the model's perplexity over a text file, computed as
// llama.cpp's llama-perplexity computes it (eval/perplexity.h), so the two can be compared on
// the same file (bench/perplexity.sh runs both). Progress on stderr; the estimate on stdout.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "eval/perplexity.h"
#include "pipeline/executor.h"
#include "pipeline/perturb.h"
#include "targets/registry.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/parallel.h"

namespace tessera::cli {

namespace {

struct PerplexityArgs {
  std::string model;
  std::string file;
  std::string target;
  int64_t ctx = 512;
  int64_t batch = 0;
  int64_t chunks = -1;
  bool chunks_given = false;
  int threads = 0;
  std::vector<std::string> perturbations;
  bool json = false;
};

// The file as llama.cpp's `-f` reads it: every byte, less one trailing newline.
std::string read_text(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("--file {}: no such file", path);
  if (fs::is_directory(path, ec)) fail("--file {}: is a directory, not a text file", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("--file {}: cannot be read", path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

std::string fixed(double v, int digits) { return std::isfinite(v) ? fmt::format("{:.{}f}", v, digits) : "nan"; }

void run_perplexity(const PerplexityArgs& a) {
  if (a.file.empty()) fail("--file is required: the text to score");
  // What can be refused before the model loads.
  if (a.ctx < 4) fail("--ctx must be at least 4 (half of each chunk is context, the rest is scored), got {}", a.ctx);
  if (a.chunks_given && a.chunks < 1) fail("--chunks must be at least 1, got {}", a.chunks);
  if (a.batch < 0) fail("--batch must be at least 1, got {}", a.batch);
  if (a.threads < 0) fail("--threads must be at least 1, got {}", a.threads);
  const std::string text = read_text(a.file);

  for (const std::string& p : a.perturbations) parse_perturbation(p);  // refused before the model loads
  Executor ex = open_executor(a.model, a.target, a.threads);
  ModelRunner& runner = *ex.runner;
  if (!a.perturbations.empty()) {
    auto* staged = dynamic_cast<StagedRunner*>(&runner);
    if (!staged) fail("--perturb: the {} target has no stages to perturb", runner.target());
    staged->set_output_tap(perturbation_tap(a.perturbations));
  }
  const Tokenizer tok = Tokenizer::for_model(*ex.model);
  const PerplexityTokens t = perplexity_tokens(tok, text);

  PerplexityOptions o;
  o.n_ctx = a.ctx;
  o.max_chunks = a.chunks_given ? a.chunks : -1;
  o.bos_id = t.bos_id;
  o.batch = a.batch;
  const int64_t n_tokens = int64_t(t.ids.size());
  if (a.ctx <= runner.spec().max_position && n_tokens < 2 * a.ctx)
    fail("--file {} tokenizes to only {} tokens; perplexity with a context of {} needs at least {} (2 x --ctx, as "
         "llama-perplexity): give a longer text or a smaller --ctx",
         a.file, n_tokens, a.ctx, 2 * a.ctx);
  check_perplexity_options(runner.spec(), n_tokens, o);
  const int threads = a.threads > 0 ? a.threads : default_threads();
  const int64_t n_chunks = o.max_chunks < 0 ? n_tokens / a.ctx : std::min(n_tokens / a.ctx, o.max_chunks);

  fmt::print(stderr, "perplexity: {} on {}, {} threads\n", ex.source, ex.description, threads);
  fmt::print(stderr, "perplexity: {} tokenizes to {} tokens{}; {} chunks of {} ({} tokens left out), {} tokens scored in each\n",
             a.file, n_tokens, t.bos_id ? fmt::format(" (BOS {} first, and first in every chunk)", *t.bos_id) : "",
             n_chunks, a.ctx, n_tokens - n_chunks * a.ctx, a.ctx - 1 - a.ctx / 2);
  if (t.special_tokens_in_text > 0)
    fmt::print(stderr,
               "perplexity: warning: the text holds {} special-token string(s) that tessera tokenizes as special tokens; "
               "llama-perplexity tokenizes them as plain text (parse_special = false), so the two differ here\n",
               t.special_tokens_in_text);

  const PerplexityResult r = perplexity(runner, t.ids, o, [](int64_t i, int64_t, double running) {
    fmt::print(stderr, "[{}]{:.4f},", i + 1, running);
    std::fflush(stderr);
  });
  fmt::print(stderr, "\n");

  if (a.json) {
    auto number = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
    nlohmann::json j = {{"ppl", r.ppl},
                        {"stderr", number(r.ppl_error)},
                        {"n_ctx", r.n_ctx},
                        {"chunks", r.chunks},
                        {"tokens", r.n_tokens},
                        {"tokens_scored", r.tokens_scored},
                        {"tokens_evaluated", r.tokens_evaluated},
                        {"seconds", r.seconds},
                        {"tokens_per_second", r.tokens_per_second()},
                        {"mean_nll", r.mean_nll},
                        {"running_ppl", r.running_ppl},
                        {"add_bos", t.bos_id.has_value()},
                        {"special_tokens_in_text", t.special_tokens_in_text},
                        {"file", a.file},
                        {"model", ex.model->path()},
                        {"source", ex.source},
                        {"target", runner.target()},
                        {"executor_description", ex.description},
                        {"perturbations", a.perturbations},
                        {"threads", threads}};
    fmt::print("{}\n", j.dump(2));
    return;
  }
  if (std::isfinite(r.ppl_error))
    fmt::print("Final estimate: PPL = {:.4f} +/- {:.5f}\n", r.ppl, r.ppl_error);
  else
    fmt::print("Final estimate: PPL = {:.4f} +/- {} (no standard error: {} token(s) scored with no spread)\n", r.ppl,
               fixed(r.ppl_error, 5), r.tokens_scored);
  fmt::print("{} chunks x {} tokens = {} tokens evaluated ({} scored) in {:.2f} s: {:.1f} tokens/s\n", r.chunks, r.n_ctx,
             r.tokens_evaluated, r.tokens_scored, r.seconds, r.tokens_per_second());
}

}  // namespace

void add_perplexity_command(CLI::App& app) {
  auto a = std::make_shared<PerplexityArgs>();
  CLI::App* cmd = app.add_subcommand(
      "perplexity", "Perplexity of a model over a text file, computed as llama.cpp's llama-perplexity computes it");
  cmd->add_option("model", a->model,
                  "A Hugging Face directory or .gguf file, or a deployment directory (default: SmolLM2-135M-Instruct)");
  cmd->add_option("-f,--file", a->file, "The text to score (UTF-8; one trailing newline is dropped, as llama.cpp does)");
  cmd->add_option("-c,--ctx", a->ctx, "Tokens per chunk; the second half of each chunk is scored")->capture_default_str();
  cmd->add_option("--chunks", a->chunks, "Score at most N chunks (default: every whole chunk of the text)")
      ->each([a](const std::string&) { a->chunks_given = true; });
  cmd->add_option("-b,--batch", a->batch,
                  "Most tokens per forward call (default: each chunk in two calls, the unscored half and the scored half)");
  cmd->add_option("--target", a->target, "For a model: " + target_choices() + " or oracle (the FP32 reference)");
  cmd->add_option("-t,--threads", a->threads, "Worker threads (default: all cores)");
  cmd->add_option("--perturb", a->perturbations,
                  "STAGE:KIND:SIZE[:SCOPE] applied to a stage's output from outside the target (see `tessera deploy "
                  "--help`); e.g. attn_norm:int8:32 rounds the q|k|v input as llama.cpp's Q8_0 activations do");
  cmd->add_flag("--json", a->json, "Print one JSON object instead of the estimate lines");
  cmd->callback([a] { run_perplexity(*a); });
}

}  // namespace tessera::cli
