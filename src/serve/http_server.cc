#include "serve/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <thread>

#include "util/error.h"

namespace tessera::serve {

using json = nlohmann::json;

namespace {

const char* kJson = "application/json";

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_body(e), kJson);
}

std::string request_id(const char* prefix) {
  static std::atomic<uint64_t> next{1};
  return fmt::format("{}-{:x}{:06x}", prefix, uint64_t(std::time(nullptr)), next++);
}

// The label /metrics counts a path under (unknown paths together, so clients cannot grow it).
std::string endpoint_label(const std::string& path) {
  for (const char* known : {"/", "/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"})
    if (path == known) return known;
  return "other";
}

// cpp-httplib 0.11.4 (Debian's) tells a handler nothing of its connection: no socket, and no
// Request::is_connection_closed (later versions; asked for upstream in issue #2017, 2025). A
// non-streamed answer is written only once it is complete, so without a look at the socket a
// client that hangs up keeps its slot generating to the end. The request names its connection
// (both ends' addresses and ports, which httplib read with getpeername/getsockname and
// getnameinfo), so the socket is the descriptor of this process with those two ends; -1 when
// none is found (no /proc).
std::string numeric_host(const sockaddr_storage& a, socklen_t n, int& port) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), n, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "";
  port = std::atoi(serv);
  return host;
}

int connection_socket(const httplib::Request& req) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    sockaddr_storage peer{}, local{};
    socklen_t pn = sizeof peer, ln = sizeof local;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pn) != 0) continue;  // not a connected socket
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ln) != 0) continue;
    int peer_port = -1, local_port = -1;
    if (numeric_host(peer, pn, peer_port) != req.remote_addr || peer_port != req.remote_port) continue;
    if (req.local_port >= 0 && (numeric_host(local, ln, local_port) != req.local_addr || local_port != req.local_port))
      continue;
    found = fd;
    break;
  }
  closedir(d);
  return found;
}

// Whether the client closed (or reset) the connection: it is readable and a peek reads
// nothing or fails, as later cpp-httplib's is_connection_closed decides. Bytes waiting (a
// pipelined request) mean it is still there. The handler's thread owns the socket until
// the handler returns, so the descriptor cannot be another connection's meanwhile.
bool client_gone(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace

std::string_view chat_page() {
  // chat_page.inc is src/serve/chat_page.html as a raw string literal, made by CMakeLists.txt.
  static constexpr std::string_view page =
#include "chat_page.inc"
      ;
  return page;
}

HttpServer::HttpServer(HttpOptions options, Metrics& metrics)
    : options_(std::move(options)), metrics_(metrics), server_(std::make_unique<httplib::Server>()),
      created_(int64_t(std::time(nullptr))) {
  routes();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::attach(const Backend& backend) {
  held_ = backend;
  backend_.store(&held_);
}

void HttpServer::detach() { backend_.store(nullptr); }

void HttpServer::bind() {
  if (options_.port == 0) {
    port_ = server_->bind_to_any_port(options_.host);
    if (port_ < 0) fail("serve: cannot listen on {} (any port)", options_.host);
  } else {
    if (!server_->bind_to_port(options_.host, options_.port))
      fail("serve: cannot listen on {}:{} (in use, or not an address of this machine)", options_.host, options_.port);
    port_ = options_.port;
  }
}

void HttpServer::listen() {
  {
    std::lock_guard<std::mutex> l(state_m_);
    if (stopped_) return;
    listening_ = true;
  }
  server_->listen_after_bind();
}

void HttpServer::stop() {
  bool listening;
  {
    std::lock_guard<std::mutex> l(state_m_);
    if (stopped_) return;  // once
    stopped_ = true;
    listening = listening_;
  }
  if (!listening) return;  // listen() has not begun and now never will
  // listen() may not have marked itself running yet: stop() does nothing before it does.
  for (int i = 0; i < 500 && !server_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  server_->stop();
}

void HttpServer::routes() {
  httplib::Server& s = *server_;
  const int threads = std::max(options_.threads, 2);
  s.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  s.set_payload_max_length(options_.max_body_bytes);
  s.set_read_timeout(options_.timeout_seconds);
  s.set_write_timeout(options_.timeout_seconds);
  s.set_tcp_nodelay(true);

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!options_.api_key.empty() && req.path.rfind("/v1/", 0) == 0 &&
        req.get_header_value("Authorization") != "Bearer " + options_.api_key) {
      send_error(res, ApiError(401, "invalid or missing API key: send 'Authorization: Bearer KEY'",
                               "authentication_error", "", "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Every failure status cpp-httplib sets itself (404, 413, 400 for a malformed request
  // line, ...) answered as an OpenAI error object.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = fmt::format("{} {}: HTTP status {}", req.method, req.path, res.status);
    std::string type = "invalid_request_error";
    if (res.status == 404) message = fmt::format("no route {} {}", req.method, req.path);
    if (res.status == 413) message = "the request body is too large";
    if (res.status >= 500) type = "server_error";
    res.set_content(error_body(res.status, message, type), kJson);
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(error_body(500, what, "server_error"), kJson);
  });
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.request(endpoint_label(req.path), res.status);
  });

  // The chat page: no API key asked for the page itself (the key guards /v1/ only; the page
  // sends the one its user gives), and served while the model loads. The policy keeps it
  // self-contained: nothing is loaded from, nor sent to, another origin.
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Content-Security-Policy",
                   "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
                   "base-uri 'none'; form-action 'none'");
    res.set_content(std::string(chat_page()), "text/html; charset=utf-8");
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (backend_.load()) {
      res.set_content(R"({"status":"ok"})", kJson);
    } else {
      res.status = 503;
      res.set_content(R"({"status":"loading"})", kJson);
    }
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const Backend* b = backend_.load();
    res.set_content(metrics_.prometheus(b ? b->scheduler->slots() : 0), "text/plain; version=0.0.4");
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const Backend* b = backend_.load();
    if (!b) return send_error(res, ApiError(503, "the model is still loading", "server_error", "", "loading"));
    res.set_content(dump(models_response(b->model_id, created_)), kJson);
  });

  auto generate = [this](Endpoint ep, const httplib::Request& req, httplib::Response& res) {
    const Backend* b = backend_.load();
    if (!b) return send_error(res, ApiError(503, "the model is still loading", "server_error", "", "loading"));
    std::vector<int32_t> prompt;
    SamplingParams params;
    try {
      if (ep == Endpoint::Chat) {
        ChatCompletionRequest r = parse_chat_request(req.body);
        if (!b->chat_template)
          throw ApiError(400, "this model ships no chat template: use /v1/completions", "invalid_request_error", "messages");
        ChatOptions co;
        co.add_generation_prompt = true;
        co.enable_thinking = r.enable_thinking;
        std::string text;
        try {
          text = b->chat_template->render(r.messages, co);
        } catch (const Error& e) {
          throw ApiError(400, e.what(), "invalid_request_error", "messages");
        }
        // The template writes BOS and the special tokens itself (as ChatSession).
        prompt = b->tokenizer->encode_raw(text);
        params = std::move(r.params);
      } else {
        CompletionRequest r = parse_completion_request(req.body);
        prompt = r.prompt_text ? b->tokenizer->encode_prompt(*r.prompt_text) : r.prompt_ids;
        params = std::move(r.params);
      }
      auto job = std::make_shared<Job>(std::move(prompt), params);
      b->scheduler->submit(job);
      const std::string id = request_id(ep == Endpoint::Chat ? "chatcmpl" : "cmpl");
      const int64_t created = int64_t(std::time(nullptr));
      const std::string model = b->model_id;
      if (!params.stream) {
        std::string text;
        std::vector<TokenOut> tokens;
        Job::Output o;
        // The connection's socket, looked for once (at the first output that is not the end)
        // and asked at each new output and every 200 ms meanwhile whether the client is there.
        std::optional<int> sock;
        do {
          o = job->take(std::chrono::milliseconds(200));
          text += o.text;
          tokens.insert(tokens.end(), o.tokens.begin(), o.tokens.end());
          if (o.done) break;
          if (!sock) sock = connection_socket(req);
          if (*sock >= 0 && client_gone(*sock)) {
            job->cancel();  // the scheduler frees the slot at its next step
            throw ApiError(499, "the client closed the connection", "invalid_request_error", "", "client_closed");
          }
        } while (true);
        if (o.finish_reason == "error") throw ApiError(500, o.error, "server_error");
        const std::vector<TokenOut>* lp = params.logprobs ? &tokens : nullptr;
        json j = ep == Endpoint::Chat ? chat_response(id, created, model, text, o.finish_reason, o.usage, lp)
                                      : completion_response(id, created, model, text, o.finish_reason, o.usage, lp);
        res.set_content(dump(j), kJson);
        return;
      }
      struct Stream {
        std::shared_ptr<Job> job;
        bool first = true;
      };
      auto st = std::make_shared<Stream>(Stream{job});
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [st, ep, id, created, model, params](size_t, httplib::DataSink& sink) {
            auto write = [&](const std::string& data) {
              if (sink.write(data.data(), data.size())) return true;
              st->job->cancel();  // the client is gone: free its slot
              return false;
            };
            const Job::Output o = st->job->take(std::chrono::milliseconds(500));
            // Nothing new (queued, or a long prefill): an SSE comment, which clients skip; a
            // write that fails tells that the client left.
            if (!o.done && o.text.empty() && o.tokens.empty()) return write(": waiting\n\n");
            if (!o.text.empty() || !o.tokens.empty() || (st->first && o.finish_reason != "error")) {
              if (!write(sse_event(stream_chunk(ep, id, created, model, o.text, std::nullopt,
                                                params.logprobs ? &o.tokens : nullptr, st->first))))
                return false;
              st->first = false;
            }
            if (!o.done) return true;
            if (o.finish_reason == "error") {
              if (!write("data: " + error_body(500, o.error, "server_error") + "\n\n")) return false;
            } else {
              if (!write(sse_event(stream_chunk(ep, id, created, model, "", o.finish_reason, nullptr, false)))) return false;
              if (params.include_usage && !write(sse_event(usage_chunk(ep, id, created, model, o.usage)))) return false;
            }
            if (!write(done_event())) return false;
            sink.done();
            return true;
          },
          [st](bool success) {
            if (!success) st->job->cancel();
          });
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      send_error(res, ApiError(400, e.what()));
    }
  };
  s.Post("/v1/chat/completions",
         [generate](const httplib::Request& req, httplib::Response& res) { generate(Endpoint::Chat, req, res); });
  s.Post("/v1/completions",
         [generate](const httplib::Request& req, httplib::Response& res) { generate(Endpoint::Completion, req, res); });
}

}  // namespace tessera::serve
