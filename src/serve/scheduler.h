// `tessera serve`'s execution: N slots, each one sequence of a single runner (its own KV
// cache and positions: ModelRunner::select_sequence; the weights held once), a bounded queue
// of requests waiting for a slot, and one scheduler thread that owns the runner and loops:
// admit queued requests into free slots (the slot whose cached ids share the longest prefix
// with the prompt: only the rest is prefilled), run one prefill chunk of each admitted
// request, then one decode step for every decoding slot together (ModelRunner::decode_batch:
// one pass over the weights for all of them, each sequence's logits those it gets alone),
// hand the tokens to their requests, and free a slot as soon as its request finishes or is
// cancelled (a client gone).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "runtime/generate.h"
#include "serve/metrics.h"
#include "serve/openai_api.h"
#include "targets/target.h"
#include "tokenizer/tokenizer.h"

namespace tessera::serve {

using Clock = std::chrono::steady_clock;

// One request as the scheduler runs it, shared with the HTTP thread that waits for it.
class Job {
 public:
  Job(std::vector<int32_t> prompt, SamplingParams params) : prompt(std::move(prompt)), params(std::move(params)) {}
  const std::vector<int32_t> prompt;
  const SamplingParams params;
  const Clock::time_point arrived = Clock::now();

  // What the HTTP side takes: text and logprobs not taken before; done once finished.
  struct Output {
    std::string text;
    std::vector<TokenOut> tokens;  // with logprobs, when asked
    bool done = false;
    std::string finish_reason;     // "stop", "length"; "error" with `error`
    std::string error;
    Usage usage;
  };
  // Waits up to `wait` for new output (or the end) and takes it.
  Output take(Clock::duration wait);
  // The client is gone or the server stops: the scheduler frees the slot at its next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Scheduler side. A request whose reader has left kMaxUnread emits untaken (a client that
  // stopped reading: the HTTP thread is blocked writing to it) is backlogged: the scheduler
  // generates nothing more for it until it is read again, so a stalled client holds its
  // slot's memory but not the step's time; its write timeout then cancels it.
  static constexpr int64_t kMaxUnread = 64;
  bool backlogged() const;
  void emit(const std::string& text, const std::optional<TokenOut>& token);
  void finish(const std::string& reason, const Usage& usage, const std::string& error = "");

 private:
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::string text_;
  std::vector<TokenOut> tokens_;
  int64_t unread_ = 0;  // emits since the last take
  bool done_ = false;
  std::string finish_reason_, error_;
  Usage usage_;
  std::atomic<bool> cancelled_{false};
};

// The cpu kernels pick their path by the rows of a call (bf16 weights: T == 1 the decode
// GEMV, 1 < T < 16 dot-product tiles, T >= 16 the packed GEMM or AMX; attention changes path
// at 8; only quantized matmuls compute a row the same at every T), so one row computed in
// calls of other sizes can differ in its last bits. A row's result does not depend on T
// within the T >= 16 paths, so the scheduler keeps every prefill call at 16 rows or more
// (a prompt shorter than that runs whole, as `tessera run` runs it) and reuses cached rows
// only where they came from such a call: a greedy answer then equals `tessera run`'s bit
// for bit, with chunked prefill and prefix reuse (tests: ServeScheduler.*,
// tests/serve_e2e.py).
constexpr size_t kMinPrefillRows = 16;

struct SchedulerOptions {
  int64_t ctx_size = 0;      // per slot (prompt + generated); 0: the model's context
  int queue_size = 16;       // requests waiting for a busy slot; more are refused (429); 0: none wait
  int prefill_chunk = 64;    // prompt tokens per prefill step (>= kMinPrefillRows); 0: the whole prompt at once
};

class Scheduler {
 public:
  // `slots` sequences of `runner` (it must hold that many: max_sequences()); only the
  // scheduler thread runs it from now on.
  Scheduler(std::unique_ptr<ModelRunner> runner, int slots, const Tokenizer& tokenizer, SchedulerOptions options,
            Metrics& metrics);
  ~Scheduler();  // shutdown()
  // Stops the thread and ends every queued and running request with an error (idempotent).
  void shutdown();

  // Queues a job; throws ApiError 429 when the queue is full, 400 when the prompt does not
  // fit the context (leaving room for one generated token) or holds an id beyond the vocabulary.
  void submit(const std::shared_ptr<Job>& job);
  int slots() const { return int(slots_.size()); }
  int64_t ctx_size() const { return ctx_size_; }
  const std::vector<int32_t>& eos_ids() const { return eos_; }

 private:
  struct Slot {
    int index = 0;                // its sequence in the runner
    std::vector<int32_t> cached;  // the ids whose keys and values the sequence holds, in order
    // How many of them a later prompt may reuse and still get `tessera run`'s numbers: those
    // a prefill pass of at least kMinPrefillRows computed (see kMinPrefillRows).
    size_t reusable = 0;
    Clock::time_point last_used{};
    // The request it runs (null: free).
    std::shared_ptr<Job> job;
    size_t prefilled = 0;            // prompt ids run so far
    int64_t reused = 0;              // prompt ids the cache already held at admission
    // The logits of the last position run, once the prompt is in: a row of step_logits_
    // after a decode step (no copy of 128K floats a slot a step), or own_logits after a
    // prefill, or when a step passes the slot by while step_logits_ is overwritten.
    std::span<const float> logits;
    std::vector<float> own_logits;
    bool borrowed() const { return !logits.empty() && logits.data() != own_logits.data(); }  // a row of step_logits_
    std::optional<Sampler> sampler;
    std::vector<int32_t> generated;
    std::vector<int32_t> stop_ids;   // sorted
    int64_t max_tokens = 0;
    Utf8Stream utf8;
    std::optional<StopHoldback> holdback;
    Clock::time_point last_token{};
    bool decoding() const { return job && prefilled == job->prompt.size(); }
  };

  void loop();
  void admit(std::unique_lock<std::mutex>& lock);
  void prefill_step(Slot& slot);
  // One generated token for every slot given: sample from its logits, hand the token to
  // its job, stop it, or run the token through the model for the next step's logits; the
  // slots that go on run in one decode_batch.
  void decode_step(std::span<Slot*> slots);
  // Samples and hands over the slot's next token; the token to run next, or none when the
  // request ended.
  std::optional<int32_t> next_token(Slot& slot);
  ModelRunner& sequence(const Slot& slot);  // the runner with the slot's sequence selected
  void release(Slot& slot, const std::string& reason, const std::string& error = "");

  std::unique_ptr<ModelRunner> runner_;
  std::vector<Slot> slots_;
  std::vector<float> step_logits_;  // a decode step's logits, every slot's row; kept across steps
  const Tokenizer& tokenizer_;
  SchedulerOptions options_;
  Metrics& metrics_;
  int64_t ctx_size_ = 0;
  std::vector<int32_t> eos_;

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  int busy_ = 0;  // slots running a request (admit() counts up, release() down)
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tessera::serve
