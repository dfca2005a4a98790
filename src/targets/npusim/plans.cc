#include "targets/npusim/plans.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>

#include "util/error.h"
#include "util/json_fields.h"

namespace tessera::npusim {

const char* placement_name(Placement p) {
  switch (p) {
    case Placement::Npu: return "npu";
    case Placement::Host: return "host";
    case Placement::NpuWithHostSoftmax: return "npu+host-softmax";
  }
  return "?";
}

namespace {

Placement placement_from_name(const std::string& s) {
  for (Placement p : {Placement::Npu, Placement::Host, Placement::NpuWithHostSoftmax})
    if (s == placement_name(p)) return p;
  fail("npusim plan: unknown placement '{}' (npu, host, npu+host-softmax)", s);
}

PlanDispatch dispatch(std::string name, std::vector<Stage> stages, Placement where = Placement::Npu) {
  PlanDispatch d{std::move(name), {}};
  for (Stage s : stages) d.steps.push_back({s, where});
  return d;
}

// One dispatch per stage, all on the NPU unless `host` names the stage.
std::vector<PlanDispatch> one_per_stage(const std::vector<Stage>& stages, const std::map<Stage, Placement>& where = {}) {
  std::vector<PlanDispatch> out;
  for (Stage s : stages) {
    auto it = where.find(s);
    out.push_back(dispatch(stage_name(s), {s}, it == where.end() ? Placement::Npu : it->second));
  }
  return out;
}

const std::vector<Stage> kHead = {Stage::FinalNorm, Stage::LmHead};

NpuPlan baseline() {
  NpuPlan p;
  p.name = "baseline";
  p.description = "every op on the NPU, one op per dispatch, weights sent with every call, every intermediate synced";
  for (NpuPlan::Pass* pass : {&p.prefill, &p.decode}) {
    pass->embedding = one_per_stage({Stage::Embedding});
    pass->layer = one_per_stage(layer_stages());
    pass->head = one_per_stage(kHead);
  }
  return p;
}

NpuPlan naive() {
  NpuPlan p;
  p.name = "naive";
  p.description = "one op per dispatch, weights sent every call, prefill softmax and decode attention on the host, "
                  "LM head on the host";
  for (NpuPlan::Pass* pass : {&p.prefill, &p.decode}) {
    const bool decode = pass == &p.decode;
    pass->embedding = one_per_stage({Stage::Embedding}, {{Stage::Embedding, Placement::Host}});
    std::map<Stage, Placement> where;
    where[Stage::Attention] = decode ? Placement::Host : Placement::NpuWithHostSoftmax;
    if (decode) where[Stage::KvWrite] = Placement::Host;
    pass->layer = one_per_stage(layer_stages(), where);
    pass->head = one_per_stage(kHead, {{Stage::LmHead, Placement::Host}});
  }
  return p;
}

NpuPlan merged() {
  NpuPlan p;
  p.name = "merged";
  p.description = "prefill 3 dispatches per layer, decode 2 around host attention, LM head on 8 columns; weights "
                  "resident, intermediates on the device";
  p.weights_resident = true;
  p.intermediates_on_device = true;
  const std::vector<Stage> mlp = {Stage::OProj,      Stage::AttnResidual, Stage::MlpNorm,    Stage::GateUpProj,
                                  Stage::SiluMul,    Stage::DownProj,     Stage::MlpResidual};
  p.prefill.embedding = one_per_stage({Stage::Embedding}, {{Stage::Embedding, Placement::Host}});
  p.prefill.layer = {dispatch("norm+qkv+rope", {Stage::AttnNorm, Stage::QkvProj, Stage::Rope, Stage::KvWrite}),
                     dispatch("attention", {Stage::Attention}), dispatch("o+mlp", mlp)};
  p.prefill.head = {dispatch("norm+lm_head", kHead)};
  p.decode.embedding = p.prefill.embedding;
  p.decode.layer = {dispatch("norm+qkv+rope", {Stage::AttnNorm, Stage::QkvProj, Stage::Rope}),
                    dispatch("attention", {Stage::KvWrite, Stage::Attention}, Placement::Host), dispatch("o+mlp", mlp)};
  p.decode.head = {dispatch("norm+lm_head", kHead)};
  return p;
}

std::vector<const PlanDispatch*> all_dispatches(const NpuPlan::Pass& pass) {
  std::vector<const PlanDispatch*> out;
  for (const auto* list : {&pass.embedding, &pass.layer, &pass.head})
    for (const PlanDispatch& d : *list) out.push_back(&d);
  return out;
}

nlohmann::json dispatches_json(const std::vector<PlanDispatch>& list) {
  nlohmann::json out = nlohmann::json::array();
  for (const PlanDispatch& d : list) {
    nlohmann::json steps = nlohmann::json::array();
    for (const PlanStep& s : d.steps) steps.push_back({{"stage", stage_name(s.stage)}, {"on", placement_name(s.placement)}});
    out.push_back({{"name", d.name}, {"steps", steps}});
  }
  return out;
}

std::vector<PlanDispatch> dispatches_from_json(const nlohmann::json& j) {
  std::vector<PlanDispatch> out;
  for (const auto& d : j) {
    PlanDispatch pd{d.at("name").get<std::string>(), {}};
    for (const auto& s : d.at("steps"))
      pd.steps.push_back({stage_from_name(s.at("stage").get<std::string>()), placement_from_name(s.at("on").get<std::string>())});
    out.push_back(std::move(pd));
  }
  return out;
}

}  // namespace

bool PlanDispatch::host() const {
  for (const PlanStep& s : steps)
    if (s.placement != Placement::Host) return false;
  return true;
}

Placement NpuPlan::placement(Stage stage, bool decode_step) const {
  for (const PlanDispatch* d : all_dispatches(pass(decode_step)))
    for (const PlanStep& s : d->steps)
      if (s.stage == stage) return s.placement;
  fail("npusim plan '{}' does not place stage '{}' ({})", name, stage_name(stage), decode_step ? "decode" : "prefill");
}

std::vector<std::string> NpuPlan::host_stages(bool decode_step) const {
  std::vector<std::string> out;
  for (const PlanDispatch* d : all_dispatches(pass(decode_step)))
    for (const PlanStep& s : d->steps)
      if (s.placement != Placement::Npu)
        out.push_back(s.placement == Placement::Host ? stage_name(s.stage) : std::string(stage_name(s.stage)) + " (softmax)");
  return out;
}

bool NpuPlan::shares_dispatch(Stage a, Stage b, bool decode_step) const {
  for (const PlanDispatch* d : all_dispatches(pass(decode_step))) {
    if (d->host()) continue;
    bool has_a = false, has_b = false;
    for (const PlanStep& s : d->steps) {
      has_a |= s.stage == a && s.placement != Placement::Host;
      has_b |= s.stage == b && s.placement != Placement::Host;
    }
    if (has_a && has_b) return true;
  }
  return false;
}

GemvTiles NpuPlan::gemv_tiles_for(const GemvShape& s, const Device& d) const {
  if (auto it = gemv_tiles.find({s.N, s.K, s.w}); it != gemv_tiles.end()) return it->second;
  return default_gemv_tiles(s, d);
}

int NpuPlan::dispatches_per_layer(bool decode_step) const {
  int n = 0;
  for (const PlanDispatch& d : pass(decode_step).layer) n += d.host() ? 0 : 1;
  return n;
}

nlohmann::json NpuPlan::to_json() const {
  nlohmann::json j = {{"name", name},
                      {"description", description},
                      {"weights_resident", weights_resident},
                      {"intermediates_on_device", intermediates_on_device},
                      {"zero_copy", zero_copy}};
  nlohmann::json gemv = nlohmann::json::array();
  for (const auto& [shape, t] : gemv_tiles) {
    gemv.push_back({{"N", std::get<0>(shape)}, {"K", std::get<1>(shape)}, {"rb", t.rb}, {"kc", t.kc},
                    {"cols", t.herd.cols}, {"rows", t.herd.rows}});
    if (std::get<2>(shape) != ElemType::BF16) gemv.back()["w"] = elem_type_name(std::get<2>(shape));
  }
  j["tiles"] = {{"gemv", gemv}};
  for (const auto& [key, pass] : {std::pair{"prefill", &prefill}, std::pair{"decode", &decode}}) {
    j[key] = {{"embedding", dispatches_json(pass->embedding)},
              {"layer", dispatches_json(pass->layer)},
              {"head", dispatches_json(pass->head)},
              {"host_stages", host_stages(pass == &decode)},
              {"npu_dispatches_per_layer", dispatches_per_layer(pass == &decode)}};
  }
  return j;
}

NpuPlan plan_from_json(const nlohmann::json& j) {
  try {
    NpuPlan p;
    p.name = j.at("name").get<std::string>();
    p.description = j.value("description", "");
    p.weights_resident = j.at("weights_resident").get<bool>();
    p.intermediates_on_device = j.at("intermediates_on_device").get<bool>();
    p.zero_copy = j.at("zero_copy").get<bool>();
    if (j.contains("tiles"))
      for (const auto& t : j.at("tiles").at("gemv")) {
        // Positive integers only (fuzz_plan found a float 1.5e23 converted to int64_t).
        auto field = [&](const char* key) {
          return json_int(t.at(key), fmt::format("npusim plan: GEMV tiles' '{}'", key), 1);
        };
        const GemvTiles g{field("rb"), field("kc"), Herd{field("cols"), field("rows")}};
        p.gemv_tiles[{field("N"), field("K"), elem_type_from_name(t.value("w", std::string("bf16")))}] = g;
      }
    for (const auto& [key, pass] : {std::pair{"prefill", &p.prefill}, std::pair{"decode", &p.decode}}) {
      pass->embedding = dispatches_from_json(j.at(key).at("embedding"));
      pass->layer = dispatches_from_json(j.at(key).at("layer"));
      pass->head = dispatches_from_json(j.at(key).at("head"));
    }
    // Every stage placed exactly once per pass.
    for (bool decode : {false, true}) {
      std::multiset<Stage> seen;
      for (const PlanDispatch* d : all_dispatches(p.pass(decode)))
        for (const PlanStep& s : d->steps) seen.insert(s.stage);
      for (int i = 0; i < kStageCount; ++i)
        if (seen.count(Stage(i)) != 1)
          fail("stage '{}' is placed {} times in the {} pass (must be once)", stage_name(Stage(i)), seen.count(Stage(i)),
               decode ? "decode" : "prefill");
    }
    return p;
  } catch (const nlohmann::json::exception& e) {
    fail("npusim plan: not a plan as tessera writes it ({})", e.what());
  }
}

const std::vector<std::string>& plan_names() {
  static const std::vector<std::string> names = {"baseline", "naive", "merged"};
  return names;
}

const std::string& default_plan_name() { return plan_names()[0]; }

NpuPlan named_plan(const std::string& name) {
  if (name == "baseline") return baseline();
  if (name == "naive") return naive();
  if (name == "merged") return merged();
  fail("npusim has no plan '{}' (plans: {})", name, fmt::join(plan_names(), ", "));
}

}  // namespace tessera::npusim
