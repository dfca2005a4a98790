#include "targets/npusim/engine.h"

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "targets/npusim/checker.h"
#include "util/error.h"
#include "util/parallel.h"

namespace tessera::npusim {

namespace {

// One buffer descriptor of a DDR transfer, normalized so that walking it touches as few
// runs as possible: size-1 dimensions dropped, dimensions merged where contiguous.
struct Bd {
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;  // outermost first, never empty
  int64_t per_rep = 0;                  // elements per repetition
  int64_t repeat = 1;
  int64_t start = 0;                    // stream position of its first element
};

Bd normalize(const AccessPattern& p, int64_t start) {
  Bd b;
  b.offset = p.offset;
  b.repeat = p.repeat;
  b.start = start;
  for (size_t d = 0; d < p.sizes.size(); ++d) {
    if (p.sizes[d] == 1) continue;
    if (!b.sizes.empty() && b.strides.back() == p.sizes[d] * p.strides[d]) {
      b.sizes.back() *= p.sizes[d];
      b.strides.back() = p.strides[d];
    } else {
      b.sizes.push_back(p.sizes[d]);
      b.strides.push_back(p.strides[d]);
    }
  }
  if (b.sizes.empty()) {
    b.sizes = {p.sizes.empty() ? 0 : 1};
    b.strides = {1};
  }
  b.per_rep = 1;
  for (int64_t s : b.sizes) b.per_rep *= s;
  return b;
}

// The element stream of a fifo's DDR side: its BD chain over one tensor.
struct Stream {
  std::vector<Bd> bds;
  int64_t total = 0;
  int esize = 2;
  uint8_t* base = nullptr;

  // Calls run(ddr_index, ddr_stride, len, request_offset) for the runs that make up stream
  // positions [start, start + count); a run is `len` elements `ddr_stride` apart.
  template <typename F>
  void walk(int64_t start, int64_t count, F&& run) const {
    size_t b = 0;
    while (b < bds.size() && start >= bds[b].start + bds[b].per_rep * bds[b].repeat) ++b;
    int64_t pos = start, done = 0;
    while (done < count) {
      if (b >= bds.size()) fail("npusim engine: DMA stream position {} is past the transfer's end ({})", pos, total);
      const Bd& bd = bds[b];
      const int64_t bd_end = bd.start + bd.per_rep * bd.repeat;
      int64_t rem = (pos - bd.start) % bd.per_rep;
      const size_t nd = bd.sizes.size();
      int64_t addr = bd.offset, inner_left = 0;
      for (size_t d = nd; d-- > 0;) {
        const int64_t i = rem % bd.sizes[d];
        rem /= bd.sizes[d];
        addr += i * bd.strides[d];
        if (d == nd - 1) inner_left = bd.sizes[d] - i;
      }
      const int64_t len = std::min({inner_left, count - done, bd_end - pos});
      run(addr, bd.strides[nd - 1], len, done);
      pos += len;
      done += len;
      if (pos == bd_end) ++b;
    }
  }

  void gather(int64_t start, int64_t count, uint8_t* dst) const {
    walk(start, count, [&](int64_t addr, int64_t stride, int64_t len, int64_t off) {
      uint8_t* d = dst + off * esize;
      const uint8_t* s = base + addr * esize;
      if (stride == 1) {
        std::memcpy(d, s, size_t(len * esize));
      } else {
        for (int64_t i = 0; i < len; ++i) std::memcpy(d + i * esize, s + i * stride * esize, size_t(esize));
      }
    });
  }

  void scatter(int64_t start, int64_t count, const uint8_t* src) const {
    walk(start, count, [&](int64_t addr, int64_t stride, int64_t len, int64_t off) {
      const uint8_t* s = src + off * esize;
      uint8_t* d = base + addr * esize;
      if (stride == 1) {
        std::memcpy(d, s, size_t(len * esize));
      } else {
        for (int64_t i = 0; i < len; ++i) std::memcpy(d + i * stride * esize, s + i * esize, size_t(esize));
      }
    });
  }
};

// Contiguous runs (memtile offset, length) of a memtile-side pattern, in visiting order.
std::vector<std::pair<int64_t, int64_t>> pattern_runs(const AccessPattern& p) {
  Stream s;
  s.bds.push_back(normalize(p, 0));
  s.total = p.elements();
  std::vector<std::pair<int64_t, int64_t>> runs;
  s.walk(0, s.total, [&](int64_t addr, int64_t stride, int64_t len, int64_t) {
    if (stride == 1) {
      runs.emplace_back(addr, len);
    } else {
      for (int64_t i = 0; i < len; ++i) runs.emplace_back(addr + i * stride, 1);
    }
  });
  return runs;
}

constexpr uint8_t kPoison = 0xff;  // never-written L1 reads as NaN (bf16 and f32)

}  // namespace

uint16_t* ObjectRef::bf16() const {
  if (type != ElemType::BF16) fail("npusim: object holds {}, not bf16", elem_type_name(type));
  return reinterpret_cast<uint16_t*>(data);
}

float* ObjectRef::f32() const {
  if (type != ElemType::F32) fail("npusim: object holds {}, not f32", elem_type_name(type));
  return reinterpret_cast<float*>(data);
}

const uint8_t* ObjectRef::blocks(ElemType t) const {
  if (type != t || !is_block(t)) fail("npusim: object holds {}, not {} blocks", elem_type_name(type), elem_type_name(t));
  return data;
}

// Who waits for what while a launch with worker-to-worker fifos runs: a state in which every
// unfinished worker waits is a deadlock, reported with each worker's tile and fifo.
struct Sched {
  std::mutex m;
  std::condition_variable cv;
  int running = 0;
  bool dead = false;
  std::string launch, report;
  struct Wait {
    std::string what;
    std::function<bool()> ready;
  };
  std::map<std::string, Wait> waiting;  // "worker w on tile (c, r)" -> what it waits for

  // Waits (lock held) until ready(); a deadlock when every unfinished worker waits and none
  // of them can go on.
  void wait(std::unique_lock<std::mutex>& lk, std::function<bool()> ready, const std::string& who,
            const std::string& what) {
    while (!ready()) {
      if (dead) fail("{}", report);
      waiting[who] = {what, ready};
      if (int(waiting.size()) == running &&
          std::none_of(waiting.begin(), waiting.end(), [](const auto& w) { return w.second.ready(); })) {
        dead = true;
        report = fmt::format("npusim: launch {} deadlocks: every unfinished worker waits:", launch);
        for (const auto& [w, x] : waiting) report += fmt::format("\n  {} waits for {}", w, x.what);
        waiting.erase(who);
        cv.notify_all();
        fail("{}", report);
      }
      cv.wait(lk);
      waiting.erase(who);
    }
  }
  void finished() {
    std::lock_guard<std::mutex> lk(m);
    --running;
    cv.notify_all();
  }
};

// One worker-to-worker fifo while its launch runs: one ring of `depth` slots that the
// producer fills and every consumer reads (poison until written).
struct LinkState {
  const LinkFifo* fifo = nullptr;
  std::vector<uint8_t> ring;
  int64_t produced = 0;           // objects the producer released
  std::vector<int64_t> consumed;  // per consumer: objects released
};

struct WorkerContext::End {
  std::string name;  // the fifo's
  const ObjectFifo* fifo = nullptr;  // DDR fifos
  LinkState* link = nullptr;         // worker-to-worker fifos
  int consumer = -1;                 // link: -1 the producer, else the consumer's index
  Sched* sched = nullptr;
  std::string who;                   // "worker w on tile (c, r)" 
  Tile tile;
  bool fill = true;
  int64_t n = 0;        // elements of this end's object
  int64_t offset = 0;   // its slice in the memtile object (no memtile pattern)
  int64_t P = 0;        // memtile object elements
  int64_t objects = 0;
  int depth = 1;
  bool skip_dma = false;  // resident fifo after its first run
  uint8_t* slots = nullptr;
  const Stream* stream = nullptr;
  std::vector<std::pair<int64_t, int64_t>> runs;  // memtile pattern runs (empty: contiguous slice)
  int64_t acquired = 0, released = 0;
  std::atomic<int64_t>* moved = nullptr;  // the engine's byte counter for this direction

  uint8_t* slot(int64_t j) const { return slots + (j % depth) * n * stream->esize; }
  void transfer(int64_t j, uint8_t* buf) const {
    const int64_t base = j * P;
    if (runs.empty()) {
      fill ? stream->gather(base + offset, n, buf) : stream->scatter(base + offset, n, buf);
      return;
    }
    int64_t off = 0;
    for (const auto& [q, len] : runs) {
      fill ? stream->gather(base + q, len, buf + off * stream->esize)
           : stream->scatter(base + q, len, buf + off * stream->esize);
      off += len;
    }
  }
};

int WorkerContext::fifo(const std::string& name) const {
  for (size_t i = 0; i < ends_.size(); ++i)
    if (ends_[i]->name == name) return int(i);
  fail("npusim: worker {} on tile {} has no end of fifo '{}'", worker_->name, to_string(tile()), name);
}

int64_t WorkerContext::objects(int h) const { return ends_.at(size_t(h))->objects; }

ObjectRef WorkerContext::acquire(int h) {
  End& e = *ends_.at(size_t(h));
  const std::string& f = e.name;
  if (e.acquired - e.released >= e.depth)
    fail("npusim: worker {} on tile {} holds {} objects of fifo {} (depth {}) and acquires another: the device "
         "would deadlock",
         worker_->name, to_string(tile()), e.acquired - e.released, f, e.depth);
  if (e.acquired >= e.objects)
    fail("npusim: worker {} on tile {} acquires object {} of fifo {}, but the runtime sequence moves only {}: the "
         "device would hang",
         worker_->name, to_string(tile()), e.acquired + 1, f, e.objects);
  if (e.link) {
    // A slot of the ring: the producer waits until every consumer released the object that
    // held it, a consumer until the producer released the object.
    LinkState& L = *e.link;
    const int64_t j = e.acquired, esize = elem_bytes(L.fifo->type);
    std::unique_lock<std::mutex> lk(e.sched->m);
    if (e.consumer < 0)
      e.sched->wait(lk, [&] { return j - *std::min_element(L.consumed.begin(), L.consumed.end()) < e.depth; }, e.who,
                    fmt::format("a free slot of fifo {} (it produces object {}; depth {})", f, j, e.depth));
    else
      e.sched->wait(lk, [&] { return j < L.produced; }, e.who,
                    fmt::format("object {} of fifo {} (its producer on tile {} released {})", j, f,
                                to_string(L.fifo->producer), L.produced));
    ++e.acquired;
    return {L.ring.data() + (j % e.depth) * e.n * esize, e.n, L.fifo->type};
  }
  const int64_t j = e.acquired++;
  uint8_t* s = e.slot(j);
  if (e.fill && !e.skip_dma) {
    e.transfer(j, s);
    e.moved->fetch_add(e.n * e.stream->esize, std::memory_order_relaxed);
  }
  return {s, e.n, e.fifo->type};
}

void WorkerContext::release(int h) {
  End& e = *ends_.at(size_t(h));
  if (e.released >= e.acquired)
    fail("npusim: worker {} on tile {} releases fifo {} without holding an object", worker_->name, to_string(tile()),
         e.name);
  if (e.link) {
    std::lock_guard<std::mutex> lk(e.sched->m);
    ++e.released;
    (e.consumer < 0 ? e.link->produced : e.link->consumed[size_t(e.consumer)]) = e.released;
    e.sched->cv.notify_all();
    return;
  }
  const int64_t j = e.released++;
  if (!e.fill) {
    e.transfer(j, e.slot(j));
    e.moved->fetch_add(e.n * e.stream->esize, std::memory_order_relaxed);
  }
}

std::span<uint8_t> WorkerContext::buffer(const std::string& name, int index) {
  auto it = locals_->find(name);
  if (it == locals_->end())
    fail("npusim: worker {} on tile {} has no L1 buffer '{}'", worker_->name, to_string(tile()), name);
  const int64_t bytes = local_slot_bytes_.at(name);
  if (index < 0 || (index + 1) * bytes > int64_t(it->second.size()))
    fail("npusim: worker {}: buffer {} has no slot {}", worker_->name, name, index);
  return {it->second.data() + index * bytes, size_t(bytes)};
}

// Device state that persists across calls for one launch name.
struct LaunchState {
  std::string signature;  // layout; a different one resets the state
  int64_t runs = 0;
  std::map<std::pair<size_t, size_t>, std::vector<uint8_t>> slots;  // (fifo, end) -> ring
  std::vector<std::map<std::string, std::vector<uint8_t>>> locals;  // per worker
};

struct Engine::Impl {
  Device device;
  int threads = 1;
  std::map<std::string, KernelFn> kernels;
  std::map<std::string, LaunchState> state;
  std::map<std::string, std::vector<uint8_t>> device_buffers;  // "dispatch/buffer"
  std::set<std::string> dispatched;
  std::atomic<int64_t> launches{0}, in_bytes{0}, out_bytes{0}, host_bytes{0};
};

Engine::Engine(Device device, int threads) : impl_(std::make_unique<Impl>()) {
  impl_->device = std::move(device);
  impl_->threads = threads > 0 ? threads : default_threads();
}

Engine::~Engine() = default;

const Device& Engine::device() const { return impl_->device; }

void Engine::register_kernel(const std::string& name, KernelFn fn) { impl_->kernels[name] = std::move(fn); }

bool Engine::has_kernel(const std::string& name) const { return impl_->kernels.count(name) > 0; }

void Engine::reset() {
  impl_->state.clear();
  impl_->device_buffers.clear();
  impl_->dispatched.clear();
}

Engine::Stats Engine::stats() const {
  return {impl_->launches.load(), impl_->in_bytes.load(), impl_->out_bytes.load(), impl_->host_bytes.load()};
}

void Engine::run(const Launch& l, const Bindings& ddr) { run(l, ddr, l.name); }

void Engine::run(const Launch& l, const Bindings& ddr, const std::string& state_key) {
  Impl& im = *impl_;
  if (auto refusals = check(l, im.device); !refusals.empty())
    fail("npusim: launch {} does not fit {}:\n{}", l.name, im.device.name, describe(refusals));

  // Bind every fifo to its tensor and check the patterns stay inside it (a DMA outside its
  // buffer faults or reads garbage on the device; here it is refused).
  std::vector<Stream> streams(l.fifos.size());
  for (size_t i = 0; i < l.fifos.size(); ++i) {
    const ObjectFifo& f = l.fifos[i];
    auto it = ddr.find(f.tensor);
    if (it == ddr.end()) fail("npusim: launch {}: fifo {} needs tensor '{}', which is not bound", l.name, f.name, f.tensor);
    const DdrTensor& t = it->second;
    if (t.type != f.type)
      fail("npusim: launch {}: fifo {} moves {} but tensor '{}' holds {}", l.name, f.name, elem_type_name(f.type),
           f.tensor, elem_type_name(t.type));
    Stream& s = streams[i];
    s.esize = elem_bytes(f.type);
    s.base = static_cast<uint8_t*>(t.data);
    for (const auto& p : f.ddr) {
      if (p.elements() == 0) continue;  // an empty BD moves nothing
      const auto [lo, hi] = p.extent();
      if (lo < 0 || hi >= t.elems)
        fail("npusim: launch {}: fifo {} pattern ({}) reaches elements [{}, {}] of '{}', which has {}", l.name, f.name,
             p.describe(), lo, hi, f.tensor, t.elems);
      s.bds.push_back(normalize(p, s.total));
      s.total += p.elements();
    }
  }

  // Device state for this launch name; a changed layout starts afresh.
  std::string sig;
  for (const auto& f : l.fifos) {
    sig += fmt::format("{}:{}:{}:{};", f.name, f.depth, f.object_elems, elem_bytes(f.type));
    for (const auto& e : f.ends) sig += fmt::format("{},{},{};", e.tile.col, e.tile.row, f.end_elems(e));
  }
  for (const auto& w : l.workers) {
    sig += fmt::format("w{},{}:", w.tile.col, w.tile.row);
    for (const auto& b : w.buffers) sig += fmt::format("{}/{}/{};", b.name, b.bytes, b.depth);
  }
  LaunchState& st = im.state[state_key];
  if (st.signature != sig) st = LaunchState{sig, 0, {}, {}};
  st.locals.resize(l.workers.size());

  std::vector<WorkerContext> ctx(l.workers.size());
  std::vector<std::unique_ptr<WorkerContext::End>> ends;
  for (size_t w = 0; w < l.workers.size(); ++w) {
    const Worker& wk = l.workers[w];
    if (!im.kernels.count(wk.kernel))
      fail("npusim: launch {}: worker {} runs kernel '{}', which is not registered", l.name, wk.name, wk.kernel);
    ctx[w].worker_ = &wk;
    ctx[w].locals_ = &st.locals[w];
    for (const auto& b : wk.buffers) {
      auto& mem = st.locals[w][b.name];
      if (mem.empty()) mem.assign(size_t(b.bytes * b.depth), kPoison);
      ctx[w].local_slot_bytes_[b.name] = b.bytes;
    }
  }
  for (size_t i = 0; i < l.fifos.size(); ++i) {
    const ObjectFifo& f = l.fifos[i];
    for (size_t k = 0; k < f.ends.size(); ++k) {
      const FifoEnd& fe = f.ends[k];
      auto e = std::make_unique<WorkerContext::End>();
      e->name = f.name;
      e->fifo = &f;
      e->tile = fe.tile;
      e->fill = f.dir == FifoDir::Fill;
      e->n = f.end_elems(fe);
      e->offset = fe.offset;
      e->P = f.object_elems;
      e->objects = f.objects();
      e->depth = f.depth;
      e->skip_dma = f.resident && e->fill && st.runs > 0;
      e->stream = &streams[i];
      if (fe.mem_pattern) e->runs = pattern_runs(*fe.mem_pattern);
      auto& ring = st.slots[{i, k}];
      if (ring.empty()) ring.assign(size_t(e->n * f.depth * elem_bytes(f.type)), kPoison);
      e->slots = ring.data();
      e->moved = e->fill ? &im.in_bytes : &im.out_bytes;
      for (size_t w = 0; w < l.workers.size(); ++w)
        if (l.workers[w].tile == fe.tile) ctx[w].ends_.push_back(e.get());
      ends.push_back(std::move(e));
    }
  }

  // Worker-to-worker fifos: one ring each, the producer's and every consumer's end on it.
  Sched sched;
  sched.launch = l.name;
  std::vector<std::unique_ptr<LinkState>> links;
  for (const LinkFifo& f : l.links) {
    auto L = std::make_unique<LinkState>();
    L->fifo = &f;
    L->ring.assign(size_t(std::max(f.depth, 1)) * size_t(f.object_bytes()), kPoison);
    L->consumed.assign(f.consumers.size(), 0);
    for (int k = -1; k < int(f.consumers.size()); ++k) {
      const Tile t = k < 0 ? f.producer : f.consumers[size_t(k)];
      auto e = std::make_unique<WorkerContext::End>();
      e->name = f.name;
      e->link = L.get();
      e->consumer = k;
      e->sched = &sched;
      e->tile = t;
      e->fill = k >= 0;
      e->n = f.object_elems;
      e->objects = f.objects;
      e->depth = std::max(f.depth, 1);
      for (size_t w = 0; w < l.workers.size(); ++w)
        if (l.workers[w].tile == t) {
          e->who = fmt::format("worker {} on tile {}", l.workers[w].name, to_string(t));
          ctx[w].ends_.push_back(e.get());
        }
      ends.push_back(std::move(e));
    }
    links.push_back(std::move(L));
  }

  auto run_worker = [&](size_t w) {
    im.kernels.at(l.workers[w].kernel)(ctx[w]);
    for (const auto* e : ctx[w].ends_)
      if (!e->fill && e->released != e->objects)
        fail("npusim: launch {}: worker {} on tile {} released {} of the {} objects of fifo {}: {} would never finish",
             l.name, l.workers[w].name, to_string(l.workers[w].tile), e->released, e->objects, e->name,
             e->link ? "its consumers" : "the drain");
  };
  if (links.empty()) {
    // Workers only meet in DDR (disjoint regions for a correct mapping), so they run in
    // parallel; contiguous chunks of workers per thread (util/parallel.h rethrows errors).
    parallel_for(int64_t(l.workers.size()), im.threads, [&](int64_t b, int64_t e) {
      for (int64_t w = b; w < e; ++w) run_worker(size_t(w));
    });
  } else {
    // Workers wait on each other: each runs on its own thread, as each core runs on its own.
    sched.running = int(l.workers.size());
    std::vector<std::exception_ptr> errors(l.workers.size());
    std::vector<std::thread> threads;
    for (size_t w = 0; w < l.workers.size(); ++w)
      threads.emplace_back([&, w] {
        try {
          run_worker(w);
        } catch (...) {
          errors[w] = std::current_exception();
        }
        sched.finished();
      });
    for (std::thread& t : threads) t.join();
    // The first error that is not the deadlock report (its cause), else the report.
    std::exception_ptr first;
    for (const std::exception_ptr& e : errors) {
      if (!e) continue;
      try {
        std::rethrow_exception(e);
      } catch (const Error& x) {
        if (std::string(x.what()).find(" deadlocks: ") == std::string::npos) std::rethrow_exception(e);
        if (!first) first = e;
      }
    }
    if (first) std::rethrow_exception(first);
  }
  ++st.runs;
  ++im.launches;
}

void Engine::run(const Dispatch& d, const Bindings& host) {
  Impl& im = *impl_;
  const bool first = !im.dispatched.count(d.name);
  Bindings dev;
  for (const auto& b : d.buffers) {
    const int64_t bytes = b.bytes();
    if (b.sync == Sync::DeviceOnly) {
      auto& mem = im.device_buffers[d.name + "/" + b.name];
      if (int64_t(mem.size()) != bytes) mem.assign(size_t(bytes), kPoison);
      dev[b.name] = {b.type, mem.data(), b.elems};
      continue;
    }
    auto it = host.find(b.name);
    if (it == host.end()) fail("npusim: dispatch {}: host buffer '{}' is not bound", d.name, b.name);
    const DdrTensor& h = it->second;
    if (h.type != b.type || h.elems != b.elems)
      fail("npusim: dispatch {}: buffer '{}' is declared {} x {} but bound to {} x {}", d.name, b.name, b.elems,
           elem_type_name(b.type), h.elems, elem_type_name(h.type));
    if (b.sync == Sync::ZeroCopy) {
      dev[b.name] = h;
      continue;
    }
    auto& mem = im.device_buffers[d.name + "/" + b.name];
    if (int64_t(mem.size()) != bytes) mem.assign(size_t(bytes), kPoison);
    if (b.to_device && (b.sync == Sync::EveryCall || first)) {
      std::memcpy(mem.data(), h.data, size_t(bytes));
      im.host_bytes += bytes;
    }
    dev[b.name] = {b.type, mem.data(), b.elems};
  }
  im.dispatched.insert(d.name);
  for (const auto& l : d.launches) run(l, dev);
  for (const auto& b : d.buffers) {
    if (!b.from_device || b.sync == Sync::ZeroCopy || b.sync == Sync::DeviceOnly) continue;
    std::memcpy(host.at(b.name).data, dev.at(b.name).data, size_t(b.bytes()));
    im.host_bytes += b.bytes();
  }
}

}  // namespace tessera::npusim
