// npusim's one lowering (issue 17): the runner executes the Program the timing model prices.
// A functional pass, priced dispatch call by dispatch call as it ran, equals the dry price of
// the Program lowered for that pass, on every tiny preset and named plan, prefill and decode;
// a merged dispatch lowered without one wait gives wrong numbers through the executor's own
// semantics (the add reads the buffer as the dispatch call began).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "model/weights.h"
#include "pipeline/deploy.h"
#include "model/presets.h"
#include "targets/npusim/checker.h"
#include "targets/npusim/executor.h"
#include "targets/npusim/npusim_runner.h"
#include "targets/npusim/predict.h"
#include "targets/npusim/program.h"
#include "targets/npusim/timing.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing_support::deploy_options;
using testing_support::ScratchDir;
using testing_support::slurp;
using testing_support::tiny_model;

std::vector<int32_t> ids(int64_t n, int32_t seed) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(int32_t((seed * 7919 + i * 104729) % 4000 + 10));
  return out;
}

void expect_same_timing(const npusim::PassPrediction& run, const npusim::PassPrediction& dry, const std::string& what) {
  EXPECT_NEAR(run.total_us, dry.total_us, 1e-9 * dry.total_us) << what;
  EXPECT_EQ(run.npu_dispatches, dry.npu_dispatches) << what;
  EXPECT_EQ(run.launches, dry.launches) << what;
  EXPECT_EQ(run.host_copy_bytes, dry.host_copy_bytes) << what;
  EXPECT_EQ(run.ddr_bytes, dry.ddr_bytes) << what;
  EXPECT_GT(dry.total_us, 0) << what;
}

// The merged plan on 2 threads, with the target's own faults.
TargetOptions merged_options(FaultSet faults = {}) {
  TargetOptions o;
  o.threads = 2;
  o.plan_name = "merged";
  o.faults = std::move(faults);
  return o;
}

struct Case {
  std::string preset, plan;
};

class NpusimProgram : public ::testing::TestWithParam<Case> {};

// Prefill (first calls: resident weights loaded), a first decode step and a steady one.
TEST_P(NpusimProgram, FunctionalRunTimesEqualTheDryPriceOfItsProgram) {
  const Model model = Model::open(tiny_model(GetParam().preset));
  TargetOptions o;
  o.threads = 2;
  o.plan_name = GetParam().plan;
  NpuSimRunner r(model, o);
  const int64_t T = 9;
  r.forward(ids(T, 1), false);
  expect_same_timing(r.last_pass_timing(), npusim::price(*r.program({false, T, 0, 1}), r.device(), true), "prefill");
  r.forward(ids(1, 2), false);
  expect_same_timing(r.last_pass_timing(), npusim::price(*r.program({true, 1, T, 1}), r.device(), true), "decode 1");
  r.forward(ids(1, 3), false);
  expect_same_timing(r.last_pass_timing(), npusim::price(*r.program({true, 1, T + 1, 1}), r.device(), false),
                     "decode 2");
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const Preset& p : presets())
    for (const char* plan : {"baseline", "naive", "merged"}) {
#ifdef TESSERA_SANITIZED
      if (std::string(plan) != "merged") continue;  // one plan per preset under sanitizers (CI time)
#endif
      out.push_back({p.name, plan});
    }
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string n = info.param.preset + "_" + info.param.plan;
  for (char& c : n)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(EveryTinyPreset, NpusimProgram, ::testing::ValuesIn(cases()), case_name);

// The merged plan's O projection and residual add share a dispatch: the add waits for the
// projection's drain of `o`, and `o` never goes to the host.
TEST(NpusimProgram, MergedDispatchWaitsForItsIntermediate) {
  const ModelSpec spec = find_preset("Llama-3.2-1B").full;
  const npusim::Device d = npusim::load_device("xdna2");
  for (const bool fault : {false, true}) {
    npusim::LoweringFaults f;
    f.drop_o_wait = fault;
    const npusim::Program p = npusim::lower(npusim::named_plan("merged"), spec, d, {true, 1, 100, 1}, f);
    const npusim::Program::Where w = p.find(Stage::AttnResidual);
    const npusim::ProgramDispatch& disp = p.dispatches[w.dispatch];
    EXPECT_EQ(disp.name, "layer.o+mlp");
    ASSERT_NE(disp.buffer("o"), nullptr);
    EXPECT_EQ(disp.buffer("o")->buffer.sync, npusim::Sync::DeviceOnly);
    const npusim::LaunchCall& add = disp.steps[w.step].launches.at(0);
    EXPECT_EQ(add.waits.count("o"), fault ? 0u : 1u);
    EXPECT_EQ(add.waits.count("h"), 0u);  // nothing earlier in the dispatch writes h
    const npusim::Program::Where n = p.find(Stage::MlpNorm);
    EXPECT_EQ(disp.steps[n.step].launches.at(0).waits.count("h"), 1u);  // the add's h
  }
}

// The naive prefill's attention gathers q on the host between its launches: merged into one
// dispatch with the intermediates on the device, q must still reach the host.
TEST(NpusimProgram, HostCodeInsideADispatchGetsItsInputsSynced) {
  const ModelSpec spec = find_preset("Llama-3.2-1B").full;
  const npusim::Device d = npusim::load_device("xdna2");
  npusim::NpuPlan p = npusim::named_plan("naive");
  npusim::PlanDispatch all{"layer", {}};
  for (const npusim::PlanDispatch& x : p.prefill.layer) all.steps.insert(all.steps.end(), x.steps.begin(), x.steps.end());
  p.prefill.layer = {all};
  p.intermediates_on_device = true;
  const npusim::Program prog = npusim::lower(p, spec, d, {false, 64, 0, 1});
  const npusim::ProgramDispatch& layer = prog.dispatches[prog.find(Stage::Attention).dispatch];
  EXPECT_EQ(layer.buffer("q")->buffer.sync, npusim::Sync::EveryCall);   // the host softmax's gather reads it
  EXPECT_EQ(layer.buffer("x")->buffer.sync, npusim::Sync::DeviceOnly);  // read by the array only
}

// The merged decode's intermediates live in the memory tiles: buffers share bytes only when
// their live ranges do not overlap (and some do share), the arena fits beside what the
// launches stage there, and their fifos stream from L2 (no DDR bytes, no shim leg).
TEST(NpusimProgram, IntermediatesShareMemoryTilesOnlyWhenTheirLiveRangesDoNot) {
  const Model model = Model::open(tiny_model("SmolLM2-360M"));
  NpuSimRunner r(model, merged_options());
  const npusim::Program p = *r.program({true, 1, 6, 1});
  const npusim::ProgramDispatch& d = p.dispatches[p.find(Stage::SiluMul).dispatch];
  const npusim::Device& dev = r.device();
  int64_t sum = 0;
  int in_l2 = 0, shared = 0;
  for (const npusim::ProgramBuffer& a : d.buffers) {
    if (!a.in_l2) continue;
    ++in_l2;
    EXPECT_EQ(a.buffer.sync, npusim::Sync::DeviceOnly) << a.buffer.name;
    const int64_t abytes = a.device_elems * npusim::elem_bytes(a.buffer.type);
    sum += abytes;
    EXPECT_LE(a.l2_offset + abytes, d.l2_arena_bytes) << a.buffer.name;
    for (const npusim::ProgramBuffer& b : d.buffers) {
      if (!b.in_l2 || &a == &b) continue;
      const int64_t bbytes = b.device_elems * npusim::elem_bytes(b.buffer.type);
      if (a.l2_offset < b.l2_offset + bbytes && b.l2_offset < a.l2_offset + abytes) {
        ++shared;
        EXPECT_TRUE(a.live.second < b.live.first || b.live.second < a.live.first) << a.buffer.name << " and " << b.buffer.name;
      }
    }
  }
  EXPECT_GE(in_l2, 4);
  EXPECT_GT(shared, 0) << "no intermediate reuses another's bytes";
  EXPECT_LT(d.l2_arena_bytes, sum);
  EXPECT_LE(d.l2_arena_bytes, int64_t(dev.columns) * dev.l2_bytes);
  int l2_fifos = 0;
  for (const npusim::ProgramStep& st : d.steps)
    for (const npusim::LaunchCall& c : st.launches) {
      EXPECT_TRUE(npusim::check(c.launch, dev).empty()) << c.launch.name << ": " << npusim::describe(npusim::check(c.launch, dev));
      npusim::Launch from_ddr = c.launch;
      int64_t l2_bytes = 0;
      for (npusim::ObjectFifo& f : from_ddr.fifos) {
        if (!f.l2_side) continue;
        ++l2_fifos;
        l2_bytes += f.stream_elements() * npusim::elem_bytes(f.type);
        f.l2_side = false;
      }
      EXPECT_EQ(npusim::time_launch(from_ddr, dev, {}).ddr_bytes - npusim::time_launch(c.launch, dev, {}).ddr_bytes, l2_bytes)
          << c.launch.name;
    }
  EXPECT_GT(l2_fifos, 0);
  // The same plan with every intermediate in DDR computes the same numbers.
  nlohmann::json plan = r.build_plan(model);
  npusim::NpuPlan in_ddr = npusim::plan_from_json(plan["npusim"]["plan"]);
  in_ddr.intermediates_on_device = false;
  plan["npusim"]["plan"] = in_ddr.to_json();
  TargetOptions o = merged_options();
  o.plan = plan;
  NpuSimRunner ddr(model, o);
  EXPECT_EQ(r.forward(ids(6, 3), false), ddr.forward(ids(6, 3), false));
  EXPECT_EQ(r.forward(ids(1, 4), false), ddr.forward(ids(1, 4), false));
}

// An allocator that forgets a buffer's readers lets a later intermediate of the merged decode
// dispatch take the bytes of one still to be read (x under gate, gate under up): the
// executor's shared bytes give wrong numbers, and the target names the buffers that share
// memory while live.
TEST(NpusimProgram, ReuseWhileLiveOverwritesAnInputThroughTheExecutor) {
  const Model model = Model::open(tiny_model("SmolLM2-360M"));
  NpuSimRunner clean(model, merged_options()), broken(model, merged_options({"reuse-while-live"}));
  std::string where;
  for (const Stage st : {Stage::OProj, Stage::AttnResidual, Stage::MlpNorm, Stage::GateUpProj, Stage::SiluMul,
                         Stage::DownProj, Stage::MlpResidual}) {
    EXPECT_EQ(clean.shared_memory(st, 1), "") << stage_name(st);
    where += broken.shared_memory(st, 1);
  }
  EXPECT_NE(where.find("dispatch `layer.o+mlp`: buffer `"), std::string::npos) << where;
  EXPECT_NE(where.find(") is overwritten by `"), std::string::npos) << where;
  EXPECT_EQ(clean.forward(ids(6, 3), false).size(), broken.forward(ids(6, 3), false).size());
  const std::vector<float> a = clean.forward(ids(1, 4), false), b = broken.forward(ids(1, 4), false);
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::isfinite(b[i]) ? double(std::abs(a[i] - b[i])) : 1e30);
  EXPECT_GT(diff, 1e-3);
}

// Without the wait the add reads `o` as the dispatch call began: on the first call never
// written (poison), on later calls the previous call's O projection.
TEST(NpusimProgram, DroppedWaitGivesThePreviousCallsIntermediate) {
  const Model model = Model::open(tiny_model("SmolLM2-360M"));
  NpuSimRunner clean(model, merged_options()), broken(model, merged_options({"merged-stale-intermediate"}));
  const int64_t H = model.spec().hidden;
  std::map<std::string, std::vector<float>> seen[2][2];  // runner, call
  for (int call = 0; call < 2; ++call)
    for (int k = 0; k < 2; ++k) {
      NpuSimRunner& r = k == 0 ? clean : broken;
      r.reset();
      std::vector<float> h(size_t(5 * H));
      for (size_t i = 0; i < h.size(); ++i) h[i] = float(std::sin(0.37 * double(i) + call));
      auto& s = seen[k][call];
      s["in"] = h;
      r.forward_layers(h.data(), 5, 1, [&](const std::string& n, const float* d, int64_t rows, int64_t cols) {
        if (n == "layers.0.o_proj" || n == "layers.0.attn_residual") s[n.substr(9)].assign(d, d + rows * cols);
      }, ProbeLevel::All);
    }
  // The first call's add read poison; the second's read the first call's o.
  const auto& b0 = seen[1][0]["attn_residual"];
  EXPECT_TRUE(std::any_of(b0.begin(), b0.end(), [](float v) { return std::isnan(v); }));
  const auto& b1 = seen[1][1];
  double worst_stale = 0, worst_clean = 0;
  for (int64_t i = 0; i < 5 * H; ++i) {
    worst_stale = std::max(worst_stale, double(std::abs(b1.at("attn_residual")[size_t(i)] -
                                                        (b1.at("in")[size_t(i)] + seen[1][0].at("o_proj")[size_t(i)]))));
    worst_clean = std::max(worst_clean, double(std::abs(seen[0][1].at("attn_residual")[size_t(i)] -
                                                        (seen[0][1].at("in")[size_t(i)] + seen[0][1].at("o_proj")[size_t(i)]))));
  }
  EXPECT_LT(worst_stale, 1e-5);
  EXPECT_LT(worst_clean, 1e-5);
  EXPECT_NE(b1.at("attn_residual"), seen[0][1].at("attn_residual"));
}

// A device-only buffer never reaches the host: with the lowering that forgets host readers,
// the merged plan's decode leaves q, k, v on the device and the host's attention reads what
// the host held before (the previous step's), so decode logits go wrong while prefill (whose
// attention is on the array) is untouched.
TEST(NpusimProgram, HostReadsWhatWasNeverSynced) {
  const Model model = Model::open(tiny_model("SmolLM2-360M"));
  NpuSimRunner clean(model, merged_options()), broken(model, merged_options({"unsynced-handover"}));
  const npusim::Program p = *broken.program({true, 1, 6, 1});
  const npusim::ProgramDispatch& first = p.dispatches[p.find(Stage::QkvProj).dispatch];
  EXPECT_EQ(first.buffer("q")->buffer.sync, npusim::Sync::DeviceOnly);
  EXPECT_EQ(clean.program({true, 1, 6, 1})->dispatches[p.find(Stage::QkvProj).dispatch].buffer("q")->buffer.sync,
            npusim::Sync::EveryCall);
  EXPECT_EQ(clean.forward(ids(6, 4), false), broken.forward(ids(6, 4), false));  // prefill: attention on the array
  for (int step = 0; step < 2; ++step) {
    const std::vector<float> a = clean.forward(ids(1, 5 + step), false), b = broken.forward(ids(1, 5 + step), false);
    double diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, double(std::abs(a[i] - b[i])));
    EXPECT_GT(diff, 1e-3) << "decode step " << step;
  }
}

// The same fault through the pipeline: phase 2's block (prefill and decode steps) fails and
// bisect names the projection whose outputs never reach the host.
TEST(NpusimProgram, UnsyncedHandoverFailsPhaseTwo) {
  ScratchDir out("npusim_unsynced");
  DeployOptions o = deploy_options(tiny_model("SmolLM2-360M"), out.str("dep"), {"unsynced-handover"});
  o.target = "npusim";
  o.plan_name = "merged";
  const DeployResult r = deploy(o);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.failed_phase, 2) << r.diagnosis;
  const std::string issues = slurp(out.path() / "dep" / "issues.md");
  EXPECT_NE(issues.find("bisect names stage 'qkv_proj'"), std::string::npos);
  // The unsynced-handover skill confirms it by experiment and names the dispatch and the
  // buffers RoPE leaves on the device.
  EXPECT_TRUE(testing_support::names_cause(issues, "unsynced-handover")) << issues;
  EXPECT_NE(issues.find("dispatch `layer.norm+qkv+rope` keeps buffers `k`, `q` on the device"), std::string::npos)
      << issues;
}

}  // namespace
}  // namespace tessera
