// `tessera campaign` (ARCHITECTURE section 8): deploy a list of models on a list of targets
// and write one results table. Per model and target: phases passed, gate summary, prefill
// and decode figures, NPU dispatches per layer, deployment wall time, and
//   eta_scale = (parameters x tokens/s) / (reference parameters x reference tokens/s)
// for prefill and decode separately, the reference being Llama-3.2-1B on the same target
// (how far a model's throughput sits from what its size alone predicts).
//
// Models are seed presets, synthesized (full size or tiny) into the work directory once,
// or model paths. Deployments resume: a campaign interrupted and run again redoes nothing
// that passed. Figures: npusim's are the timing model's predictions (prefill of 2048 tokens,
// decode at 512); the cpu's are measured wall times of the frozen plan (StagedRunner::
// measure: 128-token prefill, decode steps after it).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera {

struct CampaignOptions {
  std::vector<std::string> models;   // preset names (synthesized) or model paths
  std::vector<std::string> targets;  // "cpu", "npusim"
  std::string work_dir;              // models/, one deployment per model and target, results.*
  bool tiny = false;                 // presets in their tiny form
  int threads = 0;
  bool quiet = false;
};

struct CampaignRow {
  std::string model, target;
  int64_t parameters = 0;
  int phases_passed = 0, phases_total = 0;
  int gates_passed = 0, gates_total = 0;
  bool deployed = false;  // every phase passed
  std::string failure;    // the first failing phase's summary
  double prefill_tok_s = 0, decode_tok_s = 0;
  std::string figures;  // "predicted" or "measured"
  std::string dispatches_per_layer;  // "prefill/decode" (npusim), "-" elsewhere
  double wall_s = 0;                 // the deployment's wall time: its phases' last runs, summed
  double eta_prefill = 0, eta_decode = 0;  // 0: no reference on this target
};

struct CampaignResult {
  std::vector<CampaignRow> rows;
  nlohmann::json to_json() const;
  std::string markdown() const;
};

// Runs the campaign; writes WORK/results.md and WORK/results.json (after every deployment,
// so a long campaign shows its progress). Throws only on bad options.
CampaignResult run_campaign(const CampaignOptions& opts);

}  // namespace tessera
