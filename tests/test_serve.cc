// `tessera serve` without HTTP: request parsing and validation, response rendering, the
// stop-string holdback, the sampler's penalties and logprobs, and the scheduler on a tiny
// model (greedy equals Generator's, prefix reuse, the queue bound, slots sharing weights).
// The HTTP server with real clients: tests/serve_e2e.py (ctest ServeE2E), its chat page in
// a browser: tests/chat_page_test.py (ctest ChatPageE2E); here, only that / serves the page.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "convert/gguf_quantize.h"
#include "io/quant_plan.h"
#include "model/weights.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"
#include "serve/http_server.h"
#include "serve/openai_api.h"
#include "serve/scheduler.h"
#include "targets/cpu/cpu_runner.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace tessera::serve {
namespace {

using json = nlohmann::json;
using testing_support::tiny_model;

CpuOptions two_threads() {
  CpuOptions o;
  o.threads = 2;
  return o;
}

// The status and param of the ApiError `f` throws (0 when none).
template <typename F>
std::pair<int, std::string> api_error(F f) {
  try {
    f();
  } catch (const ApiError& e) {
    return {e.status, e.param};
  }
  return {0, ""};
}

int chat_status(const std::string& body) {
  return api_error([&] { parse_chat_request(body); }).first;
}
int completion_status(const std::string& body) {
  return api_error([&] { parse_completion_request(body); }).first;
}

TEST(ServeApi, ParsesAChatRequest) {
  const ChatCompletionRequest r = parse_chat_request(R"({
    "model": "m", "messages": [{"role": "developer", "content": "be brief"},
                                {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}],
    "max_completion_tokens": 7, "max_tokens": 99, "temperature": 0, "top_p": 0.5, "top_k": 3, "seed": 11,
    "stop": ["\n\n", "END"], "stop_token_ids": [5], "frequency_penalty": 0.5, "presence_penalty": -0.5,
    "repetition_penalty": 1.1, "logprobs": true, "top_logprobs": 2, "stream": true,
    "stream_options": {"include_usage": true}, "chat_template_kwargs": {"enable_thinking": false},
    "user": "ignored", "n": 1, "tools": []})");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "hi there");
  EXPECT_EQ(r.params.max_tokens, 7) << "max_completion_tokens wins over the deprecated max_tokens";
  EXPECT_EQ(r.params.sampling.temperature, 0.0f);
  EXPECT_EQ(r.params.sampling.top_p, 0.5f);
  EXPECT_EQ(r.params.sampling.top_k, 3);
  EXPECT_EQ(r.params.sampling.seed, 11u);
  EXPECT_TRUE(r.params.seed_given);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(r.params.stop_token_ids, std::vector<int32_t>{5});
  EXPECT_EQ(r.params.sampling.frequency_penalty, 0.5f);
  EXPECT_EQ(r.params.sampling.presence_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.params.sampling.repetition_penalty, 1.1f);
  EXPECT_TRUE(r.params.logprobs);
  EXPECT_EQ(r.params.top_logprobs, 2);
  EXPECT_TRUE(r.params.stream);
  EXPECT_TRUE(r.params.include_usage);
  EXPECT_EQ(r.enable_thinking, std::optional<bool>(false));
}

TEST(ServeApi, ChatDefaultsAreOpenAIs) {
  const ChatCompletionRequest r = parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}]})");
  EXPECT_FALSE(r.params.max_tokens);
  EXPECT_EQ(r.params.sampling.temperature, 1.0f);
  EXPECT_EQ(r.params.sampling.top_p, 1.0f);
  EXPECT_FALSE(r.params.seed_given);
  EXPECT_FALSE(r.params.stream);
  EXPECT_FALSE(r.params.logprobs);
  EXPECT_FALSE(r.enable_thinking);
  EXPECT_EQ(parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "stop": "##"})").params.stop,
            std::vector<std::string>{"##"});
}

TEST(ServeApi, RefusesBadChatRequestsWith400) {
  const char* bad[] = {
      "",                                          // empty body
      "{",                                         // malformed
      "[1, 2]",                                    // not an object
      "{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}",  // invalid UTF-8
      R"({})",                                     // no messages
      R"({"messages": []})",                       // empty
      R"({"messages": "hello"})",                  // wrong type
      R"({"messages": [42]})",
      R"({"messages": [{"content": "x"}]})",       // no role
      R"({"messages": [{"role": "tool", "content": "x"}]})",
      R"({"messages": [{"role": "user", "content": 5}]})",
      R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
      R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})",
      R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"})",
      R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5})",
      R"({"messages": [{"role": "user", "content": "x"}], "temperature": -1})",
      R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})",
      R"({"messages": [{"role": "user", "content": "x"}], "top_p": 0})",
      R"({"messages": [{"role": "user", "content": "x"}], "top_k": -1})",
      R"({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 3})",
      R"({"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 0})",
      R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})",
      R"({"messages": [{"role": "user", "content": "x"}], "stop": [""]})",
      R"({"messages": [{"role": "user", "content": "x"}], "stop_token_ids": [-1]})",
      R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})",
      R"({"messages": [{"role": "user", "content": "x"}], "n": 2})",
      R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 10}})",
      R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
      R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})",
      R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",  // without logprobs
      R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})",
      R"({"messages": [{"role": "user", "content": "x"}], "seed": 1e30})",
  };
  for (const char* body : bad) EXPECT_EQ(chat_status(body), 400) << body;
  EXPECT_EQ(api_error([] { parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "temperature": 9})"); })
                .second,
            "temperature");
  // Deep nesting is refused while parsing, not by exhausting the stack.
  EXPECT_EQ(chat_status(std::string(100000, '[') + std::string(100000, ']')), 400);
}

TEST(ServeApi, ParsesCompletionPrompts) {
  EXPECT_EQ(parse_completion_request(R"({"prompt": "Once"})").prompt_text, "Once");
  EXPECT_EQ(parse_completion_request(R"({"prompt": ["Once"]})").prompt_text, "Once");
  EXPECT_EQ(parse_completion_request(R"({"prompt": [1, 2, 3]})").prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_completion_request(R"({"prompt": [[4, 5]]})").prompt_ids, (std::vector<int32_t>{4, 5}));
  const CompletionRequest r = parse_completion_request(R"({"prompt": "x", "logprobs": 3})");
  EXPECT_TRUE(r.params.logprobs);
  EXPECT_EQ(r.params.top_logprobs, 3);
  for (const char* body : {R"({})", R"({"prompt": ""})", R"({"prompt": []})", R"({"prompt": ["a", "b"]})",
                           R"({"prompt": [1, -2]})", R"({"prompt": 7})", R"({"prompt": "x", "echo": true})",
                           R"({"prompt": "x", "best_of": 2})", R"({"prompt": "x", "logprobs": true})"})
    EXPECT_EQ(completion_status(body), 400) << body;
}

TEST(ServeApi, RendersResponsesAsOpenAI) {
  Usage u{12, 3, 4};
  std::vector<TokenOut> toks = {{7, "Hi", -0.25f, {{"Hi", -0.25f}, {"Hello", -1.5f}}}, {8, "\xe2\x82", -0.5f, {}}};
  const json c = chat_response("chatcmpl-1", 100, "m", "Hi!", "stop", u, &toks);
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(c["choices"][0]["message"]["content"], "Hi!");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(c["usage"]["total_tokens"], 15);
  EXPECT_EQ(c["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  const json& lp = c["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 2u);
  EXPECT_EQ(lp[0]["top_logprobs"][1]["token"], "Hello");
  EXPECT_EQ(lp[1]["bytes"], json::array({0xe2, 0x82})) << "bytes keep a token's partial character";
  // A partial character is not valid UTF-8 as a JSON string: replaced, never an exception.
  EXPECT_NE(dump(c).find("\xef\xbf\xbd"), std::string::npos);
  EXPECT_TRUE(chat_response("x", 1, "m", "", "length", u, nullptr)["choices"][0]["logprobs"].is_null());

  const json t = completion_response("cmpl-1", 100, "m", "ab", "length", u, &toks);
  EXPECT_EQ(t["object"], "text_completion");
  EXPECT_EQ(t["choices"][0]["text"], "ab");
  EXPECT_EQ(t["choices"][0]["logprobs"]["text_offset"], json::array({0, 2}));
  EXPECT_EQ(t["choices"][0]["logprobs"]["top_logprobs"][0]["Hello"], -1.5);

  const json first = stream_chunk(Endpoint::Chat, "id", 1, "m", "He", std::nullopt, nullptr, true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "He");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  const json last = stream_chunk(Endpoint::Chat, "id", 1, "m", "", std::string("length"), nullptr, false);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(last["choices"][0]["delta"].contains("content"));
  EXPECT_TRUE(usage_chunk(Endpoint::Chat, "id", 1, "m", u)["choices"].empty());
  const std::string ev = sse_event(first);
  EXPECT_EQ(ev.rfind("data: {", 0), 0u);
  EXPECT_EQ(ev.substr(ev.size() - 2), "\n\n");
  EXPECT_EQ(json::parse(ev.substr(6)), first);
  EXPECT_STREQ(done_event(), "data: [DONE]\n\n");

  const json e = json::parse(error_body(ApiError(429, "busy", "rate_limit_error", "", "queue_full")));
  EXPECT_EQ(e["error"]["message"], "busy");
  EXPECT_EQ(e["error"]["type"], "rate_limit_error");
  EXPECT_TRUE(e["error"]["param"].is_null());
  EXPECT_EQ(e["error"]["code"], "queue_full");
  EXPECT_EQ(models_response("m", 5)["data"][0]["id"], "m");
}

// Everything the holdback emits, and whether it stopped, for text arriving in `pieces`.
std::pair<std::string, bool> hold(std::vector<std::string> stops, const std::vector<std::string>& pieces,
                                  std::vector<std::string>* emitted = nullptr) {
  StopHoldback h(std::move(stops));
  std::string out;
  for (const std::string& p : pieces) {
    const std::string e = h.push(p);
    if (emitted) emitted->push_back(e);
    out += e;
    if (h.stopped()) break;
  }
  if (!h.stopped()) out += h.flush();
  return {out, h.stopped()};
}

TEST(ServeStop, HoldsBackWhatCouldStartAStopString) {
  std::vector<std::string> emitted;
  EXPECT_EQ(hold({"END"}, {"The ", "E", "N", "D", " more"}, &emitted), std::make_pair(std::string("The "), true));
  EXPECT_EQ(emitted, (std::vector<std::string>{"The ", "", "", ""})) << "no part of END ever reaches the client";
  emitted.clear();
  // A false start is released as soon as it cannot be a stop string any more.
  EXPECT_EQ(hold({"END"}, {"EN", "x", "y"}, &emitted), std::make_pair(std::string("ENxy"), false));
  EXPECT_EQ(emitted, (std::vector<std::string>{"", "ENx", "y"}));
  // The stop string inside one piece: the text before it only.
  EXPECT_EQ(hold({"\n\n"}, {"a\n\nb"}), std::make_pair(std::string("a"), true));
  // The earliest of several.
  EXPECT_EQ(hold({"cd", "b"}, {"abcd"}), std::make_pair(std::string("a"), true));
  // Overlapping prefixes: "aab" after "aa".
  EXPECT_EQ(hold({"aab"}, {"a", "a", "a", "b"}), std::make_pair(std::string("a"), true));
  // What is held when generation ends for another reason belongs to the answer.
  EXPECT_EQ(hold({"END"}, {"x", "EN"}), std::make_pair(std::string("xEN"), false));
  // Multi-byte characters: held and released whole.
  EXPECT_EQ(hold({"\xc3\xa9t\xc3\xa9"}, {"l'\xc3\xa9", "t\xc3\xa9", "!"}), std::make_pair(std::string("l'"), true));
  EXPECT_EQ(hold({}, {"a", "b"}), std::make_pair(std::string("ab"), false));
}

TEST(Sampler, PenaltiesChangeTheChoiceAndStayDeterministic) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.9f, -1.0f};
  const std::vector<int32_t> history = {1, 1};
  SamplingOptions none;
  EXPECT_EQ(Sampler(none).sample(logits, history), 1) << "no penalty: the history changes nothing";
  SamplingOptions rep;
  rep.repetition_penalty = 1.5f;  // 3.0 / 1.5 = 2.0 < 2.9
  EXPECT_EQ(Sampler(rep).sample(logits, history), 2);
  EXPECT_EQ(Sampler(rep).penalized(logits, std::vector<int32_t>{3})[3], -1.5f) << "negative logits are multiplied";
  SamplingOptions freq;
  freq.frequency_penalty = 0.1f;  // 3.0 - 0.2 = 2.8 < 2.9
  EXPECT_EQ(Sampler(freq).sample(logits, history), 2);
  SamplingOptions pres;
  pres.presence_penalty = 0.05f;  // 2.95 > 2.9: presence counts once
  EXPECT_EQ(Sampler(pres).sample(logits, history), 1);
  pres.presence_penalty = 0.2f;
  EXPECT_EQ(Sampler(pres).sample(logits, history), 2);
  // Seeded sampling with penalties reproduces.
  SamplingOptions s;
  s.temperature = 1.0f;
  s.seed = 9;
  s.frequency_penalty = 1.0f;
  Sampler a(s), b(s);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits, history), b.sample(logits, history));
  SamplingOptions badp;
  badp.repetition_penalty = 0;
  EXPECT_THROW(badp.validate(), Error);
}

TEST(Sampler, LogprobsAreTheLogSoftmax) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f};
  const LogprobEntry e = logprobs(logits, 2, 3);
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  EXPECT_NEAR(e.chosen.logprob, 2.0 - std::log(z), 1e-6);
  ASSERT_EQ(e.top.size(), 3u);
  EXPECT_EQ(e.top[0].id, 1) << "the lower id first among ties";
  EXPECT_EQ(e.top[1].id, 3);
  EXPECT_EQ(e.top[2].id, 2);
  EXPECT_TRUE(logprobs(logits, 0, 0).top.empty());
}

// The scheduler on a tiny model: the runners as `tessera serve` makes them.
struct Served {
  explicit Served(int slots, SchedulerOptions o = {}, const std::string& path = tiny_model("SmolLM2-360M"))
      : model(Model::open(path)), tok(Tokenizer::for_model(model)) {
    CpuOptions co;
    co.threads = 2;
    sched = std::make_unique<Scheduler>(std::make_unique<CpuRunner>(model, co), slots, tok, o, metrics);
  }
  // Runs to the end; the text and the final output.
  static std::pair<std::string, Job::Output> collect(const std::shared_ptr<Job>& job) {
    std::string text;
    Job::Output o;
    do {
      o = job->take(std::chrono::seconds(5));
      text += o.text;
    } while (!o.done);
    return {text, o};
  }
  Model model;
  Tokenizer tok;
  Metrics metrics;
  std::unique_ptr<Scheduler> sched;
};

SamplingParams greedy(int n) {
  SamplingParams p;
  p.max_tokens = n;
  p.sampling.temperature = 0;
  p.ignore_eos = true;  // random weights: run the whole length
  return p;
}

TEST(ServeScheduler, RefusesMoreSlotsThanTheRunnerHolds) {
  const Model model = Model::open(tiny_model("SmolLM2-360M"));
  const Tokenizer tok = Tokenizer::for_model(model);
  Metrics metrics;
  try {
    Scheduler sched(std::make_unique<OracleRunner>(model, 1), 2, tok, {}, metrics);
    ADD_FAILURE() << "two slots on a one-sequence runner";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use --parallel 1"), std::string::npos) << e.what();
  }
}

TEST(ServeScheduler, GreedyEqualsGeneratorAloneAndSideBySide) {
  Served s(3);
  const std::vector<std::vector<int32_t>> prompts = {
      s.tok.encode_prompt("The quick brown fox"), s.tok.encode_prompt("Once upon a time there was"),
      std::vector<int32_t>(150, 42)};  // longer than a prefill chunk: prefilled in three steps
  std::vector<std::string> alone;
  for (const auto& p : prompts) {
    CpuRunner r(s.model, two_threads());
    GenerationOptions g;
    g.max_new_tokens = 12;
    g.stop_on_eos = false;
    alone.push_back(Generator(r, s.tok).generate(p, g).text);
  }
  std::vector<std::shared_ptr<Job>> jobs;
  for (const auto& p : prompts) {
    jobs.push_back(std::make_shared<Job>(p, greedy(12)));
    s.sched->submit(jobs.back());
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    auto [text, o] = Served::collect(jobs[i]);
    EXPECT_EQ(text, alone[i]) << "prompt " << i;
    EXPECT_EQ(o.finish_reason, "length");
    EXPECT_EQ(o.usage.completion_tokens, 12);
    EXPECT_EQ(o.usage.prompt_tokens, int64_t(prompts[i].size()));
  }
}

// A client that stops reading (its HTTP thread blocked on a full socket) must not keep its
// slot generating: after Job::kMaxUnread untaken tokens the scheduler pauses it, the other
// slot's request runs to its end meanwhile, and the paused one goes on, to the same text it
// gets alone, once it is read again.
TEST(ServeScheduler, AStalledReaderPausesItsSlotAndResumes) {
  Served s(2);
  const std::vector<int32_t> prompt = s.tok.encode_prompt("The quick brown fox");
  SamplingParams p = greedy(Job::kMaxUnread + 40);
  p.logprobs = true;  // the outputs carry the ids: count them
  auto stalled = std::make_shared<Job>(prompt, p);
  auto other = std::make_shared<Job>(s.tok.encode_prompt("Once upon a time"), greedy(3 * Job::kMaxUnread));
  s.sched->submit(stalled);
  s.sched->submit(other);
  auto [text, o] = Served::collect(other);  // the other request's whole answer, while `stalled` is not read
  EXPECT_EQ(o.usage.completion_tokens, 3 * Job::kMaxUnread);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Job::Output first = stalled->take(std::chrono::seconds(5));
  EXPECT_FALSE(first.done);
  EXPECT_EQ(int64_t(first.tokens.size()), Job::kMaxUnread) << "generated while nobody read it";
  std::string all = first.text;
  Job::Output rest;
  do {
    rest = stalled->take(std::chrono::seconds(5));
    all += rest.text;
  } while (!rest.done);
  EXPECT_EQ(rest.usage.completion_tokens, Job::kMaxUnread + 40);
  CpuRunner r(s.model, two_threads());
  GenerationOptions g;
  g.max_new_tokens = int(Job::kMaxUnread + 40);
  g.stop_on_eos = false;
  EXPECT_EQ(all, Generator(r, s.tok).generate(prompt, g).text);
}

// Runs to the end; the ids generated (the request must ask for logprobs, which carry them).
std::vector<int32_t> collect_ids(const std::shared_ptr<Job>& job) {
  std::vector<int32_t> ids;
  for (Job::Output o; !o.done;) {
    o = job->take(std::chrono::seconds(5));
    for (const TokenOut& t : o.tokens) ids.push_back(t.id);
  }
  return ids;
}

// Eight requests at once, on every family's layout (SmolLM2 and Llama 3.2: Llama; Qwen2.5:
// qkv biases; Qwen3: q/k norms) in bf16 and quantized: each gets the ids it gets served alone
// and those of `tessera run` (Generator on a fresh runner), bit for bit. The prompts differ
// in length (1 to 90 ids: short ones decode while long ones are still prefilled in chunks,
// and the batch's make-up changes as requests finish at different lengths), so a row that
// read another row's cache or positions, or a kernel whose rows depended on the batch's size,
// changes some request's ids.
TEST(ServeScheduler, EightAtOnceEqualAloneAndRunOnEveryFamilyBf16AndQuantized) {
  testing_support::ScratchDir dir("serve_eight");
  std::vector<std::pair<std::string, std::string>> models;  // what, path
#ifdef TESSERA_SANITIZED
  // Under ASan/UBSan (several times slower): the bf16 and the default model's quantized
  // type once; the families in Release.
  const std::vector<const char*> bf16 = {"SmolLM2-360M"};
  const std::vector<std::pair<std::string, std::string>> quantized = {{"SmolLM2-360M", "q4_1"}};
#else
  const std::vector<const char*> bf16 = {"SmolLM2-360M", "Llama-3.2-1B", "Qwen2.5-0.5B", "Qwen3-0.6B"};
  // The default model's type (q4_1), a K-quant and q8_0 (both int8 activations in decode).
  // Not Qwen2.5 again: its tiny form is the largest (a 152k x 896 embedding).
  const std::vector<std::pair<std::string, std::string>> quantized = {
      {"SmolLM2-360M", "q4_1"}, {"Llama-3.2-1B", "q4_k_m"}, {"Qwen3-0.6B", "q8_0"}};
#endif
  for (const char* preset : bf16) models.emplace_back(std::string(preset) + " bf16", tiny_model(preset));
  for (const auto& [preset, scheme] : quantized) {
    QuantizeOptions q;
    q.out_path = dir.str(preset + "." + scheme + ".gguf");
    quantize_model(Model::open(tiny_model(preset)), *find_quant_scheme(scheme), q);
    models.emplace_back(preset + " " + scheme, q.out_path);
  }
  const std::vector<size_t> lengths = {1, 3, 9, 15, 16, 17, 40, 90};
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<int32_t> p;
    for (size_t k = 0; k < lengths[i]; ++k) p.push_back(int32_t(100 + (i * 7919 + k * 31) % 5000));
    prompts.push_back(p);
  }
  auto params = [](size_t i) {
    // Requests end at different steps; the first ends after the longest prompt's prefill
    // (two chunks), so several steps run all eight rows (the 8-row blocks of the batched GEMVs).
    SamplingParams p = greedy(int(6 + i));
    p.logprobs = true;                       // for the ids
    return p;
  };
  for (const auto& [what, path] : models) {
    SCOPED_TRACE(what);
    std::vector<std::vector<int32_t>> run, alone;
    Served s(1, {}, path);
    {
      CpuRunner r(s.model, two_threads());
      for (size_t i = 0; i < prompts.size(); ++i) {
        r.reset();  // as fresh: `tessera run`
        GenerationOptions g;
        g.max_new_tokens = params(i).max_tokens.value();
        g.stop_on_eos = false;
        run.push_back(Generator(r, s.tok).generate(prompts[i], g).tokens);
      }
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto j = std::make_shared<Job>(prompts[i], params(i));
      s.sched->submit(j);
      alone.push_back(collect_ids(j));
    }
    // Eight slots of a fresh runner on the same weights.
    s.sched = std::make_unique<Scheduler>(std::make_unique<CpuRunner>(s.model, two_threads()), 8, s.tok,
                                          SchedulerOptions{}, s.metrics);
    std::vector<std::shared_ptr<Job>> jobs;
    for (size_t i = 0; i < prompts.size(); ++i) {
      jobs.push_back(std::make_shared<Job>(prompts[i], params(i)));
      s.sched->submit(jobs.back());
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(run[i].size(), size_t(params(i).max_tokens.value())) << "prompt " << i;
      EXPECT_EQ(alone[i], run[i]) << "prompt " << i << " (" << prompts[i].size() << " ids) served alone";
      EXPECT_EQ(collect_ids(jobs[i]), run[i]) << "prompt " << i << " (" << prompts[i].size() << " ids) among 8";
    }
  }
}

TEST(ServeScheduler, ReusesTheLongestCachedPrefixWithTheSameNumbers) {
  Served s(2);
  std::vector<int32_t> base;
  for (int i = 0; i < 40; ++i) base.push_back(100 + (i * 37) % 500);
  auto j1 = std::make_shared<Job>(base, greedy(6));
  s.sched->submit(j1);
  const std::string first = Served::collect(j1).first;
  EXPECT_EQ(Served::collect(j1).second.usage.cached_tokens, 0);
  // The same prompt and 20 more ids: the slot that ran the first prompt takes it and
  // prefills only the 20; the answer is the one a fresh runner gives.
  std::vector<int32_t> longer = base;
  for (int i = 0; i < 20; ++i) longer.push_back(7 + i);
  auto j2 = std::make_shared<Job>(longer, greedy(6));
  s.sched->submit(j2);
  auto [text2, o2] = Served::collect(j2);
  EXPECT_EQ(o2.usage.cached_tokens, int64_t(base.size()));
  CpuRunner fresh(s.model, two_threads());
  GenerationOptions g;
  g.max_new_tokens = 6;
  g.stop_on_eos = false;
  EXPECT_EQ(text2, Generator(fresh, s.tok).generate(longer, g).text) << "reuse keeps tessera run's numbers";
  // The same prompt again: all but the last kMinPrefillRows ids reused, the same answer.
  auto j3 = std::make_shared<Job>(base, greedy(6));
  s.sched->submit(j3);
  auto [text3, o3] = Served::collect(j3);
  EXPECT_EQ(o3.usage.cached_tokens, int64_t(base.size() - kMinPrefillRows));
  EXPECT_EQ(text3, first);
  // A short prompt (fewer than kMinPrefillRows ids) always runs whole.
  const std::vector<int32_t> shorter(base.begin(), base.begin() + 10);
  auto j4 = std::make_shared<Job>(shorter, greedy(2));
  s.sched->submit(j4);
  EXPECT_EQ(Served::collect(j4).second.usage.cached_tokens, 0);
}

TEST(ServeScheduler, StopsOnStopStringsAndIds) {
  Served s(1);
  const std::vector<int32_t> p = s.tok.encode_prompt("Hello");
  auto j = std::make_shared<Job>(p, greedy(8));
  s.sched->submit(j);
  const std::string full = Served::collect(j).first;
  ASSERT_GE(full.size(), 4u);
  SamplingParams stop = greedy(8);
  stop.stop = {full.substr(2, 2)};
  auto js = std::make_shared<Job>(p, stop);
  s.sched->submit(js);
  auto [text, o] = Served::collect(js);
  EXPECT_EQ(o.finish_reason, "stop");
  EXPECT_EQ(text, full.substr(0, full.find(stop.stop[0])));
  // The first generated id (logprobs name it) as a stop id: nothing generated.
  SamplingParams one = greedy(1);
  one.logprobs = true;
  auto jf = std::make_shared<Job>(p, one);
  s.sched->submit(jf);
  std::vector<TokenOut> toks;
  for (Job::Output o; !o.done;) {
    o = jf->take(std::chrono::seconds(5));
    toks.insert(toks.end(), o.tokens.begin(), o.tokens.end());
  }
  ASSERT_EQ(toks.size(), 1u);
  SamplingParams ids = greedy(8);
  ids.stop_token_ids = {toks[0].id};
  auto ji = std::make_shared<Job>(p, ids);
  s.sched->submit(ji);
  auto [t2, o2] = Served::collect(ji);
  EXPECT_EQ(o2.finish_reason, "stop");
  EXPECT_EQ(t2, "");
  EXPECT_EQ(o2.usage.completion_tokens, 0);
}

TEST(ServeScheduler, RefusesWhatCannotRun) {
  SchedulerOptions o;
  o.ctx_size = 256;
  o.queue_size = 1;
  Served s(1, o);
  auto too_long = std::make_shared<Job>(std::vector<int32_t>(256, 5), greedy(1));
  EXPECT_EQ(api_error([&] { s.sched->submit(too_long); }).first, 400);
  auto bad_id = std::make_shared<Job>(std::vector<int32_t>{1, 1 << 30}, greedy(1));
  EXPECT_EQ(api_error([&] { s.sched->submit(bad_id); }).first, 400);
  // One running (long), one queued; the next is refused with 429.
  auto running = std::make_shared<Job>(std::vector<int32_t>{1, 2}, greedy(250));
  s.sched->submit(running);
  for (Job::Output r; !r.done && r.text.empty();) r = running->take(std::chrono::seconds(5));  // admitted: tokens flow
  auto queued = std::make_shared<Job>(std::vector<int32_t>{1, 2}, greedy(1));
  s.sched->submit(queued);
  auto refused = std::make_shared<Job>(std::vector<int32_t>{1, 2}, greedy(1));
  EXPECT_EQ(api_error([&] { s.sched->submit(refused); }).first, 429);
  // A cancelled request frees its slot: the queued one runs.
  running->cancel();
  EXPECT_EQ(Served::collect(queued).second.finish_reason, "length");
  // --queue 0: a free slot still takes a request.
  SchedulerOptions none;
  none.queue_size = 0;
  Served z(1, none);
  auto now = std::make_shared<Job>(std::vector<int32_t>{1, 2}, greedy(2));
  EXPECT_EQ(api_error([&] { z.sched->submit(now); }).first, 0);
  EXPECT_EQ(Served::collect(now).second.usage.completion_tokens, 2);
  // max_tokens beyond the context ends at the context.
  auto fill = std::make_shared<Job>(std::vector<int32_t>{1, 2}, greedy(1000));
  s.sched->submit(fill);
  const Job::Output f = Served::collect(fill).second;
  EXPECT_EQ(f.finish_reason, "length");
  EXPECT_EQ(f.usage.completion_tokens, 254);
}

// GET / is the embedded chat page, as HTML, without the API key (which guards /v1/ only) and
// while the model is still loading (no backend attached).
TEST(ServeHttp, ServesTheChatPageAtTheRoot) {
  ASSERT_GT(chat_page().size(), 1000u);
  EXPECT_NE(chat_page().find("<title>tessera chat</title>"), std::string_view::npos);
  HttpOptions o;
  o.port = 0;
  o.api_key = "sk-page-test";
  Metrics metrics;
  HttpServer server(o, metrics);
  server.bind();
  std::thread listener([&] { server.listen(); });
  httplib::Client client("127.0.0.1", server.bound_port());
  auto page = client.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(page->body, chat_page());
  auto api = client.Get("/v1/models");
  ASSERT_TRUE(api);
  EXPECT_EQ(api->status, 401);
  server.stop();
  listener.join();
}

}  // namespace
}  // namespace tessera::serve
