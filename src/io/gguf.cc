#include "io/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <set>

#include "util/error.h"
#include "util/mapped_file.h"

namespace tessera {

// Fields and tensor bytes are read in place from the mapping.
static_assert(std::endian::native == std::endian::little, "GGUF is read as little-endian");

namespace {

using Type = GgufValue::Type;

constexpr uint32_t kMaxDims = 4;              // GGML_MAX_DIMS
constexpr uint64_t kMaxNameBytes = 1 << 16;   // keys and tensor names; values may be longer
constexpr uint64_t kMinKvBytes = 12;          // key length (8) + value type (4), at least
constexpr uint64_t kMinTensorInfoBytes = 24;  // name length, n_dims, type, offset
constexpr uint64_t kReserveCap = 1 << 20;     // never trust a count for more up front

// Bytes of one scalar of type t; 8 for a string (its length prefix, at least).
uint64_t min_value_bytes(Type t) {
  switch (t) {
    case Type::U8:
    case Type::I8:
    case Type::BOOL: return 1;
    case Type::U16:
    case Type::I16: return 2;
    case Type::U32:
    case Type::I32:
    case Type::F32: return 4;
    case Type::U64:
    case Type::I64:
    case Type::F64:
    case Type::STRING: return 8;
    case Type::ARRAY: return 12;  // element type + count
  }
  return 1;
}

// Reads little-endian fields from the mapping; every read checks the bytes exist first.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* data, uint64_t size)
      : path_(path), data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  // `what` names the field in the error ("metadata key 3", "tensor 'x' dims").
  const uint8_t* take(uint64_t n, const std::string& what) {
    if (n > left()) {
      fail("{}: {} runs past the end of the file (needs {} bytes at offset {}, {} left)", path_,
           what, n, pos_, left());
    }
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }

  template <typename T>
  T get(const std::string& what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }

  std::string str(const std::string& what, uint64_t max_len = UINT64_MAX) {
    const uint64_t len = get<uint64_t>(what);
    if (len > max_len) fail("{}: {} claims an absurd length of {} bytes", path_, what, len);
    const uint8_t* p = take(len, what);
    return std::string(reinterpret_cast<const char*>(p), len);
  }

 private:
  const std::string& path_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

bool is_valid_value_type(uint32_t t) { return t <= uint32_t(Type::F64); }

// One scalar, or ARRAY's elements. Numbers are widened: unsigned to uint64, signed to
// int64, floats to double, as GgufValue holds them.
void read_scalar(Cursor& c, Type t, GgufValue& v, const std::string& what) {
  switch (t) {
    case Type::U8: v.scalar = uint64_t(c.get<uint8_t>(what)); return;
    case Type::I8: v.scalar = int64_t(c.get<int8_t>(what)); return;
    case Type::U16: v.scalar = uint64_t(c.get<uint16_t>(what)); return;
    case Type::I16: v.scalar = int64_t(c.get<int16_t>(what)); return;
    case Type::U32: v.scalar = uint64_t(c.get<uint32_t>(what)); return;
    case Type::I32: v.scalar = int64_t(c.get<int32_t>(what)); return;
    case Type::F32: v.scalar = double(c.get<float>(what)); return;
    case Type::BOOL: v.scalar = c.get<uint8_t>(what) != 0; return;
    case Type::STRING: v.scalar = c.str(what); return;
    case Type::U64: v.scalar = c.get<uint64_t>(what); return;
    case Type::I64: v.scalar = c.get<int64_t>(what); return;
    case Type::F64: v.scalar = c.get<double>(what); return;
    case Type::ARRAY: break;
  }
}

double scalar_as_number(const GgufValue& v) {
  if (auto* u = std::get_if<uint64_t>(&v.scalar)) return double(*u);
  if (auto* i = std::get_if<int64_t>(&v.scalar)) return double(*i);
  if (auto* d = std::get_if<double>(&v.scalar)) return *d;
  if (auto* b = std::get_if<bool>(&v.scalar)) return *b ? 1.0 : 0.0;
  return 0.0;
}

GgufValue read_value(Cursor& c, const std::string& path, const std::string& key) {
  const std::string what = fmt::format("metadata '{}'", key);
  const uint32_t type = c.get<uint32_t>(what);
  if (!is_valid_value_type(type)) {
    fail("{}: metadata '{}' has unknown value type {}", path, key, type);
  }
  GgufValue v;
  v.type = Type(type);
  if (v.type != Type::ARRAY) {
    read_scalar(c, v.type, v, what);
    return v;
  }

  const uint32_t elem = c.get<uint32_t>(what);
  if (!is_valid_value_type(elem)) {
    fail("{}: metadata '{}' is an array of unknown value type {}", path, key, elem);
  }
  if (Type(elem) == Type::ARRAY) {
    fail("{}: metadata '{}' is a nested array (not supported)", path, key);
  }
  v.elem_type = Type(elem);
  const uint64_t count = c.get<uint64_t>(what);
  if (count > c.left() / min_value_bytes(v.elem_type)) {
    fail("{}: metadata '{}' claims {} array elements, more than the {} bytes left can hold", path,
         key, count, c.left());
  }
  GgufValue e;
  if (v.elem_type == Type::STRING) {
    v.strings.reserve(std::min(count, kReserveCap));
    for (uint64_t i = 0; i < count; ++i) v.strings.push_back(c.str(what));
  } else {
    v.numbers.reserve(std::min(count, kReserveCap));
    for (uint64_t i = 0; i < count; ++i) {
      read_scalar(c, v.elem_type, e, what);
      v.numbers.push_back(scalar_as_number(e));
    }
  }
  return v;
}

uint64_t read_alignment(const std::string& path, const GgufValue& v) {
  const bool integral =
      std::holds_alternative<uint64_t>(v.scalar) || std::holds_alternative<int64_t>(v.scalar);
  const double a = integral ? scalar_as_number(v) : 0.0;
  // Capped so that rounding an offset up to it cannot overflow.
  if (!integral || a < 1 || a > double(1u << 30) || !std::has_single_bit(uint64_t(a))) {
    fail("{}: general.alignment must be a power of two up to 2^30, got {}", path,
         integral ? fmt::format("{}", a) : std::string(gguf_type_name(v.type)));
  }
  return uint64_t(a);
}

std::string printable(const uint8_t* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const bool plain = p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\';
    s += plain ? std::string(1, char(p[i])) : fmt::format("\\x{:02x}", p[i]);
  }
  return s;
}

}  // namespace

const char* gguf_type_name(GgufValue::Type t) {
  static const char* const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                      "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = size_t(t);
  return i < std::size(names) ? names[i] : "?";
}

namespace {
// ggml's type ids of the types tessera reads.
constexpr std::pair<DType, uint32_t> kGgmlIds[] = {
    {DType::F32, 0},   {DType::F16, 1},   {DType::Q4_0, 2},   {DType::Q4_1, 3},    {DType::Q5_0, 6},
    {DType::Q5_1, 7},  {DType::Q8_0, 8},  {DType::Q2_K, 10},  {DType::Q3_K, 11},   {DType::Q4_K, 12},
    {DType::Q5_K, 13}, {DType::Q6_K, 14}, {DType::IQ4_NL, 20}, {DType::IQ4_XS, 23}, {DType::BF16, 30}};
}  // namespace

uint32_t ggml_type_id(DType t) {
  for (const auto& [d, id] : kGgmlIds)
    if (d == t) return id;
  return 0;
}

std::optional<DType> dtype_from_ggml(uint32_t type) {
  for (const auto& [d, id] : kGgmlIds)
    if (id == type) return d;
  return std::nullopt;
}

std::string GgufFile::describe(const UnsupportedTensor& t) {
  const char* name = ggml_type_name(t.type);
  std::string reads;
  for (const auto& [d, id] : kGgmlIds) reads += (reads.empty() ? "" : ", ") + std::string(ggml_type_name(id));
  return fmt::format("tensor '{}' has {} type {}{}, which tessera does not read (it reads {})", t.name,
                     name ? "tensor" : "unknown tensor", t.type, name ? fmt::format(" ({})", name) : std::string(), reads);
}

const char* ggml_type_name(uint32_t type) {
  // ggml's own names, by id; gaps are ids ggml has retired.
  static const char* const names[] = {
      "f32",   "f16",        "q4_0",       "q4_1",       "q4_2",     "q4_3",     "q5_0",
      "q5_1",  "q8_0",       "q8_1",       "q2_K",       "q3_K",     "q4_K",     "q5_K",
      "q6_K",  "q8_K",       "iq2_xxs",    "iq2_xs",     "iq3_xxs",  "iq1_s",    "iq4_nl",
      "iq3_s", "iq2_s",      "iq4_xs",     "i8",         "i16",      "i32",      "i64",
      "f64",   "iq1_m",      "bf16",       "q4_0_4_4",   "q4_0_4_8", "q4_0_8_8", "tq1_0",
      "tq2_0", "iq4_nl_4_4", "iq4_nl_4_8", "iq4_nl_8_8", "mxfp4"};
  return type < std::size(names) ? names[type] : nullptr;
}

int64_t GgufValue::as_int() const {
  if (auto* u = std::get_if<uint64_t>(&scalar); u && type != Type::ARRAY) {
    if (*u > uint64_t(INT64_MAX)) fail("GGUF value {} does not fit in a signed 64-bit integer", *u);
    return int64_t(*u);
  }
  if (auto* i = std::get_if<int64_t>(&scalar); i && type != Type::ARRAY) return *i;
  fail("GGUF value of type {} used as an integer", gguf_type_name(type));
}

double GgufValue::as_double() const {
  if (type == Type::ARRAY || type == Type::STRING || type == Type::BOOL) {
    fail("GGUF value of type {} used as a number", gguf_type_name(type));
  }
  return scalar_as_number(*this);
}

bool GgufValue::as_bool() const {
  if (type != Type::BOOL) fail("GGUF value of type {} used as a bool", gguf_type_name(type));
  return std::get<bool>(scalar);
}

const std::string& GgufValue::as_string() const {
  if (type != Type::STRING) fail("GGUF value of type {} used as a string", gguf_type_name(type));
  return std::get<std::string>(scalar);
}

const std::string& GgufFile::path() const {
  static const std::string none;
  return file_ ? file_->path() : none;
}

const GgufValue& GgufFile::get(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) fail("{}: missing metadata key '{}'", path(), key);
  return *v;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile g;
  g.file_ = MappedFile::open(path);
  const uint64_t size = g.file_->size();
  const uint8_t* base = g.file_->data();
  if (size < 4) fail("{}: file is {} bytes, too short to be GGUF", path, size);
  if (std::memcmp(base, "GGUF", 4) != 0) {
    fail("{}: not a GGUF file (starts with '{}', expected 'GGUF')", path, printable(base, 4));
  }

  Cursor c(path, base, size);
  c.take(4, "magic");
  g.version_ = c.get<uint32_t>("header");
  if (g.version_ != 2 && g.version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(g.version_);
    fail("{}: unsupported GGUF version {} (tessera reads versions 2 and 3{})", path, g.version_,
         swapped == 2 || swapped == 3 ? "; this file looks big-endian" : "");
  }
  const uint64_t tensor_count = c.get<uint64_t>("header");
  const uint64_t kv_count = c.get<uint64_t>("header");
  if (tensor_count > c.left() / kMinTensorInfoBytes) {
    fail("{}: tensor count {} is larger than the file could hold ({} bytes)", path, tensor_count,
         size);
  }
  if (kv_count > (c.left() - tensor_count * kMinTensorInfoBytes) / kMinKvBytes) {
    fail("{}: metadata count {} is larger than the file could hold ({} bytes)", path, kv_count,
         size);
  }

  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = c.str(fmt::format("metadata key {}", i), kMaxNameBytes);
    GgufValue v = read_value(c, path, key);
    if (!g.kv_.emplace(key, std::move(v)).second) {
      fail("{}: metadata key '{}' appears twice", path, key);
    }
  }
  const GgufValue* align = g.find("general.alignment");
  g.alignment_ = align ? read_alignment(path, *align) : kGgufDefaultAlignment;

  // Tensor directory. Offsets are checked once the data section's start is known.
  std::vector<uint64_t> offsets;
  std::set<std::string> names;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorInfo t;
    t.name = c.str(fmt::format("name of tensor {}", i), kMaxNameBytes);
    const std::string what = fmt::format("tensor '{}'", t.name);
    if (!names.insert(t.name).second) fail("{}: tensor '{}' appears twice", path, t.name);
    const uint32_t n_dims = c.get<uint32_t>(what);
    if (n_dims > kMaxDims) {
      fail("{}: tensor '{}' has {} dimensions (at most {})", path, t.name, n_dims, kMaxDims);
    }
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = c.get<uint64_t>(what);
      if (dim > uint64_t(INT64_MAX) || __builtin_mul_overflow(numel, int64_t(dim), &numel)) {
        fail("{}: tensor '{}' has dimensions too large for a 64-bit element count", path, t.name);
      }
      t.shape.insert(t.shape.begin(), int64_t(dim));  // GGUF lists the innermost first
    }
    const uint32_t type = c.get<uint32_t>(what);
    auto dtype = dtype_from_ggml(type);
    if (!dtype) {
      c.get<uint64_t>(what);  // its offset: the tensor is left out
      g.unsupported_.push_back({t.name, type});
      continue;
    }
    t.dtype = *dtype;
    const int64_t block = dtype_block_values(t.dtype);
    const int64_t inner = t.shape.empty() ? 1 : t.shape.back();
    if (inner % block != 0) {
      fail("{}: tensor '{}' of type {} has inner dimension {}, not a multiple of its block size {}",
           path, t.name, ggml_type_name(type), inner, block);
    }
    // Bounded by the file size first, so that the byte count cannot overflow.
    if (uint64_t(numel / block) > size / uint64_t(dtype_block_bytes(t.dtype))) {
      fail("{}: tensor '{}' shape {} holds more data than the whole file", path, t.name,
           t.shape_str());
    }
    t.nbytes = dtype_bytes(t.dtype, numel);
    offsets.push_back(c.get<uint64_t>(what));
    t.file = g.file_;
    g.tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment (possibly past the end
  // of a file with no tensor data).
  const uint64_t data_start = (c.pos() + g.alignment_ - 1) / g.alignment_ * g.alignment_;
  const uint64_t data_size = data_start < size ? size - data_start : 0;
  for (size_t i = 0; i < g.tensors_.size(); ++i) {
    TensorInfo& t = g.tensors_[i];
    const uint64_t off = offsets[i];
    if (off % g.alignment_ != 0) {
      fail("{}: tensor '{}' offset {} is not a multiple of the alignment {}", path, t.name, off,
           g.alignment_);
    }
    if (off > data_size || t.nbytes > data_size - off) {
      fail("{}: tensor '{}' data (offset {}, {} bytes) runs past the end of the file", path, t.name,
           off, t.nbytes);
    }
    // An empty tensor may sit at the very end; keep its pointer within the mapping.
    t.data = base + std::min(data_start + off, size);
  }

  // Tensors must not share bytes; empty ones own none.
  std::vector<size_t> order(g.tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return offsets[a] < offsets[b]; });
  const TensorInfo* prev = nullptr;
  for (size_t i : order) {
    const TensorInfo& t = g.tensors_[i];
    if (t.nbytes == 0) continue;
    if (prev && t.data < prev->data + prev->nbytes) {
      fail("{}: tensors '{}' and '{}' overlap in the data section", path, prev->name, t.name);
    }
    prev = &t;
  }
  // The header and metadata are parsed into g: their pages are not read again, so they need
  // not stay resident (a 49k-token vocabulary is about 2 MB of them).
  g.file_->release(base, std::min(data_start, size));
  return g;
}

}  // namespace tessera
