// Picks the next token from logits: greedy at temperature 0, else temperature, top-k and
// top-p (nucleus) sampling from a seeded generator, so a seed reproduces a run.
#pragma once
#include <cstdint>
#include <random>
#include <span>

namespace tessera {

struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // 1: no limit
  uint64_t seed = 0;
  void validate() const;     // throws tessera::Error naming the bad option
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  int32_t sample(std::span<const float> logits);

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
};

// Index of the largest logit (the lowest index among ties, as torch.argmax).
int32_t argmax(std::span<const float> logits);

}  // namespace tessera
