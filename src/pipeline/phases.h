// The pipeline's phases (design section 1) on any registered target: each reads what it
// needs, does its work, runs its gate, and returns what happened. deploy.cc sequences them
// and records the outcomes in the deployment directory. The phases see the target only
// through StagedRunner (targets/staged_runner.h), made by the registry.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gates/gates.h"
#include "model/weights.h"
#include "pipeline/deployment.h"
#include "targets/staged_runner.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

struct OpInputs;  // pipeline/op_table.h

struct CanonicalPrompt {
  std::string text;
  std::vector<int32_t> ids;
  bool long_context = false;  // the passage past 256 positions (long_context_prompt)
};

struct DeployOptions {
  std::string model_path;
  std::string out_dir;
  std::string target = "cpu";  // a name from target_names()
  FaultSet faults;            // --inject: names from target_faults(target) (faults/catalogue.h)
  std::vector<std::string> perturbations;  // --perturb specs (pipeline/perturb.h), applied from outside the target
  std::string plan_name;      // "": the target's default plan
  std::string device;         // "": the target's default device (profile)
  int from_phase = -1;      // -1: resume at the first phase not passed
  int threads = 0;          // 0: default_threads()
  // Phase 0's independent reference (tools/reference): a reference directory or a directory
  // of them; "": the search path (reference_search_path()).
  std::string reference_dir;
  bool quiet = false;       // no progress lines
};

// What the registry is asked for: the target's options from the deploy options (the faults
// are applied by faults/injection.h's make_runner_with_faults).
TargetOptions target_options(const DeployOptions& opts);

struct PhaseOutcome {
  bool pass = false;
  std::string status;  // "": passed or failed by `pass`; phase 0 without a reference: "unverified"
  std::string summary;                   // one line
  std::vector<gates::GateResult> gates;  // every gate row the phase ran
  nlohmann::json details = nlohmann::json::object();
  std::string diagnosis;                 // on failure: what the evidence points at
};

// What the phases share: the model, lazily built executors, the deployment, progress.
class PhaseContext {
 public:
  PhaseContext(Deployment& dep, const Model& model, const DeployOptions& opts);
  ~PhaseContext();
  Deployment& dep;
  const Model& model;
  const DeployOptions& opts;
  const Tokenizer& tokenizer();
  // The canonical prompts, then the long-context one, as the runtime hands them to the model
  // (the tokenizer's ids, then the prompt path's injected faults), and the runtime's stop
  // set: what phases 3-6 run.
  std::vector<CanonicalPrompt> prompts();
  std::vector<int32_t> stop_ids();
  OracleRunner& oracle();
  StagedRunner& target();  // opts.target from the registry, with opts.faults injected
  // From now on, target() runs `plan` (phases 4 and 5's result; phase 6 freezes it).
  void use_plan(const nlohmann::json& plan);
  // A runner of opts.target for `plan` (a rewritten plan phases 4 and 5 try).
  std::unique_ptr<StagedRunner> make_runner(const nlohmann::json& plan) const;
  // A new runner exactly as target() is made (same plan, same faults), with no state
  // behind it: the debug skills' experiments start from a clean device.
  std::unique_ptr<StagedRunner> fresh_target() const { return make_runner(plan_); }
  const nlohmann::json& plan() const { return plan_; }
  void progress(const std::string& line) const;

  // The oracle's per-layer outputs and last-position logits on a prompt, computed once per
  // deploy run (phases 3, 4 and 5 compare every plan against the same reference).
  struct OracleRun {
    std::vector<float> embed;                // the embedding's output, [T, hidden]
    std::vector<std::vector<float>> mids;    // layers.N.attn_residual, [T, hidden] each
    std::vector<std::vector<float>> layers;  // layers.N.out, [T, hidden] each
    std::vector<float> logits;               // [vocab]
  };
  const OracleRun& oracle_run(const std::vector<int32_t>& ids);
  // The op table's inputs (the oracle's layer 0 on the long prompt), computed once per run:
  // phase 1, every rewrite phases 4 and 5 gate, and phase 6 run the table on them.
  const OpInputs& op_inputs();
  // expected_stage_errors (op_table.h) of `target` on op_inputs(), computed once per distinct
  // set of declared numerics (a rewrite that moves a stage elsewhere declares others).
  const std::map<Stage, double>& expected_stage_errors(const StagedRunner& target);

 private:
  std::map<std::string, std::map<Stage, double>> expected_stage_errors_;
  std::unique_ptr<OpInputs> op_inputs_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<OracleRunner> oracle_;
  std::unique_ptr<StagedRunner> target_;
  nlohmann::json plan_;  // set by use_plan
  std::map<std::vector<int32_t>, OracleRun> oracle_runs_;
};

// The canonical prompts, tokenized the model's way (its family's BOS rule).
std::vector<CanonicalPrompt> canonical_prompts(const Tokenizer& tok);
// A passage of prose past 256 positions (cut to the model's context, less room for phase 6's
// greedy tokens): phases 3-6 run every layer far into a context, prefill and decode.
CanonicalPrompt long_context_prompt(const Tokenizer& tok, const ModelSpec& s);
// All canonical prompts concatenated, capped at `cap` tokens (phases 1, 2 and the debug
// skills want one longer sequence), and the far position RoPE is checked at (`room`
// positions left before the model's context ends).
std::vector<int32_t> long_prompt(PhaseContext& ctx, size_t cap);
std::vector<int32_t> long_prompt(const Tokenizer& tok, size_t cap);
// The op table's inputs: the oracle's layer 0 on the long prompt capped at 64 tokens (phase
// 1, phases 4-6, the debug skills and `tessera kernels` all gate on the same activations);
// threads <= 0: default_threads().
OpInputs op_table_inputs(const Model& model, const Tokenizer& tok, OracleRunner& oracle, int threads);
int64_t long_position(const ModelSpec& s, int64_t room);

// Attention inputs whose largest causal score (scale included) is `max_score`, past exp's
// fp32 range (88.7): a softmax must subtract the row max to stay finite (porting-pitfalls
// row 8). q is scaled; q, k and v are rounded to bf16, which every target stores exactly
// (bf16 operands, an fp16 KV cache), so a correct kernel sees the oracle's inputs.
struct StressAttention {
  std::vector<float> q, k, v;
  double scaled_by = 1;  // the factor applied to q
};
StressAttention stress_attention_inputs(const ModelSpec& s, const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, int64_t T, double max_score);
constexpr double kStressScore = 120;

// The end-of-sequence ids a checkpoint declares, each with where it says so, read from its
// files (config.json / generation_config.json eos_token_id, tokenizer_config.json
// eos_token; GGUF eos/eot/eom ids): phase 6 checks the runtime stops on every one.
struct DeclaredEos {
  int32_t id;
  std::string source;
};
std::vector<DeclaredEos> declared_eos_ids(const Model& model, const Tokenizer& tok);

// The texts of a transformers fixture (fixture.json) that `tok` encodes differently from
// the fixture's ids: phase 0's tokenizer row and the prompt-ids skill.
struct TokenizedDifferently {
  std::string text;
  std::vector<int32_t> ours, theirs;
};
std::vector<TokenizedDifferently> tokenized_differently(const Tokenizer& tok, const nlohmann::json& fixture);

// Where phase 0 looks for a reference made for the checkpoint: $TESSERA_REFERENCES (':'-
// separated directories), then $XDG_CACHE_HOME/tessera/references (~/.cache/...).
std::vector<std::string> reference_search_path();
PhaseOutcome run_phase0_oracle(PhaseContext& ctx);
PhaseOutcome run_phase1_kernels(PhaseContext& ctx);  // pipeline/phase1_kernels.cc
// Every op-table row on `target`, recorded under gate name `gate` (phase 1, and phase 6's
// re-check of the frozen plan); the outcome's details hold "kernels" (kernel_registry).
PhaseOutcome kernel_rows_outcome(StagedRunner& target, const OpInputs& in, const std::string& gate,
                                 const std::function<void(const std::string&)>& progress);
PhaseOutcome run_phase2_block(PhaseContext& ctx);
// Phase 2's gate rows (layer 0 at its scenarios) on `target`, recorded under `gate` (phase
// 6 re-runs them on the frozen plan); the scenarios' metrics go to `scenario_details` if given.
std::vector<gates::GateResult> block_rows(PhaseContext& ctx, StagedRunner& target, const std::string& gate,
                                          nlohmann::json* scenario_details);
PhaseOutcome run_phase3_model(PhaseContext& ctx);
PhaseOutcome run_phase4_prefill_opt(PhaseContext& ctx);  // pipeline/optimize.cc
PhaseOutcome run_phase5_decode_opt(PhaseContext& ctx);
void write_perf_trajectory(Deployment& dep);  // perf_opt_traj.md from phases 4 and 5's records
PhaseOutcome run_phase6_integrate(PhaseContext& ctx);

// How the gates hand a prompt to a target: its prefill in chunks of at most
// kGatePrefillChunk tokens, as `tessera serve` prefills (scheduler.h prefill_chunk), so a
// long prompt runs as a serving runtime runs it (npusim maps no 539-row prefill onto the
// shim's DMA at once). Returns the last chunk's logits (all its rows when all_logits).
constexpr int64_t kGatePrefillChunk = 64;
std::vector<float> prefill_in_chunks(ModelRunner& r, std::span<const int32_t> ids, bool all_logits = false,
                                     const ProbeFn& probe = {}, ProbeLevel level = ProbeLevel::None);

// Greedy generation of n tokens after `prompt` from a reset runner, with each step's top-k
// ids and the wall time of the prefill and of the decode steps (phases 6 and 7).
struct Greedy {
  std::vector<int32_t> tokens;
  std::vector<std::vector<int32_t>> topk;
  std::vector<std::vector<float>> topk_logits;  // the logits of topk's ids, step by step
  std::vector<float> first_logits;              // the whole first step's logits (after the prompt)
  double prefill_s = 0, decode_s = 0;
};
// Whether a greedy divergence is a near-tie the numerics explain: at the first step where
// `got` chose differently, the oracle's logit for its own token exceeds its logit for the
// target's by `gap`, and `limit` is phase6.tie_margin x sqrt(2) x the RMS of the two sides'
// difference on the first step's logits (same input there; phase 3 gates that difference).
struct DivergenceTie {
  bool diverged = false;
  double gap = 0, limit = 0;
  bool within() const { return !diverged || gap <= limit; }
};
DivergenceTie divergence_tie(const Greedy& ref, const Greedy& got, int64_t first_divergence);
Greedy greedy(ModelRunner& r, const std::vector<int32_t>& prompt, int n, int k);
// The same result as greedy(r, prompt, n, k) (tokens and top-k lists; one wall time, in
// prefill_s), computed along another runner's greedy tokens `along`: while they are r's own
// choices, all of r's steps come from one forward over the prompt and them, which reads the
// weights once instead of once per token. Exact for a runner whose logits rows do not depend on
// how many rows one forward computes (the oracle: every row, attention query and matmul
// output is computed on its own); from the first step where r chooses differently it goes on
// alone. Phase 6 runs the oracle this way beside the target.
Greedy greedy_along(ModelRunner& r, const std::vector<int32_t>& prompt, const std::vector<int32_t>& along, int n, int k);
// The prompts phase 6 generates from (the first phase6.prompts_min + 1 canonical ones and the
// long-context one).
std::vector<CanonicalPrompt> phase6_prompts(PhaseContext& ctx);

// Phase 3's gate row for one prompt on `target`, as phase 3 records it: {"ids", "text",
// "decisive", "top1_prob", "layer_cosines", "gate"}. Phases 4 and 5 re-run it on every
// rewritten plan; phase 5 with `last_as_decode` (the prompt's last token run as a decode
// step, so that a rewrite of the decode pass is what the gate sees).
// With `layer_scoped`, the record also holds the layer-scoped rows (sublayer_check.h: each
// layer from the oracle's input, a second pass); phases 4 and 5 gate each rewrite without
// them (plan-wide rewrites; phase 6 holds the frozen plan to them on the long prompt).
nlohmann::json model_gate_record(PhaseContext& ctx, StagedRunner& target, const CanonicalPrompt& p,
                                 bool last_as_decode = false, bool layer_scoped = true);

// The diagnosis of a model_gate_record whose layer-scoped rows failed: the first layer and
// sublayer (in depth) over its limit; "" when none is.
std::string first_failing_sublayer_text(const nlohmann::json& record);

// Phase 2's bisect, callable on its own: runs layer 0 with each stage in turn swapped for
// the oracle's kernel and names the stage whose swap brings the block closest to the
// oracle (and whether that alone makes the gate pass).
struct BisectResult {
  bool named = false;        // one stage's swap makes the block gate pass
  std::string stage;         // the best swap
  std::string kernel;        // its kernel class
  nlohmann::json trials;     // per stage: nmse, cosine, pass
  std::string text() const;
};
BisectResult bisect_block(PhaseContext& ctx);

}  // namespace tessera
