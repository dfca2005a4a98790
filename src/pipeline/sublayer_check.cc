#include "pipeline/sublayer_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <span>

#include "pipeline/op_table.h"
#include "util/error.h"

namespace tessera {

namespace {

// Snaps the target's residual stream to the oracle's at every layer boundary (the embedding's
// output and each layer's output) and keeps what the target computed there first.
class TeacherForcing final : public OutputTap {
 public:
  TeacherForcing(const PhaseContext::OracleRun& ref, std::shared_ptr<OutputTap> inner, int64_t layers, int64_t hidden)
      : ref_(ref), inner_(std::move(inner)), H_(hidden), mid_(size_t(layers)), out_(size_t(layers)) {}

  void on_output(const StageOutput& o) override {
    if (inner_) inner_->on_output(o);  // the deployment's own perturbations act first
    switch (o.stage) {
      case Stage::Embedding:
        row0_ = rows_seen_;  // a forward call starts: its rows follow the ones before
        rows_seen_ += o.rows;
        snap(ref_.embed, o);
        break;
      case Stage::AttnResidual: keep(mid_, o); break;
      case Stage::MlpResidual:
        keep(out_, o);
        snap(ref_.layers.at(size_t(o.layer)), o);
        break;
      default: break;
    }
  }
  const std::vector<float>& mid(int64_t l) const { return mid_[size_t(l)]; }
  const std::vector<float>& out(int64_t l) const { return out_[size_t(l)]; }

 private:
  void snap(const std::vector<float>& from, const StageOutput& o) const {
    const size_t at = size_t(row0_ * H_), n = size_t(o.rows * H_);
    if (at + n > from.size()) fail("internal: teacher forcing past the oracle's {} rows", from.size() / size_t(H_));
    std::copy_n(from.data() + at, n, o.data);
  }
  void keep(std::vector<std::vector<float>>& into, const StageOutput& o) const {
    std::vector<float>& v = into.at(size_t(o.layer));
    v.resize(size_t((row0_ + o.rows) * H_));
    std::copy_n(o.data, size_t(o.rows * H_), v.data() + row0_ * H_);
  }

  const PhaseContext::OracleRun& ref_;
  std::shared_ptr<OutputTap> inner_;
  int64_t H_;
  int64_t row0_ = 0, rows_seen_ = 0;
  std::vector<std::vector<float>> mid_, out_;
};

// ||(got - got_base) - (ref - ref_base)|| / ||ref - ref_base|| over rows [r0, r1). Rows the
// target never produced (its residual add never ran: nothing reached the stream) are an
// error without bound.
double contribution_error(const std::vector<float>& got, const std::vector<float>& got_base, const std::vector<float>& ref,
                          const std::vector<float>& ref_base, int64_t r0, int64_t r1, int64_t H) {
  if (r1 <= r0) return std::nan("");
  if (got.size() < size_t(r1 * H) || got_base.size() < size_t(r1 * H)) return std::numeric_limits<double>::infinity();
  double err = 0, norm = 0;
  for (int64_t i = r0 * H; i < r1 * H; ++i) {
    const double want = double(ref[size_t(i)]) - ref_base[size_t(i)];
    const double have = double(got[size_t(i)]) - got_base[size_t(i)];
    err += (have - want) * (have - want);
    norm += want * want;
  }
  if (!std::isfinite(err)) return std::numeric_limits<double>::infinity();
  return norm > 0 ? std::sqrt(err / norm) : (err > 0 ? std::numeric_limits<double>::infinity() : 0.0);
}

}  // namespace

SublayerErrors sublayer_errors(PhaseContext& ctx, StagedRunner& target, const CanonicalPrompt& p, bool last_as_decode) {
  const ModelSpec& s = ctx.model.spec();
  const PhaseContext::OracleRun& ref = ctx.oracle_run(p.ids);
  const int64_t T = int64_t(p.ids.size()), H = s.hidden, L = s.n_layers;
  const std::shared_ptr<OutputTap> own = target.output_tap();
  auto forcing = std::make_shared<TeacherForcing>(ref, own, L, H);
  struct Restore {
    StagedRunner& t;
    std::shared_ptr<OutputTap> tap;
    ~Restore() { t.set_output_tap(tap); }
  } restore{target, own};
  target.set_output_tap(forcing);
  target.reset();
  if (last_as_decode && T > 1) {
    prefill_in_chunks(target, std::span<const int32_t>(p.ids.data(), p.ids.size() - 1));
    target.forward(std::span<const int32_t>(&p.ids.back(), 1), false);
  } else {
    prefill_in_chunks(target, p.ids);
  }
  SublayerErrors e;
  const int64_t far0 = SublayerErrors::kFarPositions;
  for (int64_t l = 0; l < L; ++l) {
    // The layer's input is the oracle's (snapped), so each contribution is measured from it.
    const std::vector<float>& in = l == 0 ? ref.embed : ref.layers[size_t(l - 1)];
    const std::vector<float>& mid = forcing->mid(l);
    e.attn.push_back(contribution_error(mid, in, ref.mids[size_t(l)], in, 0, T, H));
    e.mlp.push_back(contribution_error(forcing->out(l), mid, ref.layers[size_t(l)], ref.mids[size_t(l)], 0, T, H));
    e.attn_far.push_back(contribution_error(mid, in, ref.mids[size_t(l)], in, far0, T, H));
    e.mlp_far.push_back(contribution_error(forcing->out(l), mid, ref.layers[size_t(l)], ref.mids[size_t(l)], far0, T, H));
  }
  return e;
}

// The four series in the order a layer is read: each sublayer over all positions, then far.
std::vector<SublayerErrors::Series> SublayerErrors::series() const {
  return {{&attn, "attention", false}, {&attn_far, "attention", true}, {&mlp, "mlp", false}, {&mlp_far, "mlp", true}};
}

SublayerErrors::Worst SublayerErrors::worst() const {
  Worst w;
  for (size_t l = 0; l < attn.size(); ++l)
    for (const Series& s : series())
      if ((*s.errors)[l] > w.error) w = {int64_t(l), s.sublayer, (*s.errors)[l], s.far};  // NaN (no far rows) never wins
  return w;
}

SublayerErrors::Worst SublayerErrors::first_over(const SublayerLimits& limits) const {
  const double outer = gates::threshold("phase3.sublayer_error_max");
  for (size_t l = 0; l < attn.size(); ++l)
    for (const Series& s : series()) {
      const double limit = std::min(s.errors == &attn || s.errors == &attn_far ? limits.attention : limits.mlp, outer);
      if ((*s.errors)[l] > limit) return {int64_t(l), s.sublayer, (*s.errors)[l], s.far};
    }
  return {};
}

namespace {
double max_of(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (const std::vector<double>* v : {&a, &b})
    for (double x : *v)
      if (!std::isnan(x)) m = std::max(m, x);
  return m;
}
}  // namespace

double SublayerErrors::attention_max() const { return max_of(attn, attn_far); }
double SublayerErrors::mlp_max() const { return max_of(mlp, mlp_far); }

std::string sublayer_diagnosis(const std::string& prompt_text, const SublayerErrors::Worst& first) {
  if (first.layer < 0) return "";
  return fmt::format(
      "\"{}\": layer {}'s {} disagrees with the oracle's when the layer starts from the oracle's input (relative error "
      "{:.4f}{}), the first layer in depth that does: suspect that layer's {}, not the layers after it",
      prompt_text, first.layer, first.sublayer, first.error, first.far ? " over positions past 256" : "",
      first.sublayer == "mlp" ? "MLP (its norm, gate/up/down weights, activation or residual add)"
                              : "attention block (its norm, q/k/v/o weights, RoPE positions, KV cache or residual add)");
}

void require_sublayer_limits(gates::GateResult& g, const SublayerErrors& errors, const SublayerLimits& limits) {
  g.require_derived("attention_error", errors.attention_max(), "<=", limits.attention, "phase3.sublayer_error_max");
  g.require_derived("mlp_error", errors.mlp_max(), "<=", limits.mlp, "phase3.sublayer_error_max");
}

SublayerLimits sublayer_limits(PhaseContext& ctx, const StagedRunner& target) {
  const std::map<Stage, double>& e = ctx.expected_stage_errors(target);
  auto sum = [&](std::initializer_list<Stage> stages) {
    double s = 0;
    for (Stage st : stages)
      if (auto it = e.find(st); it != e.end()) s += it->second;
    return s;
  };
  SublayerLimits l;
  l.attention_expected = sum({Stage::AttnNorm, Stage::QkvProj, Stage::Rope, Stage::KvWrite, Stage::Attention, Stage::OProj,
                              Stage::AttnResidual});
  l.mlp_expected = sum({Stage::MlpNorm, Stage::GateUpProj, Stage::SiluMul, Stage::DownProj, Stage::MlpResidual});
  const double margin = gates::threshold("phase3.sublayer_margin"), floor = gates::threshold("phase3.sublayer_error_floor");
  l.attention = std::max(margin * l.attention_expected, floor);
  l.mlp = std::max(margin * l.mlp_expected, floor);
  return l;
}

nlohmann::json SublayerErrors::to_json() const {
  auto arr = [](const std::vector<double>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (double x : v) a.push_back(gates::json_number(x));
    return a;
  };
  nlohmann::json j = {{"attention", arr(attn)}, {"mlp", arr(mlp)}};
  if (!attn_far.empty() && !std::isnan(attn_far.front())) {
    j["attention_far"] = arr(attn_far);
    j["mlp_far"] = arr(mlp_far);
    j["far_from_position"] = kFarPositions;
  }
  return j;
}

}  // namespace tessera
