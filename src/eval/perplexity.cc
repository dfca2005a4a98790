#include "eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace tessera {

double llama_nll(const float* logits, int64_t vocab, int32_t target) {
  // llama.cpp's log_softmax(int n_vocab, const float * logits, int tok), operation for operation.
  float max_logit = logits[0];
  for (int64_t i = 1; i < vocab; ++i) max_logit = std::max(max_logit, logits[i]);
  double sum_exp = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum_exp += std::exp(logits[i] - max_logit);  // float expf
  const double log_softmax = logits[target] - max_logit - std::log(sum_exp);
  return -log_softmax;
}

PerplexityTokens perplexity_tokens(const Tokenizer& tokenizer, std::string_view text) {
  PerplexityTokens t;
  t.ids = tokenizer.encode_raw(text);
  for (const int32_t id : t.ids) t.special_tokens_in_text += tokenizer.is_special(id) ? 1 : 0;
  if (tokenizer.adds_bos()) {
    t.bos_id = tokenizer.bos_id();
    t.ids.insert(t.ids.begin(), *t.bos_id);
  }
  return t;
}

void check_perplexity_options(const ModelSpec& spec, int64_t n_tokens, const PerplexityOptions& o) {
  if (o.n_ctx < 4) fail("--ctx must be at least 4 (half of each chunk is context, the rest is scored), got {}", o.n_ctx);
  if (o.n_ctx > spec.max_position)
    fail("--ctx {} is more than the model's context of {} positions", o.n_ctx, spec.max_position);
  if (o.max_chunks == 0) fail("--chunks must be at least 1 (or left out for every chunk), got 0");
  if (o.batch < 0) fail("--batch must be at least 1 (or 0: two forward calls per chunk), got {}", o.batch);
  if (n_tokens < 2 * o.n_ctx)
    fail("the text tokenizes to only {} tokens; perplexity with a context of {} needs at least {} (2 x --ctx, as "
         "llama-perplexity): give a longer text or a smaller --ctx",
         n_tokens, o.n_ctx, 2 * o.n_ctx);
  if (o.bos_id && (*o.bos_id < 0 || *o.bos_id >= spec.vocab))
    fail("the BOS id {} is outside the model's vocabulary of {} tokens", *o.bos_id, spec.vocab);
}

PerplexityResult perplexity(ModelRunner& runner, std::span<const int32_t> tokens, const PerplexityOptions& o,
                            const PerplexityProgress& progress) {
  const ModelSpec& spec = runner.spec();
  check_perplexity_options(spec, int64_t(tokens.size()), o);
  for (const int32_t id : tokens)
    if (id < 0 || id >= spec.vocab) fail("token id {} is outside the model's vocabulary of {} tokens", id, spec.vocab);

  const int64_t n_ctx = o.n_ctx;
  const int64_t n_chunk_max = int64_t(tokens.size()) / n_ctx;
  const int64_t n_chunk = o.max_chunks < 0 ? n_chunk_max : std::min(o.max_chunks, n_chunk_max);
  const int64_t first = n_ctx / 2;
  const int64_t vocab = spec.vocab;

  PerplexityResult r;
  r.n_ctx = n_ctx;
  r.n_tokens = int64_t(tokens.size());
  double nll = 0.0, nll2 = 0.0;
  int64_t count = 0;

  // Runs ids [from, to) of the chunk at their positions, in pieces of at most `batch` tokens;
  // with `logits`, appends every position's logits to `out`.
  std::vector<float> scored;  // [n_ctx - first, vocab]
  auto run = [&](const std::vector<int32_t>& chunk, int64_t from, int64_t to, bool logits) {
    const int64_t step = o.batch > 0 ? o.batch : to - from;
    for (int64_t at = from; at < to; at += step) {
      const int64_t n = std::min(step, to - at);
      std::vector<float> out = runner.forward(std::span(chunk).subspan(size_t(at), size_t(n)), logits);
      if (logits) {
        if (int64_t(out.size()) != n * vocab)
          fail("the {} target returned {} logits for {} positions of a {}-token vocabulary", runner.target(), out.size(),
               n, vocab);
        scored.insert(scored.end(), out.begin(), out.end());
      }
    }
  };

  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n_chunk; ++i) {
    const int64_t start = i * n_ctx;
    std::vector<int32_t> chunk(tokens.begin() + start, tokens.begin() + start + n_ctx);
    if (o.bos_id) chunk[0] = *o.bos_id;  // the model's input only: tokens[start] is never a target
    runner.reset();
    scored.clear();
    run(chunk, 0, first, /*logits=*/false);
    run(chunk, first, n_ctx, /*logits=*/true);
    if (o.on_scored_logits) o.on_scored_logits(i, scored.data(), n_ctx - 1 - first, vocab);
    // Row j (position first + j) predicts tokens[start + first + j + 1], for j < n_ctx - 1 - first.
    for (int64_t j = 0; j + first + 1 < n_ctx; ++j) {
      const double v = llama_nll(scored.data() + j * vocab, vocab, tokens[size_t(start + first + j + 1)]);
      nll += v;
      nll2 += v * v;
    }
    count += n_ctx - first - 1;
    r.running_ppl.push_back(std::exp(nll / double(count)));
    if (progress) progress(i, n_chunk, r.running_ppl.back());
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  r.chunks = n_chunk;
  r.tokens_scored = count;
  r.tokens_evaluated = n_chunk * n_ctx;
  // llama.cpp's final lines, in its order of operations.
  nll2 /= double(count);
  nll /= double(count);
  r.mean_nll = nll;
  r.mean_nll2 = nll2;
  r.ppl = std::exp(nll);
  nll2 -= nll * nll;
  r.ppl_error = (nll2 > 0 && count > 1) ? std::sqrt(nll2 / double(count - 1)) * r.ppl
                                        : std::numeric_limits<double>::quiet_NaN();
  return r;
}

}  // namespace tessera
