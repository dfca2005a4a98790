// `tessera serve`'s HTTP side (cpp-httplib): the OpenAI routes, /health, /metrics, the chat
// page at / (src/serve/chat_page.html, embedded at build time), the API key, the body limit, OpenAI-shaped errors for every failure status. It listens before the
// model is loaded (/health says "loading", the API 503) and serves once attach() gives it
// the scheduler. Every request is parsed by openai_api and run by the scheduler; a bad
// request is answered and forgotten.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "serve/metrics.h"
#include "serve/scheduler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
}

namespace tessera::serve {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;               // 0: any free port (bound_port() says which)
  std::string api_key;           // "": none asked
  int timeout_seconds = 600;     // read and write timeout of a connection
  size_t max_body_bytes = 8u << 20;
  int threads = 8;               // connections served at once (streams hold one each)
};

// The chat page GET / answers with (src/serve/chat_page.html as built into the binary).
std::string_view chat_page();

// What the server needs once the model is loaded.
struct Backend {
  std::string model_id;
  const Tokenizer* tokenizer = nullptr;
  std::optional<ChatTemplate> chat_template;  // none: /v1/chat/completions answers 400
  Scheduler* scheduler = nullptr;
};

class HttpServer {
 public:
  HttpServer(HttpOptions options, Metrics& metrics);
  ~HttpServer();
  // Binds the socket (throws tessera::Error when it cannot); then listen() serves until stop().
  void bind();
  int bound_port() const { return port_; }
  void listen();
  void stop();
  void attach(const Backend& backend);  // from now on /health is "ok"
  void detach();                        // before the backend goes away

 private:
  void routes();
  HttpOptions options_;
  Metrics& metrics_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::mutex state_m_;
  bool listening_ = false, stopped_ = false;
  std::atomic<const Backend*> backend_{nullptr};
  Backend held_;
  int64_t created_ = 0;
};

}  // namespace tessera::serve
