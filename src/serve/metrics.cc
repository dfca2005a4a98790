#include "serve/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace tessera::serve {

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1) {}

void Histogram::add(double v) {
  const size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[i]++;
  sum_ += v;
  count_++;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  int64_t acc = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    acc += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], acc);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
}

Metrics::Metrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      itl_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}) {}

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> l(m_);
  requests_[{endpoint, status}]++;
}

void Metrics::tokens(int64_t prompt, int64_t cached, int64_t generated) {
  std::lock_guard<std::mutex> l(m_);
  prompt_tokens_ += prompt;
  cached_tokens_ += cached;
  generated_tokens_ += generated;
}

void Metrics::time_to_first_token(double s) {
  std::lock_guard<std::mutex> l(m_);
  ttft_.add(s);
}

void Metrics::inter_token_latency(double s) {
  std::lock_guard<std::mutex> l(m_);
  itl_.add(s);
}

void Metrics::gauges(int64_t queued, int64_t active) {
  std::lock_guard<std::mutex> l(m_);
  queued_ = queued;
  active_ = active;
}

std::string Metrics::prometheus(int slots) const {
  std::lock_guard<std::mutex> l(m_);
  std::string o;
  o += "# HELP tessera_requests_total HTTP requests answered, by endpoint and status\n# TYPE tessera_requests_total counter\n";
  for (const auto& [k, n] : requests_)
    o += fmt::format("tessera_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", k.first, k.second, n);
  o += fmt::format(
      "# HELP tessera_prompt_tokens_total Prompt tokens of finished requests (cached ones included)\n"
      "# TYPE tessera_prompt_tokens_total counter\ntessera_prompt_tokens_total {}\n"
      "# HELP tessera_prompt_tokens_cached_total Prompt tokens a slot's KV cache already held (prefix reuse)\n"
      "# TYPE tessera_prompt_tokens_cached_total counter\ntessera_prompt_tokens_cached_total {}\n"
      "# HELP tessera_generated_tokens_total Tokens generated\n"
      "# TYPE tessera_generated_tokens_total counter\ntessera_generated_tokens_total {}\n"
      "# HELP tessera_queue_length Requests waiting for a slot\n# TYPE tessera_queue_length gauge\ntessera_queue_length {}\n"
      "# HELP tessera_active_slots Slots running a request\n# TYPE tessera_active_slots gauge\ntessera_active_slots {}\n"
      "# HELP tessera_slots Slots (--parallel)\n# TYPE tessera_slots gauge\ntessera_slots {}\n",
      prompt_tokens_, cached_tokens_, generated_tokens_, queued_, active_, slots);
  ttft_.render(o, "tessera_time_to_first_token_seconds", "From arrival to the first generated token");
  itl_.render(o, "tessera_inter_token_latency_seconds", "Between consecutive generated tokens of a request");
  return o;
}

}  // namespace tessera::serve
