// `tessera serve`: an OpenAI-compatible HTTP server over a model on the cpu target or a
// deployment's frozen plan (src/serve/). It listens at once (/health says "loading" until
// the model is in), then serves --parallel slots from one copy of the weights.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "cli/commands.h"
#include "pipeline/deployment.h"
#include "pipeline/executor.h"
#include "serve/http_server.h"
#include "serve/scheduler.h"
#include "targets/registry.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace tessera::cli {

namespace {

struct ServeArgs {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 1;
  int64_t ctx_size = 0;
  int queue = 16;
  std::string api_key;
  int timeout = 600;
  int threads = 0;
  int prefill_chunk = 64;
  int64_t max_body_mib = 8;
};

std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop = true; }

// `tessera serve` runs requests on the targets whose entry says it serves them.
void refuse_unless_served(const std::string& target, const std::string& what) {
  if (target == "oracle") fail("{}: the FP32 oracle is a reference, not a target `tessera serve` runs", what);
  const TargetDef& d = target_def(target);
  if (d.serves) return;
  std::vector<std::string> serving;
  for (const TargetDef& t : target_defs())
    if (t.serves) serving.push_back(t.name);
  fail("{} is on the target '{}', which `tessera serve` does not serve ({}); it serves {}: deploy on one of those to serve it",
       what, target, d.serve_refusal.empty() ? "its entry does not say it serves" : d.serve_refusal,
       fmt::join(serving, ", "));
}

void run_serve(const ServeArgs& a) {
  if (a.parallel < 1) fail("--parallel must be >= 1, got {}", a.parallel);
  if (a.ctx_size < 0) fail("--ctx-size must be >= 0, got {}", a.ctx_size);
  if (a.queue < 0) fail("--queue must be >= 0, got {}", a.queue);
  if (a.port < 0 || a.port > 65535) fail("--port must be in [0, 65535], got {}", a.port);
  if (a.timeout < 1) fail("--timeout must be >= 1 second, got {}", a.timeout);
  if (a.prefill_chunk < 0 || (a.prefill_chunk > 0 && a.prefill_chunk < int(serve::kMinPrefillRows)))
    fail("--prefill-chunk must be 0 or at least {}, got {}", serve::kMinPrefillRows, a.prefill_chunk);
  if (a.max_body_mib < 1) fail("--max-body must be >= 1 MiB, got {}", a.max_body_mib);
  // What cannot serve is refused before anything listens.
  if (is_deployment_dir(a.model)) {
    const std::string target = Deployment::open_existing(a.model).identity().value("target", "");
    refuse_unless_served(target, a.model);
  }

  serve::HttpOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.api_key = a.api_key;
  ho.timeout_seconds = a.timeout;
  ho.max_body_bytes = size_t(a.max_body_mib) << 20;
  ho.threads = a.parallel + a.queue + 4;
  serve::Metrics metrics;
  serve::HttpServer server(ho, metrics);
  server.bind();
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::thread listener([&] { server.listen(); });
  fmt::print(stderr, "tessera serve: listening on http://{}:{} (loading the model)\n", a.host, server.bound_port());

  // Test hook: hold the server in its loading state this long, so tests can see /health
  // answer "loading" and the API 503 however fast the model loads.
  if (const char* d = std::getenv("TESSERA_SERVE_LOAD_DELAY_MS"))
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(d)));
  Executor ex;  // the model outlives the runners, the tokenizer and the scheduler
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<serve::Scheduler> scheduler;
  try {
    ex = open_executor(a.model, "", a.threads);
    refuse_unless_served(ex.runner->target(), a.model);
    tok = std::make_unique<Tokenizer>(Tokenizer::for_model(*ex.model));
    serve::Backend b;
    b.model_id = std::filesystem::path(ex.source).filename().string();
    if (b.model_id.empty()) b.model_id = std::filesystem::path(ex.source).parent_path().filename().string();
    b.tokenizer = tok.get();
    if (!tok->chat_template().empty()) {
      try {
        b.chat_template = ChatTemplate::from_source(tok->chat_template(), tok->bos_token(), tok->eos_token());
      } catch (const Error& e) {
        fmt::print(stderr, "tessera serve: /v1/chat/completions is off: {}\n", e.what());
      }
    } else {
      fmt::print(stderr, "tessera serve: this model ships no chat template: /v1/chat/completions answers 400\n");
    }
    serve::SchedulerOptions so;
    so.ctx_size = a.ctx_size;
    so.queue_size = a.queue;
    so.prefill_chunk = a.prefill_chunk;
    scheduler = std::make_unique<serve::Scheduler>(std::move(ex.runner), a.parallel, *tok, so, metrics);
    b.scheduler = scheduler.get();
    server.attach(b);
    fmt::print(stderr, "tessera serve: ready: {} on {}; {} slot(s) of {} tokens, queue {}; model id '{}'\n",
               ex.model->path(), ex.description, a.parallel, scheduler->ctx_size(), a.queue, b.model_id);
  } catch (...) {
    server.stop();
    listener.join();
    throw;
  }
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  fmt::print(stderr, "tessera serve: stopping\n");
  scheduler->shutdown();  // ends every stream, so the connections close
  server.stop();
  listener.join();
  server.detach();
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, /health, "
               "/metrics, and a chat page at /) over a model on the cpu target or a cpu deployment's frozen plan");
  cmd->add_option("model", a->model,
                  "A cpu deployment directory (serves its frozen plan; refused before phase 6 passed), or a Hugging "
                  "Face directory or .gguf file (default: SmolLM2-135M-Instruct)");
  cmd->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a->port, "TCP port (0: any free port, printed on stderr)")->capture_default_str();
  cmd->add_option("--parallel", a->parallel,
                  "Slots: requests served at once, each a sequence with its own KV cache on one copy of the weights (each "
                  "decode step runs every active slot's next token in one pass over the weights)")
      ->capture_default_str();
  cmd->add_option("--ctx-size", a->ctx_size, "Tokens per slot, prompt and answer (0: the model's context)")
      ->capture_default_str();
  cmd->add_option("--queue", a->queue, "Requests that may wait for a slot; beyond them the server answers 429")
      ->capture_default_str();
  cmd->add_option("--api-key", a->api_key, "Require 'Authorization: Bearer KEY' on /v1/ (401 otherwise)");
  cmd->add_option("--timeout", a->timeout, "Seconds a connection may stall reading or writing")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Worker threads (default: all cores; a deployment: its recorded threads)");
  cmd->add_option("--prefill-chunk", a->prefill_chunk,
                  "Prompt tokens prefilled per scheduler step between decode steps, at least 16 (0: a whole prompt at once)")
      ->capture_default_str();
  cmd->add_option("--max-body", a->max_body_mib, "Largest request body in MiB (413 beyond)")->capture_default_str();
  cmd->callback([a] { run_serve(*a); });
}

}  // namespace tessera::cli
