#include "targets/npusim/npusim_runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "oracle/ops.h"
#include "targets/cpu/kernels.h"
#include "targets/npusim/numerics.h"
#include "targets/npusim/executor.h"
#include "targets/npusim/mappings.h"
#include "targets/npusim/predict.h"
#include "targets/stages.h"
#include "util/error.h"
#include "util/half.h"
#include "util/parallel.h"

namespace tessera {

using npusim::Placement;

const std::vector<FaultInfo>& npusim_faults() {
  // Mapping bugs (design section 5's refusals and stale/aliased buffers). Each names the
  // stage whose kernel carries it and the first phase whose gate must catch it.
  static const std::vector<FaultInfo> faults = {
      {"merged-stale-intermediate", "attn_residual", 4,
       "a dispatch that merges the O projection with the residual add is lowered without the add's wait for the "
       "projection's drain of buffer o, so the add reads o as the dispatch call began: the previous call's output "
       "(plans without that merge are unaffected: phase 4's gate catches the merge rewrite and reverts it)"},
      {"unsynced-handover", "qkv_proj", 2,
       "the lowering asks only the NPU's dispatches who reads a buffer next, so the q, k and v that the host's decode "
       "attention reads stay device-only: the host reads what it held before (the merged plan's decode steps; bisect "
       "names the projection whose output never reaches the host; plans whose decode attention runs on the array "
       "are unaffected)"},
      {"reuse-while-live", "o_proj", 4,
       "the memory-tile allocator ends an intermediate's live range at its producer's last launch, forgetting its "
       "readers, so a later intermediate of the same dispatch takes its bytes before it is read (in a merged dispatch "
       "the O projection writes o over the attention output it is still reading; plans that keep intermediates in DDR "
       "are unaffected: phase 4's gate catches the rewrite that keeps them on the device and reverts it)"},
      {"l1-overflow", "qkv_proj", 1,
       "the projection's streamed tile is enlarged past the 64 KiB L1: the checker refuses the mapping with the numbers"},
      {"bd-exhaustion", "qkv_proj", 1,
       "the projection's weight transfer is cut into one buffer descriptor per run: more BDs than the shim tile has"},
      {"bad-access-pattern", "qkv_proj", 1,
       "the projection's weight is walked transposed by the DMA (a wrong n-D access pattern): wrong numbers"},
      {"stale-buffer", "mlp_norm", 1,
       "the norm's input fifo is marked resident, so later calls compute on the first call's activations"},
      {"merge-skipped", "dispatch", -1,
       "phases 4 and 5 never try the merge skill: every gate passes with one op per dispatch while the NPU's time goes to "
       "dispatch overhead (porting pitfall 14: no gate fails; `tessera diagnose` names it)"},
      {"dma-channels", "qkv_proj", 1,
       "the projection's input is sent twice through column 0's shim tile: one more MM2S channel than the tile has"},
  };
  return faults;
}

TargetDef npusim_target_def() {
  TargetDef d;
  d.name = "npusim";
  d.serve_refusal = "a modelled device that predicts timings and does not run requests at a useful speed";
  d.check_options = [](const TargetOptions& t) {
    if (!t.plan_name.empty()) npusim::named_plan(t.plan_name);  // throws naming the plans
    npusim::load_device(t.device.empty() ? "xdna2" : t.device);  // throws naming the profiles
  };
  d.make = [](const Model& model, const TargetOptions& t) -> std::unique_ptr<StagedRunner> {
    return std::make_unique<NpuSimRunner>(model, t);
  };
  d.faults = []() -> const std::vector<FaultInfo>& { return npusim_faults(); };
  d.options_from_plan = [](const nlohmann::json& plan, TargetOptions& o) {
    // A deployment runs exactly the plan and the device it was gated with.
    o.plan = plan;
    if (o.device.empty()) o.device = plan.value("npusim", nlohmann::json::object()).value("device", "");
  };
  d.skills = []() -> const std::vector<OptSkill>& { return npusim_skills(); };
  return d;
}

namespace {

// The device asked for, else the one a given plan was made for, else xdna2.
std::string device_name(const TargetOptions& o) {
  if (!o.device.empty()) return o.device;
  if (!o.plan.is_null()) return o.plan.value("npusim", nlohmann::json::object()).value("device", "xdna2");
  return "xdna2";
}

// A given plan as written, else the named plan (the default when none is named).
npusim::NpuPlan plan_for(const TargetOptions& o) {
  if (!o.plan.is_null()) return npusim::plan_from_json(o.plan.at("npusim").at("plan"));
  return npusim::named_plan(o.plan_name.empty() ? npusim::default_plan_name() : o.plan_name);
}

}  // namespace

NpuSimRunner::NpuSimRunner(const Model& model, const TargetOptions& options)
    : LayeredRunner(model, options.oracle_stages, options.profile),
      faults_(options.faults),
      device_(npusim::load_device(device_name(options))),
      plan_(plan_for(options)),
      threads_(options.threads > 0 ? options.threads : default_threads()) {
  executor_ = std::make_unique<npusim::ProgramExecutor>(device_, threads_);
  host_pool_ = std::make_unique<cpu::ThreadPool>(threads_);
  weights_ = std::make_unique<npusim::NpuWeightStore>(
      [this](int64_t n, const std::function<void(int64_t, int64_t)>& body) { host_pool_->parallel_for(n, body); });
  const ModelSpec& s = model.spec();
  {
    // Each weight buffer's matrices over the layers (its format must hold in every layer).
    std::map<std::string, std::vector<const Weight*>> by_buffer;
    for (int64_t l = 0; l < s.n_layers; ++l) {
      const LayerParams& L = layer(l);
      for (const auto& [n, w] : {std::pair{"w.q", L.q}, {"w.k", L.k}, {"w.v", L.v}, {"w.o", L.o},
                                 {"w.gate", L.gate}, {"w.up", L.up}, {"w.down", L.down}})
        by_buffer[n].push_back(w);
    }
    by_buffer["w.lm_head"].push_back(&model.lm_head());
    weights_->load(by_buffer, model.get("model.embed_tokens.weight"));
  }
  kv_.resize(size_t(s.n_layers));

  // The faults, as mapping bugs of one op's launches or a wait the merge forgets.
  npusim::MappingFaults f;
  f.l1_overflow = fault("l1-overflow");
  f.bd_exhaustion = fault("bd-exhaustion");
  f.transposed_pattern = fault("bad-access-pattern");
  f.dma_oversubscribed = fault("dma-channels");
  if (f.any()) lowering_faults_.mapping["gemv"] = lowering_faults_.mapping["gemm"] = f;
  if (fault("stale-buffer")) lowering_faults_.mapping["rmsnorm"].stale_buffer = true;
  lowering_faults_.drop_o_wait = fault("merged-stale-intermediate");
  lowering_faults_.ignore_host_readers = fault("unsynced-handover");
  lowering_faults_.live_until_written = fault("reuse-while-live");
}

NpuSimRunner::~NpuSimRunner() = default;

std::string NpuSimRunner::description() const {
  return fmt::format("npusim ({} model, plan {}, {} host threads)", device_.name, plan_.name, threads_);
}

std::string NpuSimRunner::isa() const { return "aie2p (modelled)"; }

nlohmann::json NpuSimRunner::predict_pass(bool decode, int64_t tokens, bool with_program) const {
  if (decode ? tokens < 0 : tokens < 1) fail("npusim predict: {} {} tokens", decode ? "a decode step after" : "a prefill of", tokens);
  const npusim::Program program =
      npusim::lower(plan_, spec(), device_, {decode, decode ? 1 : tokens, decode ? tokens : 0, 1}, {}, weight_formats());
  const npusim::PassPrediction p = npusim::price(program, device_);
  nlohmann::json j = {{"device", device_.name},        {"plan", plan_.name},
                      {"plan_description", plan_.description}, {"us", p.total_us},
                      {"npu_dispatches", p.npu_dispatches},    {"prediction", p.to_json()},
                      {"describe", p.describe()}};
  if (with_program) {
    j["program"] = program.to_json();
    j["plan_spec"] = plan_.to_json();
  }
  return j;
}

oracle::Numerics NpuSimRunner::numerics(Stage s, int64_t T, int64_t) const {
  using oracle::Precision;
  oracle::Numerics n;
  n.weights = n.matmul_inputs = Precision::BF16;  // bf16 weights, wherever they run
  // A projection whose every matrix runs in the file's blocks computes with the oracle's exact
  // weights (weight_blocks.h); one bf16 matrix makes the stage declare bf16, the larger error.
  std::vector<std::string> bufs;
  switch (s) {
    case Stage::QkvProj: bufs = {"w.q", "w.k", "w.v"}; break;
    case Stage::OProj: bufs = {"w.o"}; break;
    case Stage::GateUpProj: bufs = {"w.gate", "w.up"}; break;
    case Stage::DownProj: bufs = {"w.down"}; break;
    case Stage::LmHead: bufs = {"w.lm_head"}; break;
    default: break;
  }
  bool exact = !bufs.empty();
  for (const std::string& b : bufs) exact &= is_block(weights_->formats().of(b));
  if (exact) n.weights = Precision::F32;
  const Placement p = where(s, T);
  if (p == Placement::Host) {
    n.name = "npusim host (fp32, cpu " + cpu::isa() + ")";
    n.kv_cache = Precision::BF16;
    // bf16 matrices run on the cpu kernels (kernel_linears), which round x to bf16 only on
    // their AVX-512 BF16 and AMX paths; the host upcasts blocks exactly (oracle::linear).
    if (exact || !cpu::matmul_rounds_activations_to_bf16()) n.matmul_inputs = Precision::F32;
    return n;
  }
  // On the array (npusim/numerics.h): bf16 in and out of every tile, fp32 accumulators,
  // the aie2p kernels' exp, 1/sqrt and SiLU.
  n.name = p == Placement::Npu ? "npusim array" : "npusim array, host softmax";
  n.activations = n.kv_cache = n.norm_weights = n.norm_scale = n.rope_table = Precision::BF16;
  n.norm_rounds_product = true;
  // The residual stream stays fp32 in DDR: the add tiles read and write fp32.
  if (s == Stage::AttnResidual || s == Stage::MlpResidual) n.activations = Precision::F32;
  n.rsqrt = npusim::rsqrt_approx;
  n.silu = npusim::silu_bf16;
  n.approximations = "1/sqrt: bit-trick + one Newton step; SiLU: x * 0.5 * (1 + tanh(x/2)) in bf16";
  if (p == Placement::Npu) {
    n.softmax_probs = Precision::BF16;
    n.exp = npusim::exp_bf16;
    n.approximations += "; exp: 2^(x * bf16 log2e) by a bf16 cubic";
  } else if (s == Stage::Attention) {
    // Scores and the value product as array GEMMs around an fp32 host softmax: bf16 queries
    // and normalized probabilities in, fp32 out of the accumulator.
    n.attention_q = n.softmax_probs = Precision::BF16;
    n.probs_normalized = true;
    n.activations = Precision::F32;
  }
  return n;
}

int64_t NpuSimRunner::weight_bytes_per_token() const {
  int64_t bytes = 0;  // every layer's seven and the LM head, as DDR holds them
  for (const Weight* w : matrix_weights())
    if (w->name != "model.embed_tokens.weight" || w == &model_.lm_head()) bytes += weights_->bytes(w->name);
  return bytes;
}

int64_t NpuSimRunner::kv_bytes_per_position() const { return spec().n_layers * 2 * spec().kv_dim() * 2; }

PassFigure NpuSimRunner::measure(Pass pass) {
  PassFigure f;
  f.predicted = true;
  if (pass == Pass::Prefill) {
    f.seconds = npusim::predict_prefill(plan_, spec(), device_, prefill_tokens(), weight_formats()).total_us / 1e6;
    f.what = fmt::format("predicted prefill of {} tokens on {}", prefill_tokens(), device_.name);
  } else {
    f.seconds = npusim::predict_decode(plan_, spec(), device_, decode_context(), weight_formats()).total_us / 1e6;
    f.what = fmt::format("predicted decode step at context {} on {}", decode_context(), device_.name);
  }
  return f;
}

nlohmann::json NpuSimRunner::predicted_figures() const {
  const int64_t T = prefill_tokens(), C = decode_context();
  const npusim::PassPrediction p = npusim::predict_prefill(plan_, spec(), device_, T, weight_formats());
  const npusim::PassPrediction d = npusim::predict_decode(plan_, spec(), device_, C, weight_formats());
  return {{"device", device_.name},
          {"plan", plan_.name},
          {"prefill_tokens", T},
          {"prefill_ms", p.total_us / 1e3},
          {"prefill_tokens_per_s", double(T) / (p.total_us / 1e6)},
          {"decode_context", C},
          {"decode_ms_per_token", d.total_us / 1e3},
          {"decode_tokens_per_s", 1e6 / d.total_us},
          {"npu_dispatches_per_layer", {{"prefill", plan_.dispatches_per_layer(false)}, {"decode", plan_.dispatches_per_layer(true)}}},
          {"note", "predicted by the device profile's timing model (calibrated on kernel-level measurements), not measured"}};
}

nlohmann::json NpuSimRunner::predicted_timeline() const {
  const int64_t T = prefill_tokens(), C = decode_context();
  return {{"prefill", npusim::timeline_json(npusim::lower(plan_, spec(), device_, {false, T, 0, 1}, {}, weight_formats()), device_)},
          {"decode", npusim::timeline_json(npusim::lower(plan_, spec(), device_, {true, 1, C, 1}, {}, weight_formats()), device_)}};
}

std::map<std::string, int64_t> NpuSimRunner::op_counters() const {
  std::map<std::string, int64_t> out = LayeredRunner::op_counters();
  for (const auto& [stage, n] : host_calls_) {
    // A stage the plan put on the host ran there, not on the target: move its count.
    const std::string name = stage_name(stage);
    out["host:" + name] += n;
    if (auto it = out.find(name); it != out.end() && (it->second -= n) <= 0) out.erase(it);
  }
  if (host_softmax_calls_) out["host:attention.softmax"] = host_softmax_calls_;
  return out;
}

std::string NpuSimRunner::handover(Stage from, Stage to, int64_t T) const {
  // The plan lowered at this pass's shape: the dispatch holding both steps on the NPU and the
  // buffer the consumer's launches read that the producer's write.
  const npusim::Program p = npusim::lower(plan_, spec(), device_, {T == 1, T, 0, 1}, lowering_faults_, weight_formats());
  const npusim::Program::Where a = p.find(from), b = p.find(to);
  if (p.dispatches[a.dispatch].host) return "";
  const npusim::ProgramDispatch& d = p.dispatches[a.dispatch];
  if (a.dispatch != b.dispatch) {
    // Across dispatches to host code: what the producer leaves only on the device.
    if (!p.dispatches[b.dispatch].host) return "";
    std::set<std::string> kept;
    for (const npusim::LaunchCall& c : d.steps[a.step].launches)
      for (const std::string& n : c.writes())
        if (const npusim::ProgramBuffer* pb = d.buffer(n); pb && pb->buffer.sync == npusim::Sync::DeviceOnly) kept.insert(n);
    if (kept.empty()) return "";
    return fmt::format("dispatch `{}` keeps buffer{} `{}` on the device (never synced) and the host's {} runs next", d.name,
                       kept.size() > 1 ? "s" : "", fmt::join(kept, "`, `"), stage_name(to));
  }
  std::set<std::string> written, shared;
  for (const npusim::LaunchCall& c : d.steps[a.step].launches)
    for (const std::string& n : c.writes()) written.insert(n);
  for (const npusim::LaunchCall& c : d.steps[b.step].launches)
    for (const std::string& n : c.reads())
      if (written.count(n)) shared.insert(n);
  if (shared.empty()) return "";
  return fmt::format("dispatch `{}`, buffer{} `{}`", d.name, shared.size() > 1 ? "s" : "", fmt::join(shared, "`, `"));
}

std::string NpuSimRunner::shared_memory(Stage consumer, int64_t T) const {
  // The plan lowered at this pass's shape; the consumer's L2 inputs against every L2 buffer a
  // launch writes between the input's last write and the consumer's read.
  const npusim::Program p = npusim::lower(plan_, spec(), device_, {T == 1, T, 0, 1}, lowering_faults_, weight_formats());
  const npusim::Program::Where where = p.find(consumer);
  const npusim::ProgramDispatch& d = p.dispatches[where.dispatch];
  if (d.host) return "";
  std::vector<const npusim::LaunchCall*> calls;
  std::vector<int> mine;
  for (size_t si = 0; si < d.steps.size(); ++si)
    for (const npusim::LaunchCall& c : d.steps[si].launches) {
      if (si == where.step) mine.push_back(int(calls.size()));
      calls.push_back(&c);
    }
  auto bytes = [](const npusim::ProgramBuffer& b) {
    return std::pair{b.l2_offset, b.l2_offset + b.device_elems * npusim::elem_bytes(b.buffer.type)};
  };
  std::vector<std::string> found;
  for (const int r : mine)
    for (const std::string& n : calls[size_t(r)]->reads()) {
      const npusim::ProgramBuffer* pn = d.buffer(n);
      if (!pn || !pn->in_l2) continue;
      int wrote = -1;
      for (int i = 0; i < r; ++i)
        if (calls[size_t(i)]->writes().count(n)) wrote = i;
      if (wrote < 0) continue;
      const auto [lo, hi] = bytes(*pn);
      for (int i = wrote + 1; i <= r; ++i)
        for (const std::string& m : calls[size_t(i)]->writes()) {
          const npusim::ProgramBuffer* pm = d.buffer(m);
          if (m == n || !pm || !pm->in_l2) continue;
          const auto [mlo, mhi] = bytes(*pm);
          if (mlo < hi && lo < mhi)
            found.push_back(fmt::format("buffer `{}` (L2 bytes {}-{}) is overwritten by `{}` (launch {}) before launch {} "
                                        "reads it",
                                        n, lo, hi, m, calls[size_t(i)]->launch.name, calls[size_t(r)]->launch.name));
        }
    }
  if (found.empty()) return "";
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  return fmt::format("dispatch `{}`: {}", d.name, fmt::join(found, "; "));
}

nlohmann::json NpuSimRunner::build_plan(const Model& model) const {
  const ModelSpec& s = model.spec();
  nlohmann::json plan;
  plan["format"] = "tessera-plan/1";
  plan["name"] = plan_.name;
  plan["target"] = "npusim";
  plan["model"] = {{"path", model.path()}, {"format", model.format()}, {"arch", arch_name(s.arch)}, {"spec", s.to_json()}};
  plan["description"] = description();
  plan["npusim"] = {{"device", device_.name}, {"plan", plan_.to_json()}, {"host_threads", threads_}};
  plan["weights"] = weights_->to_json();
  plan["weights"]["residency"] = plan_.weights_resident ? "resident in device memory per layer" : "sent with every call";
  // What the lowering takes (and the tile-tune skill reads): each weight buffer's format.
  plan["npusim"]["weight_formats"] = weight_formats().to_json();
  plan["kv_cache"] = {{"dtype", "bf16"}, {"layout", "per layer, one [K | V] row per position"},
                      {"bytes_per_position", kv_bytes_per_position()}};
  // The grouping in the pipeline's generic form: every dispatch of each pass, in order,
  // each op with its kernel, shape, layer and where it runs.
  nlohmann::json dispatches = nlohmann::json::array();
  for (const bool decode : {false, true}) {
    const npusim::NpuPlan::Pass& pass = plan_.pass(decode);
    auto add = [&](const npusim::PlanDispatch& d, int64_t layer) {
      nlohmann::json ops = nlohmann::json::array();
      for (const npusim::PlanStep& st : d.steps) {
        nlohmann::json op = {{"op", stage_name(st.stage)}, {"kernel", stage_kernel(st.stage)},
                             {"on", npusim::placement_name(st.placement)}, {"shape", stage_shape(st.stage, s)}};
        if (layer >= 0) op["layer"] = layer;
        ops.push_back(op);
      }
      dispatches.push_back({{"id", dispatches.size()}, {"pass", decode ? "decode" : "prefill"}, {"name", d.name}, {"ops", ops}});
    };
    for (const npusim::PlanDispatch& d : pass.embedding) add(d, -1);
    for (int64_t l = 0; l < s.n_layers; ++l)
      for (const npusim::PlanDispatch& d : pass.layer) add(d, l);
    for (const npusim::PlanDispatch& d : pass.head) add(d, -1);
  }
  plan["dispatches"] = dispatches;
  std::vector<std::string> host = plan_.host_stages(false);
  for (const std::string& h : plan_.host_stages(true))
    if (std::find(host.begin(), host.end(), h) == host.end()) host.push_back(h);
  plan["host_ops"] = host;  // by the plan's choice; the runner never moves an op by itself
  plan["frozen"] = false;
  return plan;
}

// --- the Program and its steps ------------------------------------------------------------

void NpuSimRunner::begin_pass(int64_t T, int64_t head_rows) {
  pass_ = program({T == 1, T, rel_position(), std::max<int64_t>(1, std::min(head_rows, T))});
  executor_->begin_pass();
}

void NpuSimRunner::end_pass() {
  last_pass_ = executor_->end_pass();
  pass_.reset();
}

std::shared_ptr<const npusim::Program> NpuSimRunner::program(const npusim::PassShape& shape) {
  if (auto it = programs_.find(shape); it != programs_.end()) return it->second;
  if (programs_.size() >= 8) programs_.clear();  // decode lowers one per context: keep a few
  auto p = std::make_shared<const npusim::Program>(npusim::lower(plan_, spec(), device_, shape, lowering_faults_, weight_formats()));
  programs_[shape] = p;
  return p;
}

NpuSimRunner::StepRef NpuSimRunner::step_for(Stage s, int64_t rows, int64_t context) {
  const bool head = s == Stage::FinalNorm || s == Stage::LmHead;
  if (pass_ && rows == (head ? pass_->shape.head_rows : pass_->shape.tokens)) return {pass_, pass_->find(s), true};
  // A kernel called by itself (phase 1, a probe's extra rows): a program of its own.
  const npusim::PassShape shape{rows == 1, rows, head ? 0 : context, rows};
  const auto key = std::make_pair(s, shape);
  auto it = kernel_programs_.find(key);
  if (it == kernel_programs_.end()) {
    if (kernel_programs_.size() >= 64) kernel_programs_.clear();
    it = kernel_programs_
             .emplace(key, std::make_shared<const npusim::Program>(
                               npusim::lower_stage(plan_, s, spec(), device_, shape, lowering_faults_, weight_formats())))
             .first;
  }
  return {it->second, it->second->find(s), false};
}

int64_t NpuSimRunner::step_layer(Stage s) const {
  if (s == Stage::Embedding || s == Stage::FinalNorm || s == Stage::LmHead) return -1;
  // A projection knows its layer from its weights: phase 1's direct calls of another layer's
  // matrices (a Q4_K_M file's Q6_K v/down layers) run outside run_layer, and with weights resident
  // they must not find layer 0's weights in L1.
  return weights_layer_ >= 0 ? weights_layer_ : current_layer();
}

void NpuSimRunner::run(Stage s, int64_t rows, int64_t context, npusim::StepArgs& args,
                       const std::set<std::string>& outputs) {
  const StepRef r = step_for(s, rows, context);
  if (placement(r) == Placement::Host) fail("npusim: stage {} runs on the host in this plan", stage_name(s));
  executor_->run_step(r.program, r.where, step_layer(s), args, r.priced, outputs);
}

bool NpuSimRunner::on_host(Stage s, int64_t rows, int64_t context) {
  const StepRef r = step_for(s, rows, context);
  if (placement(r) != Placement::Host) return false;
  host_calls_[s]++;
  executor_->host_step(r.program, r.where, step_layer(s), r.priced);
  return true;
}

Placement NpuSimRunner::placement(const StepRef& r) const {
  return r.program->dispatches[r.where.dispatch].steps[r.where.step].placement;
}

namespace {

npusim::DdrTensor bf16_view(const uint16_t* p, int64_t n) { return npusim::DdrTensor::bf16(const_cast<uint16_t*>(p), n); }

npusim::HostArray host(const float* p, int64_t n) { return {const_cast<float*>(p), n}; }

}  // namespace

// Host values a kernel reads in bf16 (norm weights, biases, the RoPE table), kept for the call.
void NpuSimRunner::host_reads(const char* buffer, const float* data, int64_t n) {
  // The runner's array is the host's memory: host code reads what the host really holds
  // (a buffer the device kept to itself was never synced to it).
  executor_->host_reads(buffer, const_cast<float*>(data), n);
}

const uint16_t* NpuSimRunner::bf16_copy(const float* p, int64_t n) {
  bf16_scratch_.emplace_back(size_t(n));
  for (int64_t i = 0; i < n; ++i) bf16_scratch_.back()[size_t(i)] = f32_to_bf16(p[i]);
  return bf16_scratch_.back().data();
}

// --- kernels -----------------------------------------------------------------------------

void NpuSimRunner::kernel_embedding(const int32_t* ids, int64_t T, float* out) {
  const Bf16Matrix& e = weights_->bf16("model.embed_tokens.weight");
  if (on_host(Stage::Embedding, T, 0)) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < e.cols; ++c) out[t * e.cols + c] = bf16_to_f32(e.data[int64_t(ids[t]) * e.cols + c]);
    return;
  }
  npusim::StepArgs a;
  a.host["h"] = host(out, T * e.cols);
  a.external["w.embed"] = bf16_view(e.data, e.rows * e.cols);
  a.ids = {ids, size_t(T)};
  run(Stage::Embedding, T, 0, a);
}

void NpuSimRunner::kernel_rmsnorm(Stage which, int64_t, const float* w, const float* x, int64_t T, float* out) {
  const int64_t H = spec().hidden;
  if (on_host(which, T, 0)) {
    host_reads(which == Stage::FinalNorm ? "hf" : "h", x, T * H);
    return oracle::rmsnorm(x, w, out, T, H, spec().rms_eps);
  }
  npusim::StepArgs a;
  const bool head = which == Stage::FinalNorm;
  a.host[head ? "hf" : "h"] = host(x, T * H);
  a.host[head ? "xf" : "x"] = host(out, T * H);
  a.external[std::string("g.") + stage_name(which)] = bf16_view(bf16_copy(w, H), H);
  run(which, T, 0, a);
  bf16_scratch_.clear();
}

void NpuSimRunner::kernel_linear(Stage s, const float* x, int64_t T, const std::string& weight, const float* bias,
                                 float* y) {
  const LinearOut one[] = {{weight, bias, y}};
  kernel_linears(s, x, T, one);
}

void NpuSimRunner::kernel_linears(Stage s, const float* x, int64_t T, std::span<const LinearOut> outs) {
  const std::string in = s == Stage::OProj ? "attn" : s == Stage::DownProj ? "act" : s == Stage::LmHead ? "xf" : "x";
  const int64_t K = weights_->cols(outs[0].weight);
  if (on_host(s, T, 0)) {
    host_reads(in.c_str(), x, T * K);
    for (const LinearOut& o : outs) {
      if (weights_->in_blocks(o.weight)) oracle::linear(x, T, model_.get(o.weight), o.bias, o.y, threads_);  // exact upcast
      else cpu::matmul(x, T, weights_->bf16(o.weight), o.bias, o.y, *host_pool_);
    }
    return;
  }
  npusim::StepArgs a;
  a.host[in] = host(x, T * K);
  // The Program adds a bias where the checkpoint has one; a caller that hands none (a
  // dropped bias) gets zeros added.
  const ModelSpec& sp = spec();
  const bool lowered_bias = s == Stage::QkvProj ? sp.qkv_bias : s == Stage::OProj ? sp.o_bias
                            : s == Stage::LmHead ? false : sp.mlp_bias;
  std::set<std::string> outputs;
  for (const LinearOut& o : outs) {
    const int64_t rows = weights_->rows(o.weight);
    const std::string y = s == Stage::LmHead ? "logits" : projection_output(o.weight);
    a.host[y] = host(o.y, T * rows);
    a.external[s == Stage::LmHead ? "w.lm_head" : "w." + y] = weights_->view(o.weight);
    if (lowered_bias) {
      std::vector<float> zeros;
      if (!o.bias) zeros.assign(size_t(rows), 0.0f);
      a.external["b." + y] = bf16_view(bf16_copy(o.bias ? o.bias : zeros.data(), rows), rows);
    }
    outputs.insert(y);
  }
  int layer = -1;
  if (std::sscanf(outs[0].weight.c_str(), "model.layers.%d.", &layer) != 1) layer = -1;
  weights_layer_ = layer;
  run(s, T, 0, a, outputs);
  weights_layer_ = -1;
  bf16_scratch_.clear();
}

void NpuSimRunner::kernel_rope(int64_t l, float* q, float* k, int64_t T, int64_t pos) {
  const ModelSpec& s = spec();
  const LayerParams& L = layer(l);
  if (on_host(Stage::Rope, T, 0)) {
    host_reads("q", q, T * s.q_dim());
    host_reads("k", k, T * s.kv_dim());
    if (s.qk_norm) {
      oracle::rmsnorm(q, L.q_norm.data(), q, T * s.n_heads, s.head_dim, s.rms_eps);
      oracle::rmsnorm(k, L.k_norm.data(), k, T * s.n_kv_heads, s.head_dim, s.rms_eps);
    }
    oracle::rope(q, T, s.n_heads, s.head_dim, pos, inv_freq());
    oracle::rope(k, T, s.n_kv_heads, s.head_dim, pos, inv_freq());
    return;
  }
  npusim::StepArgs a;
  a.host["q"] = host(q, T * s.q_dim());
  a.host["k"] = host(k, T * s.kv_dim());
  const std::vector<float> cs = npusim::rope_table(T, pos, inv_freq());  // computed on the host, fp32
  a.external["cs"] = bf16_view(bf16_copy(cs.data(), int64_t(cs.size())), int64_t(cs.size()));
  if (s.qk_norm) {
    a.external["g.q_norm"] = bf16_view(bf16_copy(L.q_norm.data(), s.head_dim), s.head_dim);
    a.external["g.k_norm"] = bf16_view(bf16_copy(L.k_norm.data(), s.head_dim), s.head_dim);
  }
  run(Stage::Rope, T, 0, a);
  bf16_scratch_.clear();
}

uint16_t* NpuSimRunner::kv_layer(int64_t l, int64_t rows_needed) {
  std::vector<uint16_t>& kv = kv_[size_t(l)];
  const int64_t rows = npusim::kv_rows_for(rows_needed);
  const int64_t row_elems = 2 * spec().kv_dim();
  if (int64_t(kv.size()) < rows * row_elems) {
    // Grown rows start as NaN (bf16 0x7FC0): a kernel reading an unwritten row shows it.
    kv.resize(size_t(rows * row_elems), uint16_t(0x7FC0));
  }
  return kv.data();
}

void NpuSimRunner::kv_store(int64_t l, int64_t rel, const float* k, const float* v, int64_t T) {
  const int64_t KV = spec().kv_dim();
  uint16_t* kv = kv_layer(l, rel + T);
  for (int64_t t = 0; t < T; ++t) {
    npusim::detail::cast_to_bf16(k + t * KV, kv + (rel + t) * 2 * KV, KV);
    npusim::detail::cast_to_bf16(v + t * KV, kv + (rel + t) * 2 * KV + KV, KV);
  }
}

void NpuSimRunner::kernel_kv_write(int64_t l, int64_t rel, const float* k, const float* v, int64_t T) {
  // On the NPU the k and v drains write the cache rows (no launch of its own); on the host
  // the host casts them. The same bf16 rows either way.
  if (!on_host(Stage::KvWrite, T, rel)) {
    npusim::StepArgs a;
    run(Stage::KvWrite, T, rel, a);
  } else {
    host_reads("k", k, T * spec().kv_dim());
    host_reads("v", v, T * spec().kv_dim());
  }
  kv_store(l, rel, k, v, T);
}

void NpuSimRunner::kv_read(int64_t l, int64_t rel, int64_t T, float* k, float* v) {
  const int64_t KV = spec().kv_dim();
  const uint16_t* kv = kv_layer(l, rel + T);
  for (int64_t j = 0; j < T; ++j) {
    const uint16_t* row = kv + (rel + j) * 2 * KV;
    for (int64_t c = 0; c < KV; ++c) {
      k[j * KV + c] = bf16_to_f32(row[c]);
      v[j * KV + c] = bf16_to_f32(row[KV + c]);
    }
  }
}

void NpuSimRunner::host_attention(int64_t l, const float* q, int64_t T, int64_t rel, float* out) {
  const int64_t KV = spec().kv_dim(), ctx = rel + T;
  if (int64_t(scratch_.size()) < 2 * ctx * KV) scratch_.resize(size_t(2 * ctx * KV));
  float *kk = scratch_.data(), *vv = scratch_.data() + ctx * KV;
  kv_read(l, 0, ctx, kk, vv);
  oracle::attention(q, T, rel, kk, vv, spec(), out, threads_);
}

// Naive prefill: the scores and the context products on the NPU (GEMMs per query head, as
// the Program lists them), the scaled, masked softmax on the host in fp32 between them.
void NpuSimRunner::split_attention(const StepRef& r, int64_t l, const float* q, int64_t T, int64_t rel, float* out) {
  const ModelSpec& s = spec();
  const int64_t hd = s.head_dim, KV = s.kv_dim(), ctx = rel + T;
  const npusim::ProgramDispatch& d = r.program->dispatches[r.where.dispatch];
  // The host buffers as the Program sizes them (every head's operands side by side).
  std::map<std::string, std::vector<uint8_t>> mem;
  npusim::Bindings b;
  for (const char* n : {"split.q", "split.keys", "split.values", "split.scores", "split.probs", "split.context"}) {
    const npusim::ProgramBuffer* pb = d.buffer(n);
    if (!pb) fail("npusim: the split attention's program has no buffer {}", n);
    std::vector<uint8_t>& m = mem[n];
    m.assign(size_t(pb->device_elems * npusim::elem_bytes(pb->buffer.type)), 0);
    b[n] = {pb->buffer.type, m.data(), pb->device_elems};
  }
  auto* qb = reinterpret_cast<uint16_t*>(mem["split.q"].data());
  auto* kb = reinterpret_cast<uint16_t*>(mem["split.keys"].data());
  auto* vb = reinterpret_cast<uint16_t*>(mem["split.values"].data());
  auto* sc = reinterpret_cast<float*>(mem["split.scores"].data());
  auto* pr = reinterpret_cast<uint16_t*>(mem["split.probs"].data());
  auto* cx = reinterpret_cast<float*>(mem["split.context"].data());
  // Keys padded to whole key tiles (the GEMM mapping takes whole tiles); padded keys are
  // zero and masked out of the softmax. Query rows padded to the GEMM's M (zero).
  const int64_t cp = npusim::kv_rows_for(ctx);
  const int64_t mp = b.at("split.q").elems / (s.n_heads * hd);
  const uint16_t* kv = kv_layer(l, ctx);
  for (int64_t g = 0; g < s.n_kv_heads; ++g)
    for (int64_t j = 0; j < ctx; ++j)
      for (int64_t e = 0; e < hd; ++e) {
        kb[g * cp * hd + j * hd + e] = kv[j * 2 * KV + g * hd + e];
        vb[g * hd * cp + e * cp + j] = kv[j * 2 * KV + KV + g * hd + e];
      }
  for (int64_t h = 0; h < s.n_heads; ++h)
    for (int64_t t = 0; t < T; ++t) npusim::detail::cast_to_bf16(q + t * s.q_dim() + h * hd, qb + h * mp * hd + t * hd, hd);
  const float scale = float(s.attn_scale());
  std::vector<float> p(static_cast<size_t>(cp));
  for (int64_t h = 0; h < s.n_heads; ++h) {
    executor_->run_launch(r.program, r.where, current_layer(), size_t(2 * h), b, r.priced);
    for (int64_t t = 0; t < T; ++t) {
      const float* row = sc + h * mp * cp + t * cp;
      const int64_t visible = rel + t + 1;  // causal: keys [0, rel + t]
      float m = -INFINITY;
      for (int64_t j = 0; j < visible; ++j) m = std::max(m, row[j] * scale);
      double sum = 0;
      for (int64_t j = 0; j < visible; ++j) sum += p[size_t(j)] = std::exp(row[j] * scale - m);
      for (int64_t j = 0; j < cp; ++j) p[size_t(j)] = j < visible ? float(p[size_t(j)] / sum) : 0.0f;
      npusim::detail::cast_to_bf16(p.data(), pr + h * mp * cp + t * cp, cp);
    }
    executor_->run_launch(r.program, r.where, current_layer(), size_t(2 * h + 1), b, r.priced);
    for (int64_t t = 0; t < T; ++t) std::copy_n(cx + h * mp * hd + t * hd, hd, out + t * s.q_dim() + h * hd);
  }
}

void NpuSimRunner::kernel_attention(int64_t l, const float* q, int64_t T, int64_t rel, float* out) {
  const ModelSpec& s = spec();
  const StepRef r = step_for(Stage::Attention, T, rel);
  switch (placement(r)) {
    case Placement::Host:
      host_calls_[Stage::Attention]++;
      executor_->host_step(r.program, r.where, current_layer(), r.priced);
      host_reads("q", q, T * s.q_dim());
      return host_attention(l, q, T, rel, out);
    case Placement::NpuWithHostSoftmax:
      ++host_softmax_calls_;  // the products ran on the NPU, the softmax on the host
      host_reads("q", q, T * s.q_dim());  // the host gathers the heads' queries
      return split_attention(r, l, q, T, rel, out);
    case Placement::Npu: break;
  }
  const int64_t ctx = rel + T, rows = npusim::kv_rows_for(ctx);
  npusim::StepArgs a;
  a.host["q"] = host(q, T * s.q_dim());
  a.host["attn"] = host(out, T * s.q_dim());
  a.external["kv"] = bf16_view(kv_layer(l, ctx), rows * 2 * s.kv_dim());
  executor_->run_step(r.program, r.where, current_layer(), a, r.priced, {});
}

void NpuSimRunner::kernel_silu_mul(const float* gate, const float* up, int64_t T, float* out) {
  const int64_t n = T * spec().intermediate;
  if (on_host(Stage::SiluMul, T, 0)) {
    host_reads("gate", gate, n);
    host_reads("up", up, n);
    return oracle::silu_mul(gate, up, out, n);
  }
  npusim::StepArgs a;
  a.host["gate"] = host(gate, n);
  a.host["up"] = host(up, n);
  a.host["act"] = host(out, n);
  run(Stage::SiluMul, T, 0, a);
}

void NpuSimRunner::kernel_add(Stage which, float* acc, const float* x, int64_t T) {
  const int64_t n = T * spec().hidden;
  if (on_host(which, T, 0)) {
    host_reads("h", acc, n);
    host_reads(which == Stage::AttnResidual ? "o" : "down", x, n);
    for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
    return;
  }
  npusim::StepArgs a;
  a.host["h"] = host(acc, n);
  a.host[which == Stage::AttnResidual ? "o" : "down"] = host(x, n);
  run(which, T, 0, a);
}

}  // namespace tessera
