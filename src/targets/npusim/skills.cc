// npusim's optimization skills (ARCHITECTURE section 5), each a rewrite of the NpuPlan held in
// a deployment plan's "npusim.plan". The pipeline gates and measures every rewrite (phases
// 4 and 5); here they only propose. The moves are the reference deployment's:
//   promote       an op the plan leaves on the host onto the NPU, one op per rewrite;
//   merge         consecutive NPU dispatches of the pass into one, up to the boundaries the
//                 hardware imposes (a host op ends a dispatch: a dispatch is one host call);
//   buffer-reuse  weights resident in device memory per layer; intermediates never synced;
//   zero-copy     host-visible buffers mapped instead of copied;
//   tile-tune     the GEMVs of the pass (decode projections, the LM head) on the tiles the
//                 timing model prices fastest within the checker's limits. The prefill
//                 GEMMs are not searched: at 2048 tokens on xdna2 the best of ~3000 valid
//                 tilings beats the default by 0.3% at most, while a tiling chosen for 2048
//                 rows pads every short prompt to it.
#include <fmt/format.h>

#include <fmt/ranges.h>

#include <map>
#include <tuple>

#include "targets/npusim/device.h"
#include "targets/npusim/npusim_runner.h"
#include "targets/npusim/plans.h"
#include "targets/npusim/program.h"
#include "targets/npusim/timing.h"
#include "util/json_fields.h"

namespace tessera {

namespace {

using npusim::NpuPlan;
using npusim::Placement;
using npusim::PlanDispatch;

NpuPlan npu_plan(const nlohmann::json& plan) { return npusim::plan_from_json(plan.at("npusim").at("plan")); }

// The deployment plan with `np` in place, named and described as rewritten.
PlanRewrite rewrite(const nlohmann::json& plan, NpuPlan np, const std::string& what) {
  if (!np.name.ends_with("+opt")) np.name += "+opt";
  np.description += "; then " + what;
  nlohmann::json next = plan;
  next["npusim"]["plan"] = np.to_json();
  return {what, next};
}

std::vector<std::vector<PlanDispatch>*> lists(NpuPlan::Pass& pass) { return {&pass.embedding, &pass.layer, &pass.head}; }

NpuPlan::Pass& pass_of(NpuPlan& np, Pass pass) { return pass == Pass::Decode ? np.decode : np.prefill; }

// One rewrite per host-placed step of the pass. The step leaves its dispatch for one of its
// own on the NPU (a dispatch is one host call: it cannot hold host work), in place.
std::vector<PlanRewrite> propose_promote(const nlohmann::json& plan, Pass pass, std::string& why_not) {
  NpuPlan base = npu_plan(plan);
  std::vector<PlanRewrite> out;
  const std::vector<std::vector<PlanDispatch>*> base_lists = lists(pass_of(base, pass));
  for (size_t li = 0; li < base_lists.size(); ++li)
    for (size_t di = 0; di < base_lists[li]->size(); ++di)
      for (size_t si = 0; si < (*base_lists[li])[di].steps.size(); ++si) {
        const PlanDispatch& d = (*base_lists[li])[di];
        const npusim::PlanStep step = d.steps[si];
        if (step.placement == Placement::Npu) continue;
        NpuPlan np = base;
        std::vector<PlanDispatch>& list = *lists(pass_of(np, pass))[li];
        std::vector<PlanDispatch> split;
        PlanDispatch before{d.name, {}}, after{d.name, {}};
        for (size_t k = 0; k < d.steps.size(); ++k)
          if (k < si) before.steps.push_back(d.steps[k]);
          else if (k > si) after.steps.push_back(d.steps[k]);
        if (!before.steps.empty()) split.push_back(before);
        split.push_back({stage_name(step.stage), {{step.stage, Placement::Npu}}});
        if (!after.steps.empty()) split.push_back(after);
        list.erase(list.begin() + long(di));
        list.insert(list.begin() + long(di), split.begin(), split.end());
        const std::string what =
            step.placement == Placement::NpuWithHostSoftmax
                ? fmt::format("{} wholly on the NPU (its softmax leaves the host) in {}", stage_name(step.stage), pass_name(pass))
                : fmt::format("{} onto the NPU in {}", stage_name(step.stage), pass_name(pass));
        out.push_back(rewrite(plan, np, what));
      }
  if (out.empty()) why_not = fmt::format("every op of the {} pass already runs on the NPU", pass_name(pass));
  return out;
}

// Consecutive NPU dispatches of each list (embedding, layer, head) become one; a host
// dispatch is the boundary.
std::vector<PlanRewrite> propose_merge(const nlohmann::json& plan, Pass pass, std::string& why_not) {
  NpuPlan np = npu_plan(plan);
  bool merged_any = false;
  for (std::vector<PlanDispatch>* list : lists(pass_of(np, pass))) {
    std::vector<PlanDispatch> out;
    for (const PlanDispatch& d : *list) {
      if (!out.empty() && !out.back().host() && !d.host()) {
        out.back().name += "+" + d.name;
        out.back().steps.insert(out.back().steps.end(), d.steps.begin(), d.steps.end());
        merged_any = true;
      } else {
        out.push_back(d);
      }
    }
    *list = std::move(out);
  }
  if (!merged_any) {
    why_not = fmt::format("no two NPU dispatches of the {} pass are adjacent", pass_name(pass));
    return {};
  }
  return {rewrite(plan, np, fmt::format("adjacent NPU dispatches merged in {} ({} per layer)", pass_name(pass),
                                        np.dispatches_per_layer(pass == Pass::Decode)))};
}

std::vector<PlanRewrite> propose_buffer_reuse(const nlohmann::json& plan, Pass, std::string& why_not) {
  std::vector<PlanRewrite> out;
  const NpuPlan base = npu_plan(plan);
  if (!base.weights_resident) {
    NpuPlan np = base;
    np.weights_resident = true;
    out.push_back(rewrite(plan, np, "weights resident in device memory per layer"));
  }
  if (!base.intermediates_on_device) {
    NpuPlan np = base;
    np.intermediates_on_device = true;
    out.push_back(rewrite(plan, np, "intermediates kept on the device between a dispatch's launches"));
  }
  if (out.empty()) why_not = "weights are resident and intermediates stay on the device already";
  return out;
}

std::vector<PlanRewrite> propose_zero_copy(const nlohmann::json& plan, Pass, std::string& why_not) {
  NpuPlan np = npu_plan(plan);
  if (np.zero_copy) {
    why_not = "host buffers are mapped already";
    return {};
  }
  np.zero_copy = true;
  return {rewrite(plan, np, "host buffers mapped zero-copy")};
}

// The GEMVs a pass runs on the NPU, by weight shape (N, K) and format (the plan's
// npusim.weight_formats: a quantized checkpoint's blocks), with the op names.
using GemvKey = std::tuple<int64_t, int64_t, npusim::ElemType>;
std::map<GemvKey, std::string> pass_gemvs(const nlohmann::json& plan, const NpuPlan& np, Pass pass) {
  const nlohmann::json& spec = plan.at("model").at("spec");
  auto dim = [&](const char* key) {
    return json_integer(spec.at(key), fmt::format("plan.json: model spec '{}'", key), 1, 1 << 24);
  };
  const int64_t H = dim("hidden_size"), I = dim("intermediate_size"), hd = dim("head_dim"),
                Q = hd * dim("num_attention_heads"), KV = hd * dim("num_key_value_heads"), V = dim("vocab_size");
  const npusim::WeightFormats formats =
      npusim::WeightFormats::from_json(plan.at("npusim").value("weight_formats", nlohmann::json()));
  const bool decode = pass == Pass::Decode;
  std::map<GemvKey, std::string> out;
  auto add = [&](Stage st, int64_t N, int64_t K, const char* buffer, const char* name) {
    if (np.placement(st, decode) != Placement::Npu) return;
    std::string& names = out[{N, K, formats.of(buffer)}];
    names += (names.empty() ? "" : "/") + std::string(name);
  };
  if (decode) {  // prefill runs its projections as GEMMs
    add(Stage::QkvProj, Q, H, "w.q", "q_proj");
    add(Stage::QkvProj, KV, H, "w.k", "k_proj");
    add(Stage::QkvProj, KV, H, "w.v", "v_proj");
    add(Stage::OProj, H, Q, "w.o", "o_proj");
    add(Stage::GateUpProj, I, H, "w.gate", "gate_proj");
    add(Stage::GateUpProj, I, H, "w.up", "up_proj");
    add(Stage::DownProj, H, I, "w.down", "down_proj");
  }
  add(Stage::LmHead, V, H, "w.lm_head", "lm_head");  // one row in both passes
  return out;
}

std::vector<PlanRewrite> propose_tile_tune(const nlohmann::json& plan, Pass pass, std::string& why_not) {
  NpuPlan np = npu_plan(plan);
  const npusim::Device d = npusim::load_device(plan.at("npusim").at("device").get<std::string>());
  std::vector<std::string> changes;
  for (const auto& [shape, names] : pass_gemvs(plan, np, pass)) {
    const npusim::GemvShape s{std::get<0>(shape), std::get<1>(shape), false, std::get<2>(shape)};
    const npusim::GemvTiles now = np.gemv_tiles_for(s, d);
    const npusim::GemvTiles best = npusim::tune_gemv_tiles(s, d);
    const double now_us = npusim::time_launch(npusim::gemv_launch(s, now, d), d).total_us;
    const double best_us = npusim::time_launch(npusim::gemv_launch(s, best, d), d).total_us;
    if (!(best_us < now_us)) continue;
    np.gemv_tiles[shape] = best;
    changes.push_back(fmt::format("{} {}x{}{} rb {} kc {} on {}x{} -> rb {} kc {} on {}x{} ({:.1f} -> {:.1f} us)", names,
                                  s.N, s.K, npusim::is_block(s.w) ? std::string(" ") + npusim::elem_type_name(s.w) : "", now.rb, now.kc, now.herd.cols, now.herd.rows, best.rb, best.kc,
                                  best.herd.cols, best.herd.rows, now_us, best_us));
  }
  if (changes.empty()) {
    why_not = fmt::format("every NPU GEMV of the {} pass already runs on its fastest valid tiles", pass_name(pass));
    return {};
  }
  return {rewrite(plan, np, fmt::format("GEMV tiles tuned in {}: {}", pass_name(pass), fmt::join(changes, "; ")))};
}

}  // namespace

const std::vector<OptSkill>& npusim_skills() {
  static const std::vector<OptSkill> skills = {
      {"promote", "move an op the plan leaves on the host onto the NPU", propose_promote},
      {"merge", "group consecutive NPU launches into one dispatch (a host op is a boundary)", propose_merge},
      {"buffer-reuse", "keep weights resident per layer and intermediates on the device", propose_buffer_reuse},
      {"zero-copy", "map host-visible buffers instead of copying them", propose_zero_copy},
      {"tile-tune", "run each GEMV shape on the tiles the timing model prices fastest within the checker's limits",
       propose_tile_tune},
  };
  return skills;
}

}  // namespace tessera
