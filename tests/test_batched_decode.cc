// Continuous batching's decode step (ModelRunner::decode_batch): several sequences, each with
// its own KV cache and positions, one pass over the weights for all of them. On the cpu
// target every sequence's logits must be exactly those it gets when run alone, bit for bit,
// whatever joins or leaves the batch, for bf16 and quantized weights, Llama and Qwen
// (biases; q/k norms) layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "convert/gguf_quantize.h"
#include "io/quant_plan.h"
#include "model/weights.h"
#include "targets/cpu/cpu_runner.h"
#include "test_support.h"
#include "util/error.h"

namespace tessera {
namespace {

int32_t argmax(const float* v, int64_t n) { return int32_t(std::max_element(v, v + n) - v); }

// Prompts of different lengths (so the sequences sit at different positions).
const std::vector<std::vector<int32_t>> kPrompts = {
    {1, 17, 42, 99, 7}, {5, 6}, {300, 12, 13, 14, 15, 16, 17, 18, 19}, {8}, {40, 41, 42}};

// Each sequence alone: its prompt, then greedy steps; the logits of every step.
std::vector<std::vector<float>> alone(CpuRunner& cpu, const std::vector<int32_t>& prompt, int steps) {
  const int64_t V = cpu.spec().vocab;
  cpu.reset();
  std::vector<std::vector<float>> out;
  std::vector<float> logits = cpu.forward(prompt, false);
  out.push_back(logits);
  for (int s = 0; s < steps; ++s) {
    const int32_t next = argmax(logits.data(), V);
    logits = cpu.forward(std::vector<int32_t>{next}, false);
    out.push_back(logits);
  }
  return out;
}

void expect_batch_equals_alone(const Model& m, bool fused) {
  CpuOptions co;
  co.threads = 2;
  co.fused_prefill = co.fused_decode = fused;
  CpuRunner solo(m, co), batch(m, co);
  const int64_t V = m.spec().vocab;
  const int steps = 6;
  std::vector<std::vector<std::vector<float>>> want;
  for (const auto& p : kPrompts) want.push_back(alone(solo, p, steps));

  // Sequence i joins at step i - 1 (its prompt prefilled alone then), so every step's batch
  // has a different make-up; sequence 1 leaves after 3 steps.
  const int n = int(kPrompts.size());
  std::vector<int> done(size_t(n), -1);   // steps decoded so far (-1: not started)
  std::vector<int32_t> next(size_t(n), 0);
  for (int step = 0; step < steps + n; ++step) {
    for (int i = 0; i < n; ++i)
      if (done[size_t(i)] < 0 && step >= i - 1) {
        batch.select_sequence(i + 3);  // any sequence numbers, not only 0..n-1
        batch.reset();
        const std::vector<float> l = batch.forward(kPrompts[size_t(i)], false);
        ASSERT_EQ(l, want[size_t(i)][0]) << "prompt of sequence " << i;
        next[size_t(i)] = argmax(l.data(), V);
        done[size_t(i)] = 0;
      }
    std::vector<int> seqs;
    std::vector<int32_t> ids;
    std::vector<int> who;
    for (int i = 0; i < n; ++i) {
      const int limit = i == 1 ? 3 : steps;
      if (done[size_t(i)] >= 0 && done[size_t(i)] < limit) {
        seqs.push_back(i + 3);
        ids.push_back(next[size_t(i)]);
        who.push_back(i);
      }
    }
    if (seqs.empty()) continue;
    batch.select_sequence(0);
    const std::vector<float> logits = batch.decode_batch(seqs, ids);
    ASSERT_EQ(logits.size(), seqs.size() * size_t(V));
    EXPECT_EQ(batch.selected_sequence(), 0);
    for (size_t r = 0; r < who.size(); ++r) {
      const int i = who[r];
      const std::vector<float> row(logits.begin() + std::ptrdiff_t(r * size_t(V)),
                                   logits.begin() + std::ptrdiff_t((r + 1) * size_t(V)));
      ++done[size_t(i)];
      ASSERT_EQ(row, want[size_t(i)][size_t(done[size_t(i)])])
          << "sequence " << i << " step " << done[size_t(i)] << " in a batch of " << seqs.size();
      next[size_t(i)] = argmax(row.data(), V);
      batch.select_sequence(i + 3);
      EXPECT_EQ(batch.position(), int64_t(kPrompts[size_t(i)].size()) + done[size_t(i)]);
    }
  }
}

TEST(BatchedDecode, EverySequenceGetsItsAloneLogitsBitForBit) {
  for (const char* preset : {"SmolLM2-360M", "Qwen3-0.6B"}) {
    SCOPED_TRACE(preset);
    const Model m = Model::open(testing_support::tiny_model(preset));
    expect_batch_equals_alone(m, true);
  }
  const Model m = Model::open(testing_support::tiny_model("SmolLM2-360M"));
  expect_batch_equals_alone(m, false);  // cpu-naive: one kernel per matrix
}

TEST(BatchedDecode, QuantizedWeightsToo) {
  testing_support::ScratchDir dir("batched_decode_quant");
  const Model src = Model::open(testing_support::tiny_model("SmolLM2-360M"));
  for (const char* scheme : {"q4_k_m", "q8_0"}) {
    SCOPED_TRACE(scheme);
    QuantizeOptions q;
    q.out_path = dir.str(std::string(scheme) + ".gguf");
    quantize_model(src, *find_quant_scheme(scheme), q);
    expect_batch_equals_alone(Model::open(q.out_path), true);
  }
}

TEST(BatchedDecode, RefusesWhatItCannotRun) {
  const Model m = Model::open(testing_support::tiny_model("SmolLM2-360M"));
  CpuOptions co;
  co.threads = 1;
  CpuRunner cpu(m, co);
  const std::vector<int> two = {1, 1};
  const std::vector<int32_t> ids = {3, 4};
  EXPECT_THROW(cpu.decode_batch(two, ids), Error);                                   // twice
  EXPECT_THROW(cpu.decode_batch(std::vector<int>{0, CpuRunner::kMaxSequences}, ids), Error);  // out of range
  EXPECT_THROW(cpu.decode_batch(std::vector<int>{0, 1}, std::vector<int32_t>{3, -1}), Error);  // bad id
  EXPECT_THROW(cpu.decode_batch(std::vector<int>{0}, ids), Error);                   // sizes differ
  EXPECT_THROW(cpu.select_sequence(-1), Error);
  // A refused step leaves the positions and the selection as they were.
  EXPECT_EQ(cpu.position(), 0);
  EXPECT_EQ(cpu.selected_sequence(), 0);
  cpu.select_sequence(2);
  EXPECT_THROW(cpu.decode_batch(std::vector<int>{2, 1}, std::vector<int32_t>{3, -1}), Error);
  EXPECT_EQ(cpu.selected_sequence(), 2);
  // The oracle holds one sequence: its decode_batch is a forward of that one.
  OracleRunner oracle(m, 1);
  EXPECT_EQ(oracle.max_sequences(), 1);
  EXPECT_THROW(oracle.select_sequence(1), Error);
  const std::vector<float> a = oracle.decode_batch(std::vector<int>{0}, std::vector<int32_t>{7});
  oracle.reset();
  EXPECT_EQ(a, oracle.forward(std::vector<int32_t>{7}, false));
}

}  // namespace
}  // namespace tessera
