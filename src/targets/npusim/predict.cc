#include "targets/npusim/predict.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "targets/npusim/mappings.h"
#include "targets/npusim/ops.h"
#include "util/error.h"

namespace tessera::npusim {

namespace {

// What one step reads and writes (host-visible tensors) and which weights it needs.
struct StepIo {
  std::vector<std::string> in, out, weights;
};

StepIo step_io(Stage s) {
  switch (s) {
    case Stage::Embedding: return {{"ids"}, {"h"}, {}};
    case Stage::AttnNorm: return {{"h"}, {"x"}, {}};
    case Stage::QkvProj: return {{"x"}, {"q", "k", "v"}, {"wq", "wk", "wv"}};
    case Stage::Rope: return {{"q", "k"}, {"q", "k"}, {}};
    case Stage::KvWrite: return {{"k", "v"}, {"kv"}, {}};
    case Stage::Attention: return {{"q", "kv"}, {"attn"}, {}};
    case Stage::OProj: return {{"attn"}, {"o"}, {"wo"}};
    case Stage::AttnResidual: return {{"h", "o"}, {"h"}, {}};
    case Stage::MlpNorm: return {{"h"}, {"x"}, {}};
    case Stage::GateUpProj: return {{"x"}, {"gate", "up"}, {"wg", "wu"}};
    case Stage::SiluMul: return {{"gate", "up"}, {"act"}, {}};
    case Stage::DownProj: return {{"act"}, {"down"}, {"wd"}};
    case Stage::MlpResidual: return {{"h", "down"}, {"h"}, {}};
    case Stage::FinalNorm: return {{"h"}, {"xf"}, {}};
    case Stage::LmHead: return {{"xf"}, {"logits"}, {"wlm"}};
    default: fail("npusim predict: no stage {}", int(s));
  }
}

struct Shapes {
  const ModelSpec& s;
  int64_t T, context;
  const NpuPlan& plan;  // its tuned tiles
  int64_t keys() const { return context + T; }
  // Host-visible tensors: element type and count.
  std::pair<ElemType, int64_t> tensor(const std::string& n) const {
    const int64_t H = s.hidden, Q = s.q_dim(), KV = s.kv_dim(), I = s.intermediate;
    if (n == "ids") return {ElemType::F32, T};
    if (n == "h") return {ElemType::F32, T * H};
    if (n == "x") return {ElemType::BF16, T * H};
    if (n == "q") return {ElemType::F32, T * Q};
    if (n == "k" || n == "v") return {ElemType::F32, T * KV};
    if (n == "kv") return {ElemType::BF16, keys() * 2 * KV};
    if (n == "attn") return {ElemType::BF16, T * Q};
    if (n == "o" || n == "down") return {ElemType::F32, T * H};
    if (n == "gate" || n == "up") return {ElemType::F32, T * I};
    if (n == "act") return {ElemType::BF16, T * I};
    if (n == "xf") return {ElemType::BF16, H};
    if (n == "logits") return {ElemType::F32, s.vocab};
    if (n == "wq") return {ElemType::BF16, Q * H};
    if (n == "wk" || n == "wv") return {ElemType::BF16, KV * H};
    if (n == "wo") return {ElemType::BF16, H * Q};
    if (n == "wg" || n == "wu" || n == "wd") return {ElemType::BF16, I * H};
    if (n == "wlm") return {ElemType::BF16, s.vocab * H};
    fail("npusim predict: no tensor '{}'", n);
  }
};

void add_linear(std::vector<Launch>& out, const Shapes& sh, const Device& d, int64_t rows, int64_t N, int64_t K,
                bool bias, const std::string& name) {
  if (rows == 1) {
    const GemvShape g{N, K, bias};
    GemvOptions o;
    o.name = name;
    out.push_back(gemv_launch(g, sh.plan.gemv_tiles_for(g, d), d, o));
    return;
  }
  const GemmPlan p = default_gemm_plan(rows, K, N, d, ElemType::F32);
  GemmOptions o;
  o.name = name;
  o.b_nk = true;
  o.c_type = ElemType::F32;
  out.push_back(gemm_launch(p.shape, p.tiles, p.herd, d, o));
  if (bias) {
    const RowShape r{rows, N};
    RowOptions ro;
    ro.name = name + ".bias";
    out.push_back(row_launch(RowOp::BiasAdd, r, default_row_tiles(RowOp::BiasAdd, r, d), d, ro));
  }
}

void add_rows(std::vector<Launch>& out, const Device& d, RowOp op, int64_t rows, int64_t n, const std::string& name) {
  const RowShape r{rows, n};
  RowOptions o;
  o.name = name;
  out.push_back(row_launch(op, r, default_row_tiles(op, r, d), d, o));
}

// The launches of one NPU step at the pass's shapes.
std::vector<Launch> step_launches(Stage st, const Shapes& sh, const Device& d) {
  const ModelSpec& s = sh.s;
  const int64_t T = sh.T, H = s.hidden, hd = s.head_dim;
  std::vector<Launch> out;
  switch (st) {
    case Stage::Embedding: {
      const EmbedTiles t = default_embed_tiles(H, T, d);
      const int64_t per = std::max<int64_t>(1, embedding_max_tokens(H, t, d));
      for (int64_t t0 = 0; t0 < T; t0 += per) {
        std::vector<int32_t> ids;
        for (int64_t i = t0; i < std::min(T, t0 + per); ++i) ids.push_back(int32_t(i % s.vocab));
        out.push_back(embedding_launch(ids, s.vocab, H, default_embed_tiles(H, int64_t(ids.size()), d), d));
      }
      break;
    }
    case Stage::AttnNorm:
    case Stage::MlpNorm: add_rows(out, d, RowOp::RmsNorm, T, H, stage_name(st)); break;
    case Stage::FinalNorm: add_rows(out, d, RowOp::RmsNorm, 1, H, "final_norm"); break;
    case Stage::QkvProj:
      add_linear(out, sh, d, T, s.q_dim(), H, s.qkv_bias, "q_proj");
      add_linear(out, sh, d, T, s.kv_dim(), H, s.qkv_bias, "k_proj");
      add_linear(out, sh, d, T, s.kv_dim(), H, s.qkv_bias, "v_proj");
      break;
    case Stage::Rope: {
      if (s.qk_norm) {
        add_rows(out, d, RowOp::RmsNorm, T * s.n_heads, hd, "q_norm");
        add_rows(out, d, RowOp::RmsNorm, T * s.n_kv_heads, hd, "k_norm");
      }
      for (const auto& [heads, name] : {std::pair{s.n_heads, "rope.q"}, std::pair{s.n_kv_heads, "rope.k"}}) {
        const RopeShape r{T, heads, hd};
        RopeOptions o;
        o.name = name;
        out.push_back(rope_launch(r, default_rope_tiles(r, d), d, o));
      }
      break;
    }
    case Stage::KvWrite: break;  // the k and v drains write the cache rows: no launch of its own
    case Stage::Attention: {
      const AttnShape a{T, sh.context, s.n_heads, s.n_kv_heads, hd};
      out.push_back(attention_launch(a, default_attn_tiles(a, d), d));
      break;
    }
    case Stage::OProj: add_linear(out, sh, d, T, H, s.q_dim(), false, "o_proj"); break;
    case Stage::GateUpProj:
      add_linear(out, sh, d, T, s.intermediate, H, false, "gate_proj");
      add_linear(out, sh, d, T, s.intermediate, H, false, "up_proj");
      break;
    case Stage::SiluMul: {
      const int64_t n = T * s.intermediate;
      out.push_back(elt_launch(EltOp::SiluMul, n, default_elt_tiles(EltOp::SiluMul, n, d), d));
      break;
    }
    case Stage::AttnResidual:
    case Stage::MlpResidual: {
      const int64_t n = T * H;
      out.push_back(elt_launch(EltOp::Add, n, default_elt_tiles(EltOp::Add, n, d), d));
      break;
    }
    case Stage::DownProj: add_linear(out, sh, d, T, H, s.intermediate, false, "down_proj"); break;
    case Stage::LmHead: add_linear(out, sh, d, 1, s.vocab, H, false, "lm_head"); break;
    default: break;
  }
  return out;
}

// Host time of a step the plan leaves on the host: max(flops / host rate, bytes / host bandwidth).
double host_step_us(Stage st, const Shapes& sh, const Device& d) {
  const ModelSpec& s = sh.s;
  const int64_t T = sh.T, H = s.hidden, KV = s.kv_dim();
  double flops = 0, bytes = 0;
  switch (st) {
    case Stage::Attention:
      flops = 4.0 * double(s.n_heads) * double(T) * double(sh.keys()) * double(s.head_dim);
      bytes = double(sh.keys()) * double(2 * KV) * 2 + double(T) * double(s.q_dim()) * 8;
      break;
    case Stage::LmHead:
      flops = 2.0 * double(s.vocab) * double(H);
      bytes = double(s.vocab) * double(H) * 2;
      break;
    case Stage::KvWrite: bytes = double(T) * double(2 * KV) * 6; break;
    case Stage::Embedding: bytes = double(T) * double(H) * 6; break;
    default: {
      const StepIo io = step_io(st);
      for (const auto* list : {&io.in, &io.out})
        for (const std::string& n : *list) bytes += double(sh.tensor(n).second) * 4;
      flops = bytes;  // a few operations per element
    }
  }
  return 1e6 * std::max(flops / d.host_flops_per_s, bytes / d.host_read_bytes_per_s);
}

void account(PassPrediction& p, const PredictedDispatch& e) {
  const double n = double(e.count);
  if (!e.host) {
    p.npu_dispatches += e.count;
    p.launches += e.count * int64_t(e.timing.launches.size());
    p.host_copy_bytes += e.count * e.timing.host_copy_bytes;
    p.breakdown_us["dispatch overhead"] += n * e.timing.overhead_us;
    p.breakdown_us["host copies"] += n * e.timing.host_copy_us;
    for (const LaunchTiming& l : e.timing.launches) {
      p.breakdown_us["fill/drain"] += n * (l.fill_us + l.drain_us);
      p.breakdown_us[l.bound_by] += n * (l.total_us - l.fill_us - l.drain_us);
    }
  }
  p.breakdown_us["host ops"] += n * e.host_us;
  p.ddr_bytes += e.count * e.ddr_bytes;
  p.total_us += n * e.total_us();
  p.dispatches.push_back(e);
}

// Prices one list of plan dispatches (a layer's, or the embedding's, or the head's).
void price(PassPrediction& p, const NpuPlan& plan, const std::vector<PlanDispatch>& list, const std::string& prefix,
           int64_t count, const Shapes& sh, const Device& d, const std::vector<PlanDispatch>& later) {
  for (size_t i = 0; i < list.size(); ++i) {
    const PlanDispatch& pd = list[i];
    // Tensors a later dispatch (of this list, or of `later`) reads: this one must hand them over.
    std::set<std::string> read_later = {"h"};
    for (size_t j = i + 1; j < list.size(); ++j)
      for (const PlanStep& st : list[j].steps)
        for (const std::string& n : step_io(st.stage).in) read_later.insert(n);
    for (const PlanDispatch& ld : later)
      for (const PlanStep& st : ld.steps)
        for (const std::string& n : step_io(st.stage).in) read_later.insert(n);

    PredictedDispatch e;
    e.name = prefix + pd.name;
    e.count = count;
    e.host = pd.host();
    Dispatch disp;
    disp.name = e.name;
    std::set<std::string> produced;
    std::map<std::string, HostBuffer> buffers;
    auto touch = [&](const std::string& n, bool read) {
      auto [type, elems] = sh.tensor(n);
      HostBuffer& b = buffers[n];
      b.name = n;
      b.type = type;
      b.elems = elems;
      if (n == "kv") {
        b.sync = Sync::ZeroCopy;  // the cache lives in memory both sides map
      } else if (read && !produced.count(n)) {
        b.to_device = true;
        b.sync = plan.zero_copy ? Sync::ZeroCopy : Sync::EveryCall;
      } else if (!read) {
        b.from_device = true;
      }
    };
    for (const PlanStep& st : pd.steps) {
      if (st.placement == Placement::Host) {
        e.host_us += host_step_us(st.stage, sh, d);
        continue;
      }
      const StepIo io = step_io(st.stage);
      for (const std::string& n : io.in) touch(n, true);
      for (const std::string& w : io.weights) {
        auto [type, elems] = sh.tensor(w);
        buffers[w] = HostBuffer{w, type, elems, plan.weights_resident ? Sync::Once : Sync::EveryCall, true, false};
      }
      std::vector<Launch> launches;
      if (st.placement == Placement::NpuWithHostSoftmax) {
        // Scores and context GEMMs per query head on the NPU; the softmax on the host, with
        // the score matrix synced out and the probabilities back in.
        const int64_t cp = NpuOps::kv_rows_for(sh.keys()), hd = sh.s.head_dim;
        for (int64_t h = 0; h < sh.s.n_heads; ++h) {
          const GemmPlan sc = default_gemm_plan(sh.T, hd, cp, d, ElemType::F32);
          const GemmPlan cx = default_gemm_plan(sh.T, cp, hd, d, ElemType::F32);
          GemmOptions o;
          o.b_nk = true;
          o.c_type = ElemType::F32;
          o.name = fmt::format("scores.{}", h);
          launches.push_back(gemm_launch(sc.shape, sc.tiles, sc.herd, d, o));
          o.name = fmt::format("context.{}", h);
          launches.push_back(gemm_launch(cx.shape, cx.tiles, cx.herd, d, o));
        }
        const int64_t score_elems = sh.s.n_heads * sh.T * cp;
        buffers["scores"] = HostBuffer{"scores", ElemType::F32, score_elems, Sync::EveryCall, false, true};
        buffers["probs"] = HostBuffer{"probs", ElemType::BF16, score_elems, Sync::EveryCall, true, false};
        const double softmax_flops = 5.0 * double(score_elems), softmax_bytes = 6.0 * double(score_elems);
        e.host_us += 1e6 * std::max(softmax_flops / d.host_flops_per_s, softmax_bytes / d.host_read_bytes_per_s);
      } else {
        launches = step_launches(st.stage, sh, d);
      }
      for (Launch& l : launches) disp.launches.push_back(std::move(l));
      for (const std::string& n : io.out) {
        touch(n, false);
        produced.insert(n);
      }
    }
    // Outputs nobody outside reads stay on the device when the plan keeps intermediates there.
    for (auto& [n, b] : buffers) {
      if (!b.from_device || n == "kv") continue;
      const bool handed_over = read_later.count(n) > 0 || n == "logits";
      b.sync = (!handed_over && plan.intermediates_on_device) ? Sync::DeviceOnly
               : plan.zero_copy                              ? Sync::ZeroCopy
                                                             : Sync::EveryCall;
    }
    for (auto& [n, b] : buffers) disp.buffers.push_back(b);
    if (!e.host) {
      e.timing = time_dispatch(disp, d, TimingOptions{});
      for (const Launch& l : disp.launches) e.tiles = std::max(e.tiles, int(l.workers.size()));
      for (const LaunchTiming& lt : e.timing.launches) e.ddr_bytes += lt.ddr_bytes;
    }
    account(p, e);
  }
}

PassPrediction predict(const NpuPlan& plan, const ModelSpec& spec, const Device& device, int64_t T, int64_t context,
                       bool decode) {
  PassPrediction p;
  p.pass = decode ? "decode" : "prefill";
  p.tokens = T;
  p.context = context;
  const Shapes sh{spec, T, context, plan};
  const NpuPlan::Pass& pass = plan.pass(decode);
  price(p, plan, pass.embedding, "embedding.", 1, sh, device, pass.layer);
  price(p, plan, pass.layer, "layer.", spec.n_layers, sh, device, pass.head);
  price(p, plan, pass.head, "head.", 1, sh, device, {});
  return p;
}

}  // namespace

PassPrediction predict_prefill(const NpuPlan& plan, const ModelSpec& spec, const Device& device, int64_t tokens) {
  if (tokens < 1) fail("npusim predict: prefill needs at least one token");
  return predict(plan, spec, device, tokens, 0, false);
}

PassPrediction predict_decode(const NpuPlan& plan, const ModelSpec& spec, const Device& device, int64_t context) {
  if (context < 0) fail("npusim predict: negative context");
  return predict(plan, spec, device, 1, context, true);
}

nlohmann::json PassPrediction::to_json() const {
  nlohmann::json ds = nlohmann::json::array();
  for (const PredictedDispatch& e : dispatches) {
    nlohmann::json j = {{"name", e.name}, {"on", e.host ? "host" : "npu"}, {"count", e.count},
                        {"us_per_call", e.total_us()}, {"us_total", e.total_us() * double(e.count)},
                        {"host_us", e.host_us}, {"tiles", e.tiles}, {"ddr_bytes", e.ddr_bytes}};
    if (!e.host) j["timing"] = e.timing.to_json();
    ds.push_back(j);
  }
  return {{"pass", pass}, {"tokens", tokens}, {"context", context}, {"total_us", total_us},
          {"npu_dispatches", npu_dispatches}, {"launches", launches}, {"ddr_bytes", ddr_bytes},
          {"host_copy_bytes", host_copy_bytes}, {"breakdown_us", breakdown_us}, {"dispatches", ds}};
}

std::string PassPrediction::describe() const {
  std::string out = fmt::format("{} ({} tokens after {} cached): {:.3f} ms predicted; {} NPU dispatches, {} launches, "
                                "{:.1f} MB through DDR, {:.1f} MB host copies\n",
                                pass, tokens, context, total_us / 1e3, npu_dispatches, launches, ddr_bytes / 1e6,
                                host_copy_bytes / 1e6);
  out += fmt::format("  {:<34} {:>5} {:>6} {:>11} {:>11} {:>9}  {}\n", "dispatch", "on", "x", "us/call", "ms total",
                     "tiles", "bound by / launches");
  for (const PredictedDispatch& e : dispatches) {
    std::string detail;
    if (e.host) {
      detail = "host ops";
    } else {
      detail = e.timing.bound_by + ":";
      for (const LaunchTiming& l : e.timing.launches)
        if (detail.size() < 90) detail += fmt::format(" {} {:.1f}us ({})", l.name, l.total_us, l.bound_by);
      if (e.host_us > 0) detail += fmt::format(" + host {:.1f}us", e.host_us);
    }
    out += fmt::format("  {:<34} {:>5} {:>6} {:>11.1f} {:>11.3f} {:>9}  {}\n", e.name, e.host ? "host" : "npu", e.count,
                       e.total_us(), e.total_us() * double(e.count) / 1e3, e.host ? std::string("-") : std::to_string(e.tiles),
                       detail);
  }
  out += "  where the time goes:";
  for (const auto& [k, v] : breakdown_us)
    if (v > 0) out += fmt::format(" {} {:.1f}%;", k, 100 * v / std::max(total_us, 1e-9));
  return out + "\n";
}

}  // namespace tessera::npusim
