// What every executor offers generation and benchmarks: a model runner (prefill + decode
// with a KV cache, probe points named like the oracle's, per-op execution counters), and
// how a fault a target can be made to commit on purpose is described. The FP32 oracle is wrapped
// in the same interface so that generation, gates and benchmarks treat every executor
// alike. What the pipeline needs beyond this is StagedRunner (targets/staged_runner.h);
// targets are made by name through targets/registry.h.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "model/weights.h"
#include "oracle/oracle.h"

namespace tessera {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual std::string target() const = 0;  // "cpu", "oracle", "npusim"
  virtual const ModelSpec& spec() const = 0;
  // Runs `ids` at the next positions (appending to the KV cache) and returns logits for
  // every position ([T, vocab]) or the last only ([1, vocab]). Probe names as the oracle's.
  virtual std::vector<float> forward(std::span<const int32_t> ids, bool all_logits = true,
                                     const ProbeFn& probe = {}, ProbeLevel level = ProbeLevel::None) = 0;
  virtual int64_t position() const = 0;
  virtual void reset(int64_t start_position = 0) = 0;  // see Oracle::reset
  virtual void truncate(int64_t positions) = 0;
  // How many times each op ran on this target since construction ("gemm", "attention", ...).
  virtual std::map<std::string, int64_t> op_counters() const { return {}; }

  // Several sequences in one runner (continuous batching): each has its own KV cache and
  // positions; forward, position, reset and truncate act on the selected one. Sequence 0
  // always exists; a runner that holds only it says max_sequences() == 1.
  virtual int max_sequences() const { return 1; }
  virtual void select_sequence(int seq);
  virtual int selected_sequence() const { return 0; }
  // One decode step of several distinct sequences: ids[i] at the next position of sequence
  // seqs[i]. Leaves [seqs.size(), vocab] logits in `logits`, row i what forward({ids[i]},
  // false) returns on sequence seqs[i] alone (bit for bit where the target says so); a vector
  // kept from the last step of the same size is overwritten, not cleared first (4 MB a step
  // for 8 rows of a 128K vocabulary). The selection is kept. By default, one forward per
  // sequence.
  virtual void decode_batch(std::span<const int> seqs, std::span<const int32_t> ids, std::vector<float>& logits);
  std::vector<float> decode_batch(std::span<const int> seqs, std::span<const int32_t> ids) {
    std::vector<float> logits;
    decode_batch(seqs, ids, logits);
    return logits;
  }
};

// The oracle as a runner (the reference every target is gated against).
class OracleRunner final : public ModelRunner {
 public:
  explicit OracleRunner(const Model& model, int threads = 0) : oracle_(model, threads) {}
  std::string target() const override { return "oracle"; }
  const ModelSpec& spec() const override { return oracle_.spec(); }
  std::vector<float> forward(std::span<const int32_t> ids, bool all_logits = true, const ProbeFn& probe = {},
                             ProbeLevel level = ProbeLevel::None) override {
    return oracle_.forward(ids, all_logits, probe, level);
  }
  int64_t position() const override { return oracle_.position(); }
  void reset(int64_t start_position = 0) override { oracle_.reset(start_position); }
  void truncate(int64_t positions) override { oracle_.truncate(positions); }
  Oracle& oracle() { return oracle_; }

 private:
  Oracle oracle_;
};

// A fault a deployment can be made to commit on purpose (`--inject NAME`), each a known
// porting failure from ../shared/reference/porting-pitfalls.md; the gates must catch every
// one. A target declares the faults of its own mapping (TargetDef::faults); the porting and
// runtime faults every target takes live outside the targets (faults/catalogue.h).
struct FaultInfo {
  std::string name;
  std::string kernel;       // the stage whose output the fault corrupts (what bisect must name)
  int first_phase;          // the first phase whose gate must catch it; -1: none (an advisory skill names it)
  std::string description;
};
using FaultSet = std::set<std::string>;

}  // namespace tessera
