#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "util/error.h"

namespace tessera {

void SamplingOptions::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) fail("--temp must be >= 0, got {}", temperature);
  if (top_k < 0) fail("--top-k must be >= 0, got {}", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) fail("--top-p must be in (0, 1], got {}", top_p);
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), rng_(options.seed) { options.validate(); }

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (options_.temperature == 0.0f) return argmax(logits);
  // Candidates sorted by logit, cut by top-k, then softmax at the temperature, cut by top-p.
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  size_t k = idx.size();
  if (options_.top_k > 0) k = std::min(k, size_t(options_.top_k));
  std::partial_sort(idx.begin(), idx.begin() + long(k), idx.end(),
                    [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  idx.resize(k);
  std::vector<double> p(k);
  const double top = logits[size_t(idx[0])];
  double sum = 0;
  for (size_t i = 0; i < k; ++i) sum += p[i] = std::exp((logits[size_t(idx[i])] - top) / options_.temperature);
  size_t keep = k;
  if (options_.top_p < 1.0f) {
    double acc = 0;
    for (size_t i = 0; i < k; ++i) {
      acc += p[i] / sum;
      if (acc >= options_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  std::discrete_distribution<size_t> pick(p.begin(), p.begin() + long(keep));
  return idx[pick(rng_)];
}

}  // namespace tessera
