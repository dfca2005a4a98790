// What `tessera serve` counts, rendered as Prometheus text (GET /metrics): requests by
// endpoint and HTTP status, prompt and generated tokens, queue length and active slots,
// time-to-first-token and inter-token latency histograms. Thread-safe.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tessera::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void add(double v);
  // `name`_bucket{le="..."} (cumulative), `name`_sum, `name`_count.
  void render(std::string& out, const std::string& name, const std::string& help) const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; one more for +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void request(const std::string& endpoint, int status);
  void tokens(int64_t prompt, int64_t cached, int64_t generated);
  void time_to_first_token(double seconds);
  void inter_token_latency(double seconds);
  void gauges(int64_t queued, int64_t active);
  std::string prometheus(int slots) const;

 private:
  mutable std::mutex m_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0, generated_tokens_ = 0;
  int64_t queued_ = 0, active_ = 0;
  Histogram ttft_, itl_;
};

}  // namespace tessera::serve
