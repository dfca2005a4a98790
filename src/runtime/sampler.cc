#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "util/error.h"

namespace tessera {

void SamplingOptions::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) fail("--temp must be >= 0, got {}", temperature);
  if (top_k < 0) fail("--top-k must be >= 0, got {}", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) fail("--top-p must be in (0, 1], got {}", top_p);
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    fail("frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    fail("presence_penalty must be in [-2, 2], got {}", presence_penalty);
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
    fail("repetition_penalty must be > 0, got {}", repetition_penalty);
}

std::vector<float> Sampler::penalized(std::span<const float> logits, std::span<const int32_t> history) const {
  std::vector<float> out(logits.begin(), logits.end());
  if (!options_.penalizes()) return out;
  std::map<int32_t, int> counts;
  for (const int32_t id : history)
    if (id >= 0 && size_t(id) < out.size()) counts[id]++;
  for (const auto& [id, n] : counts) {
    float& l = out[size_t(id)];
    if (options_.repetition_penalty != 1.0f) l = l > 0 ? l / options_.repetition_penalty : l * options_.repetition_penalty;
    l -= options_.frequency_penalty * float(n) + options_.presence_penalty;
  }
  return out;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  if (!options_.penalizes() || history.empty()) return sample(logits);
  const std::vector<float> p = penalized(logits, history);
  return sample(p);
}

LogprobEntry logprobs(std::span<const float> logits, int32_t chosen, int top) {
  LogprobEntry e;
  if (logits.empty()) return e;
  double mx = -INFINITY;
  for (const float l : logits) mx = std::max(mx, double(l));
  double sum = 0;
  for (const float l : logits) sum += std::exp(double(l) - mx);
  const double lse = mx + std::log(sum);
  e.chosen = {chosen, float(double(logits[size_t(chosen)]) - lse)};
  const size_t k = std::min(logits.size(), size_t(std::max(top, 0)));
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + long(k), idx.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  for (size_t i = 0; i < k; ++i) e.top.push_back({idx[i], float(double(logits[size_t(idx[i])]) - lse)});
  return e;
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), rng_(options.seed) { options.validate(); }

int32_t argmax(std::span<const float> logits) {
  const auto first_largest = [&] {  // the definition: std::max_element's answer
    return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  };
#if defined(__SSE2__)
  // Greedy decoding scans a whole vocabulary per sequence per step (128K values: 140 us
  // this way on one core, 8 sequences a step 1.1 ms), so the maximum is found 16 values at
  // a time (four 4-lane maxima), then its first index (17 us); a NaN anywhere leaves the
  // answer to max_element.
  const int64_t n = int64_t(logits.size()), body = n / 16 * 16;
  const float* x = logits.data();
  __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  for (int64_t i = 0; i < body; i += 16) {  // max(v, m) keeps m where v is NaN
    m0 = _mm_max_ps(_mm_loadu_ps(x + i), m0);
    m1 = _mm_max_ps(_mm_loadu_ps(x + i + 4), m1);
    m2 = _mm_max_ps(_mm_loadu_ps(x + i + 8), m2);
    m3 = _mm_max_ps(_mm_loadu_ps(x + i + 12), m3);
  }
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3)));
  float best = std::max({lanes[0], lanes[1], lanes[2], lanes[3]});
  for (int64_t i = body; i < n; ++i) best = x[i] > best ? x[i] : best;
  const __m128 b = _mm_set1_ps(best);
  int64_t i = 0;
  for (; i < body; i += 4) {  // the first value equal to the maximum, or a NaN
    const __m128 v = _mm_loadu_ps(x + i);
    const int hit = _mm_movemask_ps(_mm_or_ps(_mm_cmpeq_ps(v, b), _mm_cmpunord_ps(v, v)));
    if (hit) {
      i += __builtin_ctz(unsigned(hit));
      break;
    }
  }
  for (; i < n && !(x[i] == best || std::isnan(x[i])); ++i) {
  }
  if (i < n && x[i] == best) return int32_t(i);
#endif
  return first_largest();
}

namespace {
// An index drawn with probability w[i] / (w[0] + ... + w[n - 1]).
size_t draw(std::span<const double> w, std::mt19937_64& rng) {
  double total = 0;
  for (const double x : w) total += x;
  const double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  double acc = 0;
  size_t last = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] <= 0) continue;
    acc += w[i];
    last = i;
    if (u < acc) return i;
  }
  return last;  // u within rounding of the total
}
}  // namespace

int32_t Sampler::sample(std::span<const float> logits) {
  if (options_.temperature == 0.0f) return argmax(logits);
  // Softmax at the temperature over the candidates: the top-k by logit (all without top-k),
  // then, with top-p, the most likely of them up to a cumulative probability of top_p. A full
  // sort of a 128K vocabulary cost 16 ms a token, so without top-k nothing is sorted unless
  // top-p asks, and then only as many of the most likely as its prefix needs.
  const size_t V = logits.size();
  const double top = logits[size_t(argmax(logits))];
  auto weight = [&](int32_t i) { return std::exp((double(logits[size_t(i)]) - top) / options_.temperature); };
  auto by_logit = [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; };
  const size_t k = options_.top_k > 0 ? std::min(V, size_t(options_.top_k)) : V;
  if (k == V && options_.top_p >= 1.0f) {
    weights_.resize(V);
    for (size_t i = 0; i < V; ++i) weights_[i] = weight(int32_t(i));
    return int32_t(draw(weights_, rng_));
  }
  order_.resize(V);
  std::iota(order_.begin(), order_.end(), 0);
  double sum = 0;  // over the candidates: every token, or (below) the top k
  size_t sorted = k;
  if (k < V) {
    std::partial_sort(order_.begin(), order_.begin() + long(k), order_.end(), by_logit);
  } else {
    for (size_t i = 0; i < V; ++i) sum += weight(int32_t(i));
    sorted = std::min<size_t>(V, 64);
  }
  // The kept prefix: all k, or the shortest whose probability reaches top_p (sorting more of
  // the most likely while it has not).
  for (;;) {
    if (k == V) {
      if (sorted < V) std::nth_element(order_.begin(), order_.begin() + long(sorted), order_.end(), by_logit);
      std::sort(order_.begin(), order_.begin() + long(sorted), by_logit);
    }
    weights_.resize(sorted);
    for (size_t i = 0; i < sorted; ++i) weights_[i] = weight(order_[i]);
    if (k < V) sum = std::accumulate(weights_.begin(), weights_.end(), 0.0);
    size_t keep = sorted;
    double acc = 0;
    for (size_t i = 0; i < sorted && options_.top_p < 1.0f; ++i) {
      acc += weights_[i] / sum;
      if (acc >= options_.top_p) {
        keep = i + 1;
        break;
      }
    }
    if (options_.top_p < 1.0f && acc < options_.top_p && sorted < k) {
      sorted = std::min(k, 4 * sorted);
      continue;
    }
    return order_[draw(std::span<const double>(weights_.data(), keep), rng_)];
  }
}

}  // namespace tessera
