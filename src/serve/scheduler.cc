#include "serve/scheduler.h"

#include <fmt/format.h>

#include <algorithm>

#include "util/error.h"

namespace tessera::serve {

Job::Output Job::take(Clock::duration wait) {
  std::unique_lock<std::mutex> l(m_);
  cv_.wait_for(l, wait, [&] { return done_ || !text_.empty() || !tokens_.empty(); });
  Output o;
  o.text.swap(text_);
  o.tokens.swap(tokens_);
  unread_ = 0;
  o.done = done_;
  o.finish_reason = finish_reason_;
  o.error = error_;
  o.usage = usage_;
  return o;
}

void Job::emit(const std::string& text, const std::optional<TokenOut>& token) {
  {
    std::lock_guard<std::mutex> l(m_);
    text_ += text;
    if (token) tokens_.push_back(*token);
    ++unread_;
  }
  cv_.notify_all();
}

bool Job::backlogged() const {
  std::lock_guard<std::mutex> l(m_);
  return unread_ >= kMaxUnread;
}

void Job::finish(const std::string& reason, const Usage& usage, const std::string& error) {
  {
    std::lock_guard<std::mutex> l(m_);
    done_ = true;
    finish_reason_ = reason;
    usage_ = usage;
    error_ = error;
  }
  cv_.notify_all();
}

Scheduler::Scheduler(std::unique_ptr<ModelRunner> runner, int slots, const Tokenizer& tokenizer,
                     SchedulerOptions options, Metrics& metrics)
    : runner_(std::move(runner)), tokenizer_(tokenizer), options_(options), metrics_(metrics) {
  if (!runner_ || slots < 1) fail("serve: no slots");
  if (slots > runner_->max_sequences())
    fail("the {} target holds {} sequence(s) at once, not {}: use --parallel {}", runner_->target(),
         runner_->max_sequences(), slots, runner_->max_sequences());
  if (options_.prefill_chunk != 0 && options_.prefill_chunk < int(kMinPrefillRows))
    fail("--prefill-chunk must be 0 or at least {}, got {}", kMinPrefillRows, options_.prefill_chunk);
  const ModelSpec& spec = runner_->spec();
  ctx_size_ = options_.ctx_size > 0 ? std::min<int64_t>(options_.ctx_size, spec.max_position) : spec.max_position;
  eos_ = stop_ids(tokenizer, spec);
  slots_.resize(size_t(slots));
  for (int i = 0; i < slots; ++i) {
    slots_[size_t(i)].index = i;
    sequence(slots_[size_t(i)]).reset();
  }
  thread_ = std::thread([this] { loop(); });
}

ModelRunner& Scheduler::sequence(const Slot& s) {
  runner_->select_sequence(s.index);
  return *runner_;
}

Scheduler::~Scheduler() { shutdown(); }

void Scheduler::shutdown() {
  {
    std::lock_guard<std::mutex> l(m_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  Usage none;
  std::lock_guard<std::mutex> l(m_);
  for (auto& j : queue_) j->finish("error", none, "the server is shutting down");
  queue_.clear();
  for (Slot& s : slots_)
    if (s.job) {
      s.job->finish("error", none, "the server is shutting down");
      s.job.reset();
    }
}

void Scheduler::submit(const std::shared_ptr<Job>& job) {
  const int64_t n = int64_t(job->prompt.size());
  if (n == 0) throw ApiError(400, "the prompt is empty", "invalid_request_error", "prompt");
  if (n >= ctx_size_)
    throw ApiError(400,
                   fmt::format("the prompt has {} tokens; the context is {} tokens (--ctx-size), which must leave room "
                               "for at least one generated token",
                               n, ctx_size_),
                   "invalid_request_error", "messages", "context_length_exceeded");
  const int32_t vocab = int32_t(runner_->spec().vocab);
  for (const int32_t id : job->prompt)
    if (id < 0 || id >= vocab)
      throw ApiError(400, fmt::format("token id {} is outside the vocabulary of {} tokens", id, vocab),
                     "invalid_request_error", "prompt");
  {
    std::lock_guard<std::mutex> l(m_);
    if (stop_) throw ApiError(503, "the server is shutting down", "server_error");
    // Free slots take requests at once; beyond them, queue_size may wait.
    if (int(queue_.size()) >= options_.queue_size + (int(slots_.size()) - busy_))
      throw ApiError(429, fmt::format("the server is busy: {} requests are waiting for {} slots; retry later",
                                      queue_.size(), slots_.size()),
                     "rate_limit_error", "", "queue_full");
    queue_.push_back(job);
  }
  cv_.notify_all();
}

void Scheduler::admit(std::unique_lock<std::mutex>&) {
  while (!queue_.empty()) {
    std::shared_ptr<Job> job = queue_.front();
    if (job->cancelled()) {
      queue_.pop_front();
      job->finish("cancelled", {});
      continue;
    }
    // The free slot whose cache shares the longest prefix with the prompt (least recently
    // used among equals).
    Slot* best = nullptr;
    size_t best_keep = 0;
    const size_t n = job->prompt.size();
    for (Slot& s : slots_) {
      if (s.job) continue;
      size_t keep =
          size_t(std::mismatch(s.cached.begin(), s.cached.end(), job->prompt.begin(), job->prompt.end()).first -
                 s.cached.begin());
      // Only rows a long enough prefill computed, and the rest prefilled in one long enough
      // call (kMinPrefillRows); at least one prompt token must run to give logits.
      keep = std::min(keep, s.reusable);
      keep = n > kMinPrefillRows ? std::min(keep, n - kMinPrefillRows) : 0;
      if (!best || keep > best_keep || (keep == best_keep && s.last_used < best->last_used)) {
        best = &s;
        best_keep = keep;
      }
    }
    if (!best) return;
    queue_.pop_front();
    ++busy_;
    Slot& s = *best;
    const size_t keep = best_keep;
    sequence(s).truncate(int64_t(keep));
    s.cached.resize(keep);
    s.reusable = std::min(s.reusable, keep);
    s.job = job;
    s.prefilled = keep;
    s.reused = int64_t(keep);
    s.logits = {};
    s.sampler.emplace(job->params.sampling);
    s.generated.clear();
    s.stop_ids = job->params.ignore_eos ? std::vector<int32_t>{} : eos_;
    s.stop_ids.insert(s.stop_ids.end(), job->params.stop_token_ids.begin(), job->params.stop_token_ids.end());
    std::sort(s.stop_ids.begin(), s.stop_ids.end());
    const int64_t room = ctx_size_ - int64_t(job->prompt.size());
    s.max_tokens = job->params.max_tokens ? std::min<int64_t>(*job->params.max_tokens, room) : room;
    s.utf8 = Utf8Stream();
    s.holdback.emplace(job->params.stop);
  }
}

void Scheduler::prefill_step(Slot& s) {
  const std::vector<int32_t>& p = s.job->prompt;
  const size_t left = p.size() - s.prefilled;
  size_t n = left;
  if (options_.prefill_chunk > 0) {
    n = std::min(left, size_t(options_.prefill_chunk));
    // No chunk below kMinPrefillRows: a short rest joins this chunk.
    if (left - n < kMinPrefillRows) n = left;
  }
  const std::span<const int32_t> chunk(p.data() + s.prefilled, n);
  s.own_logits = sequence(s).forward(chunk, /*all_logits=*/false);
  s.logits = s.own_logits;
  s.cached.insert(s.cached.end(), chunk.begin(), chunk.end());
  // Rows of a call with T >= kMinPrefillRows are what any later prefill would compute.
  if (n >= kMinPrefillRows && s.reusable == s.cached.size() - n) s.reusable = s.cached.size();
  s.prefilled += n;
}

void Scheduler::decode_step(std::span<Slot*> slots) {
  std::vector<Slot*> going;
  std::vector<int> seqs;
  std::vector<int32_t> ids;
  for (Slot* sp : slots) {
    try {
      if (const std::optional<int32_t> next = next_token(*sp)) {
        going.push_back(sp);
        seqs.push_back(sp->index);
        ids.push_back(*next);
      }
    } catch (const std::exception& e) {  // one sequence's failure ends that request only
      if (sp->job) release(*sp, "error", e.what());
    }
  }
  if (going.empty()) return;
  // The step overwrites (or reallocates) step_logits_: a running slot that is not in it (a
  // slow client's, skipped this step) keeps its row in a copy of its own; a slot in it has
  // sampled from its row already.
  for (Slot& s : slots_) {
    if (!s.borrowed()) continue;
    if (s.job && std::find(going.begin(), going.end(), &s) == going.end()) {
      s.own_logits.assign(s.logits.begin(), s.logits.end());
      s.logits = s.own_logits;
    } else {
      s.logits = {};
    }
  }
  std::vector<float>& logits = step_logits_;
  try {
    runner_->decode_batch(seqs, ids, logits);
  } catch (const std::exception& e) {  // the step failed as a whole: every request in it ends
    for (Slot* sp : going) release(*sp, "error", e.what());
    return;
  }
  const size_t V = logits.size() / going.size();
  for (size_t i = 0; i < going.size(); ++i) {
    Slot& s = *going[i];
    s.logits = std::span<const float>(logits).subspan(i * V, V);
    s.cached.push_back(ids[i]);
  }
}

std::optional<int32_t> Scheduler::next_token(Slot& s) {
  const SamplingParams& params = s.job->params;
  const int32_t next = s.sampler->sample(s.logits, s.generated);
  const auto now = Clock::now();
  if (s.generated.empty()) metrics_.time_to_first_token(std::chrono::duration<double>(now - s.job->arrived).count());
  else metrics_.inter_token_latency(std::chrono::duration<double>(now - s.last_token).count());
  s.last_token = now;
  if (std::binary_search(s.stop_ids.begin(), s.stop_ids.end(), next)) {
    release(s, "stop");
    return std::nullopt;
  }
  s.generated.push_back(next);
  const std::string bytes = tokenizer_.is_special(next) ? tokenizer_.token_string(next) : tokenizer_.token_bytes(next);
  std::optional<TokenOut> out;
  if (params.logprobs) {
    const std::vector<float> lg = s.sampler->penalized(s.logits, std::span(s.generated.data(), s.generated.size() - 1));
    const LogprobEntry e = logprobs(lg, next, params.top_logprobs);
    TokenOut t{next, bytes, e.chosen.logprob, {}};
    for (const TokenLogprob& k : e.top)
      t.top.push_back({tokenizer_.is_special(k.id) ? tokenizer_.token_string(k.id) : tokenizer_.token_bytes(k.id), k.logprob});
    out = std::move(t);
  }
  const std::string text = s.holdback->push(s.utf8.push(bytes));
  s.job->emit(text, out);
  if (s.holdback->stopped()) {
    release(s, "stop");
    return std::nullopt;
  }
  if (int64_t(s.generated.size()) >= s.max_tokens || sequence(s).position() + 1 > ctx_size_) {
    release(s, "length");
    return std::nullopt;
  }
  return next;
}

void Scheduler::release(Slot& s, const std::string& reason, const std::string& error) {
  if (reason == "length" || reason == "stop") {
    // What the UTF-8 stream and the stop holdback still hold belongs to the answer.
    std::string rest = s.holdback->push(s.utf8.flush());
    if (!s.holdback->stopped()) rest += s.holdback->flush();
    if (!rest.empty()) s.job->emit(rest, std::nullopt);
  }
  Usage u;
  u.prompt_tokens = int64_t(s.job->prompt.size());
  u.completion_tokens = int64_t(s.generated.size());
  u.cached_tokens = s.reused;
  metrics_.tokens(u.prompt_tokens, u.cached_tokens, u.completion_tokens);
  s.job->finish(reason, u, error);
  s.job.reset();
  {
    std::lock_guard<std::mutex> l(m_);
    --busy_;
  }
  s.sampler.reset();
  s.holdback.reset();
  s.last_used = Clock::now();
  if (!error.empty()) {  // the cache's state is unknown after a failure
    sequence(s).reset();
    s.cached.clear();
    s.reusable = 0;
  }
}

void Scheduler::loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> l(m_);
      cv_.wait(l, [&] {
        return stop_ || !queue_.empty() || std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return bool(s.job); });
      });
      if (stop_) return;
      admit(l);
      int64_t active = 0;
      for (const Slot& s : slots_) active += s.job ? 1 : 0;
      metrics_.gauges(int64_t(queue_.size()), active);
    }
    std::vector<Slot*> decoding;
    bool worked = false;
    for (Slot& s : slots_) {
      if (!s.job) continue;
      if (s.job->cancelled()) {
        release(s, "cancelled");
        worked = true;
        continue;
      }
      try {
        if (!s.decoding()) {
          prefill_step(s);  // one chunk per loop: running streams keep flowing
          worked = true;
        } else if (!s.job->backlogged()) {
          decoding.push_back(&s);
        }
      } catch (const std::exception& e) {
        release(s, "error", e.what());
        worked = true;
      }
    }
    worked = worked || !decoding.empty();
    decode_step(decoding);
    if (!worked) {  // every active request is backlogged: look again shortly, or at a new one
      std::unique_lock<std::mutex> l(m_);
      cv_.wait_for(l, std::chrono::milliseconds(10), [&] { return stop_ || !queue_.empty(); });
    }
    {
      // The gauges as this step left them (a request that just finished is no longer active).
      std::lock_guard<std::mutex> l(m_);
      int64_t active = 0;
      for (const Slot& s : slots_) active += s.job ? 1 : 0;
      metrics_.gauges(int64_t(queue_.size()), active);
    }
  }
}

}  // namespace tessera::serve
