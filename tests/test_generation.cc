// Generation with the default model: greedy tokens identical to transformers' (fixture made
// by tools/reference/generation_fixtures.py on the same dequantized GGUF weights), and the
// clear messages `tessera run` gives for bad prompts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/weights.h"
#include "pipeline/phases.h"
#include "targets/target.h"
#include "runtime/chat_session.h"
#include "runtime/generate.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing_support::run_tessera;

const fs::path kFixture = fs::path(TESSERA_SOURCE_DIR) / "tests/fixtures/generation/smollm2-135m-instruct.json";

bool have_default_model() { return fs::exists(testing_support::default_gguf()); }

TEST(Generation, GreedyMatchesTransformersOnTheDefaultModel) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "the real model end to end is the Release run's; CpuTargetAndOracleGiveTheSameGreedyAnswer covers generation under sanitizers";
#endif
  if (!have_default_model()) GTEST_SKIP() << "run scripts/setup.sh";
  if (!fs::exists(kFixture)) GTEST_SKIP() << "no fixture " << kFixture;
  nlohmann::json fx;
  std::ifstream(kFixture) >> fx;
  Model model = Model::open(testing_support::default_gguf());
  Tokenizer tok = Tokenizer::for_model(model);
  OracleRunner oracle(model);
  ASSERT_GE(fx["cases"].size(), 3u);
  for (const auto& c : fx["cases"]) {
    ChatSession chat(oracle, tok, std::nullopt);
    GenerationOptions opts;
    opts.max_new_tokens = int(c["generated_ids"].size());
    opts.stop_on_eos = false;  // the fixture ran exactly this many tokens
    GenerationResult r = chat.reply(c["prompt"].get<std::string>(), opts);
    EXPECT_EQ(chat.last_prompt_ids(), c["prompt_ids"].get<std::vector<int32_t>>()) << c["prompt"];
    EXPECT_EQ(r.tokens, c["generated_ids"].get<std::vector<int32_t>>()) << c["prompt"];
    std::printf("[ greedy   ] %s -> %s\n", c["prompt"].get<std::string>().c_str(), nlohmann::json(r.text).dump().c_str());
  }
}

// The second turn reuses the KV cache for the unchanged prefix; it must give exactly what a
// fresh run over the whole rendered conversation gives.
TEST(Generation, ChatReusesTheCacheWithoutChangingTheAnswer) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "the real model end to end is the Release run's; CpuTargetAndOracleGiveTheSameGreedyAnswer covers generation under sanitizers";
#endif
  if (!have_default_model()) GTEST_SKIP() << "run scripts/setup.sh";
  Model model = Model::open(testing_support::default_gguf());
  Tokenizer tok = Tokenizer::for_model(model);
  OracleRunner oracle(model);
  ChatSession chat(oracle, tok, std::nullopt);
  GenerationOptions opts;
  opts.max_new_tokens = 8;
  chat.reply("What is the capital of France?", opts);
  const GenerationResult second = chat.reply("And of Germany?", opts);
  EXPECT_LT(second.prompt_tokens, int64_t(chat.last_prompt_ids().size())) << "the history was not re-run";

  OracleRunner fresh(model);
  const GenerationResult again = Generator(fresh, tok).generate(chat.last_prompt_ids(), opts);
  EXPECT_EQ(second.tokens, again.tokens);
  EXPECT_EQ(chat.history().size(), 4u);
}

// Phase 6 runs the oracle along the target's greedy tokens (one forward over all of them):
// the result must be the oracle's own greedy run, tokens and top-k lists, whether the tokens it
// is given are its own, diverge (it goes on alone from there), or run out early.
TEST(Generation, OracleAlongAnotherRunnersTokensIsItsOwnGreedyRun) {
  for (const char* preset : {"SmolLM2-360M", "Qwen3-0.6B"}) {
    SCOPED_TRACE(preset);
    Model model = Model::open(testing_support::tiny_model(preset));
    OracleRunner oracle(model, 2);
    const std::vector<int32_t> prompt = {11, 400, 23, 7, 1999};
    const int n = 10, k = 5;
    const Greedy own = greedy(oracle, prompt, n, k);
    ASSERT_EQ(own.tokens.size(), size_t(n));
    std::vector<std::vector<int32_t>> alongs = {own.tokens, {}, {own.tokens[0], own.tokens[1]}};
    for (const size_t at : {size_t(0), size_t(4), size_t(n - 1)}) {
      std::vector<int32_t> other = own.tokens;
      other[at] = (other[at] + 1) % int32_t(model.spec().vocab);  // diverges at step `at`; the rest is stale
      alongs.push_back(other);
    }
    for (const std::vector<int32_t>& along : alongs) {
      const Greedy g = greedy_along(oracle, prompt, along, n, k);
      EXPECT_EQ(g.tokens, own.tokens) << along.size();
      EXPECT_EQ(g.topk, own.topk) << along.size();
      EXPECT_EQ(oracle.position(), int64_t(prompt.size()) + n - 1);
    }
  }
}

TEST(Generation, CliRunChatAnswers) {
  if (!have_default_model()) GTEST_SKIP() << "run scripts/setup.sh";
  auto r = run_tessera("run --chat --prompt 'What is the capital of France?' -n 12 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["text"].get<std::string>().find("Paris"), std::string::npos) << j["text"];
  EXPECT_EQ(j["executor"], "cpu");  // a model runs on the cpu target unless told otherwise
}

// The cpu target and the oracle agree on the default model's greedy answer.
TEST(Generation, CpuTargetAndOracleGiveTheSameGreedyAnswer) {
  if (!have_default_model()) GTEST_SKIP() << "run scripts/setup.sh";
  auto cpu = run_tessera("run --chat --prompt 'Name three colors.' -n 16 --json");
  auto ref = run_tessera("run --chat --prompt 'Name three colors.' -n 16 --json --target oracle");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  const auto jc = nlohmann::json::parse(cpu.out), jr = nlohmann::json::parse(ref.out);
  EXPECT_EQ(jr["executor"], "oracle");
  EXPECT_EQ(jc["generated_ids"], jr["generated_ids"]);
}

void expect_clear_error(const std::string& args, const std::string& needle) {
  auto r = run_tessera(args);
  EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

TEST(Generation, BadPromptsGiveClearMessages) {
  if (!have_default_model()) GTEST_SKIP() << "run scripts/setup.sh";
  expect_clear_error("run --prompt ''", "empty");
  expect_clear_error("run --chat --prompt ''", "empty");
  expect_clear_error("run --prompt \"$(printf 'caf\\351 au lait')\"", "UTF-8");  // Latin-1 byte
  expect_clear_error("run --chat --prompt '<|im_strat|>user hi'", "unknown special token '<|im_strat|>'");
  expect_clear_error("detokenize --ids 1,99999999", "99999999");
  // SmolLM2's context is 8192 tokens: 9000 words cannot fit.
  std::string long_prompt;
  for (int i = 0; i < 9000; ++i) long_prompt += "word ";
  const fs::path f = fs::path(::testing::TempDir()) / "tessera_long_prompt.txt";
  std::ofstream(f) << long_prompt;
  expect_clear_error("run --prompt \"$(cat " + f.string() + ")\" -n 1", "context of 8192");
  fs::remove(f);
}

// The stop set holds every end-of-sequence id the checkpoint declares: one that only
// generation_config.json lists (as Qwen2.5 instruct's does) stops generation too.
TEST(Generation, StopSetHoldsGenerationConfigIds) {
  testing_support::ScratchDir out("stopset");
  fs::copy(testing_support::tiny_model("SmolLM2-360M"), out.path() / "m", fs::copy_options::recursive);
  const Model before = Model::open((out.path() / "m").string());
  const Tokenizer tok = Tokenizer::for_model(before);
  const int32_t extra = 7;  // an ordinary token no file declares
  OracleRunner runner(before, 1);
  const Generator plain(runner, tok);
  ASSERT_FALSE(std::binary_search(plain.stop_ids().begin(), plain.stop_ids().end(), extra));
  std::ofstream(out.path() / "m" / "generation_config.json") << R"({"eos_token_id": [2, 7]})";
  const Model after = Model::open((out.path() / "m").string());
  OracleRunner runner2(after, 1);
  const Generator gen(runner2, tok);
  EXPECT_TRUE(std::binary_search(gen.stop_ids().begin(), gen.stop_ids().end(), extra));
  EXPECT_EQ(stop_ids(tok, after.spec()), gen.stop_ids());
}

}  // namespace
}  // namespace tessera
