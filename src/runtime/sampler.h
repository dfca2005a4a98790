// Picks the next token from logits: greedy at temperature 0, else temperature, top-k and
// top-p (nucleus) sampling from a seeded generator, so a seed reproduces a run. Optional
// penalties on the tokens already generated (OpenAI's frequency and presence penalties,
// the CTRL / transformers repetition penalty) adjust the logits first, and logprobs()
// reports what the model gave the chosen token and the most likely ones.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace tessera {

struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // 1: no limit
  uint64_t seed = 0;
  // Penalties over the history given to sample() (the server passes the tokens generated so
  // far): logit -= frequency_penalty * count + presence_penalty * (count > 0), then a
  // repeated token's logit is divided by repetition_penalty when positive, multiplied when
  // negative. 0, 0 and 1 leave the logits untouched.
  float frequency_penalty = 0.0f;  // [-2, 2]
  float presence_penalty = 0.0f;   // [-2, 2]
  float repetition_penalty = 1.0f; // > 0
  void validate() const;     // throws tessera::Error naming the bad option
  bool penalizes() const { return frequency_penalty != 0.0f || presence_penalty != 0.0f || repetition_penalty != 1.0f; }
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  int32_t sample(std::span<const float> logits);
  // With the penalties applied over `history` first (no copy of the logits when none is set).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  // The logits the penalties leave for `history` (a copy; the logits themselves without penalties).
  std::vector<float> penalized(std::span<const float> logits, std::span<const int32_t> history) const;

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
  std::vector<double> weights_;  // scratch: the candidates' softmax numerators
  std::vector<int32_t> order_;   // scratch: token ids, the most likely first as far as sorted
};

// Index of the largest logit (the lowest index among ties, as torch.argmax).
int32_t argmax(std::span<const float> logits);

// The log-probability log_softmax(logits)[chosen] (in double, then rounded), and the `top`
// most likely tokens with theirs, most likely first (the lower id first among ties).
struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0;
};
struct LogprobEntry {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;
};
LogprobEntry logprobs(std::span<const float> logits, int32_t chosen, int top);

}  // namespace tessera
