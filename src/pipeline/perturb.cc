#include "pipeline/perturb.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <tuple>

#include "util/error.h"

namespace tessera {

const std::vector<std::string>& perturbation_kinds() {
  static const std::vector<std::string> kinds = {"gain", "offset", "noise", "element", "tail", "permute", "stale", "shift", "int8"};
  return kinds;
}

Perturbation parse_perturbation(const std::string& spec) {
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t colon = spec.find(':', at);
    parts.push_back(spec.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  if (parts.size() < 3) fail("--perturb '{}': expected STAGE:KIND:SIZE[:SCOPE...]", spec);
  Perturbation p;
  p.spec = spec;
  p.stage = stage_from_name(parts[0]);
  p.kind = parts[1];
  const auto& kinds = perturbation_kinds();
  if (std::find(kinds.begin(), kinds.end(), p.kind) == kinds.end())
    fail("--perturb '{}': unknown kind '{}' (one of {})", spec, p.kind, fmt::join(kinds, ", "));
  char* end = nullptr;
  p.size = std::strtod(parts[2].c_str(), &end);
  if (parts[2].empty() || *end != '\0' || !std::isfinite(p.size) || p.size < 0)
    fail("--perturb '{}': SIZE must be a non-negative number, got '{}'", spec, parts[2]);
  if ((p.kind == "tail" || p.kind == "permute" || p.kind == "stale" || p.kind == "shift") && p.size > 1)
    fail("--perturb '{}': a {} size is a fraction in [0, 1]", spec, p.kind);
  if (p.kind == "int8" && (p.size < 1 || p.size != std::floor(p.size)))
    fail("--perturb '{}': an int8 size is the block's length in values (a whole number >= 1)", spec);
  for (size_t i = 3; i < parts.size(); ++i) {
    const std::string& s = parts[i];
    if (s == "decode") p.decode_only = true;
    else if (s == "prefill") p.prefill_only = true;
    else if (s == "fused") p.fused_only = true;
    else if (s.starts_with("layer=")) p.layer = std::strtoll(s.c_str() + 6, nullptr, 10);
    else if (s.starts_with("out=")) p.output = s.substr(4);
    else fail("--perturb '{}': unknown scope '{}' (decode, prefill, fused, layer=N, out=NAME)", spec, s);
  }
  return p;
}

namespace {

// A fixed N(0, 1) per index (a counter hashed, then Box-Muller): the same on every call.
double normal_at(uint64_t i) {
  auto mix = [](uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
  };
  const double u1 = (double(mix(2 * i + 1) >> 11) + 0.5) / 9007199254740992.0;
  const double u2 = double(mix(2 * i + 2) >> 11) / 9007199254740992.0;
  return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

double rms(const float* x, int64_t n) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  return n ? std::sqrt(ss / double(n)) : 0;
}

class PerturbationTap final : public OutputTap {
 public:
  explicit PerturbationTap(std::vector<Perturbation> ps) : ps_(std::move(ps)) {}

  void on_output(const StageOutput& o) override {
    for (const Perturbation& p : ps_)
      if (matches(p, o)) apply(p, o);
  }

 private:
  static bool matches(const Perturbation& p, const StageOutput& o) {
    if (p.stage != o.stage) return false;
    if (p.decode_only && o.tokens != 1) return false;
    if (p.prefill_only && o.tokens == 1) return false;
    if (p.fused_only && !o.fused) return false;
    if (p.layer && *p.layer != o.layer) return false;
    if (!p.output.empty() && p.output != o.name) return false;
    return true;
  }

  void apply(const Perturbation& p, const StageOutput& o) {
    float* x = o.data;
    const int64_t n = o.rows * o.cols, C = o.cols;
    const double s = p.size;
    if (p.kind == "gain") {
      for (int64_t i = 0; i < n; ++i) x[i] = float(x[i] * (1 + s));
    } else if (p.kind == "offset") {
      const float d = float(s * rms(x, n));
      for (int64_t i = 0; i < n; ++i) x[i] += d;
    } else if (p.kind == "noise") {
      const double r = rms(x, n);
      for (int64_t i = 0; i < n; ++i) x[i] = float(x[i] + s * r * normal_at(uint64_t(i)));
    } else if (p.kind == "element") {
      const float d = float(s * rms(x, n));  // the output's RMS: the same size in every row
      for (int64_t row = 0; row < o.rows; ++row) x[row * C + (row * 7 + 3) % C] += d;
    } else if (p.kind == "tail") {
      const int64_t from = C - int64_t(std::ceil(s * double(C)));
      for (int64_t row = 0; row < o.rows; ++row) std::fill(x + row * C + std::max<int64_t>(from, 0), x + (row + 1) * C, 0.0f);
    } else if (p.kind == "permute") {
      const int64_t upto = std::max<int64_t>(2, int64_t(s * double(C)) / 2 * 2);  // at least one pair
      for (int64_t row = 0; row < o.rows; ++row)
        for (int64_t c = 0; c + 1 < upto; c += 2) std::swap(x[row * C + c], x[row * C + c + 1]);
    } else if (p.kind == "stale") {
      auto& prev = previous_[{o.stage, o.layer, std::string(o.name), n}];
      std::vector<float> now(x, x + n);
      if (!prev.empty())
        for (int64_t i = 0; i < n; ++i) x[i] = float((1 - s) * x[i] + s * prev[size_t(i)]);
      prev = std::move(now);
    } else if (p.kind == "int8") {
      const int64_t bs = int64_t(s);
      for (int64_t row = 0; row < o.rows; ++row)
        for (int64_t c0 = 0; c0 < C; c0 += bs) {
          float* v = x + row * C + c0;
          const int64_t e = std::min(bs, C - c0);
          float amax = 0;
          for (int64_t i = 0; i < e; ++i) amax = std::max(amax, std::fabs(v[i]));
          const float d = amax / 127, id = d > 0 ? 1 / d : 0;
          for (int64_t i = 0; i < e; ++i) v[i] = std::round(v[i] * id) * d;
        }
    } else if (p.kind == "shift") {
      for (int64_t row = o.rows - 1; row >= 1; --row)
        for (int64_t c = 0; c < C; ++c) x[row * C + c] = float((1 - s) * x[row * C + c] + s * x[(row - 1) * C + c]);
    }
  }

  std::vector<Perturbation> ps_;
  std::map<std::tuple<Stage, int64_t, std::string, int64_t>, std::vector<float>> previous_;
};

}  // namespace

std::shared_ptr<OutputTap> perturbation_tap(const std::vector<std::string>& specs) {
  if (specs.empty()) return nullptr;
  std::vector<Perturbation> ps;
  for (const std::string& s : specs) ps.push_back(parse_perturbation(s));
  return std::make_shared<PerturbationTap>(std::move(ps));
}

}  // namespace tessera
