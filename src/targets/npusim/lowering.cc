// The one lowering (program.h): a plan's pass -> dispatches, launches with their arguments,
// buffers with their syncs, waits and host work.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "targets/npusim/checker.h"
#include "targets/npusim/program.h"
#include "util/error.h"

namespace tessera::npusim {

bool PassShape::operator<(const PassShape& o) const {
  return std::tie(decode, tokens, context, head_rows) < std::tie(o.decode, o.tokens, o.context, o.head_rows);
}

std::set<std::string> LaunchCall::reads() const {
  std::set<std::string> out;
  for (const ObjectFifo& f : launch.fifos)
    if (f.dir == FifoDir::Fill) out.insert(args.at(f.tensor));
  return out;
}

std::set<std::string> LaunchCall::writes() const {
  std::set<std::string> out;
  for (const ObjectFifo& f : launch.fifos)
    if (f.dir == FifoDir::Drain) out.insert(args.at(f.tensor));
  return out;
}

double HostWork::us(const Device& d) const {
  return 1e6 * std::max(flops / d.host_flops_per_s, bytes / d.host_read_bytes_per_s);
}

const ProgramBuffer* ProgramDispatch::buffer(const std::string& name) const {
  for (const ProgramBuffer& b : buffers)
    if (b.buffer.name == name) return &b;
  return nullptr;
}

Dispatch ProgramDispatch::dispatch() const {
  Dispatch d;
  d.name = name;
  for (const ProgramBuffer& b : buffers) d.buffers.push_back(b.buffer);
  for (const ProgramStep& s : steps)
    for (const LaunchCall& c : s.launches) d.launches.push_back(c.launch);
  return d;
}

double ProgramDispatch::host_us(const Device& d) const {
  double us = 0;
  for (const ProgramStep& s : steps)
    for (const HostWork& w : s.host) us += w.us(d);
  return us;
}

int ProgramDispatch::launches() const {
  int n = 0;
  for (const ProgramStep& s : steps) n += int(s.launches.size());
  return n;
}

Program::Where Program::find(Stage stage) const {
  for (size_t d = 0; d < dispatches.size(); ++d)
    for (size_t s = 0; s < dispatches[d].steps.size(); ++s)
      if (dispatches[d].steps[s].stage == stage) return {d, s};
  fail("npusim program of plan '{}' has no step for stage '{}'", plan, stage_name(stage));
}

nlohmann::json Program::to_json() const {
  nlohmann::json ds = nlohmann::json::array();
  for (const ProgramDispatch& d : dispatches) {
    nlohmann::json steps = nlohmann::json::array(), bufs = nlohmann::json::array();
    for (const ProgramStep& s : d.steps) {
      nlohmann::json ls = nlohmann::json::array(), hw = nlohmann::json::array();
      for (const LaunchCall& c : s.launches)
        ls.push_back({{"launch", c.launch.name}, {"kernel", c.launch.kernel}, {"tiles", c.launch.workers.size()},
                      {"args", c.args}, {"waits", c.waits}});
      for (const HostWork& w : s.host) hw.push_back({{"what", w.what}, {"flops", w.flops}, {"bytes", w.bytes}});
      steps.push_back({{"stage", stage_name(s.stage)}, {"on", placement_name(s.placement)}, {"launches", ls}, {"host", hw}});
    }
    for (const ProgramBuffer& b : d.buffers) {
      bufs.push_back({{"name", b.buffer.name}, {"type", elem_type_name(b.buffer.type)}, {"elems", b.buffer.elems},
                      {"device_elems", b.device_elems}, {"sync", sync_name(b.buffer.sync)},
                      {"to_device", b.buffer.to_device}, {"from_device", b.buffer.from_device}, {"external", b.external}});
      if (b.in_l2) bufs.back().update({{"l2_offset", b.l2_offset}, {"live", {b.live.first, b.live.second}}});
    }
    ds.push_back({{"name", d.name}, {"section", d.section}, {"count", d.count}, {"host", d.host}, {"steps", steps},
                  {"buffers", bufs}, {"l2_arena_bytes", d.l2_arena_bytes}});
  }
  return {{"plan", plan},
          {"pass", shape.decode ? "decode" : "prefill"},
          {"tokens", shape.tokens},
          {"context", shape.context},
          {"head_rows", shape.head_rows},
          {"dispatches", ds}};
}

ElemType WeightFormats::of(const std::string& buffer) const {
  auto it = by_buffer.find(buffer);
  return it == by_buffer.end() ? ElemType::BF16 : it->second;
}

nlohmann::json WeightFormats::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [n, t] : by_buffer)
    if (t != ElemType::BF16) j[n] = elem_type_name(t);
  return j;
}

WeightFormats WeightFormats::from_json(const nlohmann::json& j) {
  WeightFormats f;
  if (j.is_null()) return f;
  for (const auto& [n, t] : j.items()) {
    const ElemType e = elem_type_from_name(t.get<std::string>());
    if (e == ElemType::F32) fail("npusim: weight buffer {} cannot be f32 (weights are bf16 or blocks)", n);
    f.by_buffer[n] = e;
  }
  return f;
}

MappingFaults LoweringFaults::for_op(const std::string& op) const {
  if (auto it = mapping.find(op); it != mapping.end()) return it->second;
  if (auto it = mapping.find("*"); it != mapping.end()) return it->second;
  return {};
}

namespace {

// The host-visible tensors of a pass and what a step reads and writes of them.
struct Tensors {
  const ModelSpec& s;
  PassShape shape;
  int64_t keys() const { return shape.context + shape.tokens; }
  // Element type and count of an activation buffer (weights, tables and the cache are
  // external: bound by the caller).
  std::pair<ElemType, int64_t> activation(const std::string& n) const {
    const int64_t T = shape.tokens, R = shape.head_rows, H = s.hidden, Q = s.q_dim(), KV = s.kv_dim(),
                  I = s.intermediate;
    if (n == "h") return {ElemType::F32, T * H};
    if (n == "hf") return {ElemType::F32, R * H};  // the head's input: the last rows of h
    if (n == "x") return {ElemType::BF16, T * H};
    if (n == "q") return {ElemType::F32, T * Q};
    if (n == "k" || n == "v") return {ElemType::F32, T * KV};
    if (n == "attn") return {ElemType::BF16, T * Q};
    if (n == "o" || n == "down") return {ElemType::F32, T * H};
    if (n == "gate" || n == "up") return {ElemType::F32, T * I};
    if (n == "act") return {ElemType::BF16, T * I};
    if (n == "xf") return {ElemType::BF16, R * H};
    if (n == "logits") return {ElemType::F32, R * s.vocab};
    fail("npusim lowering: no activation '{}'", n);
  }
};

// What a step reads and writes of the activations (for syncs and hand-overs).
struct StepIo {
  std::vector<std::string> in, out;
};

StepIo step_io(Stage s) {
  switch (s) {
    case Stage::Embedding: return {{}, {"h"}};
    case Stage::AttnNorm:
    case Stage::MlpNorm: return {{"h"}, {"x"}};
    case Stage::QkvProj: return {{"x"}, {"q", "k", "v"}};
    case Stage::Rope: return {{"q", "k"}, {"q", "k"}};
    case Stage::KvWrite: return {{"k", "v"}, {}};
    case Stage::Attention: return {{"q"}, {"attn"}};
    case Stage::OProj: return {{"attn"}, {"o"}};
    case Stage::AttnResidual: return {{"h", "o"}, {"h"}};
    case Stage::GateUpProj: return {{"x"}, {"gate", "up"}};
    case Stage::SiluMul: return {{"gate", "up"}, {"act"}};
    case Stage::DownProj: return {{"act"}, {"down"}};
    case Stage::MlpResidual: return {{"h", "down"}, {"h"}};
    case Stage::FinalNorm: return {{"hf"}, {"xf"}};
    case Stage::LmHead: return {{"xf"}, {"logits"}};
    default: fail("npusim lowering: no stage {}", int(s));
  }
}

class Lowerer {
 public:
  Lowerer(const NpuPlan& plan, const ModelSpec& s, const Device& d, const PassShape& shape, const LoweringFaults& f,
          const WeightFormats& w)
      : plan_(plan), s_(s), d_(d), t_{s, shape}, faults_(f), formats_(w) {}

  // The launches and host work of one step.
  ProgramStep step(const PlanStep& ps) {
    ProgramStep st;
    st.stage = ps.stage;
    st.placement = ps.placement;
    if (ps.placement == Placement::Host) {
      st.host.push_back(host_work(ps.stage));
      return st;
    }
    out_ = &st.launches;
    const int64_t T = t_.shape.tokens, H = s_.hidden, hd = s_.head_dim;
    const std::string name = stage_name(ps.stage);
    switch (ps.stage) {
      case Stage::Embedding: embedding(); break;
      case Stage::AttnNorm: rows(RowOp::RmsNorm, T, H, name, "h", "g.attn_norm", "x"); break;
      case Stage::MlpNorm: rows(RowOp::RmsNorm, T, H, name, "h", "g.mlp_norm", "x"); break;
      case Stage::FinalNorm: rows(RowOp::RmsNorm, t_.shape.head_rows, H, name, "hf", "g.final_norm", "xf"); break;
      case Stage::QkvProj:
        linear(T, s_.q_dim(), H, s_.qkv_bias, "q", "x");
        linear(T, s_.kv_dim(), H, s_.qkv_bias, "k", "x");
        linear(T, s_.kv_dim(), H, s_.qkv_bias, "v", "x");
        break;
      case Stage::Rope:
        if (s_.qk_norm) {
          rows(RowOp::RmsNorm, T * s_.n_heads, hd, "q_norm", "q", "g.q_norm", "q");
          rows(RowOp::RmsNorm, T * s_.n_kv_heads, hd, "k_norm", "k", "g.k_norm", "k");
        }
        rope(s_.n_heads, "q");
        rope(s_.n_kv_heads, "k");
        break;
      case Stage::KvWrite: break;  // the cache rows are written from k and v as they leave: no launch of its own
      case Stage::Attention:
        if (ps.placement == Placement::NpuWithHostSoftmax) split_attention(st);
        else attention();
        break;
      case Stage::OProj: linear(T, H, s_.q_dim(), s_.o_bias, "o", "attn"); break;
      case Stage::AttnResidual: add("attn_residual", "o"); break;
      case Stage::GateUpProj:
        linear(T, s_.intermediate, H, s_.mlp_bias, "gate", "x");
        linear(T, s_.intermediate, H, s_.mlp_bias, "up", "x");
        break;
      case Stage::SiluMul: {
        const int64_t n = T * s_.intermediate;
        EltOptions o;
        o.name = "silu_mul";
        o.faults = faults_.for_op("silu_mul");
        push(elt_launch(EltOp::SiluMul, n, default_elt_tiles(EltOp::SiluMul, n, d_), d_, o),
             {{"A", "gate"}, {"B", "up"}, {"Y", "act"}});
        break;
      }
      case Stage::DownProj: linear(T, H, s_.intermediate, s_.mlp_bias, "down", "act"); break;
      case Stage::MlpResidual: add("mlp_residual", "down"); break;
      case Stage::LmHead: linear(t_.shape.head_rows, s_.vocab, H, false, "logits", "xf", "w.lm_head"); break;
      default: fail("npusim lowering: no stage {}", int(ps.stage));
    }
    return st;
  }

  // A dispatch's buffers and waits: activations read before any step of the dispatch
  // writes them come from the host; outputs go back unless nothing later reads them and the
  // plan keeps intermediates on the device; weights are sent once when resident.
  void finish(ProgramDispatch& pd, const std::set<std::string>& read_later) {
    std::map<std::string, ProgramBuffer> bufs;
    std::set<std::string> produced;
    auto activation = [&](const std::string& n) -> ProgramBuffer& {
      ProgramBuffer& b = bufs[n];
      if (b.buffer.name.empty()) {
        auto [type, elems] = t_.activation(n);
        b.buffer = HostBuffer{n, type, elems, Sync::EveryCall, false, false};
        b.device_elems = elems;
      }
      return b;
    };
    for (const ProgramStep& st : pd.steps) {
      if (st.placement == Placement::Host) continue;
      const StepIo io = step_io(st.stage);
      for (const std::string& n : io.in)
        if (!produced.count(n)) activation(n).buffer.to_device = true;
      for (const std::string& n : io.out) {
        activation(n).buffer.from_device = true;
        produced.insert(n);
      }
      for (const LaunchCall& c : st.launches)
        for (const ObjectFifo& f : c.launch.fifos) {
          const std::string& n = c.args.at(f.tensor);
          const int64_t off = c.offsets.count(f.tensor) ? c.offsets.at(f.tensor) : 0;
          int64_t hi = off;
          for (const AccessPattern& p : f.ddr)
            if (p.elements() > 0) hi = std::max(hi, off + p.extent().second + 1);
          if (is_external(n)) {
            ProgramBuffer& b = bufs[n];
            if (b.buffer.name.empty()) b.buffer = external_buffer(n, f.type);
            b.external = true;
            b.buffer.elems = b.device_elems = std::max(b.device_elems, hi);
          } else {
            ProgramBuffer& b = activation(n);
            b.device_elems = std::max(b.device_elems, hi);
          }
        }
    }
    // A step that runs host code inside the dispatch (the host softmax's gather of q) reads
    // its inputs on the host: they are handed over too.
    std::set<std::string> read_by_host = read_later;
    for (const ProgramStep& st : pd.steps)
      if (st.placement == Placement::NpuWithHostSoftmax)
        for (const std::string& n : step_io(st.stage).in) read_by_host.insert(n);
    for (auto& [n, b] : bufs) {
      if (b.external) continue;
      if (b.buffer.from_device) {
        const bool handed_over = read_by_host.count(n) > 0 || n == "h" || n == "logits";
        b.buffer.sync = (!handed_over && plan_.intermediates_on_device) ? Sync::DeviceOnly
                        : plan_.zero_copy                               ? Sync::ZeroCopy
                                                                        : Sync::EveryCall;
      } else {
        b.buffer.sync = plan_.zero_copy ? Sync::ZeroCopy : Sync::EveryCall;
      }
    }
    for (auto& [n, b] : bufs) pd.buffers.push_back(b);
    // Waits: a launch reading what an earlier launch of this dispatch wrote waits for its drain.
    const bool merged_o = has_npu(pd, Stage::OProj) && has_npu(pd, Stage::AttnResidual);
    std::set<std::string> written;
    for (ProgramStep& st : pd.steps)
      for (LaunchCall& c : st.launches) {
        for (const std::string& n : c.reads())
          if (written.count(n) && !(faults_.drop_o_wait && merged_o && st.stage == Stage::AttnResidual && n == "o"))
            c.waits.insert(n);
        for (const std::string& n : c.writes()) written.insert(n);
      }
    place_in_l2(pd);
  }

  // L2: a device-only intermediate (written in the dispatch before any read) is held by the
  // memory tiles, in the bytes no launch of the dispatch stages through them, for its live
  // range: from the first launch writing it to the last launch reading it. Buffers are
  // placed first fit in the order their ranges begin, so one whose range ended gives its
  // bytes to a later one (intermediate reuse); what does not fit stays in DDR. The launches'
  // fifos over an L2 buffer stream it from the memory tile. (Padding rows hold whatever the
  // bytes held: every kernel is row-independent, so they reach padding rows only.)
  void place_in_l2(ProgramDispatch& pd) const {
    std::vector<LaunchCall*> calls;
    for (ProgramStep& st : pd.steps)
      for (LaunchCall& c : st.launches) calls.push_back(&c);
    std::map<std::string, std::pair<int, int>> live;
    for (int i = 0; i < int(calls.size()); ++i) {
      for (const std::string& n : calls[size_t(i)]->writes()) {
        auto [it, fresh] = live.try_emplace(n, i, i);
        if (!fresh) it->second.second = i;
      }
      if (!faults_.live_until_written)
        for (const std::string& n : calls[size_t(i)]->reads())
          if (auto it = live.find(n); it != live.end()) it->second.second = i;
    }
    // The arena: every memory tile's bytes past what any launch of the dispatch stages in it.
    std::map<Tile, int64_t> staged;
    for (const LaunchCall* c : calls)
      for (const TileUsage& u : tile_usage(c->launch, d_))
        if (u.kind == TileKind::Mem) staged[u.tile] = std::max(staged[u.tile], u.memory_bytes);
    int64_t per_tile = d_.l2_bytes;
    for (int col = 0; col < d_.columns; ++col) {
      auto it = staged.find(Tile{col, d_.mem_row});
      per_tile = std::min(per_tile, d_.l2_bytes - (it == staged.end() ? 0 : it->second));
    }
    const int64_t capacity = std::max<int64_t>(0, per_tile) * d_.columns;
    std::vector<ProgramBuffer*> order;
    for (ProgramBuffer& b : pd.buffers)
      if (!b.external && b.buffer.sync == Sync::DeviceOnly && !b.buffer.to_device && live.count(b.buffer.name))
        order.push_back(&b);
    std::stable_sort(order.begin(), order.end(), [&](const ProgramBuffer* a, const ProgramBuffer* b) {
      return live.at(a->buffer.name).first < live.at(b->buffer.name).first;
    });
    auto slot_bytes = [](const ProgramBuffer* b) { return (b->device_elems * elem_bytes(b->buffer.type) + 63) / 64 * 64; };
    std::vector<const ProgramBuffer*> placed;
    for (ProgramBuffer* b : order) {
      const std::pair<int, int> r = live.at(b->buffer.name);
      const int64_t bytes = slot_bytes(b);
      std::vector<std::pair<int64_t, int64_t>> taken;  // bytes of buffers live at the same time
      for (const ProgramBuffer* p : placed)
        if (!(p->live.second < r.first || r.second < p->live.first)) taken.push_back({p->l2_offset, p->l2_offset + slot_bytes(p)});
      std::sort(taken.begin(), taken.end());
      int64_t off = 0;
      for (const auto& [lo, hi] : taken) {
        if (off + bytes <= lo) break;
        off = std::max(off, hi);
      }
      if (off + bytes > capacity) continue;
      b->in_l2 = true;
      b->l2_offset = off;
      b->live = r;
      pd.l2_arena_bytes = std::max(pd.l2_arena_bytes, off + bytes);
      placed.push_back(b);
    }
    for (LaunchCall* c : calls)
      for (ObjectFifo& f : c->launch.fifos)
        if (const ProgramBuffer* b = pd.buffer(c->args.at(f.tensor)); b && b->in_l2) f.l2_side = true;
  }

  HostWork host_work(Stage st) const;
  const LoweringFaults& faults() const { return faults_; }

  bool layer_gemvs_fit_resident() const {
    const int64_t H = s_.hidden, Q = s_.q_dim(), KV = s_.kv_dim(), I = s_.intermediate;
    auto w = [&](const char* n) { return formats_.of(n); };
    return gemvs_fit_resident({{Q, H, false, w("w.q")},
                               {KV, H, false, w("w.k")},
                               {KV, H, false, w("w.v")},
                               {H, Q, false, w("w.o")},
                               {I, H, false, w("w.gate")},
                               {I, H, false, w("w.up")},
                               {H, I, false, w("w.down")}},
                              s_.n_layers, d_);
  }

 private:
  static bool has_npu(const ProgramDispatch& pd, Stage s) {
    for (const ProgramStep& st : pd.steps)
      if (st.stage == s && st.placement != Placement::Host) return true;
    return false;
  }
  static bool is_external(const std::string& n) {
    return n.starts_with("w.") || n.starts_with("g.") || n.starts_with("b.") || n == "kv" || n == "cs" ||
           n.starts_with("split.");
  }
  HostBuffer external_buffer(const std::string& n, ElemType type) const {
    HostBuffer b{n, type, 0, Sync::EveryCall, true, false};
    if (n == "kv") {
      b.sync = Sync::ZeroCopy;  // the cache lives in memory both sides map
      b.from_device = true;
    } else if (n == "cs" || n.starts_with("split.")) {
      b.sync = plan_.zero_copy ? Sync::ZeroCopy : Sync::EveryCall;
      if (n == "split.scores" || n == "split.context") b.to_device = false, b.from_device = true;
    } else if (plan_.weights_resident) {
      b.sync = Sync::Once;  // weights, norm weights, biases
    }
    return b;
  }

  void push(Launch l, std::map<std::string, std::string> args, std::map<std::string, int64_t> offsets = {},
            bool patched = false) {
    LaunchCall c;
    c.launch = std::move(l);
    c.args = std::move(args);
    c.offsets = std::move(offsets);
    c.patched_by_ids = patched;
    out_->push_back(std::move(c));
  }

  void rows(RowOp op, int64_t r, int64_t n, const std::string& name, const std::string& x, const std::string& g,
            const std::string& y) {
    const RowShape rs{r, n};
    RowOptions o;
    o.name = name;
    o.eps = s_.rms_eps;
    o.faults = faults_.for_op(row_op_name(op));
    push(row_launch(op, rs, default_row_tiles(op, rs, d_), d_, o), {{"X", x}, {"G", g}, {"Y", y}});
  }

  // y = x W^T (+ bias) for `m` rows: a GEMV for one row, else a GEMM padded to whole tiles;
  // the bias a row launch over the fp32 output.
  void linear(int64_t m, int64_t N, int64_t K, bool bias, const std::string& y, const std::string& x,
              std::string w = "") {
    if (w.empty()) w = "w." + y;
    const ElemType wt = formats_.of(w);
    if (m == 1) {
      const GemvShape g{N, K, false, wt};
      const MappingFaults f = faults_.for_op("gemv");
      // The LM head is never kept in L1 (it never fits); a layer's projections only if every
      // layer's fit together.
      const bool resident = plan_.weights_resident && w != "w.lm_head" && layer_gemvs_fit_resident();
      GemvOptions o;
      o.name = y;
      o.resident = resident;
      o.faults = f;
      Launch l = gemv_launch(g, resident ? default_gemv_tiles(g, d_, true) : plan_.gemv_tiles_for(g, d_), d_, o);
      if (f.dma_oversubscribed) detail::oversubscribe_dma(l, o.x);
      push(std::move(l), {{"W", w}, {"X", x}, {"Y", y}});
    } else {
      GemmOptions o = gemm_options(y);
      o.b_type = wt;
      push(gemm(m, K, N, o), {{o.a, x}, {o.b, w}, {o.c, y}});
    }
    if (bias) {
      const RowShape rs{m, N};
      RowOptions o;
      o.name = y + ".bias";
      push(row_launch(RowOp::BiasAdd, rs, default_row_tiles(RowOp::BiasAdd, rs, d_), d_, o),
           {{"X", y}, {"G", "b." + y}, {"Y", y}});
    }
  }

  // A GEMM's options: fp32 out of the accumulator; the gemm faults walk B as if it were [K, N].
  GemmOptions gemm_options(std::string name) const {
    GemmOptions o;
    o.name = std::move(name);
    o.c_type = ElemType::F32;
    o.b_nk = !faults_.for_op("gemm").transposed_pattern;
    return o;
  }
  // y[m, N] = A[m, K] B[N, K]^T on the default tiles, M padded to whole tiles; the gemm
  // faults on A's fifo.
  Launch gemm(int64_t m, int64_t K, int64_t N, const GemmOptions& o) const {
    const MappingFaults f = faults_.for_op("gemm");
    const GemmPlan p = default_gemm_plan(m, K, N, d_, ElemType::F32, o.b_type);
    Launch l = gemm_launch(p.shape, p.tiles, p.herd, d_, o);
    for (ObjectFifo& fi : l.fifos)
      if (fi.tensor == o.a) detail::apply_fifo_faults(fi, f, d_);
    if (f.dma_oversubscribed) detail::oversubscribe_dma(l, o.a);
    return l;
  }

  void rope(int64_t heads, const std::string& x) {
    const RopeShape r{t_.shape.tokens, heads, s_.head_dim};
    RopeOptions o;
    o.name = "rope." + x;
    o.faults = faults_.for_op("rope");
    push(rope_launch(r, default_rope_tiles(r, d_), d_, o), {{"X", x}, {"CS", "cs"}, {"Y", x}});
  }

  void add(const std::string& name, const std::string& x) {
    const int64_t n = t_.shape.tokens * s_.hidden;
    EltOptions o;
    o.name = name;
    o.faults = faults_.for_op("add");
    push(elt_launch(EltOp::Add, n, default_elt_tiles(EltOp::Add, n, d_), d_, o), {{"A", "h"}, {"B", x}, {"Y", "h"}});
  }

  void attention() {
    const AttnShape a{t_.shape.tokens, t_.shape.context, s_.n_heads, s_.n_kv_heads, s_.head_dim};
    AttnTiles t = default_attn_tiles(a, d_);
    if (attn_kv_rows(a, t) > kv_rows_for(a.keys())) t.kt = detail::largest_divisor_at_most(a.keys(), t.kt);
    AttnOptions o;
    o.faults = faults_.for_op("attention");
    push(attention_launch(a, t, d_, o), {{"Q", "q"}, {"KV", "kv"}, {"O", "attn"}});
  }

  // Naive prefill attention: per query head, the scores and the context as GEMMs on the
  // array (keys and transposed values of its kv head gathered on the host), the softmax on
  // the host between them.
  void split_attention(ProgramStep& st) {
    const int64_t T = t_.shape.tokens, cp = kv_rows_for(t_.keys()), hd = s_.head_dim;
    const int64_t group = s_.n_heads / s_.n_kv_heads;
    for (int64_t h = 0; h < s_.n_heads; ++h) {
      // Every head's operands side by side in one host buffer each (offsets per head; the
      // keys and values per kv head).
      for (const auto& [what, K, N, a, b, c] :
           {std::tuple{"scores", hd, cp, "split.q", "split.keys", "split.scores"},
            std::tuple{"context", cp, hd, "split.probs", "split.values", "split.context"}}) {
        const int64_t Mp = default_gemm_plan(T, K, N, d_, ElemType::F32).shape.M;
        const GemmOptions o = gemm_options(fmt::format("{}.{}", what, h));
        push(gemm(T, K, N, o), {{o.a, a}, {o.b, b}, {o.c, c}},
             {{o.a, h * Mp * K}, {o.b, (h / group) * K * N}, {o.c, h * Mp * N}});
      }
    }
    const double n = double(s_.n_heads * T * cp);
    st.host.push_back({"softmax of every head's scores", 5.0 * n, 6.0 * n});
  }

  void embedding() {
    const int64_t T = t_.shape.tokens, H = s_.hidden;
    const EmbedTiles t = default_embed_tiles(H, T, d_);
    const int64_t per = std::max<int64_t>(1, embedding_max_tokens(H, t, d_));
    for (int64_t t0 = 0, chunk = 0; t0 < T; t0 += per, ++chunk) {
      std::vector<int32_t> ids;  // placeholders: the call patches the real ids in
      for (int64_t i = t0; i < std::min(T, t0 + per); ++i) ids.push_back(int32_t(i % s_.vocab));
      EmbedOptions o;
      o.name = fmt::format("embedding.{}", chunk);
      o.faults = faults_.for_op("embedding");
      push(embedding_launch(ids, s_.vocab, H, default_embed_tiles(H, int64_t(ids.size()), d_), d_, o),
           {{"E", "w.embed"}, {"O", "h"}}, {{"O", t0 * H}}, true);
    }
  }

  const NpuPlan& plan_;
  const ModelSpec& s_;
  const Device& d_;
  Tensors t_;
  const LoweringFaults& faults_;
  const WeightFormats& formats_;
  std::vector<LaunchCall>* out_ = nullptr;
};

HostWork Lowerer::host_work(Stage st) const {
  const int64_t T = t_.shape.tokens, R = t_.shape.head_rows, H = s_.hidden, KV = s_.kv_dim();
  HostWork w;
  w.what = std::string(stage_name(st)) + " on the host";
  switch (st) {
    case Stage::Attention:
      w.flops = 4.0 * double(s_.n_heads) * double(T) * double(t_.keys()) * double(s_.head_dim);
      w.bytes = double(t_.keys()) * double(2 * KV) * 2 + double(T) * double(s_.q_dim()) * 8;
      break;
    case Stage::LmHead:
      w.flops = 2.0 * double(R) * double(s_.vocab) * double(H);
      w.bytes = double(s_.vocab) * double(H) * 2;
      break;
    case Stage::KvWrite: w.bytes = double(T) * double(2 * KV) * 6; break;
    case Stage::Embedding: w.bytes = double(T) * double(H) * 6; break;
    default: {
      const StepIo io = step_io(st);
      for (const auto* list : {&io.in, &io.out})
        for (const std::string& n : *list) w.bytes += double(t_.activation(n).second) * 4;
      w.flops = w.bytes;  // a few operations per element
    }
  }
  return w;
}

// Lowers one section's plan dispatches; `later` are the dispatches after the section (what
// they read is handed over).
void lower_section(Program& prog, Lowerer& lw, const std::vector<PlanDispatch>& list, const std::string& section,
                   int64_t count, const std::vector<PlanDispatch>& later) {
  for (size_t i = 0; i < list.size(); ++i) {
    std::set<std::string> read_later;
    auto readers = [&](const PlanDispatch& ld) {
      for (const PlanStep& st : ld.steps)
        if (!(lw.faults().ignore_host_readers && st.placement == Placement::Host))
          for (const std::string& n : step_io(st.stage).in) read_later.insert(n);
    };
    for (size_t j = i + 1; j < list.size(); ++j) readers(list[j]);
    for (const PlanDispatch& ld : later) readers(ld);
    ProgramDispatch pd;
    pd.name = section + "." + list[i].name;
    pd.section = section;
    pd.count = count;
    pd.host = list[i].host();
    for (const PlanStep& ps : list[i].steps) pd.steps.push_back(lw.step(ps));
    if (!pd.host) lw.finish(pd, read_later);
    prog.dispatches.push_back(std::move(pd));
  }
}

void check_shape(const ModelSpec& spec, const PassShape& shape) {
  if (shape.tokens < 1) fail("npusim lowering: a pass needs at least one token");
  if (shape.decode && shape.tokens != 1) fail("npusim lowering: a decode pass runs one token, not {}", shape.tokens);
  if (shape.context < 0 || shape.context + shape.tokens > spec.max_position)
    fail("npusim lowering: {} tokens after {} cached exceed the model's context of {}", shape.tokens, shape.context,
         spec.max_position);
  if (shape.head_rows < 1 || shape.head_rows > shape.tokens)
    fail("npusim lowering: the head's {} rows are not within the pass's {} tokens", shape.head_rows, shape.tokens);
}

}  // namespace

Program lower(const NpuPlan& plan, const ModelSpec& spec, const Device& device, const PassShape& shape,
              const LoweringFaults& faults, const WeightFormats& formats) {
  check_shape(spec, shape);
  Program prog;
  prog.plan = plan.name;
  prog.shape = shape;
  Lowerer lw(plan, spec, device, shape, faults, formats);
  const NpuPlan::Pass& pass = plan.pass(shape.decode);
  lower_section(prog, lw, pass.embedding, "embedding", 1, pass.layer);
  lower_section(prog, lw, pass.layer, "layer", spec.n_layers, pass.head);
  lower_section(prog, lw, pass.head, "head", 1, {});
  return prog;
}

Program lower_stage(const NpuPlan& plan, Stage stage, const ModelSpec& spec, const Device& device,
                    const PassShape& shape, const LoweringFaults& faults, const WeightFormats& formats) {
  check_shape(spec, shape);
  Program prog;
  prog.plan = plan.name;
  prog.shape = shape;
  // A kernel program hands everything it writes back to the host.
  NpuPlan alone = plan;
  alone.intermediates_on_device = false;
  Lowerer lw(alone, spec, device, shape, faults, formats);
  const Placement where = plan.placement(stage, shape.decode);
  const std::string section = stage == Stage::Embedding                              ? "embedding"
                              : (stage == Stage::FinalNorm || stage == Stage::LmHead) ? "head"
                                                                                      : "layer";
  lower_section(prog, lw, {PlanDispatch{std::string("kernel.") + stage_name(stage), {{stage, where}}}}, section, 1, {});
  return prog;
}

}  // namespace tessera::npusim
