// The op table (issue 16; in the manner of llama.cpp's test-backend-ops): one list of every
// op the model runs on a target, fused forms included, each with its shapes (derived from
// the ModelSpec, never written by hand), its oracle twin, and its tolerance model. One
// harness runs every row: phase 1, phase 6's re-check of the frozen plan, the audit, and
// `tessera kernels` (test and perf modes) all go through it.
//
// Every case runs twice: first on decoy inputs (OpInputs::decoy, ungated), then on the real
// ones, gated: a kernel's state left over from a previous call cannot pass for its output.
//
// Tolerance model: the target declares its numerics (oracle/numerics.h); the row's twin
// runs once exact and once under those numerics (oracle/emulate.h); the emulation's error
// against the exact twin is the expected error, and each limit is a stated margin above it
// (phase1.margin), never looser than the fixed outer bound of the threshold table. Checks:
// NMSE, max error (in units of the reference's largest value), gain and offset (the
// least-squares line: a systematic error far below single-element noise still fails),
// Pearson (outer bound only), non-finite parity and guard bytes.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "gates/gates.h"
#include "model/weights.h"
#include "oracle/numerics.h"
#include "targets/staged_runner.h"

namespace tessera {

// What the rows are computed from: the oracle's layer-0 activations on a prompt.
struct OpInputs {
  const Model* model = nullptr;
  std::vector<int32_t> ids;
  int64_t T = 0;
  std::map<std::string, std::vector<float>> probe;  // "embed", "attn_norm", "q", ... of layer 0
  int host_threads = 0;
  const std::vector<float>& at(const std::string& name) const;
  // The same shapes with other values (every input's rows rotated by one position): what
  // each case runs on first, ungated, so that a kernel handing back its previous call's
  // buffer (a stale buffer, a resident fifo never refreshed) shows those values, not these.
  OpInputs decoy() const;
};
// The oracle's layer 0 on `ids` (the harness's inputs).
OpInputs op_inputs(const Model& model, OracleRunner& oracle, std::vector<int32_t> ids, int host_threads);

// One output of a case: the exact reference, and the columns the emulation covers.
struct OpOutput {
  std::string role;   // "q_proj", "keys round trip"
  std::string shape;  // "[16,576]x[576,576]^T"
  int64_t rows = 0, cols = 0;
  std::vector<float> ref;  // [rows, cols]
};

// One call of a target op on the real activations, with one or more outputs.
struct OpCase {
  std::string kernel;  // kernel class: "gemm", "rmsnorm", "rope", "attention", ...
  Stage stage = Stage::Count;
  int64_t tokens = 0;  // tokens in the step: a target may run prefill and decode differently
  int64_t layer = 0;   // whose weights (a linear's: a file may store layers in other formats)
  std::vector<OpOutput> outputs;
  // Runs the target's op, writing each output's buffer (rows x cols floats, guarded).
  std::function<void(StagedRunner&, const std::vector<float*>&)> run;
  // The same op under `num`; per output, the values of the columns in `cols[i]` (all of
  // them unless the output is large: a linear's expected error is taken on a sample).
  std::function<std::vector<std::vector<float>>(const oracle::Numerics&, std::vector<std::vector<int64_t>>& cols)> emulate;
};

// A row of the table: an op, what it needs from a model (shapes from the spec alone, for
// `tessera inspect`), and how to make its cases on real activations.
struct OpRow {
  std::string op;    // "projections", "rmsnorm", ...
  std::string what;  // one line
  std::set<Stage> stages;  // the stages its cases run (a harness asked for other stages skips the row)
  std::function<std::vector<KernelNeed>(const ModelSpec&)> needs;
  std::function<std::vector<OpCase>(const OpInputs&)> cases;
};
// The table, built-in rows first; a new op is one more row (tests add one).
std::vector<OpRow>& op_table();
// Every row's needs for a model (T: tokens of a step).
std::vector<KernelNeed> op_table_needs(const ModelSpec& spec);

// The outcome of one output of one case.
struct OpResult {
  std::string kernel, role, shape, op;
  Stage stage = Stage::Count;
  int64_t tokens = 0;
  int64_t layer = 0;
  bool fused = false;     // run inside a fused kernel on this target (fuses_linears)
  std::string numerics;   // the declared numerics' name
  gates::TensorMetrics expected, measured;
  gates::GateResult gate;
  double seconds = 0;     // perf mode: median wall time of the call
  // With OpHarnessOptions::keep_outputs: the reference and the target's output (rows x cols),
  // and the emulation's values at the columns it covers.
  int64_t rows = 0, cols = 0;
  std::vector<float> ref, got, emulated;
  std::vector<int64_t> emulated_cols;
  nlohmann::json to_json() const;
};

struct OpHarnessOptions {
  std::string gate = "phase1.kernel";  // the gate name rows are recorded under
  int perf_repeats = 0;                // > 0: also time each case (median of this many)
  bool keep_outputs = false;           // keep each output's reference and target values (debug skills)
  std::set<Stage> only_stages;         // non-empty: the cases of these stages only
  // Changes the target's declared numerics before the emulation (a debug skill asking "would
  // the kernel's numbers be right under other numerics?"); empty: as declared.
  std::function<oracle::Numerics(const oracle::Numerics&)> numerics_variant;
  std::function<void(const std::string&)> progress;
};
std::vector<OpResult> run_op_table(StagedRunner& target, const OpInputs& in, const OpHarnessOptions& opt = {});
// Per stage, the largest relative error (sqrt of NMSE) its cases are expected to have under
// the target's declared numerics: the emulated twins against the exact oracle, no target
// kernel run. Phase 3's layer-scoped limits are built from these.
std::map<Stage, double> expected_stage_errors(const StagedRunner& target, const OpInputs& in);

// The gate row for a measured output given its expected error (exposed for tests).
gates::GateResult op_gate(const std::string& gate, const std::string& subject, const std::string& kernel,
                          const gates::TensorMetrics& expected, const gates::TensorMetrics& measured, int64_t guard_bytes);

}  // namespace tessera
