#include "io/gguf_writer.h"

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include "util/error.h"

namespace tessera {

static_assert(std::endian::native == std::endian::little, "GGUF is written little-endian");

namespace {

using Type = GgufValue::Type;

constexpr uint32_t kVersion = 3;

void put_bytes(std::vector<uint8_t>& buf, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  buf.insert(buf.end(), b, b + n);
}

template <typename T>
void put(std::vector<uint8_t>& buf, T v) {
  put_bytes(buf, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& buf, const std::string& s) {
  put<uint64_t>(buf, s.size());
  put_bytes(buf, s.data(), s.size());
}

// `v` as an integer of type T, if it is one exactly.
template <typename T>
bool exact_integer(double v, T* out) {
  if (!std::isfinite(v) || v != std::floor(v)) return false;
  // The bounds are powers of two (or -0), so comparing as doubles is exact.
  const double lo = double(std::numeric_limits<T>::min());
  const double hi_excl = 2.0 * (double(std::numeric_limits<T>::max() / 2) + 1.0);
  if (v < lo || v >= hi_excl) return false;
  *out = T(v);
  return true;
}

template <typename T>
bool put_integer(std::vector<uint8_t>& buf, double v) {
  T x;
  if (!exact_integer<T>(v, &x)) return false;
  put<T>(buf, x);
  return true;
}

// Appends one number as `t`; false if `v` is not representable.
bool put_number(std::vector<uint8_t>& buf, Type t, double v) {
  switch (t) {
    case Type::U8: return put_integer<uint8_t>(buf, v);
    case Type::I8: return put_integer<int8_t>(buf, v);
    case Type::U16: return put_integer<uint16_t>(buf, v);
    case Type::I16: return put_integer<int16_t>(buf, v);
    case Type::U32: return put_integer<uint32_t>(buf, v);
    case Type::I32: return put_integer<int32_t>(buf, v);
    case Type::U64: return put_integer<uint64_t>(buf, v);
    case Type::I64: return put_integer<int64_t>(buf, v);
    case Type::F32:
      if (std::isfinite(v) && std::fabs(v) > double(std::numeric_limits<float>::max())) {
        return false;
      }
      put<float>(buf, float(v));
      return true;
    case Type::F64: put<double>(buf, v); return true;
    case Type::BOOL:
      if (v != 0.0 && v != 1.0) return false;
      put<uint8_t>(buf, v != 0.0);
      return true;
    case Type::STRING:
    case Type::ARRAY: return false;
  }
  return false;
}

struct Tensor {
  std::string name;
  uint32_t ggml_type;
  std::vector<int64_t> shape;  // outermost first
  uint64_t nbytes;
};

}  // namespace

struct GgufWriter::Impl {
  std::string path;
  std::vector<uint8_t> kv;  // encoded metadata pairs
  uint64_t kv_count = 0;
  std::set<std::string> keys;
  uint64_t alignment = kGgufDefaultAlignment;
  std::vector<Tensor> tensors;
  std::set<std::string> names;
  size_t next = 0;       // tensor being written
  uint64_t written = 0;  // bytes of it written so far
  bool header_written = false;
  bool closed = false;
  std::FILE* f = nullptr;

  ~Impl() {
    if (f) {
      std::fclose(f);
      std::remove(path.c_str());
    }
  }

  void check_open(const std::string& what) {
    if (closed) fail("{}: cannot add {} after close", path, what);
    if (header_written) fail("{}: cannot add {} after tensor data was written", path, what);
  }

  // Starts a metadata pair: the key and the value type.
  void begin_kv(const std::string& key, Type t) {
    check_open(fmt::format("metadata '{}'", key));
    // The writer lays out tensors by it, so it must be the u32 that add_u32 checks.
    if (key == "general.alignment" && t != Type::U32) {
      fail("{}: general.alignment must be a u32, not {}", path, gguf_type_name(t));
    }
    if (!keys.insert(key).second) fail("{}: metadata key '{}' added twice", path, key);
    put_string(kv, key);
    put<uint32_t>(kv, uint32_t(t));
    ++kv_count;
  }

  void out(const void* p, size_t n) {
    if (n != 0 && std::fwrite(p, 1, n, f) != n) {
      fail("{}: write failed: {}", path, std::strerror(errno));
    }
  }

  void pad_to_alignment(uint64_t pos) {
    static const uint8_t zeros[256] = {};
    for (uint64_t n = (alignment - pos % alignment) % alignment; n > 0;) {
      const uint64_t k = std::min<uint64_t>(n, sizeof(zeros));
      out(zeros, k);
      n -= k;
    }
  }

  void write_header() {
    std::vector<uint8_t> h;
    put_bytes(h, "GGUF", 4);
    put<uint32_t>(h, kVersion);
    put<uint64_t>(h, tensors.size());
    put<uint64_t>(h, kv_count);
    put_bytes(h, kv.data(), kv.size());
    uint64_t offset = 0;  // relative to the data section; each tensor starts aligned
    for (const Tensor& t : tensors) {
      put_string(h, t.name);
      put<uint32_t>(h, uint32_t(t.shape.size()));
      for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) put<uint64_t>(h, uint64_t(*it));
      put<uint32_t>(h, t.ggml_type);
      put<uint64_t>(h, offset);
      offset += (t.nbytes + alignment - 1) / alignment * alignment;
    }
    f = std::fopen(path.c_str(), "wb");
    if (!f) fail("cannot create {}: {}", path, std::strerror(errno));
    out(h.data(), h.size());
    pad_to_alignment(h.size());
    header_written = true;
  }
};

GgufWriter::GgufWriter(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
}

GgufWriter::~GgufWriter() = default;

void GgufWriter::add_u8(const std::string& key, uint8_t v) {
  impl_->begin_kv(key, Type::U8);
  put(impl_->kv, v);
}
void GgufWriter::add_i8(const std::string& key, int8_t v) {
  impl_->begin_kv(key, Type::I8);
  put(impl_->kv, v);
}
void GgufWriter::add_u16(const std::string& key, uint16_t v) {
  impl_->begin_kv(key, Type::U16);
  put(impl_->kv, v);
}
void GgufWriter::add_i16(const std::string& key, int16_t v) {
  impl_->begin_kv(key, Type::I16);
  put(impl_->kv, v);
}
void GgufWriter::add_u32(const std::string& key, uint32_t v) {
  if (key == "general.alignment") {
    if (!std::has_single_bit(v) || v > (1u << 30)) {
      fail("{}: general.alignment {} is not a power of two up to 2^30", impl_->path, v);
    }
  }
  impl_->begin_kv(key, Type::U32);
  put(impl_->kv, v);
  if (key == "general.alignment") impl_->alignment = v;
}
void GgufWriter::add_i32(const std::string& key, int32_t v) {
  impl_->begin_kv(key, Type::I32);
  put(impl_->kv, v);
}
void GgufWriter::add_f32(const std::string& key, float v) {
  impl_->begin_kv(key, Type::F32);
  put(impl_->kv, v);
}
void GgufWriter::add_bool(const std::string& key, bool v) {
  impl_->begin_kv(key, Type::BOOL);
  put<uint8_t>(impl_->kv, v ? 1 : 0);
}
void GgufWriter::add_string(const std::string& key, const std::string& v) {
  impl_->begin_kv(key, Type::STRING);
  put_string(impl_->kv, v);
}
void GgufWriter::add_u64(const std::string& key, uint64_t v) {
  impl_->begin_kv(key, Type::U64);
  put(impl_->kv, v);
}
void GgufWriter::add_i64(const std::string& key, int64_t v) {
  impl_->begin_kv(key, Type::I64);
  put(impl_->kv, v);
}
void GgufWriter::add_f64(const std::string& key, double v) {
  impl_->begin_kv(key, Type::F64);
  put(impl_->kv, v);
}

void GgufWriter::add_array(const std::string& key, const std::vector<std::string>& v) {
  impl_->begin_kv(key, Type::ARRAY);
  put<uint32_t>(impl_->kv, uint32_t(Type::STRING));
  put<uint64_t>(impl_->kv, v.size());
  for (const std::string& s : v) put_string(impl_->kv, s);
}

void GgufWriter::add_array(const std::string& key, GgufValue::Type elem_type,
                           const std::vector<double>& v) {
  if (elem_type == Type::STRING || elem_type == Type::ARRAY) {
    fail(
        "{}: metadata '{}': use the string overload for string arrays; nested arrays are not "
        "supported",
        impl_->path, key);
  }
  // Encoded aside first, so that a bad value leaves no half-written pair behind.
  std::vector<uint8_t> elems;
  for (double x : v) {
    if (!put_number(elems, elem_type, x)) {
      fail("{}: metadata '{}': {} is not representable as {}", impl_->path, key, x,
           gguf_type_name(elem_type));
    }
  }
  impl_->begin_kv(key, Type::ARRAY);
  put<uint32_t>(impl_->kv, uint32_t(elem_type));
  put<uint64_t>(impl_->kv, v.size());
  put_bytes(impl_->kv, elems.data(), elems.size());
}

void GgufWriter::add(const std::string& key, const GgufValue& v) {
  const auto& s = v.scalar;
  switch (v.type) {
    case Type::U8: return add_u8(key, uint8_t(std::get<uint64_t>(s)));
    case Type::I8: return add_i8(key, int8_t(std::get<int64_t>(s)));
    case Type::U16: return add_u16(key, uint16_t(std::get<uint64_t>(s)));
    case Type::I16: return add_i16(key, int16_t(std::get<int64_t>(s)));
    case Type::U32: return add_u32(key, uint32_t(std::get<uint64_t>(s)));
    case Type::I32: return add_i32(key, int32_t(std::get<int64_t>(s)));
    case Type::F32: return add_f32(key, float(std::get<double>(s)));
    case Type::BOOL: return add_bool(key, std::get<bool>(s));
    case Type::STRING: return add_string(key, std::get<std::string>(s));
    case Type::U64: return add_u64(key, std::get<uint64_t>(s));
    case Type::I64: return add_i64(key, std::get<int64_t>(s));
    case Type::F64: return add_f64(key, std::get<double>(s));
    case Type::ARRAY:
      if (v.elem_type == Type::STRING) return add_array(key, v.strings);
      return add_array(key, v.elem_type, v.numbers);
  }
}

void GgufWriter::add_tensor(const std::string& name, DType dtype,
                            const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(numel, d, &numel)) {
      fail("{}: tensor '{}' has an invalid shape", impl_->path, name);
    }
  }
  const int64_t block = dtype_block_values(dtype);
  if ((shape.empty() ? 1 : shape.back()) % block != 0) {
    fail("{}: tensor '{}' of type {}: inner dimension must be a multiple of {}", impl_->path, name,
         dtype_name(dtype), block);
  }
  add_tensor_raw(name, ggml_type_id(dtype), shape, dtype_bytes(dtype, numel));
}

void GgufWriter::add_tensor_raw(const std::string& name, uint32_t ggml_type,
                                const std::vector<int64_t>& shape, uint64_t nbytes) {
  impl_->check_open(fmt::format("tensor '{}'", name));
  if (!impl_->names.insert(name).second) fail("{}: tensor '{}' added twice", impl_->path, name);
  impl_->tensors.push_back({name, ggml_type, shape, nbytes});
}

void GgufWriter::write(const std::string& name, const void* data, uint64_t nbytes) {
  const Impl& w = *impl_;
  // Only the whole-tensor checks here; write_part checks the order.
  if (!w.closed && w.next < w.tensors.size() && name == w.tensors[w.next].name) {
    if (w.written != 0) fail("{}: tensor '{}' was begun with write_part", w.path, name);
    if (nbytes != w.tensors[w.next].nbytes) {
      fail("{}: tensor '{}' is {} bytes, expected {}", w.path, name, nbytes,
           w.tensors[w.next].nbytes);
    }
  }
  write_part(name, data, nbytes);
}

void GgufWriter::write_part(const std::string& name, const void* data, uint64_t nbytes) {
  Impl& w = *impl_;
  if (w.closed) fail("{}: write of '{}' after close", w.path, name);
  if (!w.header_written) w.write_header();
  if (w.next >= w.tensors.size()) {
    fail("{}: write of '{}' but all {} declared tensors are written", w.path, name,
         w.tensors.size());
  }
  const Tensor& t = w.tensors[w.next];
  if (name != t.name) {
    fail("{}: write of '{}' but '{}' is next (tensors are written in declaration order)", w.path,
         name, t.name);
  }
  if (nbytes > t.nbytes - w.written) {
    fail("{}: tensor '{}' is {} bytes; {} more after {} is too many", w.path, name, t.nbytes,
         nbytes, w.written);
  }
  w.out(data, nbytes);
  w.written += nbytes;
  if (w.written == t.nbytes) {
    w.pad_to_alignment(t.nbytes);
    ++w.next;
    w.written = 0;
  }
}

void GgufWriter::close() {
  Impl& w = *impl_;
  if (w.closed) return;
  if (!w.header_written) w.write_header();
  if (w.next != w.tensors.size()) {
    fail("{}: closed before tensor '{}' was written", w.path, w.tensors[w.next].name);
  }
  w.closed = true;
  std::FILE* f = w.f;
  w.f = nullptr;
  if (std::fclose(f) != 0) {
    const int e = errno;
    std::remove(w.path.c_str());
    fail("{}: write failed: {}", w.path, std::strerror(e));
  }
}

}  // namespace tessera
