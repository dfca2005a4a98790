#include "targets/npusim/executor.h"

#include <fmt/format.h>

#include <cstring>
#include <functional>
#include <string_view>

#include "targets/npusim/mappings.h"
#include "targets/npusim/timing.h"
#include "util/error.h"

namespace tessera::npusim {

namespace {

constexpr uint8_t kPoison = 0xff;  // never-written device memory reads as NaN (bf16 and f32)

size_t hash_floats(const float* p, int64_t n) {
  return std::hash<std::string_view>{}(std::string_view(reinterpret_cast<const char*>(p), size_t(n) * sizeof(float)));
}

// Activations are bf16 or fp32; block formats are weights, bound where they lie (external).
void values_only(ElemType t) {
  if (is_block(t)) fail("npusim executor: an activation buffer cannot hold {} blocks", elem_type_name(t));
}

// fp32 host values into device memory of type `t`, and back.
void to_device(const float* in, uint8_t* out, ElemType t, int64_t n) {
  values_only(t);
  if (t == ElemType::F32) std::memcpy(out, in, size_t(n) * sizeof(float));
  else detail::cast_to_bf16(in, reinterpret_cast<uint16_t*>(out), n);
}
void to_host(const uint8_t* in, ElemType t, float* out, int64_t n) {
  values_only(t);
  if (t == ElemType::F32) std::memcpy(out, in, size_t(n) * sizeof(float));
  else detail::cast_to_f32(reinterpret_cast<const uint16_t*>(in), out, n);
}
// Device memory of one type viewed as another (a converted copy).
void convert(const uint8_t* in, ElemType from, uint8_t* out, ElemType to, int64_t n) {
  values_only(from);
  values_only(to);
  if (from == to) {
    std::memcpy(out, in, size_t(n * elem_bytes(from)));
  } else if (from == ElemType::F32) {
    detail::cast_to_bf16(reinterpret_cast<const float*>(in), reinterpret_cast<uint16_t*>(out), n);
  } else {
    detail::cast_to_f32(reinterpret_cast<const uint16_t*>(in), reinterpret_cast<float*>(out), n);
  }
}

// The embedding's gather with the call's ids: each row BD of the table fifo addresses
// (placeholder token index) * row + column; the placeholder is the token's index in the pass.
Launch patch_ids(const Launch& l, const std::string& table_tensor, std::span<const int32_t> ids) {
  Launch out = l;
  for (ObjectFifo& f : out.fifos) {
    if (f.tensor != table_tensor) continue;
    for (AccessPattern& p : f.ddr) {
      const int64_t row = p.elements();  // one BD per token row
      const int64_t token = p.offset / row;
      if (token < 0 || token >= int64_t(ids.size()))
        fail("npusim executor: launch {} gathers token {} of a call with {} ids", l.name, token, ids.size());
      p.offset = int64_t(ids[size_t(token)]) * row + p.offset % row;
    }
  }
  return out;
}

}  // namespace

struct ProgramExecutor::Buffer {
  ElemType type = ElemType::BF16;
  int64_t elems = 0;             // host-visible part
  std::vector<uint8_t> own;      // a DDR buffer's bytes (device_elems)
  uint8_t* data = nullptr;       // `own`, or the buffer's slice of its dispatch's L2 arena
  int64_t size = 0;              // bytes
  std::vector<uint8_t> at_begin;  // the buffer as the current dispatch call began (for reads without a wait)
  size_t host_hash = 0;          // the host array's content when host and device last agreed
  bool agreed = false;
};

struct ProgramExecutor::Call {
  std::shared_ptr<const Program> program;
  size_t dispatch = 0;
  int64_t layer = -1;
  size_t last_step = 0;
  std::string instance;  // "prefill/layer.o+mlp/3"
  bool first = false;
  std::vector<LaunchTiming> launches;
  // Buffers read without a wait after an earlier launch of the call wrote them: launch
  // name -> buffer names; those launches read `at_begin`.
  std::map<std::string, std::set<std::string>> stale_reads;
  std::map<std::string, Buffer*> buffers;
  std::set<std::string> written;  // buffers a launch of this call wrote
};

ProgramExecutor::ProgramExecutor(const Device& device, int threads) : engine_(device, threads) {
  register_kernel_set(engine_);
}

ProgramExecutor::~ProgramExecutor() = default;

void ProgramExecutor::reset() {
  close(call_);
  side_.reset();
  unsynced_.clear();
  engine_.reset();
  buffers_.clear();
  l2_.clear();
  seen_instances_.clear();
  seen_launches_.clear();
}

void ProgramExecutor::begin_pass() {
  close(call_);
  pass_ = PassPrediction{};
}

PassPrediction ProgramExecutor::end_pass() {
  close(call_);
  PassPrediction out = std::move(pass_);
  pass_ = PassPrediction{};
  return out;
}

void ProgramExecutor::close(std::unique_ptr<Call>& call) {
  if (!call) return;
  if (call.get() == call_.get()) {
    const Program& prog = *call->program;
    if (pass_.dispatches.empty()) {
      pass_.pass = prog.shape.decode ? "decode" : "prefill";
      pass_.tokens = prog.shape.tokens;
      pass_.context = prog.shape.context;
    }
    add_dispatch_call(pass_, prog.dispatches[call->dispatch], std::move(call->launches), device(), call->first);
  }
  call.reset();
}

ProgramExecutor::Buffer& ProgramExecutor::device_buffer(const std::string& instance, const ProgramDispatch& d,
                                                        const ProgramBuffer& pb) {
  std::unique_ptr<Buffer>& b = buffers_[instance + "/" + pb.buffer.name];
  const int64_t es = elem_bytes(pb.buffer.type), size = pb.device_elems * es;
  if (pb.in_l2) {
    // A slice of the dispatch's arena, shared with the buffers the lowering let reuse it:
    // poison until something writes it (its padding rows too: no kernel mixes rows).
    std::vector<uint8_t>& arena = l2_[instance];
    if (int64_t(arena.size()) != d.l2_arena_bytes) arena.assign(size_t(d.l2_arena_bytes), kPoison);
    if (pb.l2_offset + size > int64_t(arena.size()))
      fail("npusim executor: buffer '{}' at L2 offset {} ({} B) is past its dispatch's arena of {} B", pb.buffer.name,
           pb.l2_offset, size, arena.size());
    if (!b || b->own.size()) b = std::make_unique<Buffer>();
    b->type = pb.buffer.type;
    b->elems = pb.buffer.elems;
    b->data = arena.data() + pb.l2_offset;
    b->size = size;
    return *b;
  }
  if (!b || b->type != pb.buffer.type || b->elems != pb.buffer.elems || int64_t(b->own.size()) != size) {
    // (Re)allocated for this shape: the host-visible part poison until written, the padding zero.
    b = std::make_unique<Buffer>();
    b->type = pb.buffer.type;
    b->elems = pb.buffer.elems;
    b->own.assign(size_t(size), 0);
    std::memset(b->own.data(), kPoison, size_t(pb.buffer.elems * es));
    b->data = b->own.data();
    b->size = size;
  }
  return *b;
}

ProgramExecutor::Call& ProgramExecutor::enter(std::shared_ptr<const Program> program, Program::Where where,
                                              int64_t layer, bool priced, bool within_step) {
  std::unique_ptr<Call>& call = priced ? call_ : side_;
  const bool same = call && call->program == program && call->dispatch == where.dispatch && call->layer == layer &&
                    (where.step > call->last_step || (within_step && where.step == call->last_step));
  if (same) {
    call->last_step = where.step;
    return *call;
  }
  close(call);
  call = std::make_unique<Call>();
  call->program = program;
  call->dispatch = where.dispatch;
  call->layer = layer;
  call->last_step = where.step;
  const ProgramDispatch& d = program->dispatches[where.dispatch];
  call->instance = fmt::format("{}{}/{}/{}", priced ? "" : "kernel:", program->shape.decode ? "decode" : "prefill",
                               d.name, layer);
  call->first = seen_instances_.insert(call->instance).second;
  if (d.host) return *call;
  // The call's device buffers, and the snapshot a read without a wait sees.
  for (const ProgramBuffer& pb : d.buffers)
    if (!pb.external) call->buffers[pb.buffer.name] = &device_buffer(call->instance, d, pb);
  std::set<std::string> written;
  for (const ProgramStep& st : d.steps)
    for (const LaunchCall& c : st.launches) {
      for (const std::string& n : c.reads())
        if (written.count(n) && !c.waits.count(n) && call->buffers.count(n)) {
          call->stale_reads[c.launch.name].insert(n);
          Buffer& b = *call->buffers[n];
          b.at_begin.assign(b.data, b.data + b.size);
        }
      for (const std::string& n : c.writes()) written.insert(n);
    }
  return *call;
}

void ProgramExecutor::run_step(std::shared_ptr<const Program> program, Program::Where where, int64_t layer,
                               const StepArgs& args, bool priced, const std::set<std::string>& outputs) {
  Call& call = enter(program, where, layer, priced);
  const ProgramStep& st = program->dispatches[where.dispatch].steps[where.step];
  for (const LaunchCall& c : st.launches) {
    if (!outputs.empty()) {
      bool wanted = false;
      for (const std::string& n : c.writes()) wanted |= outputs.count(n) > 0;
      if (!wanted) continue;
    }
    run_call(call, c, {}, &args);
  }
}

void ProgramExecutor::run_launch(std::shared_ptr<const Program> program, Program::Where where, int64_t layer,
                                 size_t index, const Bindings& ddr, bool priced) {
  Call& call = enter(program, where, layer, priced, index > 0);  // a later launch of the same step: the same call
  const ProgramStep& st = program->dispatches[where.dispatch].steps[where.step];
  if (index >= st.launches.size())
    fail("npusim executor: step {} has {} launches, not {}", stage_name(st.stage), st.launches.size(), index + 1);
  run_call(call, st.launches[index], ddr, nullptr);
}

void ProgramExecutor::host_step(std::shared_ptr<const Program> program, Program::Where where, int64_t layer,
                                bool priced) {
  enter(program, where, layer, priced);
}

void ProgramExecutor::run_call(Call& call, const LaunchCall& c, const Bindings& direct, const StepArgs* args) {
  const std::set<std::string>* stale = nullptr;
  if (auto it = call.stale_reads.find(c.launch.name); it != call.stale_reads.end()) stale = &it->second;

  Bindings bind;
  struct Converted {
    std::vector<uint8_t> bytes;
    Buffer* into = nullptr;  // drained in another type: converted back into this buffer after the launch
    int64_t offset = 0, elems = 0;
    ElemType type = ElemType::BF16;
  };
  std::vector<std::unique_ptr<Converted>> converted;
  std::set<std::string> uploaded;
  for (const ObjectFifo& f : c.launch.fifos) {
    if (bind.count(f.tensor)) continue;  // a tensor several fifos move (split, join) binds once
    const std::string& name = c.args.at(f.tensor);
    const int64_t off = c.offsets.count(f.tensor) ? c.offsets.at(f.tensor) : 0;
    const DdrTensor* ext = nullptr;
    if (args) {
      if (auto it = args->external.find(name); it != args->external.end()) ext = &it->second;
    } else {
      auto it = direct.find(name);
      if (it == direct.end()) fail("npusim executor: launch {} needs '{}', which is not bound", c.launch.name, name);
      ext = &it->second;
    }
    if (ext) {
      DdrTensor t = *ext;
      t.data = static_cast<uint8_t*>(t.data) + off * elem_bytes(t.type);
      t.elems -= off;
      bind[f.tensor] = t;
      continue;
    }
    auto bit = call.buffers.find(name);
    if (bit == call.buffers.end())
      fail("npusim executor: launch {} moves '{}', which is neither bound nor a buffer of its dispatch", c.launch.name, name);
    Buffer& b = *bit->second;
    const bool reads = f.dir == FifoDir::Fill;
    if (auto h = args->host.find(name); h != args->host.end() && reads && !uploaded.count(name)) {
      if (h->second.elems != b.elems)
        fail("npusim executor: buffer '{}' holds {} elements, the host array {}", name, b.elems, h->second.elems);
      const size_t hh = hash_floats(h->second.data, b.elems);
      if (call.written.count(name)) {
        // Written earlier in this call: the device holds it; the host changed it since (a
        // perturbation, the oracle's twin) only if its array no longer matches.
        if (hh != b.host_hash) to_device(h->second.data, b.data, b.type, b.elems), b.host_hash = hh;
      } else {
        // From the host: what the host's memory holds (stale if the producer never synced it).
        const float* src = host_memory(name, h->second);
        const size_t sh = src == h->second.data ? hh : hash_floats(src, b.elems);
        if (!b.agreed || sh != b.host_hash) {
          to_device(src, b.data, b.type, b.elems);
          b.host_hash = sh;
          b.agreed = true;
        }
      }
      uploaded.insert(name);
    }
    uint8_t* base = (reads && stale && stale->count(name)) ? b.at_begin.data() : b.data;
    const int64_t n = b.size / elem_bytes(b.type) - off;
    if (f.type == b.type) {
      bind[f.tensor] = {b.type, base + off * elem_bytes(b.type), n};
      continue;
    }
    // Another element type: a converted copy of the part the launch's fifos reach.
    int64_t reach = 0;
    for (const ObjectFifo& g : c.launch.fifos)
      if (g.tensor == f.tensor)
        for (const AccessPattern& p : g.ddr)
          if (p.elements() > 0) reach = std::max(reach, p.extent().second + 1);
    auto cv = std::make_unique<Converted>();
    cv->type = f.type;
    cv->elems = std::min(reach, n);
    cv->bytes.resize(size_t(cv->elems * elem_bytes(f.type)));
    if (reads) convert(base + off * elem_bytes(b.type), b.type, cv->bytes.data(), f.type, cv->elems);
    else cv->into = &b, cv->offset = off;
    bind[f.tensor] = {f.type, cv->bytes.data(), cv->elems};
    converted.push_back(std::move(cv));
  }

  const std::string key = call.instance + "/" + c.launch.name;
  if (c.patched_by_ids) {
    if (!args) fail("npusim executor: launch {} gathers token rows: it needs the ids", c.launch.name);
    const Launch l = patch_ids(c.launch, "E", args->ids);
    engine_.run(l, bind, key);
  } else {
    engine_.run(c.launch, bind, key);
  }
  TimingOptions opt;
  opt.first_call = seen_launches_.insert(key).second;
  call.launches.push_back(time_launch(c.launch, device(), opt));

  for (const auto& cv : converted)
    if (cv->into)
      convert(cv->bytes.data(), cv->type, cv->into->data + cv->offset * elem_bytes(cv->into->type),
              cv->into->type, cv->elems);
  for (const std::string& name : c.writes()) call.written.insert(name);
  if (!args) return;
  // What the launch wrote, shown to the host (not a sync: see executor.h). A device-only
  // buffer never reaches the host's memory: what the host held stays what a host reader gets.
  const ProgramDispatch& d = call.program->dispatches[call.dispatch];
  for (const std::string& name : c.writes()) {
    auto h = args->host.find(name);
    auto bit = call.buffers.find(name);
    if (h == args->host.end() || bit == call.buffers.end()) continue;
    Buffer& b = *bit->second;
    const ProgramBuffer* pb = d.buffer(name);
    const bool synced = !pb || pb->buffer.sync != Sync::DeviceOnly;
    auto u = unsynced_.find(name);
    if (synced) {
      if (u != unsynced_.end()) unsynced_.erase(u);
    } else if (u == unsynced_.end() || hash_floats(h->second.data, h->second.elems) != u->second.shown_hash) {
      unsynced_[name].host = std::vector<float>(h->second.data, h->second.data + h->second.elems);
    }
    to_host(b.data, b.type, h->second.data, b.elems);
    b.host_hash = hash_floats(h->second.data, b.elems);
    b.agreed = true;
    if (!synced) unsynced_[name].shown_hash = b.host_hash;
  }
}

const float* ProgramExecutor::host_memory(const std::string& name, const HostArray& a) {
  auto u = unsynced_.find(name);
  if (u == unsynced_.end()) return a.data;
  if (int64_t(u->second.host.size()) != a.elems || hash_floats(a.data, a.elems) != u->second.shown_hash) {
    unsynced_.erase(u);  // the host wrote the array since: its memory is the array
    return a.data;
  }
  return u->second.host.data();
}

void ProgramExecutor::host_reads(const std::string& name, float* data, int64_t elems) {
  const float* m = host_memory(name, {data, elems});
  if (m != data) std::copy_n(m, elems, data);
}

}  // namespace tessera::npusim
