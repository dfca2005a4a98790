// Perplexity of a model over a text, computed exactly as llama.cpp's llama-perplexity computes
// it (tools/perplexity/perplexity.cpp, perplexity(), pinned llama.cpp of llama-cpp-python
// 0.3.36), so the two tools' figures can be compared:
//   - the text is tokenized whole, with BOS first when the tokenizer adds one, special-token
//     text NOT matched as special tokens in llama.cpp (see perplexity_tokens);
//   - it is cut into n_chunks = n_tokens / n_ctx non-overlapping chunks of n_ctx tokens (the
//     remainder is dropped; at least 2 * n_ctx tokens are required);
//   - each chunk runs from an empty KV cache at positions 0..n_ctx-1, its first token replaced
//     by BOS when the tokenizer adds BOS (the original token is never a target);
//   - only the second half is scored: the logits at positions first = n_ctx/2 .. n_ctx-2
//     each predict the next token (n_ctx - 1 - first tokens per chunk);
//   - nll = -log_softmax(fp32 logits)[target], llama.cpp's arithmetic: max and differences in
//     float, the sum of expf in double; nll and nll^2 summed in double;
//   - PPL = exp(mean nll); the "+/-" figure is ppl * sqrt((mean(nll^2) - mean(nll)^2) / (count - 1)).
// `tessera perplexity` is the command; this is the computation, for tests and scripts.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "targets/target.h"

namespace tessera {

class Tokenizer;

struct PerplexityOptions {
  int64_t n_ctx = 512;
  int64_t max_chunks = -1;  // < 0: every whole chunk of the text (llama.cpp's --chunks)
  // Replaces each chunk's first token (llama.cpp: when the vocabulary adds BOS). nullopt: none.
  std::optional<int32_t> bos_id;
  // Most tokens per forward call (llama.cpp's n_batch when smaller than n_ctx); 0: each chunk
  // runs in two calls, the unscored first half without logits and the scored half with them.
  int64_t batch = 0;
  // Sees each chunk's scored logits, `rows` x `vocab` (row j: position n_ctx/2 + j, predicting
  // the chunk's token n_ctx/2 + j + 1), before they are scored. Empty: none.
  std::function<void(int64_t chunk, const float* logits, int64_t rows, int64_t vocab)> on_scored_logits;
};

// After each chunk: its index (0-based), the chunks in all, and the running perplexity
// (exp of the mean nll over every token scored so far: llama.cpp's "[i]x.xxxx,").
using PerplexityProgress = std::function<void(int64_t chunk, int64_t n_chunks, double running_ppl)>;

struct PerplexityResult {
  double ppl = 0;            // exp(mean nll)
  // llama.cpp's "+/-" figure: ppl * sqrt((mean nll^2 - mean nll^2) / (count - 1)); NaN when it
  // is undefined (fewer than 2 tokens scored, or a variance that is not positive: llama.cpp
  // then prints "Unexpected negative standard deviation of log(prob)" and no estimate).
  double ppl_error = 0;
  double mean_nll = 0;       // nll / count
  double mean_nll2 = 0;      // nll^2 / count
  int64_t n_ctx = 0;
  int64_t n_tokens = 0;      // tokens in the text (BOS included when added)
  int64_t chunks = 0;        // chunks evaluated
  int64_t tokens_scored = 0;     // count: chunks * (n_ctx - 1 - n_ctx/2)
  int64_t tokens_evaluated = 0;  // chunks * n_ctx: every token the model ran
  double seconds = 0;            // wall time of the chunk loop (forward passes and scoring)
  std::vector<double> running_ppl;  // after each chunk
  double tokens_per_second() const { return seconds > 0 ? double(tokens_evaluated) / seconds : 0.0; }
};

// -log softmax(logits)[target] the way llama.cpp computes it (its log_softmax(n_vocab,
// logits, tok)): max in float, sum of expf(logit - max) in double, logit - max - log(sum).
double llama_nll(const float* logits, int64_t vocab, int32_t target);

// The token ids llama-perplexity evaluates for `text` (llama.cpp's common_tokenize(ctx, text,
// add_special = true, parse_special = false)): BOS first when the tokenizer adds BOS, then the
// text's ids. One difference remains: tessera's tokenizer matches special-token text ("<|im_end|>")
// as the special token, llama.cpp with parse_special = false as plain text;
// special_tokens_in_text counts the ids that came from such text (0 for ordinary text).
struct PerplexityTokens {
  std::vector<int32_t> ids;
  std::optional<int32_t> bos_id;  // set when the tokenizer adds BOS (each chunk then starts with it)
  int64_t special_tokens_in_text = 0;
};
PerplexityTokens perplexity_tokens(const Tokenizer& tokenizer, std::string_view text);

// Refuses, with the reason, options or a token count perplexity() cannot run with (n_ctx < 4,
// n_ctx beyond the model's positions, fewer than 2 * n_ctx tokens, max_chunks == 0, batch < 0).
void check_perplexity_options(const ModelSpec& spec, int64_t n_tokens, const PerplexityOptions& options);

// Runs `runner` over `tokens` as described above (check_perplexity_options first). The runner's
// KV cache is reset before every chunk and left holding the last one.
PerplexityResult perplexity(ModelRunner& runner, std::span<const int32_t> tokens, const PerplexityOptions& options,
                            const PerplexityProgress& progress = {});

}  // namespace tessera
